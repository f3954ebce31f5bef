// libFuzzer harness: the CLI flag parser (cli/cli.cc). The input is an argument vector, one
// argument per NUL-separated piece; the parser and every typed getter return a value or an error
// naming the flag, never crash. Counts that parse are within range and do not wrap.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using stowage::cli::Flag;
  using stowage::cli::FlagParser;
  std::vector<std::string> args = {"plan"};
  std::string current;
  for (size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  args.push_back(current);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  FlagParser parser("stowage plan [flags]", "fuzz");
  parser.Add({"seq-len", "N", "tokens", "1M"});
  parser.Add({"loss-chunk-tokens", "N", "tokens per chunk", "8192"});
  parser.Add({"tp", "N", "tensor parallel", "1"});
  parser.Add({"gpu-mem", "GiB", "budget", ""});
  parser.Add({"format", "table|json", "format", "table"});
  parser.Add({"max-seq-len", "", "switch", ""});
  const absl::Status parsed = parser.Parse(static_cast<int>(args.size()), argv.data(), 1);
  if (!parsed.ok()) {
    STOWAGE_FUZZ_CHECK(!parsed.message().empty(), "an error without a message");
    return 0;
  }
  if (auto seq = parser.GetCount("seq-len", 1048576); seq.ok()) {
    STOWAGE_FUZZ_CHECK(*seq >= 1, "count below its minimum");
  }
  if (auto chunk = parser.GetCount("loss-chunk-tokens", 8192, 0); chunk.ok()) (void)*chunk;
  if (auto tp = parser.GetInt("tp", 1, 1, 1 << 20); tp.ok()) {
    STOWAGE_FUZZ_CHECK(*tp >= 1 && *tp <= (1 << 20), "int out of range");
  }
  if (auto mem = parser.GetDouble("gpu-mem", 1, 0.001, 1e6); mem.ok()) {
    STOWAGE_FUZZ_CHECK(*mem >= 0.001 && *mem <= 1e6, "double out of range");
  }
  (void)parser.GetString("format", "table");
  (void)parser.GetBool("max-seq-len");
  (void)parser.Help();
  for (const std::string& p : parser.positional()) (void)stowage::cli::ParseCount(p, "arg", 0);
  return 0;
}
