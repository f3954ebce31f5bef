// The job a Megatron-LM launch script starts (bridges/megatron_read.h): the training command's
// arguments and the GPUs its launcher asks for, read from the script as bridges/shell_script.h
// interprets it. Internal to bridges/.
#ifndef STOWAGE_BRIDGES_MEGATRON_JOB_H_
#define STOWAGE_BRIDGES_MEGATRON_JOB_H_

#include <optional>
#include <string>
#include <vector>

#include "bridges/shell_script.h"

namespace stowage::bridges {

struct MegatronArgument {
  std::string name;  // without "--", dashes
  std::optional<std::string> value;
  std::string unresolved;  // why the value is not known, with file and line; empty when known
  std::string spelled;     // as written, every value word after it ("--recompute-modules mlp moe")
};

struct LaunchedJob {
  std::vector<MegatronArgument> arguments;
  int line = 0;          // the training command's line; 0 when the file is a bare argument list
  std::string launcher;  // "torchrun", "python -m torch.distributed.run", "srun python", ...
  std::optional<int> gpus;
  std::string gpus_origin;   // "torchrun --nproc_per_node 8 x --nnodes 1, line 21"
  std::string gpus_missing;  // why the GPU count is not known, when a launcher is there
};

// The training command: the last command that runs a .py file with `--` arguments after it
// (pretrain_gpt.py and its kin), its launcher the words before it; without one, every `--name`
// word of the script, in order (a bare argument list). GPUs: torchrun's (or torch.distributed
// .run's) --nproc_per_node (--nproc-per-node) x --nnodes; else srun's or #SBATCH's
// --ntasks-per-node (or --gpus-per-node, --gres=gpu:N) x --nodes; else the script's WORLD_SIZE.
LaunchedJob ReadLaunchedJob(const ShellScript& script, const std::string& source);

// The `--name value` / `--name=value` arguments of `words` (a value is the next word unless it
// starts with "--").
std::vector<MegatronArgument> ArgumentsOfWords(const std::vector<ShellWord>& words);

}  // namespace stowage::bridges

#endif  // STOWAGE_BRIDGES_MEGATRON_JOB_H_
