// `stowage plan`: will this run fit, what to keep / recompute / offload per layer, how much pinned
// host memory each GPU and NUMA node needs, and what it costs in step time.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/bytes.h"
#include "bridges/megatron_emit.h"
#include "bridges/megatron_read.h"
#include "bridges/torchtitan_emit.h"
#include "bridges/torchtitan_read.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/plan_inputs.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/reference_jobs.h"
#include "planner/cost/run_settings.h"
#include "planner/frameworks/hf.h"
#include "planner/frameworks/layer_profile.h"
#include "planner/frameworks/step_cost.h"
#include "planner/hardware/hardware.h"
#include "planner/model/model.h"
#include "planner/report/pipeline_report.h"
#include "planner/report/report.h"
#include "planner/search/baseline.h"
#include "planner/search/optimizer.h"
#include "planner/search/pipeline.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"

namespace stowage::tools {
namespace {

using planner::HardwareProfile;
using planner::ModelConfig;

bool LooksLikePath(const std::string& s) {
  return s.find('/') != std::string::npos || s.ends_with(".json");
}

cli::FlagParser MakeParser() {
  cli::FlagParser p("stowage plan [flags]",
                    "Chooses, per layer, what to keep on the GPU, recompute or offload to pinned "
                    "host memory so the step fits the GPU and host budgets at the least step "
                    "time. With no flags: GLM-5.3-Flash, 1M tokens, B200, CP 8, EP 8.\n"
                    "Exit status: 0 the plan fits; 1 nothing fits (the closest plan is still "
                    "printed, written with --out and drawn with --timeline, with \"fits\": false "
                    "and what binds); 2 bad flags or input.");
  p.Add({"model", "NAME|PATH",
         absl::StrCat("model preset (", absl::StrJoin(planner::ModelPresetNames(), ", "),
                      ") or a Hugging Face config.json (families: --list-models)"),
         planner::kDefaultModel});
  p.Add({"profile", "PATH",
         "plan from a measured layer profile (as stowage.profile_layers writes) instead of "
         "--model; --gpu-mem is then required unless --hardware is given",
         ""});
  p.Add({"hardware", "NAME|PATH",
         absl::StrCat("hardware preset (", absl::StrJoin(planner::HardwarePresetNames(), ", "),
                      ") or a profile .json (as `stowage calibrate` writes)"),
         planner::kDefaultHardware});
  // The aliases are Megatron-LM's names for the same settings (megatron/training/arguments.py).
  p.Add({"seq-len", "N", "tokens per sequence (K/M suffixes: 256K, 1M)", "1M", {"seq-length"}});
  p.Add({"micro-batch", "N", "sequences per micro-batch", "1", {"micro-batch-size"}});
  p.Add({"tp",
         "N",
         "tensor parallel size (with sequence parallelism)",
         "1",
         {"tensor-model-parallel-size"}});
  p.Add(
      {"cp", "N", "context parallel size", "8 (1 with --framework hf)", {"context-parallel-size"}});
  p.Add({"ep",
         "N",
         "expert parallel size",
         "8 (1 for dense models and with --framework hf)",
         {"expert-model-parallel-size"}});
  p.Add({"gpus", "N", "GPUs in the job (data parallel = gpus / (tp x cp x pp))", "64"});
  p.Add({"pp", "N", "pipeline parallel size (stages)", "1", {"pipeline-model-parallel-size"}});
  p.Add({"vpp",
         "N",
         "model chunks per stage (virtual stages; with --schedule interleaved)",
         "1",
         {"num-virtual-stages-per-pipeline-rank"}});
  p.Add({"schedule", "1f1b|interleaved", "pipeline schedule", "1f1b"});
  p.Add({"rank-order", "tp-cp-ep-dp-pp|tp-cp-ep-pp-dp",
         "Megatron's rank order, innermost first; it places the groups on the NVLink domains: "
         "tp-cp-ep-pp-dp (Megatron's --use-tp-pp-dp-mapping) puts pipeline neighbours tp x cp "
         "ranks apart and spreads the data-parallel groups over pp times more ranks (no effect "
         "with --pp 1)",
         "tp-cp-ep-dp-pp (Megatron's default, pipeline outermost)"});
  p.Add({"microbatches", "M", "microbatches per step (gradient accumulation steps)",
         "--pp (1 without pipeline parallelism)"});
  p.Add({"global-batch",
         "N",
         "sequences per step over the whole job, instead of --microbatches: microbatches = N / "
         "(micro-batch x data parallel)",
         "",
         {"global-batch-size"}});
  p.Add({"pp-layout", "N,N,...",
         "layers of each stage (with --vpp: of each virtual stage, in order), e.g. 3,4,4,...,2; "
         "the embedding runs on the first stage, the LM head and loss on the last",
         "Megatron's even split"});
  p.Add({"account-for-embedding-in-pipeline-split", "",
         "the even split counts the embedding as a layer of the first stage (Megatron's flag)",
         ""});
  p.Add({"account-for-loss-in-pipeline-split", "",
         "the even split counts the LM head and loss as a layer of the last stage (Megatron's "
         "flag)",
         ""});
  p.Add({"moe-imbalance", "X",
         "tokens on the busiest expert-parallel rank over the average (the reference run saw 4)",
         "1"});
  p.Add({"vision-tokens", "N",
         "vision tokens each sequence's cross-attention layers attend to (Mllama); 0 plans a "
         "text-only step, which skips those layers",
         "one image at the vision config's max_num_tiles tiles"});
  p.Add({"gpu-mem", "GiB",
         "GPU memory budget per GPU: the whole device memory a step may peak at, fixed memory "
         "included",
         "the hardware's usable memory"});
  p.Add({"host-mem", "GiB", "pinned host memory budget per GPU",
         "80% of host RAM per NUMA node / GPUs per NUMA node: the rest stays for the OS, data "
         "loaders and the trainer"});
  p.Add({"sharding", "MODE",
         "data-parallel sharding: no_shard, optim (distributed optimizer), optim_grads, "
         "optim_grads_params; under --framework hf torch's DDP, DDP + ZeroRedundancyOptimizer, "
         "FSDP2 without and with resharding after forward",
         "optim_grads_params"});
  p.Add({"grad-dtype", "fp32|bf16", "main gradient precision", "fp32"});
  p.Add({"framework", "megatron|hf",
         "whose layers run: Megatron-Core/TransformerEngine, or Hugging Face transformers eager "
         "(SDPA, its default loss; gradients created during backward)",
         "megatron"});
  p.Add({"transformers", "5.N",
         "with --framework hf: the transformers release whose code the recipe follows where "
         "releases differ (5.17 applies grouped_mm experts' EP-sentinel masks on one GPU too; "
         "5.18 and later do not); 5.17 or later",
         "5.17, the release of the measured reference steps"});
  p.Add({"mtp-layers",
         "N",
         "multi-token-prediction layers trained (megatron), each a layer of the last stage after "
         "the decoder's; 0 trains none (e.g. RL post-training); not with --framework hf, where "
         "transformers drops the MTP weights",
         "the config's num_nextn_predict_layers (megatron), 0 (hf)",
         {"mtp-num-layers"}});
  p.Add({"optimizer", "adam|sgd|none",
         "optimizer state per parameter: adam (fp32 master + m + v), sgd (fp32 master + "
         "momentum), none",
         "adam"});
  p.Add({"optimizer-offload", "",
         "optimizer state in pinned host memory, stepped on the CPU (gradients D2H, weights H2D "
         "once per step)",
         ""});
  p.Add({"loss-chunk-tokens", "N", "tokens per LM-head/loss chunk (0: whole sequence at once)",
         "8192 (megatron), 0 (hf)"});
  p.Add({"force", "POLICY",
         "evaluate one uniform policy instead of optimising: keep, recompute (inputs kept), "
         "selective_recompute, offload_input (inputs offloaded, full recompute), offload_saved",
         ""});
  p.Add({"optimality-gap", "G",
         "stop the search once its plan is within this relative gap of its lower bound (step / "
         "bound - 1 <= G; 0 proves the plan optimal, at most 0.01)",
         "0.0001"});
  p.Add(
      {"max-seq-len", "",
       "find the longest sequence that fits the budgets (with --out/--format json: its plan; when "
       "none fits, the closest plan at the shortest length)",
       ""});
  p.Add({"max-step-seconds", "S",
         "with --max-seq-len: also no longer a step than this (the longest that trains in time)",
         ""});
  p.Add({"list-models", "", "list the config.json families (with aliases) and the presets", ""});
  p.Add({"from-megatron", "FILE",
         "plan the job a Megatron-LM launch script (read, never run; its arguments follow `--` "
         "at the end: --from-megatron FILE -- ARG...), argument list or YAML config starts: the "
         "model its arguments describe (unless --model), the GPUs its launcher starts, the "
         "parallel sizes, pipeline split, sequence length, batch, optimizer and sharding; flags "
         "given here win",
         ""});
  p.Add({"vocab-size", "N",
         "with --from-megatron: the tokenizer's vocabulary when the file does not say it "
         "(Megatron pads it to a multiple of --make-vocab-size-divisible-by x TP)",
         ""});
  p.Add({"from-torchtitan", "FILE",
         "take the run settings (parallel degrees, the pipeline stages, seq_len, local/global "
         "batch, optimizer, model flavor) from a torchtitan job .toml; flags given here win",
         ""});
  p.Add({"format", "table|json", "stdout format", "table"});
  p.Add({"emit", "megatron|torchtitan",
         "print the plan as the trainer's own settings instead: Megatron-LM's arguments, or "
         "torchtitan's job .toml sections; what it cannot express is listed after them (a "
         "pipelined plan whose stages need different settings is refused, naming where)",
         ""});
  p.Add({"out", "PATH",
         "also write the plan JSON to PATH (when nothing fits: the closest plan, \"fits\": false "
         "with the binding budget, by how much and where; the exit status is still 1)",
         ""});
  p.Add({"timeline", "PATH",
         "write an SVG of device memory and copies over the step (a plan that does not fit is "
         "drawn with its budget line marked exceeded)",
         ""});
  p.Add({"trace", "PATH",
         "write the predicted step as Chrome trace-event JSON (Perfetto, chrome://tracing)", ""});
  return p;
}

struct Inputs {
  ModelConfig model;
  HardwareProfile hardware;
  planner::RunSettings run;
  planner::OptimizerOptions options;
  std::string model_label, hardware_label;
  std::vector<std::string> model_notes;  // what the config reader wants the user to know
};

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
  if (trainer_model->has_value()) {
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

// --profile: the step cost comes from a measured layer profile; only the budgets, --force and
// (optionally) --hardware apply. Run-setting flags belong to a model config and are refused.
absl::StatusOr<planner::StepCost> ReadProfileInputs(const cli::FlagParser& flags, Inputs& in) {
  for (const char* flag : {"model",
                           "vision-tokens",
                           "seq-len",
                           "micro-batch",
                           "tp",
                           "cp",
                           "ep",
                           "gpus",
                           "moe-imbalance",
                           "sharding",
                           "grad-dtype",
                           "loss-chunk-tokens",
                           "max-seq-len",
                           "framework",
                           "transformers",
                           "mtp-layers",
                           "optimizer",
                           "optimizer-offload",
                           "pp",
                           "vpp",
                           "schedule",
                           "rank-order",
                           "microbatches",
                           "global-batch",
                           "pp-layout",
                           "account-for-embedding-in-pipeline-split",
                           "account-for-loss-in-pipeline-split"}) {
    if (flags.Has(flag)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " describes a model config; with --profile the layers are measured"));
    }
  }
  const std::string path = *flags.Get("profile");
  auto profile = planner::ReadProfileFile(path);
  if (!profile.ok()) return profile.status();
  in.model_label = path;
  in.hardware = planner::HardwareForProfile(*profile);
  in.hardware_label = in.hardware.name;
  uint64_t gpu_default = 0;
  if (flags.Has("hardware")) {
    const std::string hardware = *flags.Get("hardware");
    auto hw = LooksLikePath(hardware) ? planner::ReadHardwareProfileFile(hardware)
                                      : planner::HardwarePreset(hardware);
    if (!hw.ok()) return hw.status();
    in.hardware = *hw;
    in.hardware_label = hardware;
    gpu_default = hw->UsableBytes();
  }
  auto step = planner::BuildStepCostFromProfile(*profile, in.hardware);
  if (!step.ok()) return step.status();
  if (!flags.Has("gpu-mem") && gpu_default == 0) {
    return absl::InvalidArgumentError(
        "--gpu-mem is required with --profile (or give --hardware for its usable memory)");
  }
  auto gpu_mem = flags.GetDouble("gpu-mem", static_cast<double>(gpu_default) / kGiB, 0.001, 1e6);
  if (!gpu_mem.ok()) return gpu_mem.status();
  in.options.gpu_budget_bytes = static_cast<uint64_t>(*gpu_mem * kGiB);
  // Without --host-mem (and without --hardware) every saved byte may go to the host.
  const uint64_t host_default =
      planner::DefaultProfileHostBudget(*step, flags.Has("hardware") ? &in.hardware : nullptr);
  auto host_mem = flags.GetDouble("host-mem", static_cast<double>(host_default) / kGiB, 0, 1e9);
  if (!host_mem.ok()) return host_mem.status();
  in.options.host_budget_bytes =
      flags.Has("host-mem") ? static_cast<uint64_t>(*host_mem * kGiB) : host_default;
  if (absl::Status s = ReadForce(flags, in.options); !s.ok()) return s;
  in.run = step->run;
  return step;
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::fprintf(stderr, "stowage plan: cannot write '%s'\n", path.c_str());
    return false;
  }
  return true;
}

// --emit's text, or why the trainer cannot express the plan
// (Note [Megatron under pipeline parallelism] in bridges/megatron_emit.h,
// Note [torchtitan under pipeline parallelism] in bridges/torchtitan_emit.h).
absl::StatusOr<std::string> EmitText(const std::string& emit, const Plan& plan,
                                     const planner::RunSettings& run) {
  if (emit == "megatron") {
    absl::StatusOr<bridges::MegatronArguments> arguments =
        bridges::EmitMegatronArguments(plan, run);
    if (!arguments.ok()) return arguments.status();
    return bridges::RenderMegatronArguments(plan, *arguments);
  }
  absl::StatusOr<bridges::TorchtitanJobToml> job = bridges::EmitTorchtitanJob(plan, run);
  if (!job.ok()) return job.status();
  return bridges::RenderTorchtitanJob(plan, *job);
}

// With pipeline parallelism (or several microbatches): every stage planned
// (planner/search/pipeline.h), each stage's layers, the per-stage table naming the binding stage,
// the binding stage's summary; with --emit, the trainer's settings instead, or why it cannot
// express the plan.
int RunPipelinePlan(const cli::FlagParser& flags, const Inputs& in, const std::string& format) {
  const std::optional<std::string> emit = flags.Get("emit");
  if (in.options.force.has_value()) {
    std::fprintf(stderr,
                 "stowage plan: --force evaluates one stage; with --pp or --microbatches "
                 "the planner chooses every stage's options\n");
    return kExitUsage;
  }
  auto pipeline = planner::PlanPipeline(in.model, in.hardware, in.run, in.options);
  if (!pipeline.ok()) {
    std::fprintf(stderr, "stowage plan: %s\n", std::string(pipeline.status().message()).c_str());
    return kExitUsage;
  }
  std::FILE* text = format == "json" || emit.has_value() ? stderr : stdout;
  const planner::StageResult& binding = pipeline->stages[pipeline->binding_stage];
  if (!pipeline->feasible) {
    std::fprintf(text,
                 "does not fit: %s on %s at %llu tokens: stage %d needs at least %s per GPU "
                 "against a budget of %s\nbinding: %s\n%s\n",
                 in.model_label.c_str(), in.hardware_label.c_str(),
                 static_cast<unsigned long long>(in.run.seq_len), binding.stage,
                 FormatBytes(binding.result.min_peak_bytes).c_str(),
                 FormatBytes(in.options.gpu_budget_bytes).c_str(), binding.result.binding.c_str(),
                 binding.result.explanation.c_str());
    // Note [Plans that do not fit]: the closest plan is still the answer, unless a stage has none.
    for (const planner::StageResult& stage : pipeline->stages) {
      if (stage.result.schedule.options.size() != stage.step.layers.size()) return kExitUnmet;
    }
    if (text == stdout) std::fputs("\nthe closest plan (it does not fit):\n", text);
  }
  planner::PlanLabels labels{absl::StrCat("stowage ", stowage_version()), in.model_label,
                             in.hardware_label, in.options.gpu_budget_bytes,
                             in.options.host_budget_bytes};
  const Plan plan = planner::MakePipelinePlan(*pipeline, labels);
  const std::string json = PlanToJson(plan);
  if (emit.has_value()) {
    absl::StatusOr<std::string> emitted = EmitText(*emit, plan, in.run);
    if (!emitted.ok()) {
      std::fprintf(stderr, "stowage plan: %s\n", std::string(emitted.status().message()).c_str());
      // The plan itself is still written where asked: the stowage runtime runs it.
      if (auto out = flags.Get("out"); out.has_value() && !WriteFile(*out, json)) {
        return kExitUnmet;
      }
      return kExitUsage;
    }
    std::fputs(emitted->c_str(), stdout);
  } else if (format == "json") {
    std::fputs(json.c_str(), stdout);
  } else {
    std::printf("stowage plan: %s on %s (%s figures), %llu tokens, PP %d, %d microbatches\n",
                in.model_label.c_str(), in.hardware_label.c_str(), in.hardware.source.c_str(),
                static_cast<unsigned long long>(in.run.seq_len), in.run.pp, in.run.microbatches);
    for (const planner::StageResult& stage : pipeline->stages) {
      const Plan part = planner::MakePlan(stage.step, stage.result, stage.baseline, labels);
      std::printf("\nstage %d\n", stage.stage);
      std::fputs(planner::RenderTable(stage.step, part, stage.result).c_str(), stdout);
    }
    std::fputs("\n", stdout);
    std::fputs(planner::RenderStageTable(*pipeline, plan).c_str(), stdout);
    std::printf("\nstage %d (binding):\n", binding.stage);
    std::fputs(planner::RenderSummary(binding.step, plan, binding.result).c_str(), stdout);
  }
  if (auto out = flags.Get("out"); out.has_value() && !WriteFile(*out, json)) return kExitUnmet;
  if (auto svg = flags.Get("timeline"); svg.has_value()) {
    const Plan part = planner::MakePlan(binding.step, binding.result, binding.baseline, labels);
    if (!WriteFile(*svg, planner::RenderTimelineSvg(binding.step, part, binding.result))) {
      return kExitUnmet;
    }
  }
  if (auto trace = flags.Get("trace"); trace.has_value()) {
    const Plan part = planner::MakePlan(binding.step, binding.result, binding.baseline, labels);
    if (!WriteFile(*trace, planner::RenderStepTraceJson(part, binding.result))) return kExitUnmet;
  }
  return pipeline->feasible ? kExitOk : kExitUnmet;
}

}  // namespace

int RunPlanCommand(int argc, char** argv) {
  cli::FlagParser flags = MakeParser();
  // After `--`: the positional parameters of the --from-megatron launch script.
  std::vector<std::string> script_args;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--") continue;
    for (int j = i + 1; j < argc; ++j) {
      if (argv[j] != nullptr) script_args.emplace_back(argv[j]);
    }
    argc = i;
    break;
  }
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::fprintf(stderr, "stowage plan: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "stowage plan: unexpected argument '%s'\n", flags.positional()[0].c_str());
    return kExitUsage;
  }
  // Run settings from the trainer's own config: flags given on the command line win.
  absl::StatusOr<TrainerInputs> trainer = ReadTrainerInputs(flags, script_args);
  if (!trainer.ok()) {
    std::fprintf(stderr, "stowage plan: %s\n", std::string(trainer.status().message()).c_str());
    return kExitUsage;
  }
  if (flags.GetBool("list-models")) {
    std::fputs(planner::ListModelsText().c_str(), stdout);
    return kExitOk;
  }
  auto format = flags.GetString("format", "table");
  const std::optional<std::string> emit = flags.Get("emit");
  if (emit.has_value() && *emit != "megatron" && *emit != "torchtitan") {
    std::fprintf(stderr, "stowage plan: --emit is '%s'; allowed: megatron, torchtitan\n",
                 emit->c_str());
    return kExitUsage;
  }
  if (!format.ok() || (*format != "table" && *format != "json")) {
    std::fprintf(stderr, "stowage plan: --format is '%s'; allowed: table, json\n",
                 format.ok() ? format->c_str() : "");
    return kExitUsage;
  }
  Inputs in;
  std::optional<planner::StepCost> profile_step;
  if (flags.Has("profile")) {
    auto step = ReadProfileInputs(flags, in);
    if (!step.ok()) {
      std::fprintf(stderr, "stowage plan: %s\n", std::string(step.status().message()).c_str());
      return kExitUsage;
    }
    profile_step = *std::move(step);
  } else {
    if (absl::Status s = CheckTrainerJob(flags, *trainer); !s.ok()) {
      std::fprintf(stderr, "stowage plan: %s\n", std::string(s.message()).c_str());
      return kExitUsage;
    }
    auto inputs = ReadInputs(flags, *trainer);
    if (!inputs.ok()) {
      std::fprintf(stderr, "stowage plan: %s\n", std::string(inputs.status().message()).c_str());
      return kExitUsage;
    }
    in = *std::move(inputs);
  }
  for (const std::string& line : trainer->job) {  // the job as the launch script starts it
    std::fprintf(*format == "json" ? stderr : stdout, "job: %s\n", line.c_str());
  }
  // With --format json stdout carries only the plan.
  for (const std::string& note : in.model_notes) {
    std::fprintf(*format == "json" ? stderr : stdout, "note: %s: %s\n", in.model_label.c_str(),
                 note.c_str());
  }

  if (flags.GetBool("max-seq-len")) {
    const uint64_t granularity = 1024ull * static_cast<uint64_t>(in.run.cp);
    auto max_step = flags.GetDouble("max-step-seconds", 0, 0, 1e9);
    if (!max_step.ok()) {
      std::fprintf(stderr, "stowage plan: %s\n", std::string(max_step.status().message()).c_str());
      return kExitUsage;
    }
    auto longest = planner::LongestFittingSeqLen(in.model, in.hardware, in.run, in.options,
                                                 granularity, 1ull << 30, *max_step);
    if (!longest.ok()) {
      std::fprintf(stderr, "stowage plan: %s\n", std::string(longest.status().message()).c_str());
      return kExitUsage;
    }
    FILE* say = *format == "json" ? stderr : stdout;  // with --format json stdout is the plan
    // The job shape the answer is for: every default that went into it, named.
    std::fprintf(say,
                 "job: %s on %s, %d GPUs, TP %d, CP %d, EP %d, micro-batch %d; budgets: GPU %s, "
                 "host %s per GPU%s\n",
                 in.model_label.c_str(), in.hardware_label.c_str(), in.run.gpus, in.run.tp,
                 in.run.cp, in.run.ep, in.run.micro_batch,
                 FormatBytes(in.options.gpu_budget_bytes).c_str(),
                 FormatBytes(in.options.host_budget_bytes).c_str(),
                 *max_step > 0 ? absl::StrFormat(", step at most %g s", *max_step).c_str() : "");
    // What stops the next length: the budget that binds there, or the step-time limit.
    auto at = [&](uint64_t seq_len) -> absl::StatusOr<planner::OptimizeResult> {
      planner::RunSettings run = in.run;
      run.seq_len = seq_len;
      auto step = planner::BuildStepCost(in.model, in.hardware, run);
      if (!step.ok()) return step.status();
      return planner::Optimize(*step, in.options);
    };
    auto next = at(*longest + granularity);
    std::string binding = "the search limit";
    if (next.ok()) {
      binding = next->feasible ? "the step time limit (--max-step-seconds)"
                               : absl::StrCat(next->binding, " (", next->explanation, ")");
    }
    const bool wants_plan =
        flags.Has("out") || flags.Has("timeline") || flags.Has("trace") || *format == "json";
    if (*longest == 0) {
      std::fprintf(say, "no sequence length fits: even %llu tokens exceeds; binding: %s\n",
                   static_cast<unsigned long long>(granularity), binding.c_str());
      if (!wants_plan) return kExitUnmet;
      // Note [Plans that do not fit]: where a plan was asked for, the closest one at the
      // shortest length searched is written (exit status 1 all the same).
      in.run.seq_len = granularity;
    } else {
      auto found = at(*longest);
      if (!found.ok()) {
        std::fprintf(stderr, "stowage plan: %s\n", std::string(found.status().message()).c_str());
        return kExitUsage;
      }
      std::fprintf(say,
                   "longest sequence that fits: %llu tokens (%.0fK): step %s, peak %s, %s pinned "
                   "per GPU\nat %llu tokens it binds: %s\n",
                   static_cast<unsigned long long>(*longest), static_cast<double>(*longest) / 1024,
                   planner::FormatSeconds(found->sim.step_seconds).c_str(),
                   FormatBytes(found->sim.peak_bytes).c_str(),
                   FormatBytes(found->sim.host_bytes).c_str(),
                   static_cast<unsigned long long>(*longest + granularity), binding.c_str());
      if (!wants_plan) return kExitOk;
      in.run.seq_len = *longest;
    }
  }

  if (!profile_step.has_value() && (in.run.pp > 1 || in.run.microbatches > 1)) {
    return RunPipelinePlan(flags, in, *format);
  }
  auto step = profile_step.has_value() ? absl::StatusOr<planner::StepCost>(*profile_step)
                                       : planner::BuildStepCost(in.model, in.hardware, in.run);
  if (!step.ok()) {
    std::fprintf(stderr, "stowage plan: %s\n", std::string(step.status().message()).c_str());
    return kExitUsage;
  }
  planner::OptimizeResult result = planner::Optimize(*step, in.options);
  bool fits = result.feasible;
  if (!fits && in.options.force.has_value()) {
    // Show the forced policy anyway, with its own peak: users compare it with what they run.
    planner::OptimizerOptions unlimited = in.options;
    unlimited.gpu_budget_bytes = ~0ull;
    unlimited.host_budget_bytes = ~0ull;
    result = planner::Optimize(*step, unlimited);
  }
  if (!result.feasible) {
    std::FILE* say = *format == "json" || emit.has_value() ? stderr : stdout;
    std::fprintf(
        say,
        "does not fit: %s on %s at %llu tokens needs at least %s per GPU against a budget of %s\n"
        "binding: %s\n%s\n",
        in.model_label.c_str(), in.hardware_label.c_str(),
        static_cast<unsigned long long>(in.run.seq_len), FormatBytes(result.min_peak_bytes).c_str(),
        FormatBytes(in.options.gpu_budget_bytes).c_str(), result.binding.c_str(),
        result.explanation.c_str());
    // Note [Plans that do not fit]: the closest plan (MinimumPeak's) is still the answer; only
    // a step outside the input limits has none.
    if (result.schedule.options.size() != step->layers.size()) return kExitUnmet;
    if (say == stdout) std::fputs("\nthe closest plan (it does not fit):\n", stdout);
  }
  const planner::Baseline baseline = planner::ComputeBaseline(*step, in.options.gpu_budget_bytes);
  planner::PlanLabels labels{absl::StrCat("stowage ", stowage_version()), in.model_label,
                             in.hardware_label, in.options.gpu_budget_bytes,
                             in.options.host_budget_bytes};
  Plan plan = planner::MakePlan(*step, result, baseline, labels);
  const std::string json = PlanToJson(plan);
  if (emit.has_value()) {
    absl::StatusOr<std::string> emitted = EmitText(*emit, plan, step->run);
    if (!emitted.ok()) {  // only a pipelined plan is refused
      std::fprintf(stderr, "stowage plan: %s\n", std::string(emitted.status().message()).c_str());
      return kExitUsage;
    }
    std::fputs(emitted->c_str(), stdout);
  } else if (*format == "json") {
    std::fputs(json.c_str(), stdout);
  } else {
    std::printf(
        "stowage plan: %s on %s (%s figures), %llu tokens%s\n\n", in.model_label.c_str(),
        in.hardware_label.c_str(), in.hardware.source.c_str(),
        static_cast<unsigned long long>(in.run.seq_len),
        in.options.force.has_value()
            ? absl::StrCat(", forced policy ", std::string(LayerPolicyName(*in.options.force)))
                  .c_str()
            : "");
    std::fputs(planner::RenderTable(*step, plan, result).c_str(), stdout);
    std::fputs("\n", stdout);
    std::fputs(planner::RenderSummary(*step, plan, result).c_str(), stdout);
  }
  if (auto out = flags.Get("out"); out.has_value() && !WriteFile(*out, json)) return kExitUnmet;
  if (auto svg = flags.Get("timeline"); svg.has_value()) {
    if (!WriteFile(*svg, planner::RenderTimelineSvg(*step, plan, result))) return kExitUnmet;
  }
  if (auto trace = flags.Get("trace"); trace.has_value()) {
    if (!WriteFile(*trace, planner::RenderStepTraceJson(plan, result))) return kExitUnmet;
  }
  return fits ? kExitOk : kExitUnmet;
}

}  // namespace stowage::tools
