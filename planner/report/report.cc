#include "planner/report/report.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/bytes.h"
#include "plan/chrome_trace.h"
#include "planner/cost/run_settings.h"
#include "planner/frameworks/hf.h"
#include "planner/search/baseline.h"

namespace stowage::planner {
namespace {

std::string PolicyText(const LayerCost& layer, const LayerOption& o) {
  std::string text(LayerPolicyName(o.policy));
  if (o.policy == LayerPolicy::kSelectiveRecompute) {
    std::vector<std::string> names;
    for (size_t m = 0; m < layer.modules.size(); ++m) {
      if (o.module_mask & (1u << m)) names.push_back(layer.modules[m].name);
    }
    text = absl::StrCat("selective_recompute(", absl::StrJoin(names, ","), ")");
  }
  return text;
}

std::string Ms(double seconds) { return absl::StrFormat("%.1f", seconds * 1e3); }

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '&') {
      out += "&amp;";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string FormatSeconds(double seconds) {
  if (seconds < 1) return absl::StrFormat("%.0f ms", seconds * 1e3);
  if (seconds < 120) return absl::StrFormat("%.2f s", seconds);
  if (seconds < 7200) return absl::StrFormat("%.0f s (%.1f min)", seconds, seconds / 60);
  return absl::StrFormat("%.0f s (%.1f h)", seconds, seconds / 3600);
}

namespace {

// Note [Plans that do not fit]: whether the simulated schedule is within the budgets (0: none
// stated), and if not, the budget it exceeds (the device's first), by how much and where, in the
// optimizer's words where it gave them (MinimumPeak's), else in the table's.
PlanBinding BindingOf(const SimResult& sim, const OptimizeResult& result, const PlanLabels& labels,
                      bool* fits) {
  PlanBinding b;
  const bool gpu_over = labels.gpu_budget_bytes > 0 && sim.peak_bytes > labels.gpu_budget_bytes;
  const bool host_over = labels.host_budget_bytes > 0 && sim.host_bytes > labels.host_budget_bytes;
  *fits = !gpu_over && !host_over;
  if (*fits) return b;
  b.budget = gpu_over ? "gpu" : "host";
  b.exceeded_by_bytes = gpu_over ? sim.peak_bytes - labels.gpu_budget_bytes
                                 : sim.host_bytes - labels.host_budget_bytes;
  // Every offloaded byte is live while the loss runs (the arena's size), so that is where the
  // host budget binds.
  b.at = gpu_over ? sim.peak_at : "LM head and loss";
  b.what = !result.binding.empty() ? result.binding
           : gpu_over              ? absl::StrCat("device memory at the ", sim.peak_at)
                                   : std::string("pinned host memory");
  b.explanation =
      !result.explanation.empty()
          ? result.explanation
          : absl::StrCat(gpu_over ? "the peak of " : "the pinned host memory of ",
                         FormatBytes(gpu_over ? sim.peak_bytes : sim.host_bytes),
                         gpu_over ? " exceeds the GPU budget of " : " exceeds the host budget of ",
                         FormatBytes(gpu_over ? labels.gpu_budget_bytes : labels.host_budget_bytes),
                         " by ", FormatBytes(b.exceeded_by_bytes));
  return b;
}

}  // namespace

Plan MakePlan(const StepCost& step, const OptimizeResult& result, const Baseline& baseline,
              const PlanLabels& labels) {
  Plan plan;
  plan.generator = labels.generator;
  plan.model = labels.model;
  plan.model_parameters = step.model_parameters;
  plan.hardware = labels.hardware;
  plan.seq_len = step.run.seq_len;
  plan.micro_batch = step.run.micro_batch;
  plan.framework = FrameworkName(step.run.framework);
  plan.tp = step.run.tp;
  plan.cp = step.run.cp;
  plan.ep = step.run.ep;
  // Moot with tp 1 (Megatron turns it off there): recorded as the default, so that such a plan
  // keeps its bytes whichever way the setting came.
  plan.sequence_parallel = step.run.tp == 1 || step.run.sequence_parallel;
  plan.mtp_layers = step.mtp_layers;
  // The job: its GPUs and the sequences of one step (data parallel as planner/cost/
  // communication.cc groups the ranks).
  const RunSettings& run = step.run;
  plan.gpus = run.gpus;
  plan.global_batch = static_cast<uint64_t>(run.micro_batch) *
                      static_cast<uint64_t>(std::max(run.microbatches, 1)) *
                      static_cast<uint64_t>(std::max(1, run.gpus / (run.tp * run.cp * run.pp)));
  plan.gpu_budget_bytes = labels.gpu_budget_bytes;
  plan.host_budget_bytes = labels.host_budget_bytes;
  const SimResult& sim = result.sim;
  const int n = static_cast<int>(step.layers.size());
  const int distance = result.schedule.prefetch_distance;
  PlanPrediction& p = plan.predicted;
  p.peak_device_bytes = sim.peak_bytes;
  p.fixed_device_bytes = step.fixed.total();
  p.host_bytes_per_gpu = sim.host_bytes;
  p.host_bytes_per_numa_node =
      sim.host_bytes * static_cast<uint64_t>(step.hardware.gpus_per_numa_node);
  p.step_seconds = sim.step_seconds;
  p.exposed_copy_seconds = sim.exposed_copy_seconds;
  p.baseline = baseline.name;
  p.baseline_step_seconds = baseline.sim.step_seconds;
  p.unoverlapped_step_seconds =
      sim.compute_seconds + sim.copy_seconds + step.optimizer_copy_seconds;
  plan.binding = BindingOf(sim, result, labels, &plan.fits);
  p.optimality = plan.fits ? OptimalityName(result) : "";
  p.optimality_gap = plan.fits ? OptimalityGap(result) : 0;
  plan.runtime.prefetch_distance = distance;
  plan.runtime.save_lag = result.schedule.save_lag;
  plan.runtime.host_arena_bytes = sim.host_bytes;  // every offloaded byte is live at the loss
  plan.runtime.copy_chunk_bytes = step.copy_chunk_bytes;
  plan.runtime.gpus_per_numa_node = step.hardware.gpus_per_numa_node;
  plan.runtime.link_bytes_per_second = step.d2h_bytes_per_second;
  for (int i = 0; i < n; ++i) {
    const LayerCost& l = step.layers[i];
    const LayerOption& o = result.schedule.options[i];
    const OptionCost c = EvaluateOption(l, o);
    LayerPlan lp;
    lp.index = i;
    lp.type = l.type;
    lp.name = l.name;
    lp.policy = o.policy;
    lp.ffn_chunks = o.chunks;
    for (size_t m = 0; m < l.modules.size(); ++m) {
      if (o.policy == LayerPolicy::kSelectiveRecompute && (o.module_mask & (1u << m))) {
        lp.recompute_modules.push_back(l.modules[m].name);
      }
    }
    lp.device_saved_bytes = c.resident_bytes;
    lp.host_bytes = c.host_bytes;
    lp.transfers = OptionTransfers(l, o);
    const LayerProtocol protocol =
        LayerProtocolFor(i, n, c.host_bytes > 0, distance, result.schedule.save_lag);
    lp.save_wait_before_layer = protocol.save_wait_before_layer;
    lp.prefetch_after_layer = protocol.prefetch_after_layer;
    lp.forward_seconds = c.forward_seconds;
    lp.backward_seconds = c.backward_seconds;
    lp.recompute_seconds = c.recompute_seconds;
    for (const CopyInterval& copy : sim.copies) {
      if (copy.layer != i) continue;
      (copy.d2h ? lp.d2h_seconds : lp.h2d_seconds) = copy.end - copy.start;
    }
    plan.layers.push_back(std::move(lp));
  }
  return plan;
}

std::string RenderTable(const StepCost& step, const Plan& plan, const OptimizeResult& result) {
  std::vector<double> stall(plan.layers.size(), 0);
  for (const ComputeInterval& c : result.sim.compute) {
    if (c.phase == Phase::kBackward && c.layer >= 0) stall[c.layer] = c.stall;
  }
  // Columns as wide as their longest entry ("attention+dense_ffn" overflowed a fixed width).
  size_t type_width = 4, choice_width = 6;
  std::vector<std::string> choices(plan.layers.size());
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    choices[i] = PolicyText(step.layers[i], result.schedule.options[i]);
    type_width = std::max(type_width, plan.layers[i].type.size());
    choice_width = std::max(choice_width, choices[i].size());
  }
  const std::string row_format =
      absl::StrCat("%-", type_width, "s  %-", choice_width, "s  %6d  %10s  %10s  %9s  %15s  %8s");
  // Layers by their model index (LayerCost::index): a pipeline stage's step numbers its layers
  // from 0 and its plan by position, and the table names them as the pipelined plan does.
  auto model_index = [&](int position) {
    return position >= 0 && position < static_cast<int>(step.layers.size())
               ? step.layers[position].index
               : position;
  };
  auto cells = [&](size_t i) {
    const LayerPlan& l = plan.layers[i];
    std::string prefetch = "-";
    if (l.prefetch_after_layer >= 0) {
      // The trigger layer, and when the H2D actually starts in the simulated step.
      const int trigger = model_index(l.prefetch_after_layer);
      prefetch = absl::StrCat("bwd ", trigger);
      for (const CopyInterval& c : result.sim.copies) {
        if (!c.d2h && c.layer == l.index) {
          prefetch = absl::StrFormat("bwd %d @%.2fs", trigger, c.start);
        }
      }
    }
    const auto format = absl::ParsedFormat<'s', 's', 'd', 's', 's', 's', 's', 's'>::New(row_format);
    return absl::StrFormat(*format, l.type, choices[i], l.ffn_chunks,
                           FormatBytes(l.device_saved_bytes),
                           l.host_bytes ? FormatBytes(l.host_bytes) : "-", Ms(l.recompute_seconds),
                           prefetch, Ms(stall[i]));
  };
  const auto header =
      absl::ParsedFormat<'s', 's', 's', 's', 's', 's', 's', 's', 's'>::New(absl::StrCat(
          "%9s  %-", type_width, "s  %-", choice_width, "s  %6s  %10s  %10s  %9s  %15s  %8s\n"));
  std::string out = absl::StrFormat(*header, "layers", "type", "choice", "chunks", "on GPU",
                                    "offloaded", "recomp ms", "prefetch", "stall ms");
  // Runs of consecutive layers that read the same are one row ("1-32").
  for (size_t i = 0; i < plan.layers.size();) {
    const std::string row = cells(i);
    size_t j = i + 1;
    // An MTP layer (Note [MTP layers]) is a row of its own, under its name.
    const int first = model_index(plan.layers[i].index);
    while (j < plan.layers.size() &&
           model_index(plan.layers[j].index) == model_index(plan.layers[j - 1].index) + 1 &&
           plan.layers[i].name.empty() && plan.layers[j].name.empty() && cells(j) == row) {
      ++j;
    }
    const std::string layers =
        !plan.layers[i].name.empty() ? plan.layers[i].name
        : j - i == 1                 ? absl::StrCat(first)
                     : absl::StrCat(first, "-", model_index(plan.layers[j - 1].index));
    absl::StrAppend(&out, absl::StrFormat("%9s  %s\n", layers, row));
    i = j;
  }
  return out;
}

namespace {

// The "exposed communication" line: what compute waited for (recomputes included), then per
// group the bytes one rank moves in one forward and backward of every layer and their time on
// the links (Note [Communication]); then its warnings.
std::string RenderCommunication(const StepCost& step, const SimResult& sim) {
  // Byte sums over 10,000 layers may pass 2^64: shown clamped, never converted out of range.
  std::string groups;
  for (CommGroup g :
       {CommGroup::kTp, CommGroup::kCp, CommGroup::kEp, CommGroup::kFsdp, CommGroup::kDp}) {
    double seconds = 0;
    CommLink link = CommLink::kNone;
    auto count = [&](const CommOp& op) {
      if (op.group != g) return;
      seconds += (op.forward_calls + op.backward_calls) * op.seconds;
      if (op.link == CommLink::kNetwork || link == CommLink::kNone) link = op.link;
    };
    for (const LayerComm& l : step.comm.layers) {
      for (const CommOp& op : l.ops) count(op);
    }
    for (const CommOp& op : step.comm.step_ops) count(op);
    const double bytes = StepCommBytes(step.comm, g);
    if (bytes <= 0) continue;
    absl::StrAppend(&groups, groups.empty() ? "" : ", ",
                    absl::StrFormat("%s %s in %.3f s (%s)", CommGroupName(g),
                                    FormatBytes(static_cast<uint64_t>(std::min(bytes, 1.8e19))),
                                    seconds, CommLinkName(link)));
  }
  std::string out = absl::StrFormat(
      "exposed communication  %.3f s, in the step time; per rank, each layer's forward and "
      "backward once (a recompute repeats the forward's), on the links: %s\n",
      sim.exposed_comm_seconds, groups.empty() ? std::string("none") : groups);
  for (const std::string& w : step.comm.warnings) absl::StrAppend(&out, "  ", w, "\n");
  return out;
}

}  // namespace

std::string RenderSummary(const StepCost& step, const Plan& plan, const OptimizeResult& result) {
  const PlanPrediction& p = plan.predicted;
  const HardwareProfile& hw = step.hardware;
  std::string out;
  // A measured profile says what ran as far as it states it; what it does not state is
  // unknown, not a default (StepCost::profile).
  const std::optional<StepCost::ProfileStated>& stated = step.profile;
  constexpr char kNotStated[] = "not stated by the layer profile";
  if (stated.has_value() && !stated->parameters) {
    absl::StrAppend(&out, "model parameters       ", kNotStated, "\n");
  } else {
    absl::StrAppend(&out,
                    absl::StrFormat("model parameters       %d (%.2fB)\n", plan.model_parameters,
                                    static_cast<double>(plan.model_parameters) / 1e9));
  }
  absl::StrAppend(
      &out,
      absl::StrFormat(
          "tokens per GPU         %d (%d x %d / CP %d), TP %d%s, EP %d, "
          "%d GPUs, sharding %s%s\n",
          step.tokens_per_rank, step.run.seq_len, step.run.micro_batch, step.run.cp, step.run.tp,
          step.run.tp > 1 && !step.run.sequence_parallel ? " without sequence parallelism" : "",
          step.run.ep, step.run.gpus, ShardingName(step.run.sharding),
          // Note [hf data parallel]: which of torch's engines that is.
          !stated && step.run.framework == Framework::kHf
              ? absl::StrCat(" (", HfDataParallelEngine(step.run), ")")
              : std::string()));
  auto said = [](bool given, const char* what) {
    return given ? std::string(what) : std::string("(not stated)");
  };
  absl::StrAppend(
      &out, absl::StrFormat(
                "framework              %s%s, optimizer %s%s, gradients %s%s%s\n",
                said(!stated || stated->framework, FrameworkName(step.run.framework)),
                // Note [hf transformers versions]: the release whose code the recipe follows.
                !stated && step.run.framework == Framework::kHf
                    ? absl::StrCat(" (transformers 5.", step.run.transformers_minor, ")")
                    : std::string(),
                said(!stated || stated->optimizer, OptimizerKindName(step.run.optimizer)),
                step.run.optimizer_offload ? " (state offloaded to host)" : "",
                said(!stated || stated->grad_dtype, step.run.grad_bytes == 2 ? "bf16" : "fp32"),
                step.gradients_in_backward ? " (created during backward)" : "",
                stated.has_value() ? "; from the layer profile" : ""));
  absl::StrAppend(&out, HfLinearAttentionPath(step));  // Note [hf linear attention]
  // Note [MTP layers] (planner/frameworks/megatron.cc): whether this run trains the model's MTP
  // modules.
  if (step.mtp_layers > 0) {
    absl::StrAppend(
        &out, absl::StrFormat(
                  "multi-token prediction %d MTP layer%s trained (%s, after the decoder "
                  "layers on the last stage; --mtp-layers 0 trains none): planned as "
                  "layers, a second LM head and loss per layer in the tail\n",
                  step.mtp_layers, step.mtp_layers == 1 ? "" : "s",
                  step.mtp_layers == 1
                      ? MtpLayerName(0)
                      : absl::StrCat(MtpLayerName(0), " to ", MtpLayerName(step.mtp_layers - 1))));
  } else if (step.model_mtp_layers > 0) {
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "multi-token prediction not trained (%s): the model's %d MTP module%s hold%s no "
            "weights, gradients or activations here; model parameters count %s\n",
            step.run.framework == Framework::kHf ? "transformers drops its weights on load"
                                                 : "--mtp-layers 0",
            step.model_mtp_layers, step.model_mtp_layers == 1 ? "" : "s",
            step.model_mtp_layers == 1 ? "s" : "", step.model_mtp_layers == 1 ? "it" : "them"));
  }
  absl::StrAppend(
      &out, absl::StrFormat("peak device memory     %s of %s budget (%s), at the %s\n",
                            FormatBytes(p.peak_device_bytes), FormatBytes(plan.gpu_budget_bytes),
                            p.peak_device_bytes <= plan.gpu_budget_bytes ? "fits" : "DOES NOT FIT",
                            result.sim.peak_at));
  absl::StrAppend(
      &out,
      absl::StrFormat(
          "fixed device memory    %s: weights %s, gradients %s, "
          "optimizer %s, comm buffers %s%s\n",
          FormatBytes(step.fixed.total()), FormatBytes(step.fixed.weights),
          FormatBytes(step.fixed.gradients), FormatBytes(step.fixed.optimizer),
          FormatBytes(step.fixed.comm_buffers),
          step.fixed.other > 0 ? absl::StrCat(", other ", FormatBytes(step.fixed.other)) : ""));
  const double pin_seconds =
      hw.pin_seconds_per_gib * static_cast<double>(p.host_bytes_per_gpu) / kGiB;
  // Nothing pinned: no line about pinning it.
  if (p.host_bytes_per_gpu > 0)
    absl::StrAppend(
        &out,
        absl::StrFormat("pinned host memory     %s per GPU (budget %s), %s per NUMA node "
                        "(%d GPUs, %s RAM); pinning takes ~%.1f s once\n",
                        FormatBytes(p.host_bytes_per_gpu), FormatBytes(plan.host_budget_bytes),
                        FormatBytes(p.host_bytes_per_numa_node), hw.gpus_per_numa_node,
                        // 0: unknown (a measured profile planned without --hardware).
                        hw.host_bytes_per_numa_node > 0 ? FormatBytes(hw.host_bytes_per_numa_node)
                                                        : std::string("unknown"),
                        pin_seconds));
  if (hw.host_bytes_per_numa_node > 0 && p.host_bytes_per_numa_node > hw.host_bytes_per_numa_node) {
    absl::StrAppend(&out, absl::StrFormat("                       WARNING: %s per NUMA node "
                                          "exceeds its %s of RAM\n",
                                          FormatBytes(p.host_bytes_per_numa_node),
                                          FormatBytes(hw.host_bytes_per_numa_node)));
  }
  const bool baseline_fits =
      ComputeBaseline(step, plan.gpu_budget_bytes).sim.peak_bytes <= plan.gpu_budget_bytes;
  const double overhead =
      p.baseline_step_seconds > 0 ? (p.step_seconds / p.baseline_step_seconds - 1) * 100 : 0;
  absl::StrAppend(&out,
                  absl::StrFormat("step time              %.3f s (exposed copy waits %.3f s); "
                                  "%+.1f%% against %s (%.3f s)\n",
                                  p.step_seconds, p.exposed_copy_seconds, overhead,
                                  p.baseline == "keep" ? "keeping everything"
                                  : baseline_fits      ? "full recompute"
                                                       : "full recompute, which does not fit",
                                  p.baseline_step_seconds));
  if (p.unoverlapped_step_seconds > p.step_seconds) {
    // The planned time assumes the copies overlap compute as simulated; with none overlapped
    // (a synchronizing trainer, a contended link) the step is compute plus every copy.
    absl::StrAppend(
        &out, absl::StrFormat("copies not overlapped  %.3f s (compute %.3f s + every copy back to "
                              "back %.3f s): expect %.3f-%.3f s\n",
                              p.unoverlapped_step_seconds, result.sim.compute_seconds,
                              p.unoverlapped_step_seconds - result.sim.compute_seconds,
                              p.step_seconds, p.unoverlapped_step_seconds));
  }
  absl::StrAppend(&out, RenderCommunication(step, result.sim));
  // Proven, within the requested optimality gap, or cut short (Note [Optimality gap]).
  const double gap = 100 * OptimalityGap(result);
  absl::StrAppend(
      &out, absl::StrFormat(
                "prefetch distance      %d layer(s); %s\n", plan.runtime.prefetch_distance,
                result.proven_optimal ? std::string("optimal among the options")
                : result.within_gap
                    ? absl::StrFormat(
                          "within the optimality gap: no plan is more than %.3f%% faster", gap)
                    : absl::StrFormat("best plan found; no plan is more than %.3f%% faster", gap)));
  return out;
}

namespace {

// The 1-2-5 step that divides `range` into at most `max_ticks` intervals.
double NiceStep(double range, int max_ticks) {
  if (!(range > 0)) return 1;
  const double raw = range / max_ticks;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * magnitude >= raw) return m * magnitude;
  }
  return 10 * magnitude;
}

// A time tick's label in a unit that suits the whole axis.
std::string TimeLabel(double seconds, double axis_seconds) {
  if (axis_seconds < 1) return absl::StrFormat("%g ms", std::round(seconds * 1e6) / 1e3);
  if (axis_seconds < 600) return absl::StrFormat("%g s", std::round(seconds * 1e3) / 1e3);
  return absl::StrFormat("%g min", std::round(seconds / 60 * 1e3) / 1e3);
}

// Policy colours (the table's words), one per policy; the legend lists only those in the plan.
const char* PolicyColor(LayerPolicy policy) {
  switch (policy) {
    case LayerPolicy::kKeep:
      return "#59a14f";
    case LayerPolicy::kRecompute:
      return "#f28e2b";
    case LayerPolicy::kSelectiveRecompute:
      return "#edc948";
    case LayerPolicy::kOffloadInput:
      return "#4e79a7";
    case LayerPolicy::kOffloadSaved:
      return "#9467bd";
  }
  return "#9c9c9c";
}

}  // namespace

std::string RenderTimelineSvg(const StepCost& step, const Plan& plan,
                              const OptimizeResult& result) {
  const SimResult& sim = result.sim;
  constexpr double kWidth = 1000, kLeft = 80, kRight = 20, kTop = 58, kPlotH = 300;
  constexpr double kLaneH = 18, kLaneGap = 6;
  // Copies shorter than this are drawn this wide, so a long step's copy lanes never turn into
  // hairlines; the lane is an impression of when the link is busy, the trace file has the times.
  constexpr double kMinMarkWidth = 2;
  const double plot_w = kWidth - kLeft - kRight;
  const double t_max = std::max(sim.step_seconds, 1e-9);
  const double fixed = static_cast<double>(step.fixed.total());
  const double top_bytes =
      static_cast<double>(std::max(sim.peak_bytes, plan.gpu_budget_bytes)) * 1.04;
  // The y-axis starts just below fixed memory: the step's own bytes get the height.
  const double gib_step = NiceStep((top_bytes - fixed * 0.97) / kGiB, 6);
  const double y_min_gib = std::max(0.0, std::floor(fixed * 0.97 / kGiB / gib_step) * gib_step);
  const double y_max_gib =
      std::max(y_min_gib + gib_step, std::ceil(top_bytes / kGiB / gib_step) * gib_step);
  const double y_min = y_min_gib * kGiB, y_max = y_max_gib * kGiB;
  auto x = [&](double t) { return kLeft + plot_w * std::clamp(t / t_max, 0.0, 1.0); };
  auto y = [&](double bytes) {
    return kTop + kPlotH * (1 - std::clamp((bytes - y_min) / (y_max - y_min), 0.0, 1.0));
  };
  const double lanes_top = kTop + kPlotH + 36;
  const bool any_copies = !sim.copies.empty();
  const int lanes = any_copies ? 3 : 1;
  const double legend_top = lanes_top + lanes * (kLaneH + kLaneGap) + 8;

  // What appears, for the legend: policies in the plan, stalls, copies.
  std::vector<std::pair<std::string, std::string>> legend;  // colour, label
  for (LayerPolicy policy :
       {LayerPolicy::kKeep, LayerPolicy::kSelectiveRecompute, LayerPolicy::kRecompute,
        LayerPolicy::kOffloadInput, LayerPolicy::kOffloadSaved}) {
    if (std::any_of(plan.layers.begin(), plan.layers.end(),
                    [&](const LayerPlan& l) { return l.policy == policy; })) {
      legend.push_back({PolicyColor(policy), std::string(LayerPolicyName(policy))});
    }
  }
  legend.push_back({"#bab0ac", "embedding, LM head + loss"});
  const bool any_stall = std::any_of(sim.compute.begin(), sim.compute.end(),
                                     [](const ComputeInterval& c) { return c.stall > 0; });
  if (any_stall) legend.push_back({"#d62728", "waiting for a prefetch"});
  if (std::any_of(sim.copies.begin(), sim.copies.end(),
                  [](const CopyInterval& c) { return c.d2h; })) {
    legend.push_back({"#8c564b", "offload (D2H)"});
  }
  if (std::any_of(sim.copies.begin(), sim.copies.end(),
                  [](const CopyInterval& c) { return !c.d2h; })) {
    legend.push_back({"#17becf", "prefetch (H2D)"});
  }
  legend.push_back({"#a0cbe8", "device memory"});
  // Legend rows wrap at the plot's width.
  std::vector<std::pair<double, double>> legend_at;  // x, y of each entry
  double lx = kLeft, ly = legend_top + 12;
  for (const auto& [color, label] : legend) {
    const double w = 26 + 6.6 * static_cast<double>(label.size());
    if (lx + w > kLeft + plot_w && lx > kLeft) {
      lx = kLeft;
      ly += 18;
    }
    legend_at.push_back({lx, ly});
    lx += w;
  }
  const double height = ly + 16;

  std::string s;
  absl::StrAppend(
      &s, absl::StrFormat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
                          "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" "
                          "font-size=\"12\">\n",
                          kWidth, height, kWidth, height));
  absl::StrAppend(
      &s, absl::StrFormat("<defs><pattern id=\"recompute\" width=\"4\" height=\"4\" "
                          "patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
                          "<rect width=\"2\" height=\"4\" fill=\"white\" fill-opacity=\"0.6\"/>"
                          "</pattern></defs>\n"));
  absl::StrAppend(&s, absl::StrFormat("<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n",
                                      kWidth, height));
  absl::StrAppend(
      &s, absl::StrFormat(
              "<text x=\"%.0f\" y=\"20\" font-size=\"14\" font-weight=\"bold\">%s: device memory "
              "over one step (%s, %d tokens, peak %s of %s, step %s)</text>\n",
              kLeft, Escape(plan.model), Escape(plan.hardware), plan.seq_len,
              FormatBytes(sim.peak_bytes), FormatBytes(plan.gpu_budget_bytes),
              TimeLabel(sim.step_seconds, sim.step_seconds)));
  absl::StrAppend(
      &s, absl::StrFormat("<text x=\"%.0f\" y=\"38\" fill=\"#555\">%sfixed memory (weights, "
                          "gradients, optimizer state, workspaces) %s; the axis starts at %g GiB"
                          "</text>\n",
                          kLeft,
                          plan.fits ? ""
                                    : "<tspan fill=\"#d62728\" font-weight=\"bold\">DOES NOT "
                                      "FIT: the closest plan</tspan>; ",
                          FormatBytes(step.fixed.total()), y_min_gib));
  // Grid and ticks: 1-2-5 steps, at most 7 labels per axis.
  for (double g = y_min_gib; g <= y_max_gib + gib_step * 1e-6; g += gib_step) {
    absl::StrAppend(&s, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                                        "stroke=\"#e0e0e0\"/>\n",
                                        kLeft, y(g * kGiB), kLeft + plot_w, y(g * kGiB)));
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g GiB"
                                        "</text>\n",
                                        kLeft - 6, y(g * kGiB) + 4, g));
  }
  const double t_tick = NiceStep(t_max, 8);
  for (double t = 0; t <= t_max * (1 + 1e-9); t += t_tick) {
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s"
                                        "</text>\n",
                                        x(t), kTop + kPlotH + 16, TimeLabel(t, t_max)));
  }
  absl::StrAppend(&s, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                                      "stroke=\"black\"/>\n",
                                      kLeft, kTop + kPlotH, kLeft + plot_w, kTop + kPlotH));
  // Memory as a step function, filled down to the axis.
  std::string points = absl::StrFormat("%.1f,%.1f", x(0), y(y_min));
  double last_bytes = sim.timeline.empty() ? fixed : static_cast<double>(sim.timeline[0].bytes);
  for (const MemoryPoint& m : sim.timeline) {
    absl::StrAppend(&points, absl::StrFormat(" %.1f,%.1f %.1f,%.1f", x(m.seconds), y(last_bytes),
                                             x(m.seconds), y(static_cast<double>(m.bytes))));
    last_bytes = static_cast<double>(m.bytes);
  }
  absl::StrAppend(&points, absl::StrFormat(" %.1f,%.1f %.1f,%.1f", x(t_max), y(last_bytes),
                                           x(t_max), y(y_min)));
  absl::StrAppend(&s, absl::StrFormat("<polygon points=\"%s\" fill=\"#a0cbe8\" "
                                      "stroke=\"#4e79a7\" stroke-width=\"1\"/>\n",
                                      points));
  // Fixed memory: the band from the axis up to it.
  absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                                      "fill=\"#bdbdbd\" fill-opacity=\"0.85\"/>\n",
                                      kLeft, y(fixed), plot_w, y(y_min) - y(fixed)));
  if (y(y_min) - y(fixed) >= 14) {
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" fill=\"#333\">fixed %s"
                                        "</text>\n",
                                        kLeft + 6, y(fixed) + 13, FormatBytes(step.fixed.total())));
  }
  // Budget and peak.
  const double by = y(static_cast<double>(plan.gpu_budget_bytes));
  absl::StrAppend(&s, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                                      "stroke=\"#d62728\" stroke-width=\"2\" "
                                      "stroke-dasharray=\"6,4\"/>\n",
                                      kLeft, by, kLeft + plot_w, by));
  // Note [Plans that do not fit]: the closest plan's excess over the budget, shaded and named.
  const bool gpu_exceeded = !plan.fits && plan.binding.budget == "gpu";
  if (gpu_exceeded) {
    const double peak_y = y(static_cast<double>(sim.peak_bytes));
    absl::StrAppend(&s, absl::StrFormat("<rect class=\"exceeded\" x=\"%.1f\" y=\"%.1f\" "
                                        "width=\"%.1f\" height=\"%.1f\" fill=\"#d62728\" "
                                        "fill-opacity=\"0.12\"/>\n",
                                        kLeft, peak_y, plot_w, std::max(by - peak_y, 1.0)));
  }
  const std::string budget_label =
      !plan.fits
          ? absl::StrCat("budget ", FormatBytes(plan.gpu_budget_bytes),
                         gpu_exceeded ? absl::StrCat(" exceeded by ",
                                                     FormatBytes(plan.binding.exceeded_by_bytes),
                                                     " (", plan.binding.what, ")")
                                      : absl::StrCat("; host budget exceeded by ",
                                                     FormatBytes(plan.binding.exceeded_by_bytes)))
          : absl::StrCat("budget ", FormatBytes(plan.gpu_budget_bytes));
  absl::StrAppend(&s,
                  absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" "
                                  "fill=\"#d62728\"%s>%s</text>\n",
                                  kLeft + plot_w - 4, by + (gpu_exceeded ? 15 : -5),
                                  plan.fits ? "" : " font-weight=\"bold\"", Escape(budget_label)));
  const double px = x(sim.peak_seconds), py = y(static_cast<double>(sim.peak_bytes));
  const bool label_left = px > kLeft + plot_w - 120;  // keep the label inside the plot
  absl::StrAppend(
      &s,
      absl::StrFormat("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#d62728\"/>\n"
                      "<text x=\"%.1f\" y=\"%.1f\" fill=\"#333\" text-anchor=\"%s\">peak %s "
                      "(%s)</text>\n",
                      px, py, label_left ? px - 6 : px + 6, py - 6, label_left ? "end" : "start",
                      FormatBytes(sim.peak_bytes), Escape(sim.peak_at)));
  // Lanes: compute (each layer coloured by its policy, forward solid, recompute hatched,
  // backward lighter, labelled with its index where it is wide enough), D2H, H2D.
  const char* lane_names[] = {"compute", "D2H", "H2D"};
  for (int lane = 0; lane < lanes; ++lane) {
    const double lane_y = lanes_top + lane * (kLaneH + kLaneGap);
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s"
                                        "</text>\n",
                                        kLeft - 6, lane_y + 13, lane_names[lane]));
    absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                                        "height=\"%.1f\" fill=\"#f4f4f4\"/>\n",
                                        kLeft, lane_y, plot_w, kLaneH));
  }
  auto block = [&](double start, double end, double lane_y, const char* color, double opacity,
                   const char* fill_extra) {
    const double w = std::max(x(end) - x(start), 0.3);
    absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                                        "height=\"%.1f\" fill=\"%s\" fill-opacity=\"%.2f\"/>\n",
                                        x(start), lane_y, w, kLaneH, color, opacity));
    if (fill_extra != nullptr) {
      absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                                          "height=\"%.1f\" fill=\"%s\"/>\n",
                                          x(start), lane_y, w, kLaneH, fill_extra));
    }
  };
  for (const ComputeInterval& c : sim.compute) {
    const LayerPlan* lp = c.layer >= 0 && c.layer < static_cast<int>(plan.layers.size())
                              ? &plan.layers[c.layer]
                              : nullptr;
    const char* color = lp != nullptr ? PolicyColor(lp->policy) : "#bab0ac";
    if (c.phase == Phase::kBackward && lp != nullptr && lp->recompute_seconds > 0) {
      const double split = std::min(c.end, c.start + lp->recompute_seconds);
      block(c.start, split, lanes_top, color, 0.75, "url(#recompute)");
      block(split, c.end, lanes_top, color, 0.55, nullptr);
    } else {
      block(c.start, c.end, lanes_top, color, c.phase == Phase::kBackward ? 0.55 : 1.0, nullptr);
    }
    // The layer's index (an MTP layer's name) where the block has room for it.
    const std::string index = lp != nullptr && !lp->name.empty() ? lp->name : absl::StrCat(c.layer);
    if (lp != nullptr && x(c.end) - x(c.start) >= 6.5 * static_cast<double>(index.size()) + 3) {
      absl::StrAppend(&s, absl::StrFormat("<text x=\"%.2f\" y=\"%.1f\" font-size=\"10\" "
                                          "text-anchor=\"middle\" fill=\"#222\">%s</text>\n",
                                          (x(c.start) + x(c.end)) / 2, lanes_top + 13, index));
    }
    if (c.stall > 0) {
      const double w = std::max(kMinMarkWidth, x(c.start) - x(c.start - c.stall));
      absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                                          "height=\"%.1f\" fill=\"#d62728\"/>\n",
                                          x(c.start) - w, lanes_top, w, kLaneH));
    }
  }
  for (const CopyInterval& c : sim.copies) {
    const double lane_y = lanes_top + (c.d2h ? 1 : 2) * (kLaneH + kLaneGap);
    absl::StrAppend(
        &s, absl::StrFormat("<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                            "height=\"%.1f\" fill=\"%s\"/>\n",
                            x(c.start), lane_y, std::max(kMinMarkWidth, x(c.end) - x(c.start)),
                            kLaneH, c.d2h ? "#8c564b" : "#17becf"));
  }
  for (size_t i = 0; i < legend.size(); ++i) {
    const auto& [color, label] = legend[i];
    const auto [ex, ey] = legend_at[i];
    absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" "
                                        "fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                                        ex, ey - 9, color, ex + 14, ey, Escape(label)));
  }
  absl::StrAppend(&s, "</svg>\n");
  return s;
}

std::string RenderStepTraceJson(const Plan& plan, const OptimizeResult& result) {
  const SimResult& sim = result.sim;
  StepTraceInput trace;
  trace.process_name = absl::StrFormat("predicted: stowage plan (%s, %s, %d tokens)", plan.model,
                                       plan.hardware, plan.seq_len);
  auto layer_plan = [&](int layer) -> const LayerPlan* {
    return layer >= 0 && layer < static_cast<int>(plan.layers.size()) ? &plan.layers[layer]
                                                                      : nullptr;
  };
  for (const ComputeInterval& c : sim.compute) {
    const LayerPlan* lp = layer_plan(c.layer);
    const std::string policy = lp ? std::string(LayerPolicyName(lp->policy)) : "";
    const std::string index = absl::StrCat(c.layer);
    switch (c.phase) {
      case Phase::kEmbedding:
        trace.compute.push_back({"embedding", -1, "", c.start, c.end});
        break;
      case Phase::kTail:
        trace.compute.push_back({"LM head + loss", -1, "", c.start, c.end});
        break;
      case Phase::kForward:
        trace.compute.push_back({"forward " + index, c.layer, policy, c.start, c.end});
        break;
      case Phase::kBackward: {
        // The simulator runs a layer's recompute and backward as one interval, recompute first.
        const double recompute = lp ? std::min(lp->recompute_seconds, c.end - c.start) : 0;
        if (recompute > 0) {
          trace.compute.push_back(
              {"recompute " + index, c.layer, policy, c.start, c.start + recompute});
        }
        trace.compute.push_back({"backward " + index, c.layer, policy, c.start + recompute, c.end});
        break;
      }
    }
    if (c.stall > 0 && c.layer >= 0) trace.stalls.push_back({c.layer, c.start - c.stall, c.start});
  }
  for (const StepEvent& e : sim.events) {
    trace.events.push_back({e.kind, e.layer, e.bytes, 0, e.seconds});
  }
  for (const MemoryPoint& m : sim.timeline) trace.device_bytes.push_back({m.seconds, m.bytes});
  return StepTraceJson(trace);
}

}  // namespace stowage::planner
