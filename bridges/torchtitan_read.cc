// Reading a torchtitan job config (`stowage plan --from-torchtitan FILE`): its .toml as the
// planner's flags, and torchtitan's own split of the layers over the pipeline stages.
#include "bridges/torchtitan_read.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "toml++/toml.h"

namespace stowage::bridges {
namespace {

// torchtitan's [model] name and flavor -> the preset of the same shape (torchtitan/models/<name>/
// __init__.py of 0.2.2: e.g. llama3 "8B" is dim 4096, 32 layers, 8 KV heads, FFN 14336, vocab
// 128256, Llama 3.1 8B's). Flavors without one (debug models, attention-kernel variants such as
// "8B_flex") are named in a note.
const std::map<std::pair<std::string, std::string>, std::string>& TorchtitanPresets() {
  static const auto* table = new std::map<std::pair<std::string, std::string>, std::string>{
      {{"llama3", "8B"}, "llama-3.1-8b"},
      {{"llama3", "70B"}, "llama-3.1-70b"},
      {{"llama3", "405B"}, "llama-3.1-405b"},
      {{"qwen3", "8B"}, "qwen3-8b"},
      {{"qwen3", "32B"}, "qwen3-32b"},
      {{"qwen3", "30B-A3B"}, "qwen3-30b-a3b"},
      {{"qwen3", "235B-A22B"}, "qwen3-235b-a22b"},
      {{"deepseek_v3", "671B"}, "deepseek-v3"},
      {{"gpt_oss", "120b"}, "gpt-oss-120b"},
  };
  return *table;
}

// Typed reads of `section.key` from a parsed job config; every key read is remembered, so the
// rest can be named as not used.
class TomlSettings {
 public:
  TomlSettings(const toml::table& root, std::string source)
      : root_(root), source_(std::move(source)) {}

  const toml::node* Find(const std::string& section, const std::string& key) {
    used_.insert(absl::StrCat(section, ".", key));
    const toml::table* table = root_[section].as_table();
    return table == nullptr ? nullptr : table->get(key);
  }

  absl::StatusOr<std::optional<int64_t>> Int(const std::string& section, const std::string& key,
                                             int64_t min, int64_t max) {
    const toml::node* node = Find(section, key);
    if (node == nullptr) return std::nullopt;
    const std::optional<int64_t> value = node->value_exact<int64_t>();
    if (!value.has_value() || *value < min || *value > max) {
      return Invalid(section, key, *node, absl::StrCat("an integer in [", min, ", ", max, "]"));
    }
    return value;
  }

  absl::StatusOr<std::optional<std::string>> String(const std::string& section,
                                                    const std::string& key) {
    const toml::node* node = Find(section, key);
    if (node == nullptr) return std::nullopt;
    if (!node->is_string()) return Invalid(section, key, *node, "a string");
    return std::optional<std::string>(std::string(*node->value<std::string_view>()));
  }

  absl::StatusOr<std::optional<bool>> Bool(const std::string& section, const std::string& key) {
    const toml::node* node = Find(section, key);
    if (node == nullptr) return std::nullopt;
    if (!node->is_boolean()) return Invalid(section, key, *node, "true or false");
    return node->value<bool>();
  }

  absl::Status Invalid(const std::string& section, const std::string& key, const toml::node& node,
                       const std::string& allowed) const {
    std::ostringstream value;
    node.visit([&](const auto& v) { value << v; });  // as TOML writes it: "two", 0, [1, 2]
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", node.source().begin.line, ": ",
                                                   section, ".", key, " has value ", value.str(),
                                                   "; allowed: ", allowed));
  }

  // Every key of the file not read, as "section.key" ("quantize.linear.float8.fqns").
  std::vector<std::string> Unused() const {
    std::vector<std::string> out;
    Walk(root_, "", out);
    return out;
  }

 private:
  void Walk(const toml::table& table, const std::string& prefix,
            std::vector<std::string>& out) const {
    for (const auto& [key, node] : table) {
      const std::string name = absl::StrCat(prefix, std::string(key.str()));
      if (const toml::table* child = node.as_table(); child != nullptr) {
        Walk(*child, name + ".", out);
      } else if (!used_.contains(name)) {
        out.push_back(name);
      }
    }
  }

  const toml::table& root_;
  std::string source_;
  std::set<std::string> used_;
};

}  // namespace

absl::StatusOr<TrainerSettings> ReadTorchtitanSettings(std::string_view text,
                                                       std::string_view source_in) {
  const std::string source(source_in);
  toml::table root;
  try {
    root = toml::parse(text, source_in);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.source().begin.line, ":",
                                                   e.source().begin.column,
                                                   ": not TOML: ", std::string(e.description())));
  }
  TomlSettings toml(root, source);
  TrainerSettings out;
  auto flag = [&](const char* name, int64_t value) {
    out.flags.push_back({name, absl::StrCat(value)});
  };
  constexpr int64_t kMaxDegree = 1 << 20;  // the planner's own limit on a parallel size

  // [parallelism]: torchtitan's world is dp_replicate x dp_shard x cp x tp x pp
  // (distributed/parallel_dims.py, ParallelDims._validate).
  const std::string par = "parallelism";
  STOWAGE_ASSIGN_OR_RETURN(tp, toml.Int(par, "tensor_parallel_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(cp, toml.Int(par, "context_parallel_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(pp, toml.Int(par, "pipeline_parallel_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(ep, toml.Int(par, "expert_parallel_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(etp, toml.Int(par, "expert_tensor_parallel_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(replicate,
                           toml.Int(par, "data_parallel_replicate_degree", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(shard, toml.Int(par, "data_parallel_shard_degree", -1, kMaxDegree));
  if (shard.has_value() && *shard == 0) {
    return toml.Invalid(par, "data_parallel_shard_degree",
                        *toml.Find(par, "data_parallel_shard_degree"),
                        "-1 (every GPU the other degrees leave) or an integer of at least 1");
  }
  STOWAGE_ASSIGN_OR_RETURN(reshard, toml.String(par, "fsdp_reshard_after_forward"));
  STOWAGE_ASSIGN_OR_RETURN(schedule, toml.String(par, "pipeline_parallel_schedule"));
  STOWAGE_ASSIGN_OR_RETURN(pp_microbatch,
                           toml.Int(par, "pipeline_parallel_microbatch_size", 1, kMaxDegree));
  const int64_t tp_v = tp.value_or(1), cp_v = cp.value_or(1), pp_v = pp.value_or(1);
  const int64_t replicate_v = replicate.value_or(1), shard_v = shard.value_or(-1);
  if (tp) flag("tp", *tp);
  if (cp) flag("cp", *cp);
  if (pp) flag("pp", *pp);
  if (ep) flag("ep", *ep);
  if (etp.value_or(1) != 1) {
    out.notes.push_back(absl::StrCat(
        source, " sets parallelism.expert_tensor_parallel_degree = ", *etp,
        ": the planner's experts are not tensor-parallel (TP splits their routed tokens)"));
  }
  if (shard_v >= 1) {
    flag("gpus", replicate_v * shard_v * cp_v * tp_v * pp_v);
  } else {
    out.notes.push_back(absl::StrCat(
        source,
        " sets parallelism.data_parallel_shard_degree = -1 (every GPU the other degrees "
        "leave): give --gpus, the job's world size"));
  }
  // FSDP2 shards parameters, gradients and optimizer state over dp_shard x cp; with neither
  // above 1 the replicas are plain data parallel.
  const bool fsdp = shard_v != 1 || cp_v > 1;
  if (fsdp && reshard.has_value() && *reshard == "never") {
    // Parameters stay gathered from the forward to the backward: replicated through the step.
    out.flags.push_back({"sharding", "optim_grads"});
    out.notes.push_back(
        absl::StrCat(source,
                     " sets parallelism.fsdp_reshard_after_forward = \"never\": parameters stay "
                     "gathered between forward and backward, planned as --sharding optim_grads"));
  } else {
    out.flags.push_back({"sharding", fsdp ? "optim_grads_params" : "no_shard"});
  }
  if (reshard.has_value() && *reshard != "default" && *reshard != "always" && *reshard != "never") {
    return toml.Invalid(par, "fsdp_reshard_after_forward",
                        *toml.Find(par, "fsdp_reshard_after_forward"),
                        "\"default\", \"always\", \"never\"");
  }
  // torch.distributed.pipelining get_schedule_class (case-insensitive): single-stage schedules
  // run one stage per rank, multi-stage ones several (pipeline_llm).
  const toml::node* fqns_node = toml.Find(par, "module_fqns_per_model_part");
  STOWAGE_ASSIGN_OR_RETURN(layers_per_stage,
                           toml.Int(par, "pipeline_parallel_layers_per_stage", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(
      first_less, toml.Int(par, "pipeline_parallel_first_stage_less_layers", 0, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(
      last_less, toml.Int(par, "pipeline_parallel_last_stage_less_layers", 0, kMaxDegree));
  if (pp_v > 1) {
    const std::string name = absl::AsciiStrToLower(schedule.value_or("1F1B"));
    const std::set<std::string> single = {"1f1b", "gpipe", "pipelineschedulesingle"};
    const std::set<std::string> multi = {"interleaved1f1b", "loopedbfs", "interleavedzerobubble",
                                         "zbvzerobubble",   "dualpipev", "pipelineschedulemulti"};
    if (!single.contains(name) && !multi.contains(name)) {
      return toml.Invalid(par, "pipeline_parallel_schedule",
                          *toml.Find(par, "pipeline_parallel_schedule"),
                          "\"1F1B\", \"GPipe\", \"Interleaved1F1B\", \"LoopedBFS\", "
                          "\"InterleavedZeroBubble\", \"ZBVZeroBubble\", \"DualPipeV\"");
    }
    const bool multi_stage = multi.contains(name);
    if (schedule.has_value() || multi_stage) {
      out.flags.push_back({"schedule", multi_stage ? "interleaved" : "1f1b"});
    }
    if (name != "1f1b" && name != "interleaved1f1b") {
      out.notes.push_back(absl::StrCat(
          source, " sets parallelism.pipeline_parallel_schedule = \"", *schedule,
          "\": the planner models 1F1B and Interleaved1F1B; planned as ",
          multi_stage ? "Interleaved1F1B (its stages looped over the ranks)" : "1F1B",
          name == "gpipe" ? ", which holds fewer microbatches in flight than GPipe's all" : ""));
    }
    if (fqns_node != nullptr) {
      // Note [torchtitan model parts]: each part's modules (pipeline_module_split keeps a part's
      // "layers.<i>" by index, and tok_embeddings, norm, output by name), said as the planner's
      // virtual stages; the parts are looped over the ranks (stage v on rank v mod pp).
      const std::string key = "module_fqns_per_model_part";
      auto invalid = [&](const std::string& allowed) {
        return toml.Invalid(par, key, *fqns_node, allowed);
      };
      const toml::array* parts = fqns_node->as_array();
      if (parts == nullptr || parts->empty() || parts->size() % pp_v != 0) {
        return invalid(
            absl::StrCat("a list of model parts, a multiple of pipeline_parallel_degree (", pp_v,
                         "), each a list of module names"));
      }
      std::vector<int> counts;
      int next_layer = 0;
      for (size_t v = 0; v < parts->size(); ++v) {
        const toml::array* part = (*parts)[v].as_array();
        if (part == nullptr) return invalid("a list of lists of module names");
        int layers = 0;
        for (const toml::node& module : *part) {
          const std::optional<std::string> fqn = module.value<std::string>();
          if (!fqn.has_value()) return invalid("a list of lists of module names (strings)");
          const bool first = v == 0, last = v + 1 == parts->size();
          if (*fqn == "tok_embeddings" && first) continue;
          if ((*fqn == "norm" || *fqn == "output") && last) continue;
          int index = -1;
          const bool layer = fqn->rfind("layers.", 0) == 0 &&
                             absl::SimpleAtoi(fqn->substr(7), &index) && index >= 0;
          if (layer && index == next_layer) {
            ++next_layer;
            ++layers;
            continue;
          }
          return invalid(absl::StrCat(
              "\"tok_embeddings\" in the first part, \"layers.<i>\" for i = 0, 1, ... in "
              "order, \"norm\" and \"output\" in the last part (the planner runs the embedding "
              "on the first stage and the LM head on the last); part ",
              v, " has \"", *fqn, "\"",
              layer ? absl::StrCat(" where layers.", next_layer, " is next") : ""));
        }
        counts.push_back(layers);
      }
      const int64_t per_rank = static_cast<int64_t>(parts->size()) / pp_v;
      if (multi_stage ? per_rank < 2 : per_rank != 1) {
        return invalid(
            absl::StrCat(multi_stage ? "at least 2" : "exactly 1",
                         " model parts per rank under the ", multi_stage ? "multi" : "single",
                         "-stage schedule \"", schedule.value_or("1F1B"), "\" (",
                         multi_stage ? absl::StrCat(2 * pp_v, " parts or more")
                                     : absl::StrCat(pp_v, " parts, or a multi-stage schedule"),
                         ")"));
      }
      if (per_rank > 1) flag("vpp", per_rank);
      out.flags.push_back({"pp-layout", absl::StrJoin(counts, ",")});
      out.notes.push_back(absl::StrCat(source, "'s parallelism.", key, ": planned as ",
                                       per_rank > 1 ? absl::StrCat("--vpp ", per_rank, " ") : "",
                                       "--pp-layout ", absl::StrJoin(counts, ",")));
    } else {
      out.torchtitan_split =
          TorchtitanSplit{source, layers_per_stage, first_less.value_or(1), last_less.value_or(1)};
      out.notes.push_back(absl::StrCat(
          source,
          " lists no parallelism.module_fqns_per_model_part: planned with torchtitan's own split "
          "of the model's layers (generate_llm_fqn_per_model_part, the embedding and the output "
          "counted as ",
          first_less.value_or(1), " and ", last_less.value_or(1), " layers)"));
    }
  }

  // [training]: torchtitan's local_batch_size is per data-parallel rank; under PP it is split
  // into microbatches of pipeline_parallel_microbatch_size (train.py, build_pipeline_schedule),
  // and global_batch_size > 0 accumulates gradients over global / (local x dp) of them.
  const std::string tr = "training";
  STOWAGE_ASSIGN_OR_RETURN(seq_len, toml.Int(tr, "seq_len", 1, int64_t{1} << 40));
  STOWAGE_ASSIGN_OR_RETURN(local, toml.Int(tr, "local_batch_size", 1, kMaxDegree));
  STOWAGE_ASSIGN_OR_RETURN(global, toml.Int(tr, "global_batch_size", -1, int64_t{1} << 40));
  STOWAGE_ASSIGN_OR_RETURN(cpu_offload, toml.Bool(tr, "enable_cpu_offload"));
  STOWAGE_ASSIGN_OR_RETURN(param_dtype, toml.String(tr, "mixed_precision_param"));
  if (seq_len) flag("seq-len", *seq_len);
  const bool global_given = global.has_value() && *global > 0;
  if (pp_v > 1) {
    const int64_t micro = pp_microbatch.value_or(1);
    flag("micro-batch", micro);
    if (global_given) {
      flag("global-batch", *global);
    } else if (local.has_value()) {
      if (*local % micro != 0) {
        return toml.Invalid(tr, "local_batch_size", *toml.Find(tr, "local_batch_size"),
                            absl::StrCat("a multiple of parallelism.pipeline_parallel_microbatch_"
                                         "size (",
                                         micro, ")"));
      }
      flag("microbatches", *local / micro);
    }
  } else {
    if (local) flag("micro-batch", *local);
    if (global_given) flag("global-batch", *global);
  }
  if (cpu_offload.value_or(false)) {
    out.flags.push_back({"optimizer-offload", "true"});
    out.notes.push_back(absl::StrCat(
        source,
        " sets training.enable_cpu_offload: planned as --optimizer-offload; FSDP2's CPU "
        "offload also keeps parameters and gradients in host memory"));
  }
  if (param_dtype.has_value() && *param_dtype == "float32") {
    out.notes.push_back(absl::StrCat(source,
                                     " sets training.mixed_precision_param = \"float32\": the "
                                     "planner counts bf16 weights and activations"));
  }

  // [optimizer]: torchtitan builds Adam and AdamW (components/optimizer.py), Adam's state.
  STOWAGE_ASSIGN_OR_RETURN(optimizer, toml.String("optimizer", "name"));
  if (optimizer.has_value()) {
    if (*optimizer != "Adam" && *optimizer != "AdamW") {
      return toml.Invalid("optimizer", "name", *toml.Find("optimizer", "name"),
                          "\"Adam\", \"AdamW\" (what torchtitan builds)");
    }
    out.flags.push_back({"optimizer", "adam"});
  }

  // [model]: a preset where one has the flavor's shape.
  STOWAGE_ASSIGN_OR_RETURN(model, toml.String("model", "name"));
  STOWAGE_ASSIGN_OR_RETURN(flavor, toml.String("model", "flavor"));
  if (model.has_value() || flavor.has_value()) {
    const std::pair<std::string, std::string> key{model.value_or("llama3"),
                                                  flavor.value_or("debugmodel")};
    if (auto it = TorchtitanPresets().find(key); it != TorchtitanPresets().end()) {
      out.flags.push_back({"model", it->second});
    } else {
      out.notes.push_back(absl::StrCat(source, " sets model ", key.first, " flavor ", key.second,
                                       ", which no preset has the shape of: give --model (a "
                                       "preset or the model's config.json)"));
    }
  }

  // [activation_checkpoint]: stowage's own choice, per layer; the --force that evaluates the
  // file's setting as it is (Note [torchtitan expressiveness] in bridges/torchtitan_emit.h).
  // Absent, torchtitan's default applies: selective, every 2nd block.
  const std::string ac = "activation_checkpoint";
  STOWAGE_ASSIGN_OR_RETURN(mode, toml.String(ac, "mode"));
  STOWAGE_ASSIGN_OR_RETURN(option, toml.String(ac, "selective_ac_option"));
  const std::string mode_v = mode.value_or("selective"), option_v = option.value_or("2");
  std::string compare;
  if (mode_v == "none") {
    compare = "--force keep runs it as it is";
  } else if (mode_v == "full") {
    compare = "--force recompute runs it as it is";
  } else if (mode_v == "selective" || mode_v == "memory_budget") {
    compare = "no uniform --force is the same; --emit torchtitan prints the plan in these terms";
  } else {
    return toml.Invalid(ac, "mode", *toml.Find(ac, "mode"),
                        "\"none\", \"full\", \"selective\", \"memory_budget\"");
  }
  out.notes.push_back(absl::StrCat(
      source, mode.has_value() ? " sets" : " leaves torchtitan's default,",
      " activation_checkpoint.mode = \"", mode_v, "\"",
      mode_v == "selective" ? absl::StrCat(" (selective_ac_option = \"", option_v, "\")") : "",
      ": stowage chooses recompute and offload per layer (", compare, ")"));
  STOWAGE_ASSIGN_OR_RETURN(compile, toml.Bool("compile", "enable"));
  if (compile.value_or(false)) {
    out.notes.push_back(absl::StrCat(source,
                                     " sets compile.enable: torch.compile fuses kernels and "
                                     "changes what is saved; the planner counts eager kernels"));
  }
  const std::vector<std::string> unused = toml.Unused();
  if (!unused.empty()) {
    out.notes.push_back(absl::StrCat(
        "not used from ", source, " (the model's shape comes from --model): ", unused.size(),
        " settings, ",
        absl::StrJoin(unused.begin(), unused.begin() + std::min<size_t>(unused.size(), 8), ", "),
        unused.size() > 8 ? ", ..." : ""));
  }
  return out;
}

absl::StatusOr<StageLayers> TorchtitanStageLayers(const TorchtitanSplit& split, int num_layers,
                                                  int pp, bool multi_stage,
                                                  std::optional<int> vpp) {
  if (pp <= 1) return StageLayers{};
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(split.source, ": ", why));
  };
  const int64_t n = num_layers, in = split.first_stage_less_layers,
                out = split.last_stage_less_layers;
  const int64_t effective = n + in + out;  // the embedding and the output counted as layers
  int64_t stages = int64_t{pp} * (multi_stage ? 2 : 1);
  if (vpp.has_value()) {
    stages = int64_t{pp} * *vpp;
  } else if (split.layers_per_stage.has_value()) {
    // pipeline_llm: ceil((layers + weights) / layers_per_stage) virtual stages.
    const int64_t per = *split.layers_per_stage;
    stages = (effective + per - 1) / per;
    const std::string given =
        absl::StrCat("parallelism.pipeline_parallel_layers_per_stage = ", per, " makes ", stages,
                     " stages of the model's ", n, " layers (+ ", in, " + ", out,
                     " for the embedding and the output)");
    if (stages % pp != 0) {
      return refuse(absl::StrCat(given, ", not a multiple of the ", pp, " pipeline ranks"));
    }
    if (multi_stage ? stages / pp < 2 : stages / pp != 1) {
      return refuse(absl::StrCat(given, ": ", stages / pp, " per rank, where the ",
                                 multi_stage ? "multi" : "single", "-stage schedule runs ",
                                 multi_stage ? "at least 2" : "exactly 1"));
    }
  }
  // generate_llm_fqn_per_model_part: effective / stages each, the first `extra` stages one more;
  // the first stage gives `in` of its share to the embedding, the last `out` to the output.
  const int64_t per = effective / stages, extra = effective % stages;
  if (stages > effective || per == 0 || in > per || out > per) {
    return refuse(absl::StrCat(
        stages, " pipeline stages of the model's ", n, " layers (+ ", in, " + ", out,
        " for the embedding and the output, parallelism.pipeline_parallel_first/last_stage_less_"
        "layers): torchtitan refuses a split with an empty stage or a weight above the ",
        per, " layers per stage"));
  }
  StageLayers result;
  result.vpp = static_cast<int>(stages / pp);
  int64_t placed = 0;
  for (int64_t s = 0; s < stages; ++s) {
    int64_t share = per + (s < extra ? 1 : 0);
    if (s == 0) share -= in;
    if (s + 1 == stages) share -= out;
    const int64_t layers = std::clamp<int64_t>(share, 0, n - placed);
    placed += layers;
    result.layers.push_back(static_cast<int>(layers));
  }
  return result;
}

}  // namespace stowage::bridges
