// Simulator ≡ runtime, in C++: a measured profile is evaluated through the C ABI
// (stowage_plan_evaluate: the one simulator), the plan it returns is carried out on the host
// backend by a driver that does what the PyTorch wrapper does (Note [Runtime protocol], reading
// only the plan's fields), and the runtime's trace must show the calls in the predicted order
// with the predicted bytes per layer. Times are never compared. tests/python/package/test_trace.py
// does the same with real torch layers.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "planner/frameworks/layer_profile.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"
#include "tests/runtime/test_plans.h"

namespace {

using nlohmann::json;

stowage_options HostOptions() {
  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_HOST;
  options.copy_threads = 1;
  options.metrics_address = "";
  return options;
}

// Six layers, MLP blocks and attention blocks alternating, each saving its input and two module
// tensors (so selective recompute has modules to choose from); sizes differ per layer so a byte
// count names its layer. Copies at 1 GB/s.
std::string ProfileJson() {
  stowage::planner::LayerProfileSet p;
  p.generator = "trace_test";
  p.device = "cpu";
  p.tokens = 64;
  p.loss_peak_bytes = 4096;
  p.loss_seconds = 0.001;
  p.d2h_bytes_per_second = 1e9;
  p.h2d_bytes_per_second = 1e9;
  p.bidir_d2h_bytes_per_second = 1e9;
  p.bidir_h2d_bytes_per_second = 1e9;
  p.copy_chunk_bytes = 64 << 10;
  for (int i = 0; i < 6; ++i) {
    stowage::planner::ProfileLayer l;
    l.index = i;
    const bool attention = i % 2 == 1;
    l.type = attention ? "Attention" : "Mlp";
    const uint64_t unit = 1024 * static_cast<uint64_t>(i + 1);
    l.input_bytes = 4 * unit;
    l.output_bytes = 4 * unit;
    const std::string a = attention ? "attn" : "fc1";
    const std::string b = attention ? "proj" : "act";
    l.saved = {{"input", 4 * unit, ""}, {a + ".out", 8 * unit, a}, {b + ".out", 2 * unit, b}};
    l.modules = {{a, 0.002}, {b, 0.001}};
    l.forward_peak_bytes = 20 * unit;
    l.backward_peak_bytes = 30 * unit;
    l.forward_seconds = 0.003;
    l.backward_seconds = 0.006;
    p.layers.push_back(l);
  }
  return stowage::planner::ProfileToJson(p);
}

std::string Call(stowage_status status, const char* what) {
  return status == STOWAGE_OK ? "" : absl::StrCat(what, ": ", stowage_last_error());
}

// One event as compared: the kind's name, the layer, the bytes (summed over a layer's tensors).
using Event = std::tuple<std::string, int, uint64_t>;

bool Landed(const std::string& kind) { return kind == "save_landed" || kind == "prefetch_landed"; }

// What the simulator predicted: the calls in order, and the landed bytes per (kind, layer).
struct Expected {
  std::vector<Event> calls;
  std::map<std::pair<std::string, int>, uint64_t> landed;
};

Expected FromSimulator(const json& events) {
  Expected out;
  for (const json& e : events) {
    const std::string kind = e.at("kind").get<std::string>();
    const int layer = e.at("layer").get<int>();
    const uint64_t bytes = e.at("bytes").get<uint64_t>();
    if (Landed(kind)) {
      out.landed[{kind, layer}] += bytes;
    } else {
      out.calls.emplace_back(kind, layer, bytes);
    }
  }
  return out;
}

// The runtime's trace in the same shape: per-tensor calls of one kind and layer in a row merge
// into one (the simulator speaks of layers). Also checks each landing follows its issue.
Expected FromTrace(const std::vector<stowage_trace_event>& trace) {
  Expected out;
  std::map<std::pair<int, stowage_tensor_id>, uint64_t> issued_at;  // (direction, id) -> seq
  for (size_t i = 0; i < trace.size(); ++i) {
    const stowage_trace_event& e = trace[i];
    EXPECT_EQ(e.seq, i) << "sequence numbers are gapless from 0";
    const std::string kind = stowage_event_kind_name(e.kind);
    const int direction = kind.rfind("save", 0) == 0 ? 0 : 1;
    if (kind == "save_issued" || kind == "prefetch_issued") issued_at[{direction, e.id}] = e.seq;
    if (Landed(kind)) {
      auto it = issued_at.find({direction, e.id});
      EXPECT_TRUE(it != issued_at.end() && it->second < e.seq)
          << kind << " of tensor " << e.id << " before its issue";
      out.landed[{kind, e.layer}] += e.bytes;
      continue;
    }
    if (!out.calls.empty() && std::get<0>(out.calls.back()) == kind &&
        std::get<1>(out.calls.back()) == e.layer) {
      std::get<2>(out.calls.back()) += e.bytes;
    } else {
      out.calls.emplace_back(kind, e.layer, e.bytes);
    }
  }
  return out;
}

std::string Text(const std::vector<Event>& events) {
  std::string out;
  for (const auto& [kind, layer, bytes] : events) {
    absl::StrAppend(&out, kind, "(", layer, ",", bytes, ") ");
  }
  return out;
}

// One step of `plan` as the PyTorch wrapper runs it, reading only the plan's protocol fields.
// Device memory is host memory here (host backend); every tensor gets its own buffer.
std::string RunStep(stowage_runtime* rt, const stowage::Plan& plan) {
  const int n = static_cast<int>(plan.layers.size());
  std::vector<std::vector<std::vector<std::byte>>> device(n), restored(n);
  std::vector<std::vector<stowage_tensor_id>> ids(n);
  std::vector<bool> waited(n, false);
  if (auto e = Call(stowage_begin_step(rt), "begin_step"); !e.empty()) return e;
  auto wait_before = [&](int j) -> std::string {
    for (int i = 0; i < n; ++i) {
      if (plan.layers[i].save_wait_before_layer != j || waited[i]) continue;
      waited[i] = true;
      for (stowage_tensor_id id : ids[i]) {
        if (auto e = Call(stowage_save_wait(rt, id), "save_wait"); !e.empty()) return e;
      }
      device[i].clear();  // the device blocks are free from here on
    }
    return "";
  };
  for (int i = 0; i < n; ++i) {
    if (auto e = wait_before(i); !e.empty()) return e;
    for (const stowage::PlannedTransfer& t : plan.layers[i].transfers) {
      device[i].emplace_back(t.bytes, std::byte{static_cast<unsigned char>(i + 1)});
      stowage_tensor_id id = 0;
      if (auto e =
              Call(stowage_save(rt, i, device[i].back().data(), t.bytes, nullptr, &id), "save");
          !e.empty())
        return e;
      ids[i].push_back(id);
    }
  }
  if (auto e = wait_before(n); !e.empty()) return e;  // backward starts
  for (int j = n - 1; j >= 0; --j) {
    for (int k = n - 1; k >= 0; --k) {  // highest layer first
      if (plan.layers[k].prefetch_after_layer != j) continue;
      for (size_t t = 0; t < ids[k].size(); ++t) {
        restored[k].emplace_back(plan.layers[k].transfers[t].bytes);
        if (auto e = Call(stowage_prefetch(rt, ids[k][t], restored[k].back().data(), nullptr),
                          "prefetch");
            !e.empty())
          return e;
      }
    }
    for (size_t t = 0; t < ids[j].size(); ++t) {
      if (restored[j].size() <= t) restored[j].emplace_back(plan.layers[j].transfers[t].bytes);
      if (auto e = Call(stowage_restore(rt, ids[j][t], restored[j][t].data(), nullptr), "restore");
          !e.empty())
        return e;
      if (restored[j][t].front() != std::byte{static_cast<unsigned char>(j + 1)}) {
        return absl::StrCat("layer ", j, " came back different");
      }
    }
  }
  return Call(stowage_end_step(rt), "end_step");
}

std::vector<stowage_trace_event> Trace(stowage_runtime* rt, uint64_t* dropped) {
  size_t count = 0;
  EXPECT_EQ(stowage_get_trace(rt, nullptr, 0, &count, dropped), STOWAGE_OK);
  std::vector<stowage_trace_event> trace(count);
  EXPECT_EQ(stowage_get_trace(rt, trace.data(), trace.size(), &count, dropped), STOWAGE_OK);
  EXPECT_EQ(count, trace.size());
  return trace;
}

// The assignments: every policy, offloading layers next to each other and apart, the last layer
// offloading (its prefetch and its save wait are both at backward start) and not.
const std::vector<std::vector<std::string>> kAssignments = {
    {"offload_input", "offload_saved", "keep", "recompute", "selective_recompute", "offload_input"},
    {"offload_saved", "offload_saved", "offload_saved", "offload_input", "offload_input",
     "offload_saved"},
    {"keep", "offload_input", "selective_recompute", "offload_saved", "recompute", "keep"},
    {"recompute", "keep", "offload_saved", "offload_input", "offload_saved", "recompute"},
};

TEST(TraceMatchesSimulator, EveryPolicyAndPrefetchDistance) {
  const json profile = json::parse(ProfileJson());
  for (size_t a = 0; a < kAssignments.size(); ++a) {
    for (int distance = 1; distance <= 4; ++distance) {
      SCOPED_TRACE(absl::StrCat("assignment ", a, ", prefetch distance ", distance));
      json request = {{"profile", profile}, {"prefetch_distance", distance}};
      json layers = json::array();
      for (const std::string& policy : kAssignments[a]) {
        json layer = {{"policy", policy}};
        if (policy == "selective_recompute") {
          layer["recompute_modules"] = json::array({"proj"});
          if (layers.size() % 2 == 0) layer["recompute_modules"] = json::array({"act"});
        }
        layers.push_back(layer);
      }
      request["layers"] = layers;
      const std::string text = request.dump();
      char* result = nullptr;
      ASSERT_EQ(stowage_plan_evaluate(text.data(), text.size(), &result), STOWAGE_OK)
          << stowage_last_error();
      const json evaluated = json::parse(result);
      stowage_free_string(result);
      const std::string plan_json = evaluated.at("plan").dump();
      auto plan = stowage::ParsePlanJson(plan_json);
      ASSERT_TRUE(plan.ok()) << plan.status();

      stowage_options options = HostOptions();
      stowage_runtime* rt = nullptr;
      ASSERT_EQ(stowage_create(plan_json.data(), plan_json.size(), &options, &rt), STOWAGE_OK)
          << stowage_last_error();
      ASSERT_EQ(stowage_set_trace_capacity(rt, 1024), STOWAGE_OK);
      for (int step = 0; step < 2; ++step) {  // the trace is per step: the second is the same
        ASSERT_EQ(RunStep(rt, *plan), "");
        uint64_t dropped = 1;
        const Expected got = FromTrace(Trace(rt, &dropped));
        EXPECT_EQ(dropped, 0u);
        const Expected want = FromSimulator(evaluated.at("events"));
        EXPECT_EQ(Text(got.calls), Text(want.calls));
        EXPECT_EQ(got.landed, want.landed);
        EXPECT_FALSE(want.calls.empty());
      }
      EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
    }
  }
}

TEST(Trace, OffByDefaultAndOnlyBetweenSteps) {
  const std::string plan = stowage::PlanToJson(stowage::testing::MakeTestPlan(2, 4096));
  stowage_options options = HostOptions();
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_OK);
  std::vector<std::byte> src(4096), dst(4096);
  ASSERT_EQ(stowage_begin_step(rt), STOWAGE_OK);
  EXPECT_EQ(stowage_set_trace_capacity(rt, 8), STOWAGE_ERROR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(stowage_last_error()).find("between steps"), std::string::npos);
  stowage_tensor_id id = 0;
  ASSERT_EQ(stowage_save(rt, 0, src.data(), src.size(), nullptr, &id), STOWAGE_OK);
  ASSERT_EQ(stowage_restore(rt, id, dst.data(), nullptr), STOWAGE_OK);
  ASSERT_EQ(stowage_end_step(rt), STOWAGE_OK);
  size_t count = 99;
  ASSERT_EQ(stowage_get_trace(rt, nullptr, 0, &count, nullptr), STOWAGE_OK);
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(stowage_get_trace(rt, nullptr, 4, &count, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_get_trace(rt, nullptr, 0, nullptr, nullptr), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stowage_set_trace_capacity(rt, (size_t{1} << 20) + 1), STOWAGE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stowage_last_error()).find("allowed: 0 (off) to 1048576"),
            std::string::npos);
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
  EXPECT_STREQ(stowage_event_kind_name(STOWAGE_EVENT_SAVE_WAIT), "save_wait");
  EXPECT_STREQ(stowage_event_kind_name(STOWAGE_EVENT_RESTORE), "restore");
  EXPECT_STREQ(stowage_event_kind_name(6), "unknown");
  EXPECT_STREQ(stowage_event_kind_name(-1), "unknown");
}

// Past its capacity a step's trace stores nothing more and counts what it dropped; the next step
// starts again from sequence number 0.
TEST(Trace, CapacityBoundsAStepAndCountsTheRest) {
  const std::string plan = stowage::PlanToJson(stowage::testing::MakeTestPlan(1, 4 * 1024));
  stowage_options options = HostOptions();
  stowage_runtime* rt = nullptr;
  ASSERT_EQ(stowage_create(plan.data(), plan.size(), &options, &rt), STOWAGE_OK);
  ASSERT_EQ(stowage_set_trace_capacity(rt, 3), STOWAGE_OK);
  std::vector<std::byte> src(4 * 1024), dst(4 * 1024);
  for (int step = 0; step < 2; ++step) {
    ASSERT_EQ(stowage_begin_step(rt), STOWAGE_OK);
    stowage_tensor_id ids[4];
    for (int t = 0; t < 4; ++t) {
      ASSERT_EQ(stowage_save(rt, 0, src.data() + t * 1024, 1024, nullptr, &ids[t]), STOWAGE_OK);
      ASSERT_EQ(stowage_save_wait(rt, ids[t]), STOWAGE_OK);
    }
    for (int t = 0; t < 4; ++t) {
      ASSERT_EQ(stowage_restore(rt, ids[t], dst.data() + t * 1024, nullptr), STOWAGE_OK);
    }
    ASSERT_EQ(stowage_end_step(rt), STOWAGE_OK);
    // 4 x (issued, landed, wait) + 4 x (prefetch issued, landed, restore) = 24 events.
    stowage_trace_event out[8];
    size_t count = 0;
    uint64_t dropped = 0;
    ASSERT_EQ(stowage_get_trace(rt, out, 8, &count, &dropped), STOWAGE_OK);
    ASSERT_EQ(count, 3u);
    EXPECT_EQ(dropped, 21u);
    for (size_t i = 0; i < count; ++i) EXPECT_EQ(out[i].seq, i);
    EXPECT_STREQ(stowage_event_kind_name(out[0].kind), "save_issued");
    EXPECT_EQ(out[0].layer, 0);
    EXPECT_EQ(out[0].bytes, 1024u);
    EXPECT_EQ(out[0].id, ids[0]);
  }
  EXPECT_EQ(stowage_destroy(rt), STOWAGE_OK);
}

}  // namespace
