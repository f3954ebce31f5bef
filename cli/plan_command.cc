// `stowage plan`: will this run fit, what to keep / recompute / offload per layer, how much pinned
// host memory each GPU and NUMA node needs, and what it costs in step time.
#include <algorithm>
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
#include "cli/plan_flags.h"
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
         "--model; --gpu-mem is then required unless --hardware is given; a profile measured on "
         "every stage of a pipeline (its `pipeline` section) is planned stage by stage",
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
         "tensor parallel size (with sequence parallelism unless --no-sequence-parallel)",
         "1",
         {"tensor-model-parallel-size"}});
  p.Add({"no-sequence-parallel", "",
         "TP without Megatron's --sequence-parallel (Megatron-LM's default): every TP rank holds "
         "the layer input, norms and residual for the whole sequence, the TP collectives are "
         "all-reduces and the pipeline's messages whole; refused for a MoE model with --tp > 1, "
         "which Megatron-Core trains only with sequence parallelism (no effect with --tp 1)",
         "off: sequence parallelism"});
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
  p.Add({"microbatches", "M",
         "microbatches per step (gradient accumulation steps); with --profile too: a pipelined "
         "profile's stages each hold the microbatches their schedule keeps in flight (the "
         "interleaved schedule needs a multiple of the profile's pp), a one-stage profile "
         "accumulates M",
         "--pp (1 without pipeline parallelism; with --profile the profile's pipeline.pp)"});
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

// What --profile plans from: the profile, and its stages' step costs under the run (one stage
// without a `pipeline` section).
struct ProfileInputs {
  planner::LayerProfileSet profile;
  std::vector<planner::StepCost> stages;
};

// --profile: the step costs come from a measured layer profile; only the budgets, --force,
// --microbatches and (optionally) --hardware apply. Run-setting flags belong to a model config and
// are refused; the pipeline is the profile's own (Note [Pipelined profiles] in
// planner/frameworks/layer_profile.cc).
absl::StatusOr<ProfileInputs> ReadProfileInputs(const cli::FlagParser& flags, Inputs& in) {
  for (const char* flag : {"pp", "vpp", "schedule"}) {
    if (flags.Has(flag)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag,
          " is refused with --profile: a profile's stages are where it was measured (its "
          "`pipeline` section decides pp, vpp and the schedule); for a pipelined plan, measure "
          "the profile on the pipelined model, e.g. stowage.megatron.profile(model_chunks, "
          "batch) on every rank"));
    }
  }
  for (const char* flag : {"model",
                           "vision-tokens",
                           "seq-len",
                           "micro-batch",
                           "tp",
                           "no-sequence-parallel",
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
                           "rank-order",
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
  ProfileInputs out;
  out.profile = *std::move(profile);
  in.model_label = path;
  in.hardware = planner::HardwareForProfile(out.profile);
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
  const int pp = out.profile.pipeline.has_value() ? out.profile.pipeline->pp : 1;
  auto microbatches = flags.GetInt("microbatches", pp, 1, kPlanMaxMicrobatches);
  if (!microbatches.ok()) return microbatches.status();
  auto run = planner::ProfileRunSettings(out.profile.pipeline, static_cast<int>(*microbatches),
                                         "--microbatches");
  if (!run.ok()) return run.status();
  auto stages = planner::BuildStageStepCostsFromProfile(out.profile, in.hardware, *run);
  if (!stages.ok()) return stages.status();
  out.stages = *std::move(stages);
  if (!flags.Has("gpu-mem") && gpu_default == 0) {
    return absl::InvalidArgumentError(
        "--gpu-mem is required with --profile (or give --hardware for its usable memory)");
  }
  auto gpu_mem = flags.GetDouble("gpu-mem", static_cast<double>(gpu_default) / kGiB, 0.001, 1e6);
  if (!gpu_mem.ok()) return gpu_mem.status();
  in.options.gpu_budget_bytes = static_cast<uint64_t>(*gpu_mem * kGiB);
  // Without --host-mem (and without --hardware) every saved byte of any stage may go to the host.
  uint64_t host_default = 0;
  for (const planner::StepCost& stage : out.stages) {
    host_default = std::max(
        host_default,
        planner::DefaultProfileHostBudget(stage, flags.Has("hardware") ? &in.hardware : nullptr));
  }
  auto host_mem = flags.GetDouble("host-mem", static_cast<double>(host_default) / kGiB, 0, 1e9);
  if (!host_mem.ok()) return host_mem.status();
  in.options.host_budget_bytes =
      flags.Has("host-mem") ? static_cast<uint64_t>(*host_mem * kGiB) : host_default;
  if (absl::Status s = ReadForce(flags, in.options); !s.ok()) return s;
  in.run = out.stages.front().run;
  return out;
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

// The --force path: Optimize under the budgets; a forced policy that does not fit them is
// evaluated again without budgets, so that its own peak is shown (users compare it with what
// they run). `fits` says whether the budgets hold.
planner::OptimizeResult OptimizeStep(const planner::StepCost& step,
                                     const planner::OptimizerOptions& options, bool& fits) {
  planner::OptimizeResult result = planner::Optimize(step, options);
  fits = result.feasible;
  if (!fits && options.force.has_value()) {
    planner::OptimizerOptions unlimited = options;
    unlimited.gpu_budget_bytes = ~0ull;
    unlimited.host_budget_bytes = ~0ull;
    result = planner::Optimize(step, unlimited);
  }
  return result;
}

// Note [The script's own setting]
// A Megatron-LM job that recomputes today (TrainerInputs::script_force) is evaluated as `--force
// POLICY` evaluates it, through the same path (OptimizeStep; every stage forced for a pipeline),
// and printed beside the plan: its step and peak against the GPU budget, and the plan's, so a
// user sees what the plan changes. Empty when the script recomputes nothing.
std::string ScriptSettingLine(const Inputs& in, const TrainerInputs& trainer,
                              const planner::StepCost* step, double plan_seconds,
                              uint64_t plan_peak) {
  if (trainer.script_force.empty()) return "";
  absl::StatusOr<LayerPolicy> policy = ParseLayerPolicy(trainer.script_force);
  if (!policy.ok()) return "";
  planner::OptimizerOptions forced = in.options;
  forced.force = *policy;
  bool fits = false;
  double seconds = 0;
  uint64_t peak = 0;
  if (step != nullptr) {
    const planner::OptimizeResult result = OptimizeStep(*step, forced, fits);
    seconds = result.sim.step_seconds;
    peak = result.sim.peak_bytes;
  } else {
    auto pipeline = planner::PlanPipeline(in.model, in.hardware, in.run, forced);
    fits = pipeline.ok() && pipeline->feasible;
    if (pipeline.ok() && !fits) {  // its own peak: every stage forced, without budgets
      forced.gpu_budget_bytes = ~0ull;
      forced.host_budget_bytes = ~0ull;
      pipeline = planner::PlanPipeline(in.model, in.hardware, in.run, forced);
    }
    if (!pipeline.ok()) {
      return absl::StrCat("the script's own setting (", trainer.script_policy,
                          ") could not be evaluated: ", pipeline.status().message());
    }
    seconds = pipeline->step_seconds;
    peak = pipeline->stages[pipeline->binding_stage].result.sim.peak_bytes;
  }
  return absl::StrCat("the script's own setting (", trainer.script_policy, ") as --force ",
                      trainer.script_force, ": step ", planner::FormatSeconds(seconds), ", peak ",
                      FormatBytes(peak), " of ", FormatBytes(in.options.gpu_budget_bytes), " (",
                      fits ? "fits" : "does not fit", "); the plan: step ",
                      planner::FormatSeconds(plan_seconds), ", peak ", FormatBytes(plan_peak));
}

// With pipeline parallelism (or several microbatches): every stage planned
// (planner/search/pipeline.h), each stage's layers, the per-stage table naming the binding stage,
// the binding stage's summary; with --emit, the trainer's settings instead, or why it cannot
// express the plan.
int RunPipelinePlan(const cli::FlagParser& flags, const Inputs& in, const TrainerInputs& trainer,
                    const std::string& format, const ProfileInputs* profile) {
  const std::optional<std::string> emit = flags.Get("emit");
  if (in.options.force.has_value()) {
    std::fprintf(stderr,
                 "stowage plan: --force evaluates one stage; with --pp or --microbatches "
                 "the planner chooses every stage's options\n");
    return kExitUsage;
  }
  // A measured profile's stages (Note [Pipelined profiles]), or the model's.
  auto pipeline =
      profile != nullptr
          ? planner::PlanStages(profile->stages, in.hardware, in.run,
                                planner::ProfileMessageBytes(profile->profile), in.options)
          : planner::PlanPipeline(in.model, in.hardware, in.run, in.options);
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
  if (const std::string line = profile != nullptr
                                   ? std::string()
                                   : ScriptSettingLine(in, trainer, nullptr, pipeline->step_seconds,
                                                       binding.result.sim.peak_bytes);
      !line.empty()) {
    std::fprintf(text, "job: %s\n", line.c_str());
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
  std::optional<ProfileInputs> profile;
  if (flags.Has("profile")) {
    auto read = ReadProfileInputs(flags, in);
    if (!read.ok()) {
      std::fprintf(stderr, "stowage plan: %s\n", std::string(read.status().message()).c_str());
      return kExitUsage;
    }
    profile = *std::move(read);
    // A pipelined profile, or gradient accumulation over one stage: the pipeline path.
    if (in.run.pp > 1 || in.run.microbatches > 1) {
      return RunPipelinePlan(flags, in, *trainer, *format, &*profile);
    }
    profile_step = profile->stages.front();
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
    return RunPipelinePlan(flags, in, *trainer, *format, nullptr);
  }
  auto step = profile_step.has_value() ? absl::StatusOr<planner::StepCost>(*profile_step)
                                       : planner::BuildStepCost(in.model, in.hardware, in.run);
  if (!step.ok()) {
    std::fprintf(stderr, "stowage plan: %s\n", std::string(step.status().message()).c_str());
    return kExitUsage;
  }
  bool fits = false;
  planner::OptimizeResult result = OptimizeStep(*step, in.options, fits);
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
  if (const std::string line =
          ScriptSettingLine(in, *trainer, &*step, result.sim.step_seconds, result.sim.peak_bytes);
      !line.empty()) {
    std::fprintf(*format == "json" || emit.has_value() ? stderr : stdout, "job: %s\n",
                 line.c_str());
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
