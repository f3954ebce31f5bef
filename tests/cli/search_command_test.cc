// `stowage search` end to end: each row, re-planned alone by `stowage plan` with the flags the
// search prints, gives the numbers the table shows; the best plan is `stowage plan`'s own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/bytes.h"
#include "planner/report/report.h"
#include "stowage/plan.h"
#include "tests/test_util.h"

namespace {

using ::testing::HasSubstr;

using Result = stowage::testing::CommandResult;

using stowage::testing::RunStowage;

// A small job: Llama-3.1-8B on 8 H100 at 8K tokens, 16 sequences per step.
constexpr char kJob[] =
    "search --model llama-3.1-8b --hardware h100 --gpus 8 --seq-len 8K --global-batch 16 "
    "--max-vpp 2 --max-micro-batch 2 --top 6";

struct Row {
  std::string rank, step, tokens_per_second;
};

// The table's rows and the "to plan a row alone" commands, in order.
void ReadTable(const std::string& out, std::vector<Row>& rows, std::vector<std::string>& plans) {
  bool in_table = false, in_plans = false;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StrContains(line, " rank  layout")) {
      in_table = true;
      continue;
    }
    if (absl::StrContains(line, "to plan a row alone:")) {
      in_plans = true;
      continue;
    }
    if (line.empty()) {
      in_table = false;
      continue;
    }
    if (in_plans) {
      const size_t at = line.find("stowage plan ");
      if (at != absl::string_view::npos) plans.emplace_back(line.substr(at + 8));
    } else if (in_table) {
      // rank, layout words, peak (2), host (2), step (2), tokens/s, comm (2), bubble (2), binds (2)
      std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
      ASSERT_GE(words.size(), 14u) << line;
      const size_t n = words.size();
      rows.push_back({words[0], words[n - 9] + " " + words[n - 8], words[n - 7]});
    }
  }
}

TEST(SearchCommand, EveryRowReplannedAloneGivesTheNumbersItShows) {
  const Result run = RunStowage(kJob);
  ASSERT_EQ(run.code, 0) << run.out;
  std::vector<Row> rows;
  std::vector<std::string> plans;
  ReadTable(run.out, rows, plans);
  ASSERT_EQ(rows.size(), 6u) << run.out;
  ASSERT_EQ(plans.size(), rows.size()) << run.out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Result alone = RunStowage(plans[i] + " --format json", /*with_stderr=*/false);
    ASSERT_EQ(alone.code, 0) << plans[i] << "\n" << alone.out;
    auto plan = stowage::ParsePlanJson(alone.out);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(stowage::planner::FormatSeconds(plan->predicted.step_seconds), rows[i].step)
        << plans[i];
    const double tokens = 16.0 * 8192 / plan->predicted.step_seconds;
    EXPECT_EQ(absl::StrFormat("%.0f", tokens), rows[i].tokens_per_second) << plans[i];
  }
}

TEST(SearchCommand, WritesTheBestPlanAsStowagePlanDoes) {
  const Result best = RunStowage(std::string(kJob) + " --format json", /*with_stderr=*/false);
  ASSERT_EQ(best.code, 0) << best.out;
  const Result table = RunStowage(kJob);
  std::vector<Row> rows;
  std::vector<std::string> plans;
  ReadTable(table.out, rows, plans);
  ASSERT_FALSE(plans.empty());
  const Result alone = RunStowage(plans[0] + " --format json", /*with_stderr=*/false);
  EXPECT_EQ(best.out, alone.out);
}

// A switch given off (--NAME=false) stays off in the reproducing commands; given on, it is on.
// The regression: `--no-sequence-parallel=false` was passed on as a bare `--no-sequence-parallel`,
// whose plans are another job's (TP without sequence parallelism).
TEST(SearchCommand, ReproducingCommandsKeepASwitchAsGiven) {
  for (const char* given : {"--no-sequence-parallel=false", "--no-sequence-parallel"}) {
    const bool on = !absl::StrContains(given, "=false");
    const Result run = RunStowage(std::string(kJob) + " --top 2 " + given);
    ASSERT_EQ(run.code, 0) << run.out;
    std::vector<Row> rows;
    std::vector<std::string> plans;
    ReadTable(run.out, rows, plans);
    ASSERT_FALSE(plans.empty()) << run.out;
    for (const std::string& plan : plans) {
      EXPECT_EQ(absl::StrContains(plan, "--no-sequence-parallel"), on) << given << ": " << plan;
      const Result alone = RunStowage(plan + " --format json", /*with_stderr=*/false);
      ASSERT_EQ(alone.code, 0) << plan << "\n" << alone.out;
      auto parsed = stowage::ParsePlanJson(alone.out);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(parsed->sequence_parallel || parsed->tp == 1, !on || parsed->tp == 1) << plan;
    }
  }
}

TEST(SearchCommand, RanksAPatternAndSaysWhyFamiliesArePruned) {
  const Result run = RunStowage(std::string(kJob) + " --rank 'tp=1,pp=2' --exact-rank");
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("tp=1,pp=2: TP 1 CP "));
  EXPECT_THAT(run.out, HasSubstr("(exact)"));
  EXPECT_THAT(run.out, HasSubstr("pruned: "));
  // A dense model's tp-cp-ep-pp-dp order with CP > 1: ValidatePipeline's rule, said once.
  EXPECT_THAT(run.out, HasSubstr("(divisibility): --rank-order is tp-cp-ep-pp-dp"));
}

TEST(SearchCommand, RefusesBadFlagsNamingThem) {
  Result run = RunStowage("search --gpus 8,x --global-batch 8");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("--gpus is '8,x'"));
  run = RunStowage("search --gpus 8");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("--global-batch"));
  run = RunStowage("search --gpus 8 --global-batch 8 --rank tq=2");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("unknown key 'tq'"));
  run = RunStowage("search --gpus 8 --seq-len 8K --global-batch-tokens 12K");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("multiple of --seq-len"));
  run = RunStowage("search --tp 2");
  EXPECT_EQ(run.code, 2);
  EXPECT_THAT(run.out, HasSubstr("unknown flag '--tp'"));
  EXPECT_EQ(RunStowage("search --help").code, 0);
}

}  // namespace
