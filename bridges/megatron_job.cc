// The job a Megatron-LM launch script starts: see bridges/megatron_job.h.
#include "bridges/megatron_job.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/model/model.h"

namespace stowage::bridges {
namespace {

// A launcher option's value: `--name V` or `--name=V`, under any of `names`; the word that gave
// it, for the message.
struct Option {
  std::optional<std::string> value;
  std::string unresolved;
  std::string spelled;  // "--nproc_per_node 8"
};

Option FindOption(const std::vector<ShellWord>& words, std::initializer_list<const char*> names) {
  Option out;
  for (size_t i = 0; i < words.size(); ++i) {
    for (const char* name : names) {
      const std::string flag = absl::StrCat("--", name);
      if (words[i].text == flag && i + 1 < words.size()) {
        out = {words[i + 1].text, words[i + 1].unresolved, flag + " " + words[i + 1].text};
      } else if (absl::StartsWith(words[i].text, flag + "=")) {
        out = {words[i].text.substr(flag.size() + 1), words[i].unresolved, words[i].text};
      }
    }
  }
  return out;
}

// A count of GPUs or nodes; false (with `why`) when the value is not a positive integer.
bool Count(const Option& o, int& out, std::string& why) {
  if (!o.unresolved.empty()) {
    why = absl::StrCat(o.spelled, ": ", o.unresolved);
    return false;
  }
  if (!absl::SimpleAtoi(*o.value, &out) || out < 1 || out > planner::kMaxParallel) {
    why = absl::StrCat(o.spelled, " is not a GPU count");
    return false;
  }
  return true;
}

bool IsTorchrun(const std::vector<ShellWord>& words, size_t end, std::string& name) {
  for (size_t i = 0; i < end; ++i) {
    const std::string& w = words[i].text;
    if (w == "torchrun" || absl::EndsWith(w, "/torchrun")) {
      name = "torchrun";
      return true;
    }
    if (w == "torch.distributed.run" || w == "torch.distributed.launch") {
      name = absl::StrCat("python -m ", w);
      return true;
    }
  }
  return false;
}

}  // namespace

std::vector<MegatronArgument> ArgumentsOfWords(const std::vector<ShellWord>& words) {
  std::vector<MegatronArgument> out;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i].text;
    // --name: a letter after the dashes (not "---", "--" or "--=").
    if (!absl::StartsWith(w, "--") || w.size() == 2 ||
        !absl::ascii_isalpha(static_cast<unsigned char>(w[2]))) {
      continue;
    }
    MegatronArgument a{w.substr(2), std::nullopt, words[i].unresolved, w};
    for (size_t j = i + 1; j < words.size() && !absl::StartsWith(words[j].text, "--"); ++j) {
      absl::StrAppend(&a.spelled, " ", words[j].text);
    }
    if (auto eq = a.name.find('='); eq != std::string::npos) {
      a.value = a.name.substr(eq + 1);
      a.name = a.name.substr(0, eq);
    } else if (i + 1 < words.size() && !absl::StartsWith(words[i + 1].text, "--")) {
      a.value = words[i + 1].text;
      a.unresolved = words[i + 1].unresolved;
    }
    // Quotes left in a value by the script's own quoting ("--split '99,1,0'").
    if (a.value.has_value() && a.value->size() >= 2 &&
        (a.value->front() == '\'' || a.value->front() == '"') &&
        a.value->back() == a.value->front()) {
      a.value = a.value->substr(1, a.value->size() - 2);
    }
    out.push_back(std::move(a));
  }
  return out;
}

LaunchedJob ReadLaunchedJob(const ShellScript& script, const std::string& source) {
  LaunchedJob job;
  const ShellCommand* training = nullptr;
  size_t program = 0;
  for (const ShellCommand& c : script.commands) {
    for (size_t i = 0; i < c.words.size(); ++i) {
      if (!absl::EndsWith(c.words[i].text, ".py")) continue;
      bool has_arguments = false;
      for (size_t j = i + 1; j < c.words.size(); ++j) {
        has_arguments |= absl::StartsWith(c.words[j].text, "--");
      }
      if (has_arguments) {
        training = &c;
        program = i;
      }
      break;
    }
  }
  if (training == nullptr) {  // a bare argument list
    for (const ShellCommand& c : script.commands) {
      for (MegatronArgument& a : ArgumentsOfWords(c.words)) job.arguments.push_back(std::move(a));
    }
    return job;
  }
  job.line = training->line;
  const std::vector<ShellWord> launcher(training->words.begin(),
                                        training->words.begin() + static_cast<long>(program));
  job.arguments = ArgumentsOfWords(std::vector<ShellWord>(
      training->words.begin() + static_cast<long>(program) + 1, training->words.end()));
  std::string name;
  const std::string at_line = absl::StrCat(source, ":", training->line);
  if (IsTorchrun(launcher, launcher.size(), name)) {
    job.launcher = name;
    const Option per_node = FindOption(launcher, {"nproc_per_node", "nproc-per-node"});
    const Option nodes = FindOption(launcher, {"nnodes"});
    int p = 1, n = 1;
    std::string why;
    if (!per_node.value.has_value()) {
      job.gpus_missing = absl::StrCat(at_line, ": ", name, " has no --nproc_per_node");
    } else if (!Count(per_node, p, why) || (nodes.value.has_value() && !Count(nodes, n, why))) {
      job.gpus_missing = absl::StrCat(at_line, ": ", name, " ", why);
    } else {
      job.gpus = p * n;
      job.gpus_origin = absl::StrCat(name, " ", per_node.spelled, " x ",
                                     nodes.value.has_value() ? nodes.spelled : "(one node)",
                                     ", line ", training->line);
    }
    return job;
  }
  // srun (this command's, an earlier srun's, or the #SBATCH lines): tasks per node x nodes.
  job.launcher = launcher.empty() ? "python" : launcher[0].text;
  std::vector<ShellWord> slurm;
  for (const ShellCommand& c : script.commands) {
    if (&c == training) break;
    if (!c.words.empty() && (c.words[0].text == "srun" || c.words[0].text == "salloc")) {
      slurm = c.words;
    }
  }
  if (!launcher.empty() && launcher[0].text == "srun") slurm = launcher;
  for (const SbatchDirective& d : script.sbatch) {  // after srun's own: srun's options win
    std::string option = d.name;
    if (option == "gres" && absl::StartsWith(d.value, "gpu:")) {
      slurm.insert(slurm.begin(), {ShellWord{"--gpus-per-node", ""},
                                   ShellWord{d.value.substr(d.value.rfind(':') + 1), ""}});
      continue;
    }
    slurm.insert(slurm.begin(), {ShellWord{"--" + option, ""}, ShellWord{d.value, ""}});
  }
  const Option tasks = FindOption(slurm, {"ntasks-per-node", "gpus-per-node"});
  const Option nodes = FindOption(slurm, {"nodes", "N"});
  const Option total = FindOption(slurm, {"ntasks", "gpus"});
  int t = 0, n = 1;
  std::string why;
  if (total.value.has_value() && Count(total, t, why)) {
    job.gpus = t;
    job.gpus_origin = absl::StrCat("SLURM ", total.spelled);
    return job;
  }
  if (tasks.value.has_value() || nodes.value.has_value()) {
    if (!tasks.value.has_value()) {
      job.gpus_missing = "SLURM gives the nodes but not the tasks (GPUs) per node";
    } else if (!Count(tasks, t, why) || (nodes.value.has_value() && !Count(nodes, n, why))) {
      job.gpus_missing = absl::StrCat("SLURM ", why);
    } else {
      job.gpus = t * n;
      job.gpus_origin = absl::StrCat("SLURM ", tasks.spelled, " x ",
                                     nodes.value.has_value() ? nodes.spelled : "(one node)");
    }
    return job;
  }
  if (auto it = script.variables.find("WORLD_SIZE"); it != script.variables.end()) {
    int w = 0;
    if (it->second.unresolved.empty() && it->second.values.size() == 1 &&
        absl::SimpleAtoi(it->second.values[0], &w) && w >= 1 && w <= planner::kMaxParallel) {
      job.gpus = w;
      job.gpus_origin = absl::StrCat("the script's WORLD_SIZE=", w);
      return job;
    }
  }
  job.gpus_missing = absl::StrCat(at_line, ": ", job.launcher,
                                  " starts the training; no launcher option, #SBATCH line or "
                                  "WORLD_SIZE says how many GPUs");
  return job;
}

}  // namespace stowage::bridges
