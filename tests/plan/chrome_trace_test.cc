#include "plan/chrome_trace.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace stowage {
namespace {

using nlohmann::json;

std::vector<json> Spans(const json& doc, const std::string& track) {
  std::map<int, std::string> names;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
  }
  std::vector<json> out;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string& name = names[e["tid"].get<int>()];
    if (name.substr(0, name.find(' ')) == track) out.push_back(e);
  }
  return out;
}

TEST(StepTraceJson, PairsCopiesByTensorIdAcrossInterleavedLandings) {
  StepTraceInput in;
  in.pid = 42;
  // Two tensors of layer 0 (microbatches 0 and 1) issued together; the second lands first.
  in.events = {{StepEventKind::kSaveIssued, 0, 100, 7, 0.001, 0},
               {StepEventKind::kSaveIssued, 0, 200, 8, 0.002, 1},
               {StepEventKind::kSaveLanded, 0, 200, 8, 0.004, 1},
               {StepEventKind::kSaveLanded, 0, 100, 7, 0.005, 0},
               {StepEventKind::kSaveWait, 0, 100, 7, 0.006, 0}};
  const json doc = json::parse(StepTraceJson(in));
  const std::vector<json> d2h = Spans(doc, "D2H");
  ASSERT_EQ(d2h.size(), 2u);
  for (const json& s : d2h) {
    EXPECT_EQ(s["pid"], 42);
    if (s["args"]["tensor"] == 7) {
      EXPECT_DOUBLE_EQ(s["ts"].get<double>(), 1000);
      EXPECT_DOUBLE_EQ(s["dur"].get<double>(), 4000);
      EXPECT_EQ(s["args"]["bytes"], 100);
      EXPECT_EQ(s["args"]["microbatch"], 0);
    } else {
      EXPECT_EQ(s["args"]["tensor"], 8);
      EXPECT_EQ(s["args"]["microbatch"], 1);
      EXPECT_DOUBLE_EQ(s["dur"].get<double>(), 2000);
    }
  }
  // They overlap, so they sit on two lanes of the D2H track.
  EXPECT_NE(d2h[0]["tid"], d2h[1]["tid"]);
  int instants = 0;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "i") {
      ++instants;
      EXPECT_EQ(e["name"], "save_wait 0");
      EXPECT_EQ(e["args"]["microbatch"], 0);
    }
  }
  EXPECT_EQ(instants, 1);
}

TEST(StepTraceJson, PairsPerLayerEventsInIssueOrderAndMarksCopiesThatNeverLanded) {
  StepTraceInput in;
  in.events = {{StepEventKind::kPrefetchIssued, 3, 10, 0, 1.0},
               {StepEventKind::kPrefetchIssued, 3, 20, 0, 2.0},
               {StepEventKind::kPrefetchLanded, 3, 10, 0, 3.0},
               {StepEventKind::kRestore, 3, 10, 0, 3.5}};
  const json doc = json::parse(StepTraceJson(in));
  const std::vector<json> h2d = Spans(doc, "H2D");
  ASSERT_EQ(h2d.size(), 2u);
  int landed = 0, open = 0;
  for (const json& s : h2d) {
    EXPECT_FALSE(s["args"].contains("microbatch"));  // per-layer events name none
    if (s["args"].contains("landed")) {
      EXPECT_EQ(s["args"]["landed"], false);
      EXPECT_EQ(s["args"]["bytes"], 20);
      EXPECT_DOUBLE_EQ(s["ts"].get<double>() + s["dur"].get<double>(), 3.5e6);  // the last event
      ++open;
    } else {
      EXPECT_EQ(s["args"]["bytes"], 10);  // the first issue pairs with the first landing
      EXPECT_DOUBLE_EQ(s["dur"].get<double>(), 2e6);
      ++landed;
    }
  }
  EXPECT_EQ(landed, 1);
  EXPECT_EQ(open, 1);
}

TEST(StepTraceJson, ComputeStallsAndMemoryOnTheirTracks) {
  StepTraceInput in;
  in.process_name = "predicted: test";
  in.compute = {{"forward 0", 0, "offload_input", 0, 1}, {"loss", -1, "", 1, 2}};
  in.stalls = {{0, 2, 2.5}};
  in.device_bytes = {{0, 5}, {1, 9}};
  const json doc = json::parse(StepTraceJson(in));
  ASSERT_EQ(Spans(doc, "compute").size(), 2u);
  EXPECT_EQ(Spans(doc, "compute")[0]["args"]["policy"], "offload_input");
  EXPECT_FALSE(Spans(doc, "compute")[1]["args"].contains("layer"));
  ASSERT_EQ(Spans(doc, "stall").size(), 1u);
  EXPECT_DOUBLE_EQ(Spans(doc, "stall")[0]["dur"].get<double>(), 0.5e6);
  int counters = 0;
  bool named = false;
  for (const json& e : doc["traceEvents"]) {
    counters += e["ph"] == "C";
    named |= e["name"] == "process_name" && e["args"]["name"] == "predicted: test";
  }
  EXPECT_EQ(counters, 2);
  EXPECT_TRUE(named);
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
}

}  // namespace
}  // namespace stowage
