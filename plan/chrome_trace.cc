#include "plan/chrome_trace.h"

#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace stowage {
namespace {

// Thread ids of the tracks (Note [Step trace tracks]); the sort index keeps this order on screen.
// Lane k of a copy track is thread kD2H + k (kH2D + k).
enum Track : int { kCompute = 1, kStall = 2, kWaits = 3, kD2H = 100, kH2D = 200 };
constexpr size_t kMaxLanes = 99;  // beyond it, spans share the last lane

double Micros(double seconds) { return seconds * 1e6; }

void NameTrack(int pid, int tid, const std::string& name, nlohmann::json& out) {
  out.push_back({{"name", "thread_name"},
                 {"ph", "M"},
                 {"pid", pid},
                 {"tid", tid},
                 {"args", {{"name", name}}}});
  out.push_back({{"name", "thread_sort_index"},
                 {"ph", "M"},
                 {"pid", pid},
                 {"tid", tid},
                 {"args", {{"sort_index", tid}}}});
}

nlohmann::json Span(int pid, int tid, std::string name, double start, double end,
                    nlohmann::json args) {
  return {{"name", std::move(name)},
          {"ph", "X"},
          {"pid", pid},
          {"tid", tid},
          {"ts", Micros(start)},
          {"dur", Micros(std::max(0.0, end - start))},
          {"args", std::move(args)}};
}

struct CopySpan {
  double start = 0, end = 0;
  std::string name;
  nlohmann::json args;
};

// Greedy interval packing: each span, by start, goes to the first lane free by then.
void EmitLanes(int pid, int track, const char* label, std::vector<CopySpan> spans,
               nlohmann::json& out) {
  std::stable_sort(spans.begin(), spans.end(),
                   [](const CopySpan& a, const CopySpan& b) { return a.start < b.start; });
  std::vector<double> lane_end;
  NameTrack(pid, track, label, out);
  for (CopySpan& span : spans) {
    size_t lane = 0;
    while (lane < lane_end.size() && lane_end[lane] > span.start) ++lane;
    if (lane == lane_end.size()) {
      if (lane_end.size() < kMaxLanes) {
        if (lane > 0)
          NameTrack(pid, track + static_cast<int>(lane), absl::StrCat(label, " ", lane + 1), out);
        lane_end.push_back(0);
      } else {
        lane = kMaxLanes - 1;
      }
    }
    lane_end[lane] = std::max(lane_end[lane], span.end);
    out.push_back(Span(pid, track + static_cast<int>(lane), std::move(span.name), span.start,
                       span.end, std::move(span.args)));
  }
}

// A step event's args: its layer and bytes, and the tensor and its microbatch when known.
nlohmann::json EventArgs(const TraceStepEvent& e) {
  nlohmann::json args = {{"layer", e.layer}, {"bytes", e.bytes}};
  if (e.id != 0) args["tensor"] = e.id;
  if (e.microbatch >= 0) args["microbatch"] = e.microbatch;
  return args;
}

CopySpan MakeCopySpan(const TraceStepEvent& issue, double end, bool landed, const char* what) {
  nlohmann::json args = EventArgs(issue);
  if (!landed) args["landed"] = false;
  return CopySpan{issue.seconds, std::max(end, issue.seconds), absl::StrCat(what, " ", issue.layer),
                  std::move(args)};
}

// Pairs each issue with its landing: by tensor id when the events carry ids, else by layer in
// issue order (the simulator's events are per layer).
void CopySpans(int pid, const std::vector<TraceStepEvent>& events, nlohmann::json& out) {
  using Key = std::pair<int, uint64_t>;  // (layer or -1, id)
  std::map<Key, std::deque<const TraceStepEvent*>> open_d2h, open_h2d;
  std::vector<CopySpan> d2h, h2d;
  auto key = [](const TraceStepEvent& e) { return e.id != 0 ? Key{-1, e.id} : Key{e.layer, 0}; };
  double last = 0;
  for (const TraceStepEvent& e : events) last = std::max(last, e.seconds);
  for (const TraceStepEvent& e : events) {
    switch (e.kind) {
      case StepEventKind::kSaveIssued:
        open_d2h[key(e)].push_back(&e);
        break;
      case StepEventKind::kPrefetchIssued:
        open_h2d[key(e)].push_back(&e);
        break;
      case StepEventKind::kSaveLanded:
      case StepEventKind::kPrefetchLanded: {
        const bool is_d2h = e.kind == StepEventKind::kSaveLanded;
        auto& open = is_d2h ? open_d2h : open_h2d;
        auto it = open.find(key(e));
        if (it == open.end() || it->second.empty()) break;  // a landing without its issue
        (is_d2h ? d2h : h2d)
            .push_back(
                MakeCopySpan(*it->second.front(), e.seconds, true, is_d2h ? "save" : "prefetch"));
        it->second.pop_front();
        break;
      }
      case StepEventKind::kSaveWait:
      case StepEventKind::kRestore: {
        nlohmann::json args = EventArgs(e);
        out.push_back({{"name", absl::StrCat(std::string(StepEventKindName(e.kind)), " ", e.layer)},
                       {"ph", "i"},
                       {"s", "t"},
                       {"pid", pid},
                       {"tid", kWaits},
                       {"ts", Micros(e.seconds)},
                       {"args", std::move(args)}});
        break;
      }
    }
  }
  for (auto& [k, issues] : open_d2h) {
    for (const TraceStepEvent* issue : issues)
      d2h.push_back(MakeCopySpan(*issue, last, false, "save"));
  }
  for (auto& [k, issues] : open_h2d) {
    for (const TraceStepEvent* issue : issues) {
      h2d.push_back(MakeCopySpan(*issue, last, false, "prefetch"));
    }
  }
  EmitLanes(pid, kD2H, "D2H", std::move(d2h), out);
  EmitLanes(pid, kH2D, "H2D", std::move(h2d), out);
}

}  // namespace

std::string StepTraceJson(const StepTraceInput& input) {
  const int pid = input.pid;
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"args", {{"name", input.process_name}}}});
  NameTrack(pid, kCompute, "compute", events);
  NameTrack(pid, kStall, "stall", events);
  NameTrack(pid, kWaits, "waits", events);
  for (const TraceSpan& c : input.compute) {
    nlohmann::json args = nlohmann::json::object();
    if (c.layer >= 0) args["layer"] = c.layer;
    if (!c.policy.empty()) args["policy"] = c.policy;
    events.push_back(Span(pid, kCompute, c.name, c.start_seconds, c.end_seconds, std::move(args)));
  }
  for (const TraceStall& s : input.stalls) {
    events.push_back(Span(pid, kStall, absl::StrCat("wait for prefetch ", s.layer), s.start_seconds,
                          s.end_seconds, {{"layer", s.layer}}));
  }
  CopySpans(pid, input.events, events);
  for (const TraceMemoryPoint& m : input.device_bytes) {
    events.push_back({{"name", "device memory"},
                      {"ph", "C"},
                      {"pid", pid},
                      {"ts", Micros(m.seconds)},
                      {"args", {{"bytes", m.bytes}}}});
  }
  nlohmann::json root = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return root.dump(1) + "\n";
}

}  // namespace stowage
