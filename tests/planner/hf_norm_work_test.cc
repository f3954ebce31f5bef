// NormWorkOf (planner/framework_hf.cc) against the real transformers norms' measured work
// (tests/planner/data/hf_norm_work.json, which tests/python/test_hf_norm_work.py measures on the
// real modules): each family's norm costs what its code runs.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "planner/framework_hf.h"
#include "planner/model.h"

namespace stowage::planner {
namespace {

TEST(HfNormWork, EachFamilysNormCostsWhatTheRealModuleMeasures) {
  std::ifstream in(std::string(STOWAGE_SOURCE_DIR) + "/tests/planner/data/hf_norm_work.json");
  ASSERT_TRUE(in) << "tests/planner/data/hf_norm_work.json";
  const nlohmann::json data = nlohmann::json::parse(in);
  int rows = 0;
  for (const nlohmann::json& row : data.at("norms")) {
    ModelConfig m;
    m.family = row.at("family").get<std::string>();
    SCOPED_TRACE(m.family + " (" + row.at("class").get<std::string>() + ")");
    const HfNormWork w = NormWorkOf(m);
    EXPECT_EQ(w.fwd, row.at("forward_bytes").get<double>());
    EXPECT_EQ(w.bwd, row.at("backward_bytes").get<double>());
    EXPECT_EQ(w.fwd_kernels, row.at("forward_kernels").get<double>());
    EXPECT_EQ(w.bwd_kernels, row.at("backward_kernels").get<double>());
    ++rows;
  }
  EXPECT_GE(rows, 3);  // a row of each kind of norm code at least
}

}  // namespace
}  // namespace stowage::planner
