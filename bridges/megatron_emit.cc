// A plan as Megatron-LM arguments (`stowage plan --emit megatron`;
// Note [Megatron expressiveness] and Note [Megatron under pipeline parallelism] in
// bridges/megatron_emit.h).
#include "bridges/megatron_emit.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bridges/emit_layers.h"

namespace stowage::bridges {

using planner::RunSettings;

namespace {

bool IsPrefix(const std::vector<int>& layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] != static_cast<int>(i)) return false;
  }
  return true;
}

// The planner's selective-recompute module names (planner/frameworks/megatron.cc) in Megatron's
// words (TransformerConfig.recompute_modules). The others have no Megatron counterpart.
const std::map<std::string, std::string>& MegatronModuleNames() {
  static const auto* names = new std::map<std::string, std::string>{
      {"attn_core", "core_attn"}, {"mla_up_proj", "mla_up_proj"}, {"moe_act", "moe_act"}};
  return *names;
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

// What runs a plan Megatron's arguments cannot express: the Python module stowage.megatron wraps
// the layers of a Megatron-Core model, each under its own policy, with Megatron's own recompute
// and CPU offloading left off.
constexpr char kStowageMegatron[] =
    "stowage.megatron.wrap(model, plan) runs each TransformerLayer under its own policy";

absl::Status MegatronCannotExpress(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "--emit megatron cannot express this pipelined plan: ", where, " ", what,
      ". Megatron's recompute settings are one per job and apply alike to the model chunk of "
      "every pipeline stage (megatron/core/recompute.py checkpointed_forward): --recompute-method "
      "block --recompute-num-layers K recomputes the first K layers of each chunk, uniform every "
      "layer, --recompute-granularity selective the same --recompute-modules in every layer. Run "
      "this plan under the stowage runtime inside Megatron-Core: ",
      kStowageMegatron, " (write the plan with --out)"));
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

// A token as a shell reads it back: quoted when it holds anything but plain characters (the
// layout's "|" and "*").
std::string ShellWord(const std::string& token) {
  const bool plain = std::all_of(token.begin(), token.end(), [](char ch) {
    return absl::ascii_isalnum(ch) || std::string_view("-_.,=/:+").find(ch) != std::string::npos;
  });
  return plain && !token.empty() ? token : absl::StrCat("'", token, "'");
}

}  // namespace

absl::StatusOr<MegatronArguments> EmitMegatronArguments(const Plan& plan, const RunSettings& run) {
  MegatronArguments out;
  auto add = [&](std::string flag, std::string value = "") {
    out.args.push_back(std::move(flag));
    if (!value.empty()) out.args.push_back(std::move(value));
  };
  add("--tensor-model-parallel-size", absl::StrCat(plan.tp));
  // Megatron's --sequence-parallel (norms and dropout split too) when the plan has it
  // (run.sequence_parallel, the planner's default); Megatron-LM's default is off.
  if (plan.tp > 1 && plan.sequence_parallel) add("--sequence-parallel");
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
          " under the stowage runtime (stowage.megatron.wrap(model, plan))"));
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
          " under the stowage runtime (stowage.megatron.wrap(model, plan))"));
    }
  }
  return out;
}

std::string RenderMegatronArguments(const Plan& plan, const MegatronArguments& arguments) {
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
  if (!arguments.exact()) {
    absl::StrAppend(&out,
                    "# the layers' policies run exactly as planned with the Python module "
                    "stowage.megatron: ",
                    kStowageMegatron,
                    " (write the plan with --out; leave out the recompute and CPU-offloading "
                    "arguments above)\n");
  }
  return out;
}

}  // namespace stowage::bridges
