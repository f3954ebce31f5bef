// The plan reader's strictness and the validator's limits: one regression test per bug the reader
// had and per rule ValidatePlan states. Each edits one field of a valid plan's JSON, so the
// test fails if the reader starts accepting the value again.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "stowage/plan.h"

namespace stowage {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

Plan OffloadingPlan() {
  Plan plan;
  plan.generator = "stowage test";
  plan.predicted.peak_device_bytes = 1000;
  plan.predicted.host_bytes_per_gpu = 300;
  plan.runtime.host_arena_bytes = 300;
  plan.runtime.gpus_per_numa_node = 4;
  plan.predicted.host_bytes_per_numa_node = 1200;
  LayerPlan keep;
  keep.index = 0;
  keep.type = "attention+swiglu";
  keep.device_saved_bytes = 500;
  LayerPlan offload;
  offload.index = 1;
  offload.type = "attention+swiglu";
  offload.policy = LayerPolicy::kOffloadSaved;
  offload.host_bytes = 300;
  offload.transfers = {{"a", 200}, {"b", 100}};
  offload.save_wait_before_layer = 2;  // past the last layer: when backward starts
  offload.prefetch_after_layer = 1;
  plan.layers = {keep, offload};
  return plan;
}

Json PlanObject() { return Json::parse(PlanToJson(OffloadingPlan())); }

// The error ParsePlanJson gives for `j` ("" when it accepts it).
std::string ErrorOf(const Json& j) {
  absl::StatusOr<Plan> plan = ParsePlanJson(j.dump());
  return plan.ok() ? "" : std::string(plan.status().message());
}
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<Plan> plan = ParsePlanJson(text);
  return plan.ok() ? "" : std::string(plan.status().message());
}

TEST(PlanReader, TheBasePlanIsValid) { EXPECT_EQ(ErrorOf(PlanObject()), ""); }

TEST(PlanReader, NegativeIsNotReadAs2To64MinusN) {
  Json j = PlanObject();
  j["layers"][0]["device_saved_bytes"] = -1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'layers[0].device_saved_bytes' has value -1; allowed: "
                                    "an integer in [0, 1152921504606846976]"));
  j = PlanObject();
  j["runtime"]["copy_chunk_bytes"] = -1;  // once read as 2^64-1: the runtime hung
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'runtime.copy_chunk_bytes' has value -1"));
}

TEST(PlanReader, FractionIsNotTruncated) {
  Json j = PlanObject();
  j["layers"][1]["transfers"][0]["bytes"] = 1.5;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'layers[1].transfers[0].bytes' has value 1.5"));
  j = PlanObject();
  j["runtime"]["prefetch_distance"] = 2.0;  // integral, but written as a real: still not an integer
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'runtime.prefetch_distance' has value 2.0"));
}

TEST(PlanReader, BoolIsNotOne) {
  Json j = PlanObject();
  j["layers"][1]["index"] = true;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'layers[1].index' has value true"));
  j = PlanObject();
  j["predicted"]["step_seconds"] = false;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'predicted.step_seconds' has value false"));
}

TEST(PlanReader, SchemaVersionIsExact) {
  Json j = PlanObject();
  j["schema_version"] = 1.9;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'schema_version' has value 1.9"));
  j["schema_version"] = 4294967297;  // 2^32 + 1: read as 1 through a 32-bit truncation
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'schema_version' has value 4294967297"));
  j["schema_version"] = "1";
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'schema_version' has value \"1\""));
  j["schema_version"] = 2;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'schema_version' is 2; this runtime reads schema_version 1"));
}

TEST(PlanReader, HugeRealForAnIntegerIsAnErrorNotUndefinedBehaviour) {
  std::string text = PlanObject().dump();
  const std::string field = "\"host_arena_bytes\":300";
  ASSERT_NE(text.find(field), std::string::npos);
  text.replace(text.find(field), field.size(), "\"host_arena_bytes\":1e30");
  EXPECT_THAT(ErrorOf(text), HasSubstr("field 'runtime.host_arena_bytes' has value 1e+30"));
  // An integer literal past 2^64 is a real to the JSON parser: refused the same way.
  text = PlanObject().dump();
  text.replace(text.find(field), field.size(), "\"host_arena_bytes\":18446744073709551616");
  EXPECT_THAT(ErrorOf(text), HasSubstr("field 'runtime.host_arena_bytes' has value"));
}

TEST(PlanReader, TransferSumThatWrapsIsRefused) {
  // A keep layer with transfers [2^64-1, 1]: the sum wrapped to 0 == host_bytes and validated.
  Plan plan = OffloadingPlan();
  plan.layers[0].transfers = {{"a", UINT64_MAX}, {"b", 1}};
  EXPECT_THAT(ValidatePlan(plan).message(),
              HasSubstr("field 'layers[0].transfers[0].bytes' has value 18446744073709551615"));
  Json j = PlanObject();
  j["layers"][0]["transfers"] =
      Json::array({{{"name", "a"}, {"bytes", UINT64_MAX}}, {{"name", "b"}, {"bytes", 1}}});
  EXPECT_THAT(ErrorOf(j),
              HasSubstr("'layers[0].transfers[0].bytes' has value 18446744073709551615"));
  // Within each field's limit, but 17 x 2^60 still passes 2^64: checked, not wrapped.
  plan = OffloadingPlan();
  plan.layers[1].transfers.assign(17, {"x", kPlanMaxBytes});
  EXPECT_THAT(ValidatePlan(plan).message(),
              HasSubstr("'layers[1].transfers' sums past 2^64 bytes"));
}

TEST(PlanReader, HostTotalThatWrapsIsRefused) {
  Plan plan = OffloadingPlan();
  plan.layers.clear();
  for (int i = 0; i < 16; ++i) {  // 16 x 2^60 = 2^64
    LayerPlan l;
    l.index = i;
    l.type = "t";
    l.policy = LayerPolicy::kOffloadInput;
    l.host_bytes = kPlanMaxBytes;
    l.transfers = {{"input", kPlanMaxBytes}};
    plan.layers.push_back(l);
  }
  for (int i = 0; i < 16; ++i) {
    const LayerProtocol p = LayerProtocolFor(i, 16, true, 1, kDefaultSaveLag);
    plan.layers[i].save_wait_before_layer = p.save_wait_before_layer;
    plan.layers[i].prefetch_after_layer = p.prefetch_after_layer;
  }
  plan.predicted.host_bytes_per_numa_node = 0;
  EXPECT_THAT(ValidatePlan(plan).message(),
              HasSubstr("host_bytes sum past 2^64 bytes at layers[15]"));
}

TEST(PlanReader, CopyChunkBytesIsBounded) {
  Json j = PlanObject();
  j["runtime"]["copy_chunk_bytes"] = 1;  // once ~1 GB of RAM for 30 MiB of copies
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'runtime.copy_chunk_bytes' has value 1; allowed: an "
                                    "integer in [4096, 1073741824]"));
  j["runtime"]["copy_chunk_bytes"] = (uint64_t{1} << 30) + 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'runtime.copy_chunk_bytes' has value 1073741825"));
  j["runtime"]["copy_chunk_bytes"] = 0;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'runtime.copy_chunk_bytes' has value 0"));
  for (uint64_t ok : {kPlanMinCopyChunkBytes, kPlanMaxCopyChunkBytes}) {
    j["runtime"]["copy_chunk_bytes"] = ok;
    EXPECT_EQ(ErrorOf(j), "") << ok;
  }
  Plan plan = OffloadingPlan();
  plan.runtime.copy_chunk_bytes = UINT64_MAX;  // the same limit for a plan built in code
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("'runtime.copy_chunk_bytes' has value"));
}

TEST(PlanReader, DuplicateKeysAreRefused) {
  // nlohmann keeps the first copy and Python's json the last: two readers, two plans.
  std::string text = PlanObject().dump();
  text.insert(1, "\"schema_version\":1,");
  EXPECT_THAT(ErrorOf(text), HasSubstr("duplicate key 'schema_version'"));
}

TEST(PlanReader, SyntaxErrorsSayWhere) {
  EXPECT_THAT(ErrorOf(std::string("{\n  \"schema_version\": 1,\n  x")),
              HasSubstr("plan: not valid JSON at line 3, column 3"));
  EXPECT_THAT(ErrorOf(std::string("[1]")), HasSubstr("plan: expected a JSON object, found [1]"));
}

TEST(PlanReader, WrongTypesNameThePath) {
  Json j = PlanObject();
  j["layers"][1]["transfers"] = "input";
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'layers[1].transfers' has value \"input\"; allowed: a "
                                    "JSON array"));
  j = PlanObject();
  j["layers"][1] = 7;
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'layers[1]' has value 7; allowed: a JSON object"));
  j = PlanObject();
  j["runtime"] = Json::array();
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'runtime' has value []"));
  j = PlanObject();
  j["layers"][0]["recompute_modules"] = Json::array({"attn", 3});
  EXPECT_THAT(ErrorOf(j), HasSubstr("field 'layers[0].recompute_modules[1]' has value 3"));
  j = PlanObject();
  j["predicted"].erase("peak_device_bytes");
  EXPECT_THAT(ErrorOf(j), HasSubstr("missing field 'predicted.peak_device_bytes'"));
}

TEST(PlanReader, UnknownFieldsAreIgnored) {
  Json j = PlanObject();
  j["future_field"] = {{"anything", 1.5}};
  j["layers"][0]["future_layer_field"] = -3;
  j["runtime"]["future_setting"] = "x";
  EXPECT_EQ(ErrorOf(j), "");
}

TEST(PlanReader, NonFiniteAndNegativeSecondsAreRefused) {
  Plan plan = OffloadingPlan();
  plan.layers[1].h2d_seconds = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(ValidatePlan(plan).message(), HasSubstr("'layers[1].h2d_seconds' has value nan"));
  Json j = PlanObject();
  j["predicted"]["exposed_copy_seconds"] = -0.5;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'predicted.exposed_copy_seconds' has value -0.5"));
  j = PlanObject();
  j["runtime"]["link_bytes_per_second"] = 1e16;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'runtime.link_bytes_per_second' has value 1e+16"));
}

// Note [Runtime protocol]: the trigger is the protocol's (min(index + distance, last layer)), or
// none (restore on demand).
TEST(PlanValidator, PrefetchAfterLayerIsMinusOneOrAtOrAfterTheLayer) {
  Plan plan = OffloadingPlan();
  plan.layers[1].prefetch_after_layer = 0;  // before the layer's own backward: never issued
  EXPECT_THAT(ValidatePlan(plan).message(),
              HasSubstr("'layers[1].prefetch_after_layer' has value 0; allowed: -1 (restore on "
                        "demand) or 1 (min(index + runtime.prefetch_distance, last layer))"));
  plan.layers[1].prefetch_after_layer = 2;  // past the last layer
  EXPECT_FALSE(ValidatePlan(plan).ok());
  plan.layers[1].prefetch_after_layer = -1;
  EXPECT_TRUE(ValidatePlan(plan).ok());
}

TEST(PlanValidator, HostBytesPerNumaNodeIsPerGpuTimesGpusPerNode) {
  Plan plan = OffloadingPlan();
  plan.predicted.host_bytes_per_numa_node = 300;  // the per-GPU figure under the per-node name
  EXPECT_THAT(ValidatePlan(plan).message(),
              HasSubstr("'predicted.host_bytes_per_numa_node' has value 300; allowed: 0 (not "
                        "stated) or predicted.host_bytes_per_gpu (300) x "
                        "runtime.gpus_per_numa_node (4)"));
  plan.predicted.host_bytes_per_numa_node = 0;
  EXPECT_TRUE(ValidatePlan(plan).ok());
}

TEST(PlanValidator, LimitsOfRunSettings) {
  Json j = PlanObject();
  j["run"]["tp"] = 0;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'run.tp' has value 0; allowed: an integer in [1, 1048576]"));
  j = PlanObject();
  j["runtime"]["gpus_per_numa_node"] = 0;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'runtime.gpus_per_numa_node' has value 0"));
  j = PlanObject();
  j["layers"][1]["ffn_chunks"] = 0;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'layers[1].ffn_chunks' has value 0"));
}

// run.gpus and run.global_batch: the job the plan was made for, when stated. A plan without them
// (written before them) loads as before and keeps its bytes, hence its hash.
TEST(PlanReader, TheJobsGpusAndGlobalBatchAreOptional) {
  const Json old_plan = PlanObject();
  ASSERT_FALSE(old_plan["run"].contains("gpus"));
  ASSERT_FALSE(old_plan["run"].contains("global_batch"));
  absl::StatusOr<Plan> read = ParsePlanJson(old_plan.dump());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->gpus, 0);
  EXPECT_EQ(read->global_batch, 0u);
  EXPECT_EQ(CanonicalPlanHash(*read), CanonicalPlanHash(OffloadingPlan()));

  Plan stated = OffloadingPlan();
  stated.micro_batch = 2;
  stated.gpus = 64;
  stated.global_batch = 256;
  const std::string json = PlanToJson(stated);
  EXPECT_THAT(json, HasSubstr("\"gpus\": 64"));
  EXPECT_THAT(json, HasSubstr("\"global_batch\": 256"));
  absl::StatusOr<Plan> again = ParsePlanJson(json);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->gpus, 64);
  EXPECT_EQ(again->global_batch, 256u);
  EXPECT_NE(CanonicalPlanHash(stated), CanonicalPlanHash(OffloadingPlan()));

  Json j = Json::parse(json);
  j["run"]["global_batch"] = 255;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'run.global_batch' is 255; allowed: 0 (not stated) or a "
                                    "multiple of run.micro_batch x run.microbatches = 2"));
  j = Json::parse(json);
  j["run"]["gpus"] = -1;
  EXPECT_THAT(ErrorOf(j),
              HasSubstr("'run.gpus' has value -1; allowed: an integer in [0, 1048576]"));
  j = Json::parse(json);
  j["run"]["global_batch"] = uint64_t{1} << 41;
  EXPECT_THAT(ErrorOf(j), HasSubstr("'run.global_batch' has value 2199023255552"));
}

}  // namespace
}  // namespace stowage

namespace stowage {
namespace {

TEST(PlanReader, OldFieldNameIsRefusedNamingTheNewOne) {
  Json j = Json::parse(PlanToJson(OffloadingPlan()));
  j["layers"][1]["moe_chunks"] = 2;  // renamed: it chunks dense FFNs too
  EXPECT_THAT(ErrorOf(j), HasSubstr("plan: field 'layers[1].moe_chunks' is now called "
                                    "'ffn_chunks'; rename it in the plan"));
  j["layers"][1].erase("moe_chunks");
  j["layers"][1]["ffn_chunks"] = 2;
  absl::StatusOr<Plan> plan = ParsePlanJson(j.dump());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->layers[1].ffn_chunks, 2);
}

// Limits are checked while the text is read (Note [JSON limits while reading] in
// base/json_reader.cc). A plan of more layers than allowed used to be built whole before its
// layers were counted: 12 s for a 99 MB plan of 243,853 layers.
std::string PlanWithLayers(size_t layers, bool close) {
  Json j = PlanObject();
  j.erase("layers");
  std::string text = j.dump();
  text.pop_back();  // the closing '}'
  text += ",\"layers\":[";
  for (size_t i = 0; i < layers; ++i) {
    absl::StrAppend(&text, i == 0 ? "" : "\n,", "{\"index\":", i,
                    ",\"type\":\"a\",\"policy\":\"keep\",\"device_saved_bytes\":0,"
                    "\"host_bytes\":0}");
  }
  if (close) text += "]}";
  return text;
}

TEST(PlanReader, TooManyLayersAreRefusedAtTheFirstOneTooMany) {
  const size_t too_many = static_cast<size_t>(kPlanMaxLayers) + 1;
  // Refused at layer 100,001 (the comma before it starts line 100,001), naming the field and the
  // limit.
  EXPECT_THAT(ErrorOf(PlanWithLayers(too_many, /*close=*/true)),
              HasSubstr("plan: field 'layers' has more than 100000 elements at line 100001, "
                        "column 1; allowed: at most 100000"));
  // What follows the layer too many is never read: a plan cut off after it is refused for its
  // layers, not for being cut off (which a reader that builds everything first would say).
  EXPECT_THAT(ErrorOf(PlanWithLayers(too_many, /*close=*/false)),
              HasSubstr("field 'layers' has more than 100000 elements"));
}

TEST(PlanReader, LongStringsAreRefusedWhileReadingNamingTheField) {
  Json j = PlanObject();
  j["model"] = std::string(size_t{2} << 20, 'm');
  EXPECT_THAT(ErrorOf(j), HasSubstr("plan: field 'model' holds a string longer than 1048576 "
                                    "bytes at line 1, column "));
  j = PlanObject();
  j["layers"][1]["type"] = std::string(size_t{2} << 20, 't');
  EXPECT_THAT(ErrorOf(j), HasSubstr("plan: field 'layers[1].type' holds a string longer than "
                                    "1048576 bytes"));
  // A long key is named by the object holding it.
  j = PlanObject();
  j["run"][std::string(size_t{2} << 20, 'k')] = 1;
  EXPECT_THAT(ErrorOf(j), HasSubstr("plan: field 'run' holds a string longer than 1048576"));
}

}  // namespace
}  // namespace stowage
