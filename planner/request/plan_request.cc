#include "planner/request/plan_request.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "base/json_reader.h"
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
#include "planner/search/simulator.h"
#include "stowage/plan.h"

namespace stowage::planner {
namespace {

constexpr char kSource[] = "plan request";
// The fields of an evaluation request (stowage_plan_evaluate); a plan request
// (stowage_plan_request) has all but the last, the layers' assignment. Any other key is refused.
constexpr std::string_view kRequestKeys[] = {"model",
                                             "profile",
                                             "microbatches",
                                             "hardware",
                                             "run",
                                             "gpu_budget_bytes",
                                             "host_budget_bytes",
                                             "force",
                                             "optimality_gap",
                                             "prefetch_distance",
                                             "model_label",
                                             "layers"};
constexpr absl::Span<const std::string_view> kEvaluateRequestKeys(kRequestKeys);
constexpr absl::Span<const std::string_view> kPlanRequestKeys =
    kEvaluateRequestKeys.first(std::size(kRequestKeys) - 1);
constexpr int kMaxPrefetchDistance = 64;

// What a request plans from: its step cost and the labels and defaults that go with it.
struct Source {
  StepCost step;
  std::string model_label;
  std::string hardware_label;
  uint64_t default_gpu_budget = 0;  // 0: the request must give one
  uint64_t default_host_budget = 0;
  bool profile = false;
  // A pipelined profile, or one stage with microbatches > 1: every stage's step cost (`step` is
  // stage 0's), planned and evaluated through PlanStages (Note [Pipelined profiles] in
  // planner/frameworks/layer_profile.cc).
  bool pipelined = false;
  std::vector<StepCost> stages;
  HardwareProfile hardware;
  RunSettings run;
  double message_bytes = 0;
};

absl::StatusOr<HardwareProfile> ReadHardware(const json::Object& o, std::string& label) {
  const json::Json& value = o.json().at("hardware");
  if (value.is_string()) {
    label = value.get<std::string>();
    return HardwarePreset(label);
  }
  if (!value.is_object()) {
    return o.Invalid("hardware",
                     absl::StrCat("a preset name (", absl::StrJoin(HardwarePresetNames(), ", "),
                                  ") or a hardware profile object"));
  }
  auto hw = ParseHardwareProfileJson(value.dump());
  if (!hw.ok()) return hw.status();
  label = hw->name.empty() ? "hardware profile" : hw->name;
  return hw;
}

// The request's run settings over DefaultRunSettings of its framework and model.
absl::StatusOr<RunSettings> ReadRun(const json::Object& o, const ModelConfig& model) {
  if (!o.Has("run")) return DefaultRunSettings(Framework::kMegatron, model);
  auto r = o.Child("run");
  if (!r.ok()) return r.status();
  // Whose code runs the layers, as the CLI's --framework and the plan's run.framework spell it;
  // read first, since the defaults follow it.
  std::string framework;
  if (absl::Status s = r->ReadOptional("framework", framework); !s.ok()) return s;
  Framework parsed_framework = Framework::kMegatron;
  if (!framework.empty()) {
    auto parsed = ParseFramework(framework);
    if (!parsed.ok()) return r->Invalid("framework", "megatron or hf");
    parsed_framework = *parsed;
  }
  if (absl::Status s =
          r->OnlyKeys({"framework", "seq_len", "micro_batch", "tp", "cp", "ep", "gpus",
                       "moe_imbalance", "loss_chunk_tokens", "grad_bytes", "mtp_layers",
                       "transformers", "optimizer", "sharding", "sequence_parallel"});
      !s.ok())
    return s;
  RunSettings run = DefaultRunSettings(parsed_framework, model);
  const json::Range<int> parallel{1, 1 << 20};
  if (absl::Status s =
          r->ReadOptional("seq_len", run.seq_len, json::Range<uint64_t>{1, uint64_t{1} << 40});
      !s.ok())
    return s;
  for (auto [key, field] : {std::pair<const char*, int*>{"micro_batch", &run.micro_batch},
                            {"tp", &run.tp},
                            {"cp", &run.cp},
                            {"ep", &run.ep},
                            {"gpus", &run.gpus}}) {
    if (absl::Status s = r->ReadOptional(key, *field, parallel); !s.ok()) return s;
  }
  if (absl::Status s =
          r->ReadOptional("moe_imbalance", run.moe_imbalance, json::Range<double>{1.0, 1e6});
      !s.ok())
    return s;
  if (absl::Status s = r->ReadOptional("loss_chunk_tokens", run.loss_chunk_tokens,
                                       json::Range<uint64_t>{0, uint64_t{1} << 40});
      !s.ok())
    return s;
  if (absl::Status s = r->ReadOptional("grad_bytes", run.grad_bytes, json::Range<int>{2, 4});
      !s.ok())
    return s;
  if (run.grad_bytes == 3) return r->Invalid("grad_bytes", "2 (bf16) or 4 (fp32)");
  // MTP depths trained, as --mtp-layers (Note [MTP layers]); absent: the config's count.
  if (absl::Status s =
          r->ReadOptional("mtp_layers", run.mtp_layers, json::Range<int>{0, kPlanMaxMtpLayers});
      !s.ok())
    return s;
  // Megatron's --sequence-parallel under TP, as --no-sequence-parallel and the plan's
  // run.sequence_parallel (Note [Sequence parallelism] in planner/frameworks/megatron.cc).
  if (absl::Status s = r->ReadOptional("sequence_parallel", run.sequence_parallel); !s.ok()) {
    return s;
  }
  // The optimizer's state, as the CLI's --optimizer and the plan's run.optimizer spell it.
  std::string optimizer;
  // The transformers release the hf recipe follows, as --transformers
  // (Note [hf transformers versions] in planner/frameworks/).
  std::string transformers;
  if (absl::Status s = r->ReadOptional("transformers", transformers); !s.ok()) return s;
  if (!transformers.empty()) {
    auto minor = ParseTransformersVersion(transformers);
    if (!minor.ok()) return r->Invalid("transformers", "a transformers release 5.N with N >= 17");
    run.transformers_minor = *minor;
  }
  if (absl::Status s = r->ReadOptional("optimizer", optimizer); !s.ok()) return s;
  if (!optimizer.empty()) {
    auto parsed = ParseOptimizerKind(optimizer);
    if (!parsed.ok()) return r->Invalid("optimizer", "adam, sgd or none");
    run.optimizer = *parsed;
  }
  std::string sharding;
  if (absl::Status s = r->ReadOptional("sharding", sharding); !s.ok()) return s;
  if (!sharding.empty()) {
    auto parsed = ParseSharding(sharding);
    if (!parsed.ok())
      return r->Invalid("sharding",
                        "no_shard, optim, optim_grads, "
                        "optim_grads_params");
    run.sharding = *parsed;
  }
  return run;
}

absl::StatusOr<Source> ReadSource(const json::Object& o) {
  Source src;
  const bool has_profile = o.Has("profile"), has_model = o.Has("model");
  if (has_profile == has_model) {
    return o.Invalid(has_profile ? "model" : "profile",
                     "exactly one of 'profile' (a measured layer profile) and 'model' (a preset "
                     "name or a Hugging Face config.json object)");
  }
  if (has_profile) {
    const json::Json& value = o.json().at("profile");
    if (!value.is_object()) return o.Invalid("profile", "a layer profile object");
    auto profile = ParseProfileJson(value.dump(), "plan request's profile");
    if (!profile.ok()) return profile.status();
    HardwareProfile hw = HardwareForProfile(*profile);
    src.hardware_label = hw.name;
    const bool hardware_given = o.Has("hardware");
    if (hardware_given) {
      auto given = ReadHardware(o, src.hardware_label);
      if (!given.ok()) return given.status();
      // The link is what the profile measured; the rest (host RAM, GPUs per node) is the
      // hardware's.
      hw = *given;
      src.default_gpu_budget = given->UsableBytes();
    }
    // Microbatches per step: a pipelined profile's pp unless given.
    int microbatches = profile->pipeline.has_value() ? profile->pipeline->pp : 1;
    if (absl::Status s =
            o.ReadOptional("microbatches", microbatches, json::Range<int>{1, kPlanMaxMicrobatches});
        !s.ok())
      return s;
    auto run = ProfileRunSettings(profile->pipeline, microbatches, "microbatches");
    if (!run.ok()) return run.status();
    auto stages = BuildStageStepCostsFromProfile(*profile, hw, *run);
    if (!stages.ok()) return stages.status();
    src.stages = *std::move(stages);
    src.step = src.stages.front();
    src.model_label = src.step.model;
    src.profile = true;
    src.pipelined = run->pp > 1 || run->microbatches > 1;
    src.hardware = hw;
    src.run = src.step.run;
    src.message_bytes = ProfileMessageBytes(*profile);
    for (const StepCost& stage : src.stages) {
      src.default_host_budget = std::max(
          src.default_host_budget, DefaultProfileHostBudget(stage, hardware_given ? &hw : nullptr));
    }
    return src;
  }
  if (o.Has("microbatches")) {
    return o.Invalid("microbatches",
                     "absent with 'model' (microbatches apply to a measured 'profile': a "
                     "pipelined profile's stages, or gradient accumulation over one stage)");
  }
  const json::Json& value = o.json().at("model");
  ModelConfig model;
  if (value.is_string()) {
    src.model_label = value.get<std::string>();
    auto preset = ModelPreset(src.model_label);
    if (!preset.ok()) return preset.status();
    model = *preset;
  } else if (value.is_object()) {
    auto parsed = ParseHfConfigJson(value.dump(), "config.json");
    if (!parsed.ok()) return parsed.status();
    model = *parsed;
    src.model_label = model.name;
  } else {
    return o.Invalid("model",
                     absl::StrCat("a preset name (", absl::StrJoin(ModelPresetNames(), ", "),
                                  ") or a Hugging Face config.json object"));
  }
  HardwareProfile hw;
  if (o.Has("hardware")) {
    auto given = ReadHardware(o, src.hardware_label);
    if (!given.ok()) return given.status();
    hw = *given;
  } else {
    src.hardware_label = kDefaultHardware;
    hw = *HardwarePreset(kDefaultHardware);
  }
  auto run = ReadRun(o, model);
  if (!run.ok()) return run.status();
  auto step = BuildStepCost(model, hw, *run);
  if (!step.ok()) return step.status();
  src.step = *std::move(step);
  src.default_gpu_budget = hw.UsableBytes();
  src.default_host_budget = hw.DefaultHostBudgetPerGpu();
  return src;
}

// Budgets and search options common to both calls.
absl::Status ReadOptions(const json::Object& o, const Source& src, bool budget_required,
                         OptimizerOptions& options) {
  options.gpu_budget_bytes = src.default_gpu_budget;
  if (budget_required && src.default_gpu_budget == 0 && !o.Has("gpu_budget_bytes")) {
    return o.Missing("gpu_budget_bytes");
  }
  if (absl::Status s = o.ReadOptional("gpu_budget_bytes", options.gpu_budget_bytes,
                                      json::Range<uint64_t>{1, uint64_t{1} << 56});
      !s.ok())
    return s;
  options.host_budget_bytes = src.default_host_budget;
  if (absl::Status s = o.ReadOptional("host_budget_bytes", options.host_budget_bytes,
                                      json::Range<uint64_t>{0, uint64_t{1} << 56});
      !s.ok())
    return s;
  std::string force;
  if (absl::Status s = o.ReadOptional("force", force); !s.ok()) return s;
  if (!force.empty()) {
    auto policy = ParseLayerPolicy(force);
    if (!policy.ok()) {
      return o.Invalid("force",
                       "keep, recompute, selective_recompute, offload_input, offload_saved");
    }
    options.force = *policy;
  }
  if (absl::Status s = o.ReadOptional("optimality_gap", options.optimality_gap,
                                      json::Range<double>{0, OptimizerOptions::kMaxOptimalityGap});
      !s.ok())
    return s;
  if (o.Has("prefetch_distance")) {
    int distance = 1;
    if (absl::Status s = o.Read("prefetch_distance", distance, {1, kMaxPrefetchDistance}); !s.ok())
      return s;
    options.prefetch_distances = {distance};
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PlanJson(const Source& src, const json::Object& o,
                                     const OptimizeResult& result, const OptimizerOptions& options,
                                     const std::string& generator) {
  std::string model = src.model_label;
  if (absl::Status s = o.ReadOptional("model_label", model); !s.ok()) return s;
  const Baseline baseline = ComputeBaseline(src.step, options.gpu_budget_bytes);
  const PlanLabels labels{generator, model, src.hardware_label, options.gpu_budget_bytes,
                          options.host_budget_bytes};
  return PlanToJson(MakePlan(src.step, result, baseline, labels));
}

absl::StatusOr<json::Object> Root(const json::Json& parsed) {
  return json::Object::Of(parsed, kSource);
}

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kEmbedding:
      return "embedding";
    case Phase::kForward:
      return "forward";
    case Phase::kTail:
      return "loss";
    case Phase::kBackward:
      return "backward";
  }
  return "unknown";
}

// The request's per-layer assignment as options of the cost source's layers (every layer of the
// model in global order: a pipelined profile's from all its stages).
absl::StatusOr<Schedule> ReadAssignment(const json::Object& o,
                                        const std::vector<const LayerCost*>& costs) {
  auto layers = o.Array("layers");
  if (!layers.ok()) return layers.status();
  if ((*layers)->size() != costs.size()) {
    return o.Invalid("layers", absl::StrCat("one entry per layer of the cost source (",
                                            costs.size(), "), got ", (*layers)->size()));
  }
  Schedule schedule;
  schedule.prefetch_distance = 1;
  if (absl::Status s = o.ReadOptional("prefetch_distance", schedule.prefetch_distance,
                                      json::Range<int>{1, kMaxPrefetchDistance});
      !s.ok())
    return s;
  for (size_t i = 0; i < costs.size(); ++i) {
    const LayerCost& cost = *costs[i];
    auto entry = json::Object::Of((**layers)[i], kSource, absl::StrCat("layers[", i, "]"));
    if (!entry.ok()) return entry.status();
    if (absl::Status s = entry->OnlyKeys({"policy", "chunks", "recompute_modules"}); !s.ok()) {
      return s;
    }
    std::string name;
    if (absl::Status s = entry->Read("policy", name); !s.ok()) return s;
    auto policy = ParseLayerPolicy(name);
    if (!policy.ok()) {
      return entry->Invalid("policy",
                            "keep, recompute, selective_recompute, offload_input, offload_saved");
    }
    LayerOption option{*policy, 0, 1};
    if (absl::Status s = entry->ReadOptional("chunks", option.chunks, json::Range<int>{1, 64});
        !s.ok())
      return s;
    if (entry->Has("recompute_modules")) {
      auto modules = entry->Array("recompute_modules");
      if (!modules.ok()) return modules.status();
      std::vector<std::string> known;
      for (const RecomputeModule& m : cost.modules) known.push_back(m.name);
      for (size_t k = 0; k < (*modules)->size(); ++k) {
        std::string module;
        const std::string path = absl::StrCat("layers[", i, "].recompute_modules[", k, "]");
        if (absl::Status s = json::ReadValue((**modules)[k], kSource, path, module); !s.ok())
          return s;
        auto it = std::find(known.begin(), known.end(), module);
        if (it == known.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(kSource, ": field '", path, "' has value \"", module, "\"; allowed: ",
                           known.empty() ? "none (layer " + std::to_string(i) +
                                               " lists no modules that save "
                                               "tensors)"
                                         : absl::StrJoin(known, ", ")));
        }
        option.module_mask |= 1u << (it - known.begin());
      }
    }
    if ((option.policy == LayerPolicy::kSelectiveRecompute) != (option.module_mask != 0)) {
      return entry->Invalid("recompute_modules",
                            "a non-empty list exactly when the policy is selective_recompute");
    }
    schedule.options.push_back(option);
  }
  return schedule;
}

// A given assignment simulated as the optimizer's answer for it: it fits when no budget is given
// or its peak is within it.
OptimizeResult SimulateAssignment(const StepCost& step, Schedule schedule,
                                  const OptimizerOptions& options) {
  OptimizeResult r;
  r.schedule = std::move(schedule);
  r.sim = Simulate(step, r.schedule, /*record=*/true);
  r.feasible = options.gpu_budget_bytes == 0 || r.sim.peak_bytes <= options.gpu_budget_bytes;
  r.min_peak_bytes = r.sim.peak_bytes;
  return r;
}

// A pipelined source's plan JSON (MakePipelinePlan).
absl::StatusOr<std::string> PipelinePlanJson(const Source& src, const json::Object& o,
                                             const PipelineResult& pipeline,
                                             const OptimizerOptions& options,
                                             const std::string& generator) {
  std::string model = src.model_label;
  if (absl::Status s = o.ReadOptional("model_label", model); !s.ok()) return s;
  const PlanLabels labels{generator, model, src.hardware_label, options.gpu_budget_bytes,
                          options.host_budget_bytes};
  return PlanToJson(MakePipelinePlan(pipeline, labels));
}

// The simulation's answer for one step (stowage_plan_evaluate's keys but the plan's).
json::Json SimulationJson(const StepCost& step, const SimResult& sim, uint64_t gpu_budget_bytes) {
  json::Json out;
  out["peak_device_bytes"] = sim.peak_bytes;
  out["fixed_device_bytes"] = step.fixed.total();
  out["peak_at"] = sim.peak_at;
  out["peak_seconds"] = sim.peak_seconds;
  out["step_seconds"] = sim.step_seconds;
  out["compute_seconds"] = sim.compute_seconds;
  out["exposed_copy_seconds"] = sim.exposed_copy_seconds;
  out["host_bytes"] = sim.host_bytes;
  if (gpu_budget_bytes > 0) out["gpu_budget_bytes"] = gpu_budget_bytes;
  json::Json compute = json::Json::array();
  for (const ComputeInterval& c : sim.compute) {
    compute.push_back({{"phase", PhaseName(c.phase)},
                       {"layer", c.layer},
                       {"start", c.start},
                       {"end", c.end},
                       {"stall", c.stall}});
  }
  out["compute"] = compute;
  json::Json copies = json::Json::array();
  for (const CopyInterval& c : sim.copies) {
    copies.push_back({{"layer", c.layer},
                      {"direction", c.d2h ? "d2h" : "h2d"},
                      {"bytes", c.bytes},
                      {"start", c.start},
                      {"end", c.end}});
  }
  out["copies"] = copies;
  json::Json timeline = json::Json::array();
  for (const MemoryPoint& p : sim.timeline) {
    timeline.push_back({{"seconds", p.seconds}, {"bytes", p.bytes}});
  }
  out["timeline"] = timeline;
  // The step's events in order (Note [Runtime protocol]): what the runtime's trace must show.
  json::Json events = json::Json::array();
  for (const StepEvent& e : sim.events) {
    events.push_back({{"kind", std::string(StepEventKindName(e.kind))},
                      {"layer", e.layer},
                      {"bytes", e.bytes},
                      {"seconds", e.seconds}});
  }
  out["events"] = events;
  return out;
}

// A pipelined source planned: every stage optimized (PlanStages). No plan fits: the closest
// pipelined plan into `closest_plan` (unless a layer has no option) and an error naming the
// binding stage.
absl::StatusOr<std::string> PlanPipelinedRequest(const Source& src, const json::Object& o,
                                                 const OptimizerOptions& options,
                                                 const std::string& generator,
                                                 std::string* closest_plan) {
  auto pipeline = PlanStages(src.stages, src.hardware, src.run, src.message_bytes, options);
  if (!pipeline.ok()) return pipeline.status();
  if (!pipeline->feasible) {
    bool complete = true;
    for (const StageResult& stage : pipeline->stages) {
      complete &= stage.result.schedule.options.size() == stage.step.layers.size();
    }
    if (closest_plan != nullptr && complete) {
      auto closest = PipelinePlanJson(src, o, *pipeline, options, generator);
      if (!closest.ok()) return closest.status();
      *closest_plan = *std::move(closest);
    }
    const StageResult& b = pipeline->stages[pipeline->binding_stage];
    return absl::ResourceExhaustedError(
        absl::StrCat("gpu_budget_bytes is ", options.gpu_budget_bytes, " (",
                     FormatBytes(options.gpu_budget_bytes),
                     ", the whole device) but on pipeline stage ", b.stage,
                     " (the binding stage) the smallest "
                     "peak any plan reaches is ",
                     b.result.min_peak_bytes, " (", FormatBytes(b.result.min_peak_bytes),
                     ", fixed memory included", options.force.has_value() ? ", policy " : "",
                     options.force.has_value() ? std::string(LayerPolicyName(*options.force)) : "",
                     "); what binds: ", b.result.binding, ": ", b.result.explanation));
  }
  return PipelinePlanJson(src, o, *pipeline, options, generator);
}

// A pipelined source evaluated: the assignment of every layer (global order) split by stage, each
// stage simulated with its own layers' options; the binding stage's simulation,
// the pipeline's step, the most host bytes of any stage, the pipelined plan and every stage's
// figures.
absl::StatusOr<std::string> EvaluatePipelinedRequest(const Source& src, const json::Object& o,
                                                     const OptimizerOptions& options,
                                                     const std::string& generator) {
  std::vector<const LayerCost*> global;
  for (const StepCost& stage : src.stages) {
    for (const LayerCost& l : stage.layers) {
      if (l.index < 0) continue;
      if (global.size() <= static_cast<size_t>(l.index)) global.resize(l.index + 1, nullptr);
      global[l.index] = &l;
    }
  }
  for (const LayerCost* l : global) {
    if (l == nullptr) return absl::InternalError("pipelined profile: a layer is on no stage");
  }
  auto assignment = ReadAssignment(o, global);
  if (!assignment.ok()) return assignment.status();
  const StageScheduler simulate = [&](const StepCost& step) {
    Schedule schedule;
    schedule.prefetch_distance = assignment->prefetch_distance;
    for (const LayerCost& l : step.layers) schedule.options.push_back(assignment->options[l.index]);
    return SimulateAssignment(step, std::move(schedule), options);
  };
  auto pipeline =
      PlanStages(src.stages, src.hardware, src.run, src.message_bytes, options, simulate);
  if (!pipeline.ok()) return pipeline.status();
  uint64_t host = 0;
  json::Json stages = json::Json::array();
  for (const StageResult& st : pipeline->stages) {
    host = std::max(host, st.result.sim.host_bytes);
    stages.push_back({{"stage", st.stage},
                      {"peak_device_bytes", st.result.sim.peak_bytes},
                      {"fixed_device_bytes", st.step.fixed.total()},
                      {"host_bytes", st.result.sim.host_bytes},
                      {"microbatch_seconds", MicrobatchSeconds(st.step, st.result.sim)}});
  }
  // The binding stage, as the plan names it (PlanStages: the first over budget, else the
  // highest peak).
  const StageResult& b = pipeline->stages[pipeline->binding_stage];
  json::Json out = SimulationJson(b.step, b.result.sim, options.gpu_budget_bytes);
  // The binding stage's layers by their model index, as the plan and the runtime's trace name them
  // (the simulation numbers them by position in the stage).
  for (const char* key : {"compute", "copies", "events"}) {
    for (json::Json& entry : out[key]) {
      const int k = entry["layer"].get<int>();
      if (k >= 0 && k < static_cast<int>(b.step.layers.size())) {
        entry["layer"] = b.step.layers[k].index;
      }
    }
  }
  out["step_seconds"] = pipeline->step_seconds;
  out["host_bytes"] = host;
  auto plan = PipelinePlanJson(src, o, *pipeline, options, generator);
  if (!plan.ok()) return plan.status();
  out["plan"] = json::Json::parse(*plan);
  if (options.gpu_budget_bytes > 0) out["fits"] = out["plan"]["fits"];
  out["stages"] = stages;
  return out.dump(2) + "\n";
}

}  // namespace

absl::StatusOr<std::string> PlanFromRequestJson(std::string_view request,
                                                const std::string& generator,
                                                std::string* closest_plan) {
  auto parsed = json::Parse(request, kSource);
  if (!parsed.ok()) return parsed.status();
  auto root = Root(*parsed);
  if (!root.ok()) return root.status();
  if (absl::Status s = root->OnlyKeys(kPlanRequestKeys); !s.ok()) return s;
  auto src = ReadSource(*root);
  if (!src.ok()) return src.status();
  OptimizerOptions options;
  if (absl::Status s = ReadOptions(*root, *src, /*budget_required=*/true, options); !s.ok())
    return s;
  if (src->pipelined) return PlanPipelinedRequest(*src, *root, options, generator, closest_plan);
  OptimizeResult result = Optimize(src->step, options);
  if (!result.feasible) {
    // Note [Plans that do not fit]: the closest plan is still an answer, as `stowage plan`
    // prints it, unless a layer has no option at all.
    if (closest_plan != nullptr && result.schedule.options.size() == src->step.layers.size()) {
      auto closest = PlanJson(*src, *root, result, options, generator);
      if (!closest.ok()) return closest.status();
      *closest_plan = *std::move(closest);
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("gpu_budget_bytes is ", options.gpu_budget_bytes, " (",
                     FormatBytes(options.gpu_budget_bytes),
                     ", the whole device) but the smallest peak any "
                     "plan reaches is ",
                     result.min_peak_bytes, " (", FormatBytes(result.min_peak_bytes),
                     ", fixed memory included", options.force.has_value() ? ", policy " : "",
                     options.force.has_value() ? std::string(LayerPolicyName(*options.force)) : "",
                     "); what binds: ", result.binding, ": ", result.explanation));
  }
  return PlanJson(*src, *root, result, options, generator);
}

absl::StatusOr<std::string> EvaluateRequestJson(std::string_view request,
                                                const std::string& generator) {
  auto parsed = json::Parse(request, kSource);
  if (!parsed.ok()) return parsed.status();
  auto root = Root(*parsed);
  if (!root.ok()) return root.status();
  if (absl::Status s = root->OnlyKeys(kEvaluateRequestKeys); !s.ok()) return s;
  auto src = ReadSource(*root);
  if (!src.ok()) return src.status();
  OptimizerOptions options;
  if (absl::Status s = ReadOptions(*root, *src, /*budget_required=*/false, options); !s.ok())
    return s;
  if (src->pipelined) return EvaluatePipelinedRequest(*src, *root, options, generator);
  std::vector<const LayerCost*> costs;
  for (const LayerCost& l : src->step.layers) costs.push_back(&l);
  auto schedule = ReadAssignment(*root, costs);
  if (!schedule.ok()) return schedule.status();
  const OptimizeResult result = SimulateAssignment(src->step, *std::move(schedule), options);
  json::Json out = SimulationJson(src->step, result.sim, options.gpu_budget_bytes);
  auto plan = PlanJson(*src, *root, result, options, generator);
  if (!plan.ok()) return plan.status();
  out["plan"] = json::Json::parse(*plan);
  // Both budgets, as the plan's own `fits` (Note [Plans that do not fit]).
  if (options.gpu_budget_bytes > 0) out["fits"] = out["plan"]["fits"];
  return out.dump(2) + "\n";
}

}  // namespace stowage::planner
