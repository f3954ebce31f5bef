#include "planner/search/simulator.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/checked_math.h"

namespace stowage::planner {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

uint64_t InFlight(const StepCost& step, int layer) {
  return layer < static_cast<int>(step.layers.size())
             ? static_cast<uint64_t>(std::max(1, step.layers[layer].in_flight_microbatches))
             : 1;
}

struct MemEvent {
  double time;
  int64_t delta;
  int what;  // >= 0: layer index of a compute op starting; -1 tail; -2 other
  Phase phase;
};

// Note [Events in time order]
// The level's walk needs the memory events by time, frees before allocations at one instant
// (ascending delta). Simulate makes them in time order already: every event is stamped with
// compute's clock `now` at the moment it is made (a forward's or backward's start and end, a
// save's wait — at the later of now and its landing, which then becomes now — a prefetch's
// issue, the tail's start and end), and that clock never goes back. So only the events of one
// instant need ordering, a handful at a time: linear in the layers, where sorting them all was
// n log n per simulation (16% of a 1,000-layer plan's CPU). Events of one instant with the same
// delta keep the order they were made in. Should a later change make an event out of time order,
// the whole list is sorted instead (same order), so the walk never sees one.
void OrderByTime(std::vector<MemEvent>& mem) {
  auto before = [](const MemEvent& a, const MemEvent& b) {
    return a.time != b.time ? a.time < b.time : a.delta < b.delta;
  };
  for (size_t i = 1; i < mem.size(); ++i) {
    if (mem[i].time < mem[i - 1].time) {
      std::stable_sort(mem.begin(), mem.end(), before);
      return;
    }
  }
  for (size_t start = 0; start < mem.size();) {
    size_t end = start + 1;
    while (end < mem.size() && mem[end].time == mem[start].time) ++end;
    // Insertion sort of the instant's events (stable).
    for (size_t i = start + 1; i < end; ++i) {
      const MemEvent e = mem[i];
      size_t j = i;
      for (; j > start && e.delta < mem[j - 1].delta; --j) mem[j] = mem[j - 1];
      mem[j] = e;
    }
    start = end;
  }
}

// Lists of layers keyed by a slot, each layer in at most one: layers in ascending order per slot.
struct Lists {
  std::vector<int> begin;  // slot s: layers[begin[s] .. begin[s + 1])
  std::vector<int> layers;
  struct Range {
    const int* first;
    const int* last;
    const int* begin() const { return first; }
    const int* end() const { return last; }
  };
  struct ReverseRange {
    const int* first;
    const int* last;
    std::reverse_iterator<const int*> begin() const {
      return std::reverse_iterator<const int*>(last);
    }
    std::reverse_iterator<const int*> end() const {
      return std::reverse_iterator<const int*>(first);
    }
  };
  Range In(int slot) const {
    return {layers.data() + begin[slot], layers.data() + begin[slot + 1]};
  }
  ReverseRange InReverse(int slot) const {
    return {layers.data() + begin[slot], layers.data() + begin[slot + 1]};
  }
};

// slot_of(i) for layers 0..n-1: its slot in [0, slots), or -1 for none.
template <typename F>
Lists ListsOf(int slots, int n, F&& slot_of) {
  Lists lists;
  lists.begin.assign(slots + 1, 0);
  std::vector<int> slot(n);
  for (int i = 0; i < n; ++i) {
    slot[i] = slot_of(i);
    if (slot[i] >= 0) ++lists.begin[slot[i] + 1];
  }
  for (int s = 0; s < slots; ++s) lists.begin[s + 1] += lists.begin[s];
  lists.layers.resize(lists.begin[slots]);
  std::vector<int> fill(lists.begin.begin(), lists.begin.end() - 1);
  for (int i = 0; i < n; ++i) {
    if (slot[i] >= 0) lists.layers[fill[slot[i]]++] = i;
  }
  return lists;
}

}  // namespace

std::vector<LayerProtocol> ProtocolFor(const std::vector<OptionCost>& costs, int prefetch_distance,
                                       int save_lag) {
  const int n = static_cast<int>(costs.size());
  std::vector<LayerProtocol> out(n);
  for (int i = 0; i < n; ++i) {
    out[i] = LayerProtocolFor(i, n, costs[i].host_bytes > 0, prefetch_distance, save_lag);
  }
  return out;
}

std::vector<LayerProtocol> ProtocolFor(const StepCost& step, const std::vector<OptionCost>& costs,
                                       int prefetch_distance, int save_lag) {
  if (step.chunks.size() <= 1) return ProtocolFor(costs, prefetch_distance, save_lag);
  // Note [Pipeline stages] (plan.h): the protocol runs within each model chunk of the stage; the
  // step's layers are the chunks' layers in order.
  const int n = static_cast<int>(costs.size());
  std::vector<LayerProtocol> out(n);
  int first = 0;
  for (const LayerRange& chunk : step.chunks) {
    const LayerRange local{first, chunk.num_layers};
    for (int i = first; i < std::min(n, local.end()); ++i) {
      out[i] = LayerProtocolFor(i, local, costs[i].host_bytes > 0, prefetch_distance, save_lag);
    }
    first = local.end();
  }
  return out;
}

BackwardHeld BackwardHeldBytes(const StepCost& step) {
  const int n = static_cast<int>(step.layers.size());
  const bool grads = step.gradients_in_backward;
  auto sum = [](uint64_t a, uint64_t b) { return CheckedAdd(a, b).value_or(~0ull); };
  BackwardHeld held;
  held.in_layer.assign(n, 0);
  uint64_t level = sum(step.held_logits_bytes, grads ? step.tail_grad_bytes : 0);
  for (int j = n - 1; j >= 0; --j) {
    held.in_layer[j] = level;
    const uint64_t shards = static_cast<uint64_t>(std::max(1, step.layer_grad_shards));
    level = sum(level, grads ? (step.layers[j].grad_bytes + shards - 1) / shards : 0);
  }
  // The embedding's backward makes its gradient from the one it receives, the first layer's
  // input's (Note [Gradient timing]: made last in that layer's backward), alive beside it.
  const uint64_t received = n > 0 ? step.layers.front().input_bytes : 0;
  held.at_end = grads ? sum(level, sum(step.embedding_grad_bytes, received)) : level;
  return held;
}

SimResult Simulate(const StepCost& step, const std::vector<OptionCost>& costs,
                   int prefetch_distance, bool record) {
  return Simulate(step, costs, ProtocolFor(step, costs, prefetch_distance), record);
}

SimResult Simulate(const StepCost& step, const std::vector<OptionCost>& costs,
                   const std::vector<LayerProtocol>& protocol, bool record) {
  SimResult r;
  const int n = static_cast<int>(costs.size());
  std::vector<MemEvent> mem;
  mem.reserve(8 * n + 8);
  auto add = [&](double t, int64_t delta, int what, Phase phase) {
    if (delta != 0) mem.push_back({t, delta, what, phase});
  };
  auto event = [&](StepEventKind kind, int layer, double t) {
    if (record) r.events.push_back({kind, layer, costs[layer].host_bytes, t});
  };
  // Who waits for whom (Note [Runtime protocol]): waits_before(j) = the layers whose saves the
  // forward of j (j == n: backward) waits for, in layer order; prefetch_at(j) = the layers
  // prefetched when the backward of j starts, highest first. Each layer is in at most one list of
  // each, so both are one array with offsets (no allocation per layer).
  const Lists waits_before = ListsOf(n + 1, n, [&](int i) {
    return costs[i].host_bytes == 0 ? -1 : std::clamp(protocol[i].save_wait_before_layer, i + 1, n);
  });
  const Lists prefetch_at = ListsOf(n, n, [&](int i) {
    const int at = protocol[i].prefetch_after_layer;
    return costs[i].host_bytes == 0 || at < i || at >= n ? -1 : at;
  });

  std::vector<double> d2h_done(n, 0), h2d_done(n, kNever);
  // Waits for the saves the protocol makes compute wait for at `now`; frees their device bytes
  // when each has landed. Returns the time compute goes on.
  auto wait_for_saves = [&](int at, double now, Phase phase) {
    for (int k : waits_before.In(at)) {
      event(StepEventKind::kSaveWait, k, now);
      now = std::max(now, d2h_done[k]);
      add(now, -static_cast<int64_t>(costs[k].host_bytes), -2, phase);
    }
    return now;
  };

  // Forward.
  double now = step.embedding_seconds / 3;
  if (record) r.compute.push_back({Phase::kEmbedding, -1, 0, now, 0});
  double d2h_free = 0;
  uint64_t others = 0;  // resident bytes of the other in-flight microbatches
  for (int i = 0; i < n; ++i) {
    const OptionCost& c = costs[i];
    const double ready = now;
    now = wait_for_saves(i, now, Phase::kForward);
    r.exposed_copy_seconds += now - ready;
    const double start = now;
    const double end = start + c.forward_seconds;
    add(start, static_cast<int64_t>(c.forward_peak), i, Phase::kForward);
    add(end,
        static_cast<int64_t>(c.resident_bytes + c.host_bytes) -
            static_cast<int64_t>(c.forward_peak),
        -2, Phase::kForward);
    if (c.host_bytes > 0) {
      const double issued = c.save_at_forward_start ? start : end;
      const double copy_start = std::max(issued, d2h_free);
      d2h_done[i] = copy_start + static_cast<double>(c.host_bytes) / step.d2h_bytes_per_second;
      r.copy_seconds += d2h_done[i] - copy_start;
      d2h_free = d2h_done[i];
      event(StepEventKind::kSaveIssued, i, issued);
      event(StepEventKind::kSaveLanded, i, d2h_done[i]);
      if (record) r.copies.push_back({i, true, c.host_bytes, copy_start, d2h_done[i]});
    }
    if (record) r.compute.push_back({Phase::kForward, i, start, end, start - ready});
    now = end;
    // Note [In-flight microbatches] (simulator.h): m copies of the layer's host bytes, and the
    // other m - 1 microbatches' resident bytes on the GPU all step.
    const uint64_t m = InFlight(step, i);
    r.host_bytes =
        CheckedAdd(r.host_bytes, CheckedMul(c.host_bytes, m).value_or(~0ull)).value_or(~0ull);
    others =
        CheckedAdd(others, CheckedMul(c.resident_bytes, m - 1).value_or(~0ull)).value_or(~0ull);
    r.compute_seconds += c.compute_seconds();
    r.exposed_comm_seconds += c.comm_seconds;
  }
  // Note [Checkpoint-held inputs]
  // A checkpoint that holds the step's shared inputs (OptionCost::checkpoint_held_bytes: under
  // hf the attention masks, passed to every checkpointed layer or attention call) keeps them
  // from the forward to its own backward's end, so they are alive in the loss and in the
  // backward of every layer above the lowest such checkpoint, kept layers included, and freed
  // with it. One set per group (LayerCost::checkpoint_held_group: hf, one layer type's mask),
  // held once by however many checkpoints of the group: held_below[j] sums each group's most
  // that a layer below j holds, and j's backward holds that beyond what its own backward_peak
  // counts, less its own group's part that it holds itself.
  std::vector<uint64_t> held_below(n + 1, 0);
  std::vector<uint64_t> own_group_below(n, 0);       // layer j's group's most below j
  std::vector<std::pair<int, uint64_t>> group_most;  // (group, most held below), few groups
  for (int i = 0; i < n; ++i) {
    const int group =
        i < static_cast<int>(step.layers.size()) ? step.layers[i].checkpoint_held_group : 0;
    auto it = std::find_if(group_most.begin(), group_most.end(),
                           [group](const auto& g) { return g.first == group; });
    if (it == group_most.end()) it = group_most.insert(group_most.end(), {group, 0});
    own_group_below[i] = it->second;
    it->second = std::max(it->second, costs[i].checkpoint_held_bytes);
    uint64_t sum = 0;
    for (const auto& g : group_most) sum = CheckedAdd(sum, g.second).value_or(~0ull);
    held_below[i + 1] = sum;
  }
  auto held_beyond = [&](int j) {
    const uint64_t own = std::min(own_group_below[j], costs[j].checkpoint_held_bytes);
    return static_cast<int64_t>(
        std::min<uint64_t>(held_below[j] - own, std::numeric_limits<int64_t>::max()));
  };
  const double tail_start = now;
  const double tail_end = now + step.tail_seconds;
  add(tail_start, static_cast<int64_t>(step.tail_bytes + held_below[n]), -1, Phase::kTail);
  add(tail_end, -static_cast<int64_t>(step.tail_bytes + held_below[n]), -2, Phase::kTail);
  // Note [Gradient timing] (cost_model.cc): the held logits and the gradients made in backward
  // (eager PyTorch) stay to the end of the step; the level around each layer's backward is
  // BackwardHeldBytes', which a layer's backward raises by its gradients when it ends.
  const BackwardHeld held = BackwardHeldBytes(step);
  auto held_at = [&](int j) {  // j = -1: at the end of the step
    return static_cast<int64_t>(std::min<uint64_t>(j >= 0 && j < n ? held.in_layer[j] : held.at_end,
                                                   std::numeric_limits<int64_t>::max()));
  };
  if (n > 0) add(tail_end, held_at(n - 1), -2, Phase::kBackward);
  if (record) r.compute.push_back({Phase::kTail, -1, tail_start, tail_end, 0});
  r.compute_seconds += step.tail_seconds + step.embedding_seconds;
  now = tail_end;

  // Backward. The saves still in flight are waited for when it starts.
  double reach = now;
  now = wait_for_saves(n, now, Phase::kBackward);
  double h2d_free = 0;
  auto issue_h2d = [&](int k, double t) {
    const double copy_start = std::max({t, h2d_free, d2h_done[k]});
    h2d_done[k] = copy_start + static_cast<double>(costs[k].host_bytes) / step.h2d_bytes_per_second;
    r.copy_seconds += h2d_done[k] - copy_start;
    h2d_free = h2d_done[k];
    add(t, static_cast<int64_t>(costs[k].host_bytes), -2, Phase::kBackward);
    event(StepEventKind::kPrefetchIssued, k, t);
    event(StepEventKind::kPrefetchLanded, k, h2d_done[k]);
    if (record) r.copies.push_back({k, false, costs[k].host_bytes, copy_start, h2d_done[k]});
  };
  for (int j = n - 1; j >= 0; --j) {
    const OptionCost& c = costs[j];
    for (int k : prefetch_at.InReverse(j)) issue_h2d(k, now);
    if (c.host_bytes > 0) {
      if (h2d_done[j] == kNever) issue_h2d(j, now);  // no prefetch: the restore issues it
      event(StepEventKind::kRestore, j, now);
      now = std::max(now, h2d_done[j]);
    }
    const double start = now;
    const double end = start + c.recompute_seconds + c.backward_seconds;
    add(start,
        static_cast<int64_t>(c.backward_peak) -
            static_cast<int64_t>(c.resident_bytes + c.host_bytes) + held_beyond(j),
        j, Phase::kBackward);
    add(end, -static_cast<int64_t>(c.backward_peak) - held_beyond(j), -2, Phase::kBackward);
    add(end, held_at(j - 1) - held_at(j), -2, Phase::kBackward);
    const double stall = start - reach;
    r.exposed_copy_seconds += stall;
    if (record) r.compute.push_back({Phase::kBackward, j, start, end, stall});
    now = reach = end;
  }
  const double step_end = now;
  // --optimizer-offload: the step's gradient and weight copies run after the backward.
  r.step_seconds = step_end + step.embedding_seconds * 2 / 3 + step.optimizer_copy_seconds +
                   step.comm.step_exposed_seconds;
  r.exposed_comm_seconds += step.comm.step_exposed_seconds;
  r.host_bytes += step.optimizer_host_bytes;
  if (record) {
    r.compute.push_back({Phase::kEmbedding, -1, step_end, r.step_seconds, 0});
    // The calls were recorded in the order they are made, at non-decreasing times; landings
    // move to their times (before a call at the same instant).
    auto landed = [](const StepEvent& e) {
      return e.kind == StepEventKind::kSaveLanded || e.kind == StepEventKind::kPrefetchLanded;
    };
    std::stable_sort(r.events.begin(), r.events.end(), [&](const StepEvent& a, const StepEvent& b) {
      if (a.seconds != b.seconds) return a.seconds < b.seconds;
      return landed(a) && !landed(b);
    });
  }

  // Device memory: frees before allocations at the same instant (Note [Events in time order]).
  OrderByTime(mem);
  int64_t level = static_cast<int64_t>(std::min<uint64_t>(
      CheckedAdd(step.fixed.total(), others).value_or(~0ull), std::numeric_limits<int64_t>::max()));
  int64_t peak = level;
  r.peak_seconds = 0;
  r.peak_at = "start";
  int current_layer = -1;
  Phase current_phase = Phase::kEmbedding;
  bool peaked = false;  // past the start: the peak is in (peak_layer, peak_phase)
  int peak_layer = -1;
  Phase peak_phase = Phase::kEmbedding;
  if (record) r.timeline.push_back({0, static_cast<uint64_t>(level)});
  for (const MemEvent& e : mem) {
    // Byte counts fit int64 and their sums cannot wrap when the step keeps within
    // CheckStepCostBounds (kMaxStepBytes = 2^62); a step that does not saturates the level
    // (a peak that fits no budget) instead of wrapping to a small one.
    level = CheckedAdd(level, e.delta).value_or(std::numeric_limits<int64_t>::max());
    if (e.what >= 0 || e.what == -1) {
      current_layer = e.what;
      current_phase = e.phase;
    }
    if (level > peak) {
      peak = level;
      r.peak_seconds = e.time;
      peaked = true;
      peak_layer = current_layer;
      peak_phase = current_phase;
    }
    if (record) {
      // Events at one instant merge into one point (the starting point at 0 stays).
      if (r.timeline.size() > 1 && r.timeline.back().seconds == e.time) {
        r.timeline.back().bytes = static_cast<uint64_t>(level);
      } else {
        r.timeline.push_back({e.time, static_cast<uint64_t>(level)});
      }
    }
  }
  r.peak_bytes = static_cast<uint64_t>(peak);
  // Named once, not at every rise of the level (the forward raises it at nearly every layer).
  if (peaked && peak_phase == Phase::kTail) {
    r.peak_at = "LM head and loss";
  } else if (peaked) {
    // An MTP layer by its name (Note [MTP layers] in planner/frameworks/megatron.cc).
    const std::string* name = peak_layer >= 0 &&
                                      peak_layer < static_cast<int>(step.layers.size()) &&
                                      !step.layers[peak_layer].name.empty()
                                  ? &step.layers[peak_layer].name
                                  : nullptr;
    // A layer by its model index (LayerCost::index: a pipeline stage's layers keep theirs), as
    // the plan and the runtime's trace name it.
    const int model_index = peak_layer >= 0 && peak_layer < static_cast<int>(step.layers.size())
                                ? step.layers[peak_layer].index
                                : peak_layer;
    r.peak_at =
        absl::StrCat(peak_phase == Phase::kForward ? "forward" : "backward",
                     name ? " of " : " of layer ", name ? *name : absl::StrCat(model_index));
  }
  return r;
}

SimResult Simulate(const StepCost& step, const Schedule& schedule, bool record) {
  std::vector<OptionCost> costs;
  costs.reserve(step.layers.size());
  for (size_t i = 0; i < step.layers.size(); ++i) {
    costs.push_back(EvaluateOption(step.layers[i], schedule.options[i]));
  }
  return Simulate(step, costs,
                  ProtocolFor(step, costs, schedule.prefetch_distance, schedule.save_lag), record);
}

}  // namespace stowage::planner
