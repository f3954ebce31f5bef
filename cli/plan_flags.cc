// Reading the run flags of `stowage plan` (plan_flags.h).
#include "cli/plan_flags.h"

#include <cmath>
#include <cstdint>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/bytes.h"
#include "planner/cost/reference_jobs.h"
#include "planner/frameworks/hf.h"
#include "stowage/plan.h"

namespace stowage::tools {

bool LooksLikePath(const std::string& s) {
  return s.find('/') != std::string::npos || s.ends_with(".json");
}

// --force takes a policy's own name (plan.h), as the plan file and the C ABI's "force" do; and
// --optimality-gap (Note [Optimality gap] in planner/search/optimizer.cc).
absl::Status ReadForce(const cli::FlagParser& flags, planner::OptimizerOptions& options) {
  if (auto force = flags.Get("force"); force.has_value()) {
    if (*force == "offload") {  // the old spelling: it always meant offload_input
      return absl::InvalidArgumentError(
          "--force offload is now --force offload_input (every layer input offloaded, full "
          "recompute); use offload_input, or offload_saved for saved tensors without recompute");
    }
    absl::StatusOr<LayerPolicy> policy = ParseLayerPolicy(*force);
    if (!policy.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--force is '", *force,
                                                     "'; allowed: keep, "
                                                     "recompute, selective_recompute, "
                                                     "offload_input, offload_saved"));
    }
    options.force = *policy;
  }
  // Read as text, so that a value out of range is named as given (CheckOptimalityGap's range).
  if (auto gap = flags.Get("optimality-gap"); gap.has_value()) {
    double value = 0;
    if (!absl::SimpleAtod(*gap, &value) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--optimality-gap is '", *gap, "'; allowed: a number from 0 (prove the plan optimal) to ",
          planner::OptimizerOptions::kMaxOptimalityGap));
    }
    if (absl::Status s = planner::CheckOptimalityGap(value, "--optimality-gap"); !s.ok()) return s;
    options.optimality_gap = value;
  }
  return absl::OkStatus();
}

// --pp, --vpp, --schedule, --rank-order, --microbatches or --global-batch, --pp-layout and
// Megatron's two accounting switches; planner::ValidatePipeline checks them against each other and
// the model. Without --pp-layout, a torchtitan job's own split of the model's `num_layers` applies.
absl::Status ReadPipeline(const cli::FlagParser& flags, int num_layers,
                          const std::optional<bridges::TorchtitanSplit>& torchtitan_split,
                          planner::RunSettings& r) {
  auto pp = flags.GetInt("pp", 1, 1, kPlanMaxPipelineStages);
  if (!pp.ok()) return pp.status();
  r.pp = static_cast<int>(*pp);
  auto vpp = flags.GetInt("vpp", 1, 1, kPlanMaxVirtualStages);
  if (!vpp.ok()) return vpp.status();
  r.vpp = static_cast<int>(*vpp);
  auto schedule = flags.GetString("schedule", "1f1b");
  if (!schedule.ok()) return schedule.status();
  auto parsed = ParsePipelineSchedule(*schedule);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule is '", *schedule, "'; allowed: 1f1b, interleaved"));
  }
  r.schedule = *parsed;
  auto order = flags.GetString("rank-order", std::string(RankOrderName(r.rank_order)));
  if (!order.ok()) return order.status();
  auto parsed_order = ParseRankOrder(*order);
  if (!parsed_order.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank-order is '", *order,
                     "'; allowed: tp-cp-ep-dp-pp (Megatron's default, pipeline outermost), "
                     "tp-cp-ep-pp-dp (Megatron's --use-tp-pp-dp-mapping)"));
  }
  r.rank_order = *parsed_order;
  if (flags.Has("microbatches") && flags.Has("global-batch")) {
    return absl::InvalidArgumentError(
        "--microbatches and --global-batch both set the microbatches per step; give one");
  }
  auto microbatches = flags.GetInt("microbatches", r.pp, 1, kPlanMaxMicrobatches);
  if (!microbatches.ok()) return microbatches.status();
  r.microbatches = static_cast<int>(*microbatches);
  if (flags.Has("global-batch")) {
    auto global = flags.GetInt("global-batch", 1, 1, int64_t{1} << 40);
    if (!global.ok()) return global.status();
    const int64_t model_parallel = int64_t{r.tp} * r.cp * r.pp;
    const int64_t dp = r.gpus % model_parallel == 0 ? r.gpus / model_parallel : 0;
    const int64_t per_step = dp * r.micro_batch;
    if (dp == 0 || *global % per_step != 0 || *global / per_step > kPlanMaxMicrobatches) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--global-batch is ", *global,
          "; it must be a multiple of --micro-batch x data parallel (", r.micro_batch, " x ", dp,
          " = gpus / (tp x cp x pp)), at most ", kPlanMaxMicrobatches, " microbatches"));
    }
    r.microbatches = static_cast<int>(*global / per_step);
  }
  if (torchtitan_split.has_value() && !flags.Has("pp-layout")) {
    auto stages = bridges::TorchtitanStageLayers(
        *torchtitan_split, num_layers, r.pp, r.schedule == PipelineSchedule::kInterleaved,
        flags.Has("vpp") ? std::optional<int>(r.vpp) : std::nullopt);
    if (!stages.ok()) return stages.status();
    if (!stages->layers.empty()) {
      r.vpp = stages->vpp;
      r.pp_layout = stages->layers;
    }
  }
  if (auto layout = flags.Get("pp-layout"); layout.has_value()) {
    for (absl::string_view part : absl::StrSplit(*layout, ',')) {
      int count = 0;
      if (!absl::SimpleAtoi(part, &count) || count < 0 || count > planner::kMaxLayers ||
          part.empty() || part.find_first_not_of("0123456789") != absl::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("--pp-layout is '", *layout,
                         "'; allowed: layer counts (0 or more) separated by "
                         "commas, one per stage, e.g. 3,4,4,2"));
      }
      r.pp_layout.push_back(count);
    }
  }
  r.account_for_embedding_in_pipeline_split =
      flags.GetBool("account-for-embedding-in-pipeline-split");
  r.account_for_loss_in_pipeline_split = flags.GetBool("account-for-loss-in-pipeline-split");
  return absl::OkStatus();
}

absl::StatusOr<Inputs> ReadInputs(const cli::FlagParser& flags, const TrainerInputs& trainer) {
  Inputs in;
  const std::optional<bridges::TorchtitanSplit>& torchtitan_split = trainer.torchtitan_split;
  std::vector<std::string> trainer_notes;
  auto trainer_model = TrainerModel(flags, trainer, trainer_notes);
  if (!trainer_model.ok()) return trainer_model.status();
  if (trainer_model->has_value()) {  // the model a Megatron-LM job's own arguments describe
    in.model_label = trainer.megatron_file;
    in.model = **trainer_model;
  } else {
    auto model = flags.GetString("model", planner::kDefaultModel);
    if (!model.ok()) return model.status();
    in.model_label = *model;
    auto m =
        LooksLikePath(*model) ? planner::ReadHfConfigFile(*model) : planner::ModelPreset(*model);
    if (!m.ok()) return m.status();
    in.model = *m;
  }
  if (flags.Has("vision-tokens")) {
    auto vision = flags.GetInt("vision-tokens", 0, 0, 1 << 30);
    if (!vision.ok()) return vision.status();
    if (absl::Status s = planner::SetVisionTokens(in.model, static_cast<int>(*vision)); !s.ok()) {
      return s;
    }
  }
  in.model_notes = in.model.notes;
  in.model_notes.insert(in.model_notes.end(), trainer_notes.begin(), trainer_notes.end());
  auto hardware = flags.GetString("hardware", planner::kDefaultHardware);
  if (!hardware.ok()) return hardware.status();
  in.hardware_label = *hardware;
  auto hw = LooksLikePath(*hardware) ? planner::ReadHardwareProfileFile(*hardware)
                                     : planner::HardwarePreset(*hardware);
  if (!hw.ok()) return hw.status();
  in.hardware = *hw;

  // The framework comes first: the run's defaults follow it (planner::DefaultRunSettings).
  auto framework = flags.GetString("framework", "megatron");
  if (!framework.ok()) return framework.status();
  auto parsed_framework = planner::ParseFramework(*framework);
  if (!parsed_framework.ok()) return parsed_framework.status();
  in.run = planner::DefaultRunSettings(*parsed_framework, in.model);
  planner::RunSettings& r = in.run;
  const planner::RunSettings defaults = r;
  auto seq = flags.GetCount("seq-len", defaults.seq_len);
  if (!seq.ok()) return seq.status();
  r.seq_len = *seq;
  auto get_int = [&](const char* name, int fallback, int& out) -> absl::Status {
    auto v = flags.GetInt(name, fallback, 1, 1 << 20);
    if (!v.ok()) return v.status();
    out = static_cast<int>(*v);
    return absl::OkStatus();
  };
  for (auto [name, fallback, out] :
       {std::tuple<const char*, int, int*>{"micro-batch", defaults.micro_batch, &r.micro_batch},
        {"tp", defaults.tp, &r.tp},
        {"cp", defaults.cp, &r.cp},
        {"ep", defaults.ep, &r.ep},
        {"gpus", defaults.gpus, &r.gpus}}) {
    if (absl::Status s = get_int(name, fallback, *out); !s.ok()) return s;
  }
  if (absl::Status s = ReadPipeline(flags, in.model.num_layers(), torchtitan_split, r); !s.ok()) {
    return s;
  }
  auto imbalance = flags.GetDouble("moe-imbalance", 1.0, 1.0, 1e6);
  if (!imbalance.ok()) return imbalance.status();
  r.moe_imbalance = *imbalance;
  auto sharding = flags.GetString("sharding", "optim_grads_params");
  if (!sharding.ok()) return sharding.status();
  auto parsed_sharding = planner::ParseSharding(*sharding);
  if (!parsed_sharding.ok()) return parsed_sharding.status();
  r.sharding = *parsed_sharding;
  auto grad = flags.GetString("grad-dtype", "fp32");
  if (!grad.ok()) return grad.status();
  if (*grad != "fp32" && *grad != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrCat("--grad-dtype is '", *grad, "'; allowed: fp32, bf16"));
  }
  r.grad_bytes = *grad == "fp32" ? 4 : 2;
  if (flags.Has("transformers")) {
    if (r.framework != planner::Framework::kHf) {
      return absl::InvalidArgumentError(
          "--transformers applies to --framework hf only (the release of transformers' code)");
    }
    auto transformers = flags.GetString("transformers", "5.17");
    if (!transformers.ok()) return transformers.status();
    auto minor = planner::ParseTransformersVersion(*transformers);
    if (!minor.ok()) return minor.status();
    r.transformers_minor = *minor;
  }
  if (flags.Has("mtp-layers")) {  // else the config's count (planner::TrainedMtpLayers)
    auto mtp = flags.GetInt("mtp-layers", 0, 0, kPlanMaxMtpLayers);
    if (!mtp.ok()) return mtp.status();
    r.mtp_layers = static_cast<int>(*mtp);
  }
  auto optimizer = flags.GetString("optimizer", "adam");
  if (!optimizer.ok()) return optimizer.status();
  auto parsed_optimizer = planner::ParseOptimizerKind(*optimizer);
  if (!parsed_optimizer.ok()) return parsed_optimizer.status();
  r.optimizer = *parsed_optimizer;
  r.optimizer_offload = flags.GetBool("optimizer-offload");
  // Megatron's --sequence-parallel (Note [Sequence parallelism] in planner/frameworks/megatron.cc).
  r.sequence_parallel = !flags.GetBool("no-sequence-parallel");
  auto loss_chunk = flags.GetCount("loss-chunk-tokens", defaults.loss_chunk_tokens, /*min=*/0);
  if (!loss_chunk.ok()) return loss_chunk.status();
  r.loss_chunk_tokens = *loss_chunk;

  auto gpu_mem =
      flags.GetDouble("gpu-mem", static_cast<double>(in.hardware.UsableBytes()) / kGiB, 0.001, 1e6);
  if (!gpu_mem.ok()) return gpu_mem.status();
  in.options.gpu_budget_bytes = static_cast<uint64_t>(*gpu_mem * kGiB);
  auto host_mem = flags.GetDouble(
      "host-mem", static_cast<double>(in.hardware.DefaultHostBudgetPerGpu()) / kGiB, 0, 1e9);
  if (!host_mem.ok()) return host_mem.status();
  in.options.host_budget_bytes = static_cast<uint64_t>(*host_mem * kGiB);
  if (absl::Status s = ReadForce(flags, in.options); !s.ok()) return s;
  return in;
}

}  // namespace stowage::tools
