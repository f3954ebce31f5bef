#include "bridges/trainer_arguments.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/cost/run_settings.h"

namespace stowage::planner {
namespace {

// "layers 3-7 and 12" for {3,4,5,6,7,12}.
std::string LayerList(const std::vector<int>& layers) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    runs.push_back(j == i ? absl::StrCat(layers[i]) : absl::StrCat(layers[i], "-", layers[j]));
    i = j + 1;
  }
  if (runs.size() == 1) return absl::StrCat(layers.size() == 1 ? "layer " : "layers ", runs[0]);
  const std::string last = runs.back();
  runs.pop_back();
  return absl::StrCat("layers ", absl::StrJoin(runs, ", "), " and ", last);
}

// The verb for LayerList(layers): `one` for a single layer, `many` otherwise.
const char* Verb(const std::vector<int>& layers, const char* one, const char* many) {
  return layers.size() == 1 ? one : many;
}

bool IsPrefix(const std::vector<int>& layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] != static_cast<int>(i)) return false;
  }
  return true;
}

// The planner's selective-recompute module names (planner/frameworks/megatron.cc) in Megatron's
// words
// (TransformerConfig.recompute_modules). The others have no Megatron counterpart.
const std::map<std::string, std::string>& MegatronModuleNames() {
  static const auto* names = new std::map<std::string, std::string>{
      {"attn_core", "core_attn"}, {"mla_up_proj", "mla_up_proj"}, {"moe_act", "moe_act"}};
  return *names;
}

// The decoder layers of one model chunk (Note [Pipeline stages]; the MTP depths, Note [MTP
// layers], left out): the chunk's layers within [0, decoder layers).
struct ChunkLayers {
  int stage = 0;
  int chunk = 0;
  LayerRange layers;
};

// Every chunk in virtual-stage order (v = chunk x pp + stage), which is layer order.
std::vector<ChunkLayers> DecoderChunks(const Plan& plan, int decoder_layers) {
  const std::vector<StagePlan> stages = PlanStages(plan);
  std::vector<ChunkLayers> out;
  for (int c = 0; c < plan.vpp; ++c) {
    for (const StagePlan& stage : stages) {
      if (c >= static_cast<int>(stage.chunks.size())) continue;
      const LayerRange& r = stage.chunks[c];
      const int first = std::min(r.first_layer, decoder_layers);
      const int end = std::min(r.end(), decoder_layers);
      out.push_back({stage.stage, c, {first, end - first}});
    }
  }
  return out;
}

// "stage 2's layer 19 (of its chunk 1: layers 16-23)"; without virtual stages "stage 2's layer
// 19 (of its layers 16-23)".
std::string StageLayer(const Plan& plan, const ChunkLayers& chunk, int layer) {
  std::vector<int> range;
  for (int i = chunk.layers.first_layer; i < chunk.layers.end(); ++i) range.push_back(i);
  return absl::StrCat("stage ", chunk.stage, "'s layer ", layer, " (of its ",
                      plan.vpp > 1 ? absl::StrCat("chunk ", chunk.chunk, ": ") : std::string(),
                      LayerList(range), ")");
}

// The chunk running `layer` (DecoderChunks guarantees one for a decoder layer).
const ChunkLayers& ChunkOf(const std::vector<ChunkLayers>& chunks, int layer) {
  for (const ChunkLayers& c : chunks) {
    if (layer >= c.layers.first_layer && layer < c.layers.end()) return c;
  }
  return chunks.front();
}

// What Megatron runs a layer as: the nearest of its recompute settings (offload is noted apart).
enum class MegatronRecompute { kNone, kFull, kSelective };
MegatronRecompute MegatronRecomputeOf(LayerPolicy policy) {
  switch (policy) {
    case LayerPolicy::kRecompute:
    case LayerPolicy::kOffloadInput:  // recomputed with its input kept on the GPU
      return MegatronRecompute::kFull;
    case LayerPolicy::kSelectiveRecompute:
      return MegatronRecompute::kSelective;
    case LayerPolicy::kKeep:
    case LayerPolicy::kOffloadSaved:  // kept: nothing offloads under pipeline parallelism
      return MegatronRecompute::kNone;
  }
  return MegatronRecompute::kNone;
}

std::string ModuleList(const std::vector<std::string>& modules) {
  return modules.empty() ? std::string("nothing") : absl::StrJoin(modules, ", ");
}

absl::Status MegatronCannotExpress(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--emit megatron cannot express this pipelined plan: ", where, " ", what,
      ". Megatron's recompute settings are one per job and apply alike to the model chunk of "
      "every pipeline stage (megatron/core/recompute.py checkpointed_forward): --recompute-method "
      "block --recompute-num-layers K recomputes the first K layers of each chunk, uniform every "
      "layer, --recompute-granularity selective the same --recompute-modules in every layer. Run "
      "this plan under the stowage runtime (its C ABI or Python layer carries per-layer choices; "
      "write the plan with --out)"));
}

// Note [Megatron under pipeline parallelism]: the one recompute setting every chunk of a
// pipelined plan follows (its flags added to `out`), or the refusal naming the stage and layer
// that breaks it.
absl::Status MegatronPipelineRecompute(const Plan& plan, int n,
                                       const std::vector<ChunkLayers>& chunks,
                                       std::vector<std::string>& recompute_args,
                                       std::vector<std::string>& unmapped_modules) {
  auto kind = [&](int layer) { return MegatronRecomputeOf(plan.layers[layer].policy); };
  auto modules = [&](int layer) {
    std::vector<std::string> m = plan.layers[layer].recompute_modules;
    std::sort(m.begin(), m.end());
    return m;
  };
  int first_full = -1, first_selective = -1;
  for (int i = 0; i < n; ++i) {
    if (kind(i) == MegatronRecompute::kFull && first_full < 0) first_full = i;
    if (kind(i) == MegatronRecompute::kSelective && first_selective < 0) first_selective = i;
  }
  if (first_full >= 0 && first_selective >= 0) {
    return MegatronCannotExpress(
        StageLayer(plan, ChunkOf(chunks, first_selective), first_selective),
        absl::StrCat("recomputes ", ModuleList(modules(first_selective)), " selectively while ",
                     StageLayer(plan, ChunkOf(chunks, first_full), first_full),
                     " recomputes in full, and Megatron has one --recompute-granularity"));
  }
  if (first_selective >= 0) {
    const std::vector<std::string> want = modules(first_selective);
    for (int i = 0; i < n; ++i) {
      if (kind(i) == MegatronRecompute::kSelective && modules(i) == want) continue;
      return MegatronCannotExpress(
          StageLayer(plan, ChunkOf(chunks, i), i),
          absl::StrCat(kind(i) == MegatronRecompute::kSelective
                           ? absl::StrCat("recomputes ", ModuleList(modules(i)), " selectively")
                           : std::string("is not recomputed selectively"),
                       " while ",
                       StageLayer(plan, ChunkOf(chunks, first_selective), first_selective),
                       " recomputes ", ModuleList(want), " selectively"));
    }
    std::vector<std::string> megatron_modules;
    for (const std::string& m : want) {
      auto it = MegatronModuleNames().find(m);
      (it == MegatronModuleNames().end() ? unmapped_modules : megatron_modules)
          .push_back(it == MegatronModuleNames().end() ? m : it->second);
    }
    if (!megatron_modules.empty()) {
      recompute_args = {"--recompute-granularity", "selective", "--recompute-modules"};
      recompute_args.insert(recompute_args.end(), megatron_modules.begin(), megatron_modules.end());
    }
    return absl::OkStatus();
  }
  if (first_full < 0) return absl::OkStatus();
  // Full: each chunk recomputes a prefix of its layers, the same count K in every chunk that
  // has more than K layers (Megatron's block), or every layer of every chunk (uniform).
  std::vector<int> prefix(chunks.size(), 0);
  const ChunkLayers* reference = nullptr;
  int k = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const LayerRange& r = chunks[c].layers;
    while (prefix[c] < r.num_layers &&
           kind(r.first_layer + prefix[c]) == MegatronRecompute::kFull) {
      ++prefix[c];
    }
    for (int i = r.first_layer + prefix[c]; i < r.end(); ++i) {
      if (kind(i) != MegatronRecompute::kFull) continue;
      return MegatronCannotExpress(
          StageLayer(plan, chunks[c], i),
          absl::StrCat("is recomputed after layer ", r.first_layer + prefix[c],
                       ", which is not, and Megatron's block method recomputes only the first "
                       "layers of a chunk"));
    }
    if (reference == nullptr && prefix[c] < r.num_layers) {
      reference = &chunks[c];
      k = prefix[c];
    }
  }
  if (reference == nullptr) {
    recompute_args = {"--recompute-granularity", "full", "--recompute-method", "uniform",
                      "--recompute-num-layers",  "1"};
    return absl::OkStatus();
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    const LayerRange& r = chunks[c].layers;
    const int expected = std::min(k, r.num_layers);
    if (prefix[c] == expected) continue;
    const int layer = r.first_layer + std::min(prefix[c], expected);
    return MegatronCannotExpress(
        StageLayer(plan, chunks[c], layer),
        absl::StrCat("is ", prefix[c] < expected ? "not recomputed" : "recomputed", ", while ",
                     StageLayer(plan, *reference, reference->layers.first_layer),
                     " starts a chunk ",
                     k == 0 ? std::string("the plan recomputes none of")
                            : absl::StrCat("whose first ", k, k == 1 ? " layer" : " layers",
                                           " alone the plan recomputes"),
                     ", and --recompute-method block recomputes the same first layers of every "
                     "chunk"));
  }
  recompute_args = {"--recompute-granularity", "full",         "--recompute-method", "block",
                    "--recompute-num-layers",  absl::StrCat(k)};
  return absl::OkStatus();
}

// Note [Megatron under pipeline parallelism]: --pipeline-model-parallel-layout for a split
// Megatron's even one is not: per virtual stage "E" (the first), "t" per decoder layer, "m" per
// MTP depth and "L" (the last), commas only for reading.
std::string MegatronLayout(const Plan& plan, const std::vector<ChunkLayers>& chunks) {
  std::vector<std::string> parts;
  auto times = [](const char* what, int count) {
    return count == 0   ? std::string()
           : count == 1 ? std::string(what)
                        : absl::StrCat(what, "*", count);
  };
  for (size_t v = 0; v < chunks.size(); ++v) {
    std::vector<std::string> part;
    if (v == 0) part.push_back("E");
    if (chunks[v].layers.num_layers > 0) part.push_back(times("t", chunks[v].layers.num_layers));
    if (v + 1 == chunks.size()) {
      if (plan.mtp_layers > 0) part.push_back(times("m", plan.mtp_layers));
      part.push_back("L");
    }
    parts.push_back(absl::StrJoin(part, ","));
  }
  return absl::StrJoin(parts, "|");
}

}  // namespace

absl::StatusOr<TrainerArguments> MegatronArguments(const Plan& plan, const RunSettings& run) {
  TrainerArguments out;
  auto add = [&](std::string flag, std::string value = "") {
    out.args.push_back(std::move(flag));
    if (!value.empty()) out.args.push_back(std::move(value));
  };
  add("--tensor-model-parallel-size", absl::StrCat(plan.tp));
  // The planner's TP is Megatron's with sequence parallelism (norms and dropout split too).
  if (plan.tp > 1) add("--sequence-parallel");
  add("--context-parallel-size", absl::StrCat(plan.cp));
  if (plan.ep > 1) add("--expert-model-parallel-size", absl::StrCat(plan.ep));
  add("--seq-length", absl::StrCat(plan.seq_len));
  add("--micro-batch-size", absl::StrCat(plan.micro_batch));
  // Note [MTP layers] (stowage/plan.h): the MTP depths are the plan's last layers; Megatron's
  // recompute flags count the decoder layers only.
  if (plan.mtp_layers > 0) add("--mtp-num-layers", absl::StrCat(plan.mtp_layers));

  std::vector<int> full, selective, offload_input, offload_saved;
  std::set<std::string> modules;
  const int n = static_cast<int>(plan.layers.size()) - std::max(0, plan.mtp_layers);
  // Note [Megatron under pipeline parallelism]: the stages and their split, and the microbatches.
  const bool pipelined = plan.pp > 1;
  const std::vector<ChunkLayers> chunks = DecoderChunks(plan, n);
  if (pipelined) {
    add("--pipeline-model-parallel-size", absl::StrCat(plan.pp));
    // The rank order the plan's links assume (RunSettings::rank_order): Megatron's
    // initialize.py orders 'tp-cp-ep-pp-dp' under --use-tp-pp-dp-mapping (common_config.py).
    if (run.rank_order == RankOrder::kTpCpEpPpDp) add("--use-tp-pp-dp-mapping");
    const bool even = std::all_of(chunks.begin(), chunks.end(), [&](const ChunkLayers& c) {
      return c.layers.num_layers * static_cast<int>(chunks.size()) == n;
    });
    if (!even) {
      add("--pipeline-model-parallel-layout", MegatronLayout(plan, chunks));
    } else if (plan.vpp > 1) {
      // The chunks per rank, not the layers per chunk: it needs no --num-layers to read back.
      add("--num-virtual-stages-per-pipeline-rank", absl::StrCat(plan.vpp));
    }
  }
  if (plan.microbatches > 1) {
    const int64_t model_parallel = int64_t{plan.tp} * plan.cp * plan.pp;
    if (run.gpus > 0 && run.gpus % model_parallel == 0) {
      add("--global-batch-size", absl::StrCat(int64_t{plan.micro_batch} * plan.microbatches *
                                              (run.gpus / model_parallel)));
    } else {
      out.notes.push_back(absl::StrCat(
          "the plan runs ", plan.microbatches, " microbatches per step; give --global-batch-size ",
          plan.microbatches, " x --micro-batch-size x data parallel (--gpus ", run.gpus,
          " does not divide by TP x CP x PP = ", model_parallel, ")"));
    }
  }
  std::vector<std::string> mtp_recomputed, mtp_kept;
  for (const LayerPlan& l : plan.layers) {
    if (l.index >= n) {
      (l.policy == LayerPolicy::kRecompute || l.policy == LayerPolicy::kOffloadInput
           ? mtp_recomputed
           : mtp_kept)
          .push_back(l.name);
      continue;
    }
    switch (l.policy) {
      case LayerPolicy::kKeep:
        break;
      case LayerPolicy::kRecompute:
        full.push_back(l.index);
        break;
      case LayerPolicy::kOffloadInput:
        offload_input.push_back(l.index);
        full.push_back(l.index);  // Megatron's nearest: recompute it with its input kept
        break;
      case LayerPolicy::kSelectiveRecompute:
        selective.push_back(l.index);
        modules.insert(l.recompute_modules.begin(), l.recompute_modules.end());
        break;
      case LayerPolicy::kOffloadSaved:
        offload_saved.push_back(l.index);
        break;
    }
  }
  std::sort(full.begin(), full.end());

  if (!offload_input.empty()) {
    out.notes.push_back(absl::StrCat(
        LayerList(offload_input),
        " offload their input to host memory and recompute the rest (offload_input); Megatron "
        "cannot offload a recomputed layer's input, so they are recomputed with the input kept "
        "on the GPU: its peak is higher than the plan's by those inputs"));
  }
  if (pipelined) {
    std::vector<std::string> recompute_args, unmapped;
    if (absl::Status s = MegatronPipelineRecompute(plan, n, chunks, recompute_args, unmapped);
        !s.ok()) {
      return s;
    }
    out.args.insert(out.args.end(), recompute_args.begin(), recompute_args.end());
    if (!unmapped.empty()) {
      out.notes.push_back(absl::StrCat("Megatron has no selective recompute of ",
                                       absl::StrJoin(unmapped, ", "), " (recompute_modules)"));
    }
    const bool uniform =
        std::find(recompute_args.begin(), recompute_args.end(), "uniform") != recompute_args.end();
    if (!mtp_recomputed.empty() && !uniform) {
      out.notes.push_back(absl::StrCat(
          "the plan recomputes ", absl::StrJoin(mtp_recomputed, " and "),
          "; Megatron recomputes MTP layers only under --recompute-granularity full with "
          "--recompute-method uniform (every decoder layer), so they keep their activations"));
    }
    if (!mtp_kept.empty() && uniform) {
      out.notes.push_back(absl::StrCat(
          "the plan keeps ", absl::StrJoin(mtp_kept, " and "),
          "; Megatron's uniform full recompute recomputes MTP layers too (more recompute than "
          "planned, less memory)"));
    }
    if (!offload_saved.empty()) {
      out.notes.push_back(absl::StrCat(
          LayerList(offload_saved), Verb(offload_saved, " offloads its", " offload their"),
          " saved activations (offload_saved); Megatron refuses its CPU offloading "
          "(--cpu-offloading-num-layers) with pipeline parallelism, and its fine-grained "
          "activation offloading offloads chosen modules' inputs in every layer, not chosen "
          "layers, so ",
          Verb(offload_saved, "it is not offloaded: run it", "they are not offloaded: run them"),
          " under the stowage runtime"));
    }
    return out;
  }
  if (!full.empty() && !selective.empty()) {
    out.notes.push_back(absl::StrCat(
        "the plan recomputes ", LayerList(full), " in full and ", LayerList(selective),
        " selectively; Megatron has one recompute granularity per job, so only the full "
        "recompute is emitted and the selective layers keep everything"));
  }
  if (!full.empty()) {
    add("--recompute-granularity", "full");
    if (static_cast<int>(full.size()) == n) {
      add("--recompute-method", "uniform");
      add("--recompute-num-layers", "1");
    } else {
      add("--recompute-method", "block");
      add("--recompute-num-layers", absl::StrCat(full.size()));
      if (!IsPrefix(full)) {
        std::vector<int> first(full.size());
        for (size_t i = 0; i < first.size(); ++i) first[i] = static_cast<int>(i);
        out.notes.push_back(absl::StrCat(
            "the plan recomputes ", LayerList(full), "; Megatron's block method recomputes ",
            LayerList(first), " instead, which hold different activations when the layers differ"));
      }
    }
  }
  // MultiTokenPredictionLayer._checkpointed_forward recomputes an MTP layer exactly when
  // recompute_granularity is full with the uniform method (block: "not supported for MTP yet",
  // kept); a selective recompute applies inside its transformer layer as in any other.
  const bool megatron_recomputes_mtp = !full.empty() && static_cast<int>(full.size()) == n;
  if (!mtp_recomputed.empty() && !megatron_recomputes_mtp) {
    out.notes.push_back(absl::StrCat(
        "the plan recomputes ", absl::StrJoin(mtp_recomputed, " and "),
        "; Megatron recomputes MTP layers only under --recompute-granularity full with "
        "--recompute-method uniform (every decoder layer), so they keep their activations"));
  }
  if (!mtp_kept.empty() && megatron_recomputes_mtp) {
    out.notes.push_back(absl::StrCat(
        "the plan keeps ", absl::StrJoin(mtp_kept, " and "),
        "; Megatron's uniform full recompute recomputes MTP layers too (more recompute than "
        "planned, less memory)"));
  }
  if (full.empty() && !selective.empty()) {
    std::vector<std::string> megatron_modules, unmapped;
    for (const std::string& m : modules) {
      auto it = MegatronModuleNames().find(m);
      (it == MegatronModuleNames().end() ? unmapped : megatron_modules)
          .push_back(it == MegatronModuleNames().end() ? m : it->second);
    }
    if (!megatron_modules.empty()) {
      add("--recompute-granularity", "selective");
      out.args.push_back("--recompute-modules");
      out.args.insert(out.args.end(), megatron_modules.begin(), megatron_modules.end());
    }
    if (!unmapped.empty()) {
      out.notes.push_back(absl::StrCat("Megatron has no selective recompute of ",
                                       absl::StrJoin(unmapped, ", "), " (recompute_modules)"));
    }
    if (static_cast<int>(selective.size()) < n && !megatron_modules.empty()) {
      out.notes.push_back(absl::StrCat(
          "the plan recomputes modules of ", LayerList(selective),
          " only; Megatron's selective recompute applies to every layer (more recompute than "
          "planned, less memory)"));
    }
  }
  if (!offload_saved.empty()) {
    const bool prefix = IsPrefix(offload_saved) && static_cast<int>(offload_saved.size()) < n;
    if (prefix && full.empty() && selective.empty()) {
      add("--cpu-offloading-num-layers", absl::StrCat(offload_saved.size()));
      out.notes.push_back(
          "Megatron's CPU offloading copies on its own schedule (after each layer's forward, "
          "back before its backward), not the plan's prefetch distance and save lag");
    } else {
      out.notes.push_back(absl::StrCat(
          LayerList(offload_saved), Verb(offload_saved, " offloads its", " offload their"),
          " saved activations (offload_saved); Megatron's CPU offloading takes only the first N "
          "layers (fewer than all) and is refused together with recompute, so ",
          Verb(offload_saved, "it is not offloaded: run it", "they are not offloaded: run them"),
          " under the stowage runtime"));
    }
  }
  return out;
}

// A token as a shell reads it back: quoted when it holds anything but plain characters (the
// layout's "|" and "*").
std::string ShellWord(const std::string& token) {
  const bool plain = std::all_of(token.begin(), token.end(), [](char ch) {
    return absl::ascii_isalnum(ch) || std::string_view("-_.,=/:+").find(ch) != std::string::npos;
  });
  return plain && !token.empty() ? token : absl::StrCat("'", token, "'");
}

std::string RenderMegatronArguments(const Plan& plan, const TrainerArguments& arguments) {
  std::string out = absl::StrCat("# Megatron-LM arguments for the stowage plan of ", plan.model,
                                 " (", plan.seq_len, " tokens)",
                                 arguments.exact() ? "" : ": the nearest Megatron can run", "\n");
  if (!plan.fits) {
    absl::StrAppend(&out, "# does not fit: ", plan.binding.what, " (", plan.binding.explanation,
                    "); these arguments run the closest plan, which does not fit either\n");
  }
  // One flag and its values per line.
  std::vector<std::string> lines;
  for (const std::string& token : arguments.args) {
    if (token.rfind("--", 0) == 0 || lines.empty()) {
      lines.push_back(token);
    } else {
      absl::StrAppend(&lines.back(), " ", ShellWord(token));
    }
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::StrAppend(&out, lines[i], i + 1 < lines.size() ? " \\\n" : "\n");
  }
  for (const std::string& note : arguments.notes)
    absl::StrAppend(&out, "# not expressed: ", note, "\n");
  return out;
}

absl::StatusOr<TrainerConfig> TorchtitanConfig(const Plan& plan, const RunSettings& run) {
  TrainerConfig out;
  // torchtitan's device mesh is always pp, dp_replicate, dp_shard, cp, tp outermost first
  // (ParallelDims build_mesh): PP outermost, the links --rank-order tp-cp-ep-dp-pp plans.
  if (plan.pp > 1 && run.rank_order != RankOrder::kTpCpEpDpPp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank-order is ", std::string(RankOrderName(run.rank_order)),
        "; torchtitan's device mesh puts the pipeline outermost (ParallelDims: pp, dp_replicate, "
        "dp_shard, cp, tp), which only --rank-order tp-cp-ep-dp-pp plans; plan with that order "
        "or emit megatron (--use-tp-pp-dp-mapping)"));
  }
  auto set = [&](const char* section, const char* key, std::string value) {
    out.entries.push_back({section, key, std::move(value)});
  };
  auto quoted = [](std::string_view s) { return absl::StrCat("\"", std::string(s), "\""); };

  // Data parallel: the GPUs left over by TP x CP x PP.
  const int64_t model_parallel = int64_t{plan.tp} * plan.cp * plan.pp;
  const int64_t dp =
      run.gpus > 0 && run.gpus % model_parallel == 0 ? run.gpus / model_parallel : -1;
  const std::string dp_text = absl::StrCat(dp);
  if (run.sharding == Sharding::kNoShard) {
    set("parallelism", "data_parallel_replicate_degree", dp_text);
    set("parallelism", "data_parallel_shard_degree", "1");
    if (plan.cp > 1) {
      out.notes.push_back(absl::StrCat(
          "--sharding no_shard: torchtitan applies FSDP over the CP ranks whenever CP > 1 "
          "(ParallelDims: the fsdp mesh is dp_shard x cp), so parameters, gradients and "
          "optimizer state are sharded over ",
          plan.cp, " ranks: less fixed memory than planned"));
    }
  } else {
    set("parallelism", "data_parallel_replicate_degree", "1");
    set("parallelism", "data_parallel_shard_degree", dp_text);  // -1: the rest of the GPUs
    if (run.sharding != Sharding::kOptimGradsParams) {
      out.notes.push_back(absl::StrCat(
          "--sharding ", ShardingName(run.sharding),
          ": torchtitan shards with FSDP2, which shards the parameters too (it has no "
          "optimizer-only or gradient-only sharding): less fixed memory than planned, and "
          "parameter all-gathers the plan did not count"));
    }
  }
  // The planner's TP is with sequence parallelism, as torchtitan's TP plans are; its experts
  // are not tensor-parallel (the routed tokens are split over TP instead).
  set("parallelism", "tensor_parallel_degree", absl::StrCat(plan.tp));
  set("parallelism", "context_parallel_degree", absl::StrCat(plan.cp));
  set("parallelism", "pipeline_parallel_degree", absl::StrCat(plan.pp));
  set("parallelism", "expert_parallel_degree", absl::StrCat(plan.ep));
  if (plan.ep > 1) set("parallelism", "expert_tensor_parallel_degree", "1");
  // Note [torchtitan under pipeline parallelism]: the schedule, the microbatch and every model
  // part's modules (the plan's split, whatever rule made it).
  const int n = static_cast<int>(plan.layers.size()) - std::max(0, plan.mtp_layers);
  const bool pipelined = plan.pp > 1;
  const std::vector<ChunkLayers> chunks = DecoderChunks(plan, n);
  if (pipelined) {
    set("parallelism", "pipeline_parallel_schedule",
        quoted(plan.schedule == PipelineSchedule::kInterleaved ? "Interleaved1F1B" : "1F1B"));
    set("parallelism", "pipeline_parallel_microbatch_size", absl::StrCat(plan.micro_batch));
    std::vector<std::string> parts;
    for (size_t v = 0; v < chunks.size(); ++v) {
      std::vector<std::string> names;
      if (v == 0) names.push_back(quoted("tok_embeddings"));
      for (int i = chunks[v].layers.first_layer; i < chunks[v].layers.end(); ++i) {
        names.push_back(quoted(absl::StrCat("layers.", i)));
      }
      if (v + 1 == chunks.size()) {
        names.push_back(quoted("norm"));
        names.push_back(quoted("output"));
      }
      parts.push_back(absl::StrCat("[", absl::StrJoin(names, ", "), "]"));
    }
    set("parallelism", "module_fqns_per_model_part",
        absl::StrCat("[", absl::StrJoin(parts, ", "), "]"));
  }
  set("training", "seq_len", absl::StrCat(plan.seq_len));
  // Under PP the local batch is split into the microbatches (build_pipeline_schedule); without
  // it they are gradient accumulation steps over global_batch_size (train.py).
  set("training", "local_batch_size",
      absl::StrCat(int64_t{plan.micro_batch} * (pipelined ? plan.microbatches : 1)));
  if (!pipelined && plan.microbatches > 1) {
    if (dp > 0) {
      set("training", "global_batch_size",
          absl::StrCat(int64_t{plan.micro_batch} * plan.microbatches * dp));
    } else {
      out.notes.push_back(absl::StrCat(
          "the plan accumulates ", plan.microbatches,
          " microbatches per step; set training.global_batch_size to local_batch_size x data "
          "parallel x ",
          plan.microbatches, " (--gpus ", run.gpus, " does not divide by TP x CP x PP)"));
    }
  }
  if (run.optimizer_offload) {
    set("training", "enable_cpu_offload", "true");
    out.notes.push_back(
        "--optimizer-offload: torchtitan's enable_cpu_offload (FSDP2's CPUOffloadPolicy) keeps "
        "parameters and gradients in host memory too and copies them every step");
  }
  switch (run.optimizer) {
    case OptimizerKind::kAdam:
      set("optimizer", "name", quoted("AdamW"));  // Adam's state, torchtitan's default name
      break;
    case OptimizerKind::kSgd:
    case OptimizerKind::kNone:
      out.notes.push_back(absl::StrCat("--optimizer ", OptimizerKindName(run.optimizer),
                                       ": torchtitan builds only Adam and AdamW "
                                       "(components/optimizer.py), which hold more state"));
      break;
  }

  // Note [torchtitan expressiveness]: the layers torchtitan checkpoints, and what it cannot do.
  // Its models build no multi-token-prediction module (Note [MTP layers] in stowage/plan.h).
  if (plan.mtp_layers > 0) {
    out.notes.push_back(absl::StrCat("the plan trains ", plan.mtp_layers,
                                     " MTP layer(s); torchtitan's models have no MTP module "
                                     "(plan with --mtp-layers 0 for a torchtitan run)"));
  }
  std::vector<int> recomputed, offload_input, offload_saved, selective;
  std::set<std::string> modules;
  for (const LayerPlan& l : plan.layers) {
    if (l.index >= n) continue;
    switch (l.policy) {
      case LayerPolicy::kKeep:
        break;
      case LayerPolicy::kRecompute:
        recomputed.push_back(l.index);
        break;
      case LayerPolicy::kSelectiveRecompute:
        // torchtitan cannot recompute chosen modules: the whole block, which holds less.
        recomputed.push_back(l.index);
        selective.push_back(l.index);
        modules.insert(l.recompute_modules.begin(), l.recompute_modules.end());
        break;
      case LayerPolicy::kOffloadInput:
        recomputed.push_back(l.index);  // its recompute; the input stays on the GPU
        offload_input.push_back(l.index);
        break;
      case LayerPolicy::kOffloadSaved:
        offload_saved.push_back(l.index);  // kept on the GPU: the nearest without offload
        break;
    }
  }
  std::vector<int> checkpointed;  // what the emitted config checkpoints
  if (pipelined && !recomputed.empty() && static_cast<int>(recomputed.size()) < n) {
    // Note [torchtitan under pipeline parallelism]: every N-th of each rank's own blocks.
    const std::set<int> recomputes(recomputed.begin(), recomputed.end());
    std::vector<std::vector<const ChunkLayers*>> stage_chunks(plan.pp);
    for (const ChunkLayers& c : chunks) stage_chunks[c.stage].push_back(&c);
    int every = 0, first_stage = 0;
    for (int s = 0; s < plan.pp && every == 0; ++s) {
      int block = 0;
      for (const ChunkLayers* c : stage_chunks[s]) {
        for (int i = c->layers.first_layer; i < c->layers.end() && every == 0; ++i) {
          ++block;
          if (recomputes.count(i) > 0) every = block, first_stage = s;
        }
      }
    }
    for (int s = 0; s < plan.pp; ++s) {
      int block = 0;
      for (const ChunkLayers* c : stage_chunks[s]) {
        for (int i = c->layers.first_layer; i < c->layers.end(); ++i) {
          ++block;
          const bool wanted = block % every == 0;
          if (wanted == (recomputes.count(i) > 0)) continue;
          return absl::InvalidArgumentError(absl::StrCat(
              "--emit torchtitan cannot express this pipelined plan: ", StageLayer(plan, *c, i),
              ", its rank's block ", block, ", is ", wanted ? "not recomputed" : "recomputed",
              ", where selective_ac_option \"", every, "\" (stage ", first_stage,
              " recomputes its block ", every, " first) ",
              wanted ? "checkpoints" : "does not checkpoint",
              " it. torchtitan checkpoints every block (mode \"full\"), none, or every N-th "
              "block of each pipeline rank, counted over that rank's model parts in order "
              "(distributed/activation_checkpoint.py _apply_layer_sac, a process-wide count; "
              "distributed/pipeline_parallel.py pipeline_llm applies parallelize_fn to each "
              "part). Run this plan under the stowage runtime (its C ABI or Python layer "
              "carries per-layer choices; write the plan with --out)"));
        }
      }
    }
    set("activation_checkpoint", "mode", quoted("selective"));
    set("activation_checkpoint", "selective_ac_option", quoted(absl::StrCat(every)));
  } else if (recomputed.empty()) {
    set("activation_checkpoint", "mode", quoted("none"));
  } else if (static_cast<int>(recomputed.size()) == n) {
    set("activation_checkpoint", "mode", quoted("full"));
    checkpointed = recomputed;
  } else {
    // Every N-th block (1-based) covers the recomputed layers exactly when N divides each
    // index + 1: the largest such N is their gcd.
    int every = 0;
    for (int i : recomputed) every = std::gcd(every, i + 1);
    if (every >= 2) {
      set("activation_checkpoint", "mode", quoted("selective"));
      set("activation_checkpoint", "selective_ac_option", quoted(absl::StrCat(every)));
      for (int i = every - 1; i < n; i += every) checkpointed.push_back(i);
    } else {
      set("activation_checkpoint", "mode", quoted("full"));
      for (int i = 0; i < n; ++i) checkpointed.push_back(i);
    }
    std::vector<int> extra;
    std::set_difference(checkpointed.begin(), checkpointed.end(), recomputed.begin(),
                        recomputed.end(), std::back_inserter(extra));
    if (!extra.empty()) {
      out.notes.push_back(
          absl::StrCat("the plan recomputes ", LayerList(recomputed), "; torchtitan checkpoints ",
                       every >= 2 ? absl::StrCat("the blocks whose position is a multiple of ",
                                                 every, " (selective_ac_option)")
                                  : std::string("every block (no every-N option covers them)"),
                       ", so ", LayerList(extra), Verb(extra, " is", " are"),
                       " recomputed too: slower than planned, less memory"));
    }
  }
  if (!selective.empty()) {
    out.notes.push_back(absl::StrCat(
        LayerList(selective), Verb(selective, " recomputes only ", " recompute only "),
        absl::StrJoin(std::vector<std::string>(modules.begin(), modules.end()), ", "),
        " (selective_recompute); torchtitan cannot recompute chosen modules, so they are "
        "checkpointed in full (its selective_ac_option \"op\" policy, which saves matmul and "
        "attention outputs, is the other choice, with memory the plan does not predict)"));
  }
  if (!offload_input.empty()) {
    out.notes.push_back(absl::StrCat(
        LayerList(offload_input),
        Verb(offload_input, " offloads its input to host memory and recomputes",
             " offload their input to host memory and recompute"),
        " the rest (offload_input); torchtitan has no activation offload, so ",
        Verb(offload_input, "it is", "they are"),
        " checkpointed with the input kept on the GPU: its peak is higher than the plan's by ",
        Verb(offload_input, "that input (run it", "those inputs (run them"),
        " under the stowage runtime)"));
  }
  if (!offload_saved.empty()) {
    out.notes.push_back(absl::StrCat(
        LayerList(offload_saved), Verb(offload_saved, " offloads its", " offload their"),
        " saved activations (offload_saved); torchtitan has no activation offload, so ",
        Verb(offload_saved,
             "they stay on the GPU: its peak is higher than the plan's by those "
             "bytes (run it",
             "they stay on the GPU: its peak is higher than the plan's by those bytes (run them"),
        " under the stowage runtime)"));
  }
  out.notes.push_back(absl::StrCat(
      "the plan's per-layer bytes are the ", plan.framework,
      " framework's recipe (--framework); torchtitan runs its own model code, so measure its "
      "layers (python -m stowage.profile) and plan with --profile for its exact figures"));
  return out;
}

std::string RenderTorchtitanConfig(const Plan& plan, const TrainerConfig& config) {
  std::string out = absl::StrCat(
      "# torchtitan job config (0.2.2 names) for the stowage plan of ", plan.model, " (",
      plan.seq_len, " tokens): the nearest torchtitan can run; merge into your job's .toml\n");
  if (!plan.fits) {
    absl::StrAppend(&out, "# does not fit: ", plan.binding.what, " (", plan.binding.explanation,
                    "); this config runs the closest plan, which does not fit either\n");
  }
  std::string section;
  for (const TomlEntry& e : config.entries) {
    if (e.section != section) {
      absl::StrAppend(&out, section.empty() ? "" : "\n", "[", e.section, "]\n");
      section = e.section;
    }
    absl::StrAppend(&out, e.key, " = ", e.value, "\n");
  }
  if (!config.notes.empty()) absl::StrAppend(&out, "\n");
  for (const std::string& note : config.notes) {
    absl::StrAppend(&out, "# not expressed: ", note, "\n");
  }
  return out;
}

}  // namespace stowage::planner
