// `stowage search`: which job shape. Every parallel layout Megatron-Core accepts for a model,
// hardware, GPU count(s), sequence length and global batch, each with its optimal per-layer plan,
// ranked by step time (planner/layout/layout_search.h); the best written as `stowage plan`
// writes a plan, with the flags that reproduce it.
#include "cli/search_command.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "planner/cost/reference_jobs.h"
#include "planner/layout/layout_report.h"
#include "planner/layout/layout_search.h"

namespace stowage::tools {
namespace {

// The flags of `stowage plan` that describe the job but not its layout: the search takes them
// as `stowage plan` does (ReadInputs) and passes them on in every reproducing command.
struct RunFlag {
  const char* name;
  const char* value_name;  // "" for a switch
};
constexpr RunFlag kRunFlags[] = {
    {"model", "NAME|PATH"},  {"hardware", "NAME|PATH"},    {"seq-len", "N"},
    {"framework", "NAME"},   {"transformers", "5.N"},      {"vision-tokens", "N"},
    {"moe-imbalance", "X"},  {"gpu-mem", "GiB"},           {"host-mem", "GiB"},
    {"sharding", "MODE"},    {"grad-dtype", "fp32|bf16"},  {"mtp-layers", "N"},
    {"optimizer", "NAME"},   {"optimizer-offload", ""},    {"loss-chunk-tokens", "N"},
    {"optimality-gap", "G"}, {"no-sequence-parallel", ""},
};

cli::FlagParser MakeParser() {
  cli::FlagParser p(
      "stowage search [flags]",
      "Which job shape: enumerates every parallel layout Megatron-Core accepts for the model, "
      "hardware, GPU count(s), sequence length and global batch (TP dividing the heads within "
      "an NVLink domain, CP splitting each sequence into 2 x CP chunks, EP dividing the experts, "
      "PP with Megatron's even split or a derived --pp-layout, VPP, micro-batch, both rank "
      "orders), plans each with the per-layer optimizer and ranks them by step time. Bounds "
      "(fixed memory alone, a compute-only step time) leave most layouts unplanned; the table is "
      "the exact top of the full enumeration. The best is written as `stowage plan` writes a "
      "plan (--out, --format json, --timeline, --trace, --emit).\nExit status: 0 a layout fits; "
      "1 none fits; 2 bad flags or input.");
  for (const RunFlag& f : kRunFlags) {
    p.Add({f.name, f.value_name, "as in `stowage plan` (see its --help)", ""});
  }
  p.Add({"gpus", "N[,N...]", "GPU counts to search (each a job of its own)", "64"});
  p.Add({"global-batch", "N",
         "sequences per step over the whole job (microbatches = N / (micro-batch x data "
         "parallel)); or --global-batch-tokens",
         "required, or --global-batch-tokens"});
  p.Add({"global-batch-tokens", "N",
         "tokens per step over the whole job (K/M/G suffixes), a multiple of --seq-len", ""});
  p.Add({"top", "N", "layouts ranked exactly and shown", "10"});
  p.Add({"rank", "PATTERN[;PATTERN...]",
         "also rank the best layout matching each pattern wherever it falls, with its gap to the "
         "best and the cost term that decides it, e.g. tp=1,cp=8,ep=8 (keys gpus, tp, cp, ep, "
         "pp, vpp, mb)",
         ""});
  p.Add({"allow-tp-outside-nvlink", "", "also try TP larger than one NVLink domain", ""});
  p.Add({"max-vpp", "N", "model chunks per stage tried (interleaved schedule)", "4"});
  p.Add({"max-micro-batch", "N", "sequences per micro-batch tried", "8"});
  p.Add({"exact-rank", "",
         "plan every layout that might rank above a --rank layout, so that its rank is exact "
         "(else a range: the layouts whose bound is below its step are not planned)",
         ""});
  p.Add({"exhaustive", "", "plan every valid layout (no bound prunes; slow)", ""});
  p.Add({"pruned-lines", "N", "pruned families listed (the rest are counted)", "16"});
  p.Add({"format", "table|json", "stdout: the table, or the best plan's JSON (table on stderr)",
         "table"});
  p.Add({"emit", "megatron|torchtitan",
         "print the best plan as the trainer's settings (as `stowage plan --emit`); the table "
         "goes to stderr",
         ""});
  p.Add({"out", "PATH", "write the best plan's JSON to PATH", ""});
  p.Add({"timeline", "PATH", "write the best plan's SVG timeline", ""});
  p.Add({"trace", "PATH", "write the best plan's step as Chrome trace-event JSON", ""});
  return p;
}

std::string Quoted(const std::string& value) {
  if (value.find_first_of(" \t'\"$\\") == std::string::npos && !value.empty()) return value;
  std::string out = "'";
  for (char c : value) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `stowage plan` with `args`; with `quiet` its stdout goes to /dev/null.
int RunPlan(const std::vector<std::string>& args, bool quiet) {
  std::vector<std::string> storage = {"plan"};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  int saved = -1;
  if (quiet) {
    std::fflush(stdout);
    saved = ::dup(STDOUT_FILENO);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) {
      ::dup2(null, STDOUT_FILENO);
      ::close(null);
    }
  }
  const int code = RunPlanCommand(static_cast<int>(storage.size()), argv.data());
  if (saved >= 0) {
    std::fflush(stdout);
    ::dup2(saved, STDOUT_FILENO);
    ::close(saved);
  }
  return code;
}

}  // namespace

absl::StatusOr<SearchInputs> ReadSearchInputs(const cli::FlagParser& flags) {
  SearchInputs s;
  // The job's run flags through `stowage plan`'s own reader, from a parser of them alone (the
  // layout flags absent: the search sets them).
  cli::FlagParser run("stowage search", "");
  std::vector<std::string> args = {"search"};
  // The reproducing commands name the model, hardware and length even where defaulted.
  const std::pair<const char*, const char*> named[] = {{"model", planner::kDefaultModel},
                                                       {"hardware", planner::kDefaultHardware},
                                                       {"seq-len", "1M"}};
  for (const auto& [name, fallback] : named) {
    if (!flags.Has(name))
      s.base_args.insert(s.base_args.end(), {absl::StrCat("--", name), fallback});
  }
  for (const RunFlag& f : kRunFlags) {
    run.Add({f.name, f.value_name, "", ""});
    if (*f.value_name == '\0') {
      // A switch given as --NAME=false is off: the reproducing command leaves it out.
      if (flags.GetBool(f.name)) s.base_args.push_back(absl::StrCat("--", f.name));
    } else if (auto value = flags.Get(f.name); value.has_value()) {
      s.base_args.insert(s.base_args.end(), {absl::StrCat("--", f.name), *value});
    }
  }
  for (const std::string& arg : s.base_args) {
    args.push_back(arg);
    absl::StrAppend(&s.base_flags, s.base_flags.empty() ? "" : " ", Quoted(arg));
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  if (absl::Status st = run.Parse(static_cast<int>(argv.size()), argv.data(), 1); !st.ok()) {
    return st;
  }
  absl::StatusOr<Inputs> in = ReadInputs(run, TrainerInputs{});
  if (!in.ok()) return in.status();
  s.inputs = *std::move(in);
  if (s.inputs.options.force.has_value()) {
    return absl::InvalidArgumentError("--force is not a search flag");
  }
  planner::LayoutSearchRequest& q = s.request;
  q.model = s.inputs.model;
  q.hardware = s.inputs.hardware;
  q.base = s.inputs.run;
  q.options = s.inputs.options;
  for (absl::string_view part : absl::StrSplit(flags.Get("gpus").value_or("64"), ',')) {
    int gpus = 0;
    if (!absl::SimpleAtoi(part, &gpus) || gpus < 1 || gpus > planner::kMaxParallel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus is '", flags.Get("gpus").value_or(""), "'; allowed: GPU counts from 1 to ",
          planner::kMaxParallel, " separated by commas, e.g. 64 or 64,128"));
    }
    q.gpu_counts.push_back(gpus);
  }
  if (flags.Has("global-batch") && flags.Has("global-batch-tokens")) {
    return absl::InvalidArgumentError(
        "--global-batch and --global-batch-tokens both set the batch per step; give one");
  }
  if (flags.Has("global-batch-tokens")) {
    auto tokens = flags.GetCount("global-batch-tokens", 0);
    if (!tokens.ok()) return tokens.status();
    if (*tokens % q.base.seq_len != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--global-batch-tokens is ", *tokens,
                                                     "; it must be a multiple of --seq-len (",
                                                     q.base.seq_len, ")"));
    }
    q.global_batch = *tokens / q.base.seq_len;
  } else {
    auto global = flags.GetInt("global-batch", 0, 1, int64_t{1} << 40);
    if (!global.ok()) return global.status();
    q.global_batch = *global > 0 ? static_cast<uint64_t>(*global) : 0;
    if (q.global_batch == 0) {
      return absl::InvalidArgumentError(
          "--global-batch (sequences per step) or --global-batch-tokens is required: the "
          "layouts are ranked by the step time of the same batch");
    }
  }
  auto top = flags.GetInt("top", 10, 1, 10000);
  if (!top.ok()) return top.status();
  q.top = static_cast<int>(*top);
  auto max_vpp = flags.GetInt("max-vpp", 4, 1, kPlanMaxVirtualStages);
  if (!max_vpp.ok()) return max_vpp.status();
  q.max_vpp = static_cast<int>(*max_vpp);
  auto max_mb = flags.GetInt("max-micro-batch", 8, 1, 1 << 16);
  if (!max_mb.ok()) return max_mb.status();
  q.max_micro_batch = static_cast<int>(*max_mb);
  q.allow_tp_outside_nvlink = flags.GetBool("allow-tp-outside-nvlink");
  // Under hf the layouts are torch's data-parallel engines: DDP, DDP + ZeroRedundancyOptimizer,
  // FSDP2 without and with resharding after forward, unless --sharding names one.
  if (q.base.framework == planner::Framework::kHf && !flags.Has("sharding")) {
    q.shardings = {planner::Sharding::kNoShard, planner::Sharding::kOptim,
                   planner::Sharding::kOptimGrads, planner::Sharding::kOptimGradsParams};
  }
  q.exhaustive = flags.GetBool("exhaustive");
  q.exact_rank = flags.GetBool("exact-rank");
  if (auto rank = flags.Get("rank"); rank.has_value()) {
    for (absl::string_view text : absl::StrSplit(*rank, ';', absl::SkipEmpty())) {
      auto pattern = planner::ParseLayoutPattern(std::string(text));
      if (!pattern.ok()) return pattern.status();
      q.rank_also.push_back(*pattern);
    }
  }
  return s;
}

int RunSearchCommand(int argc, char** argv) {
  cli::FlagParser flags = MakeParser();
  if (absl::Status s = flags.Parse(argc, argv, 1); !s.ok()) {
    std::fprintf(stderr, "stowage search: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "stowage search: unexpected argument '%s'\n",
                 flags.positional()[0].c_str());
    return kExitUsage;
  }
  const std::string format = flags.Get("format").value_or("table");
  if (format != "table" && format != "json") {
    std::fprintf(stderr, "stowage search: --format is '%s'; allowed: table, json\n",
                 format.c_str());
    return kExitUsage;
  }
  const std::optional<std::string> emit = flags.Get("emit");
  if (emit.has_value() && *emit != "megatron" && *emit != "torchtitan") {
    std::fprintf(stderr, "stowage search: --emit is '%s'; allowed: megatron, torchtitan\n",
                 emit->c_str());
    return kExitUsage;
  }
  auto pruned_lines = flags.GetInt("pruned-lines", 16, 0, 1 << 20);
  if (!pruned_lines.ok()) {
    std::fprintf(stderr, "stowage search: %s\n",
                 std::string(pruned_lines.status().message()).c_str());
    return kExitUsage;
  }
  absl::StatusOr<SearchInputs> in = ReadSearchInputs(flags);
  if (!in.ok()) {
    std::fprintf(stderr, "stowage search: %s\n", std::string(in.status().message()).c_str());
    return kExitUsage;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<planner::LayoutSearchResult> result = planner::SearchLayouts(in->request);
  if (!result.ok()) {
    std::fprintf(stderr, "stowage search: %s\n", std::string(result.status().message()).c_str());
    return kExitUsage;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::FILE* text = format == "json" || emit.has_value() ? stderr : stdout;
  std::fprintf(
      text, "stowage search: %s on %s, %s GPUs, %llu tokens x %llu sequences per step (%.3g s)\n",
      in->inputs.model_label.c_str(), in->inputs.hardware_label.c_str(),
      absl::StrJoin(in->request.gpu_counts, ",").c_str(),
      static_cast<unsigned long long>(in->request.base.seq_len),
      static_cast<unsigned long long>(in->request.global_batch), seconds);
  planner::LayoutReportOptions report;
  report.base_flags = in->base_flags;
  report.global_batch = in->request.global_batch;
  report.max_pruned_lines = static_cast<int>(*pruned_lines);
  std::fputs(planner::RenderLayoutSearch(in->request, *result, report).c_str(), text);
  if (result->ranked.empty()) return kExitUnmet;
  // The best plan, written by `stowage plan` itself with the flags that reproduce it.
  std::vector<std::string> plan_args = in->base_args;
  for (absl::string_view arg :
       absl::StrSplit(planner::LayoutFlags(result->ranked[0].layout, in->request.global_batch), ' ',
                      absl::SkipEmpty())) {
    plan_args.emplace_back(arg);
  }
  bool wants_plan = format == "json" || emit.has_value();
  for (const char* flag : {"out", "timeline", "trace"}) {
    if (auto path = flags.Get(flag); path.has_value()) {
      plan_args.push_back(absl::StrCat("--", flag, "=", *path));
      wants_plan = true;
    }
  }
  if (!wants_plan) return kExitOk;
  if (emit.has_value()) plan_args.push_back(absl::StrCat("--emit=", *emit));
  if (format == "json") plan_args.push_back("--format=json");
  const int code = RunPlan(plan_args, format == "table" && !emit.has_value());
  return code;
}

}  // namespace stowage::tools
