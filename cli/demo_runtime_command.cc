// `stowage demo-runtime`: drives the runtime's host backend through a plan, step after step,
// exactly as a trainer drives it through the C ABI (save in forward, prefetch and restore in
// backward, end step), with the Prometheus endpoint up -- so the metrics and the dashboards can
// be watched, and tested, on a machine without a GPU.
//
// The "device" is host memory (host backend). Compute is simulated by sleeping, so the copies
// overlap it as they would overlap kernels; a restore that has to wait for its H2D shows up as a
// compute stall. Every restored buffer is checked against the pattern written before its save.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "offload/backend_factory.h"
#include "offload/node_ledger.h"
#include "runtime/metrics.h"
#include "stowage/plan.h"
#include "stowage/stowage.h"

namespace stowage::tools {
namespace {

// The reference model's layer input (GLM-5.3-Flash: mHC keeps 4 residual streams of hidden 4096,
// bf16), per token, and its layer pattern; see the glm-5.3-flash preset in
// planner/model/model_presets.cc.
constexpr uint64_t kInputBytesPerToken = 4 * 4096 * 2;
constexpr int kReferenceLayers = 45;
constexpr char kDefaultAddress[] = "127.0.0.1:9464";

// SIGINT/SIGTERM: the first asks the demo to stop (within the step it is in, which is ended so
// that everything is released); a second one is not ignored but ends the process at once, so a
// demo that cannot stop is never left running.
std::atomic<bool> stop_requested{false};
extern "C" void OnStopSignal(int signal) {
  if (stop_requested.exchange(true)) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
}
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler needs a lock-free flag");

// Returned by RunStep when a signal cut the step short.
absl::Status Interrupted() { return absl::CancelledError("interrupted"); }

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

// The URL of the endpoint `endpoint` (CanonicalMetricsAddress's spelling): one that can be opened
// from this machine (scripts take the line's last word): an endpoint on every interface (0.0.0.0,
// [::]) is reached through loopback.
std::string MetricsUrl(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  const std::string host = endpoint.substr(0, colon);
  const std::string port = endpoint.substr(colon + 1);
  if (host == "0.0.0.0" || host == "[::]") {
    return absl::StrCat("http://", host == "0.0.0.0" ? "127.0.0.1" : "[::1]", ":", port,
                        "/metrics");
  }
  return absl::StrCat("http://", endpoint, "/metrics");
}

// A plan shaped like the reference run, scaled down to `tokens` tokens per rank so it fits any
// machine: 45 layers (KDA, DSA every fourth; dense FFN in the first three, MoE after), every
// layer input offloaded except the last layer's (its backward starts as soon as forward ends),
// prefetch distance 1. Predictions follow the demo's own simulated compute.
Plan SyntheticPlan(uint64_t tokens, double layer_forward_seconds) {
  Plan plan;
  plan.generator = absl::StrCat("stowage ", stowage_version(), " demo-runtime");
  plan.model = "glm-5.3-flash (synthetic, scaled down)";
  plan.hardware = "host backend";
  plan.seq_len = tokens;
  plan.runtime.prefetch_distance = 1;
  const uint64_t input_bytes = tokens * kInputBytesPerToken;
  uint64_t host_bytes = 0;
  for (int i = 0; i < kReferenceLayers; ++i) {
    LayerPlan layer;
    layer.index = i;
    layer.type = absl::StrCat(i % 4 == 3 ? "dsa" : "kda", i < 3 ? "+dense_ffn" : "+moe");
    layer.forward_seconds = layer_forward_seconds;
    layer.backward_seconds = 2 * layer_forward_seconds;
    if (i + 1 < kReferenceLayers) {
      layer.policy = LayerPolicy::kOffloadInput;
      layer.recompute_seconds = layer_forward_seconds;
      layer.host_bytes = input_bytes;
      layer.transfers.push_back({"input", input_bytes});
      const LayerProtocol protocol = LayerProtocolFor(
          i, kReferenceLayers, true, plan.runtime.prefetch_distance, plan.runtime.save_lag);
      layer.save_wait_before_layer = protocol.save_wait_before_layer;
      layer.prefetch_after_layer = protocol.prefetch_after_layer;
    } else {
      layer.policy = LayerPolicy::kKeep;
      layer.device_saved_bytes = 6 * input_bytes;  // the saved tensors of one layer, roughly
    }
    host_bytes += layer.host_bytes;
    plan.predicted.step_seconds +=
        layer.forward_seconds + layer.backward_seconds + layer.recompute_seconds;
    plan.layers.push_back(std::move(layer));
  }
  plan.runtime.host_arena_bytes = host_bytes;
  plan.predicted.host_bytes_per_gpu = host_bytes;
  plan.predicted.host_bytes_per_numa_node = host_bytes;
  // Peak: the kept layer's tensors, plus two layer inputs in flight in forward (one being
  // written while the previous one's D2H drains) and in backward (one restored, one prefetched).
  plan.predicted.peak_device_bytes = plan.layers.back().device_saved_bytes + 2 * input_bytes;
  plan.gpu_budget_bytes = 2 * plan.predicted.peak_device_bytes;
  plan.predicted.baseline = "keep";
  return plan;
}

// Simulated device memory: reusable blocks, counting what is live so the demo can report its
// device peak like a trainer reporting torch.cuda.max_memory_allocated().
class DevicePool {
 public:
  using Block = std::vector<std::byte>;
  explicit DevicePool(uint64_t base_bytes) : base_(base_bytes) {}

  Block* Take(uint64_t bytes) {
    auto fits = std::find_if(free_.begin(), free_.end(),
                             [&](const std::unique_ptr<Block>& b) { return b->size() >= bytes; });
    std::unique_ptr<Block> block;
    if (fits != free_.end()) {
      block = std::move(*fits);
      free_.erase(fits);
    } else {
      block = std::make_unique<Block>(bytes);
    }
    live_ += block->size();
    peak_ = std::max(peak_, live_);
    in_use_.push_back(std::move(block));
    return in_use_.back().get();
  }
  void Give(Block* block) {
    auto it = std::find_if(in_use_.begin(), in_use_.end(),
                           [&](const std::unique_ptr<Block>& b) { return b.get() == block; });
    if (it == in_use_.end()) return;
    live_ -= block->size();
    free_.push_back(std::move(*it));
    in_use_.erase(it);
  }
  // The most live since the last call (plus the base), then starts counting again.
  uint64_t TakePeak() {
    const uint64_t peak = base_ + peak_;
    peak_ = live_;
    return peak;
  }

 private:
  uint64_t base_;
  uint64_t live_ = 0;
  uint64_t peak_ = 0;
  std::vector<std::unique_ptr<Block>> in_use_;
  std::vector<std::unique_ptr<Block>> free_;
};

std::byte Pattern(int layer, size_t transfer, uint64_t step) {
  return static_cast<std::byte>((layer * 31 + transfer * 7 + step) & 0xff);
}

absl::Status Check(stowage_status status, const char* call) {
  if (status == STOWAGE_OK) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(call, " failed: ", stowage_status_string(status), ": ", stowage_last_error()));
}

void SleepSeconds(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

struct Saved {
  int layer = 0;
  size_t transfer = 0;
  stowage_tensor_id id = 0;
  DevicePool::Block* dst = nullptr;  // backward: where it is restored
};

// One training step: forward saves every planned transfer, backward prefetches at the plan's
// distance and restores, then the step ends. Returns the step's simulated device peak.
absl::StatusOr<uint64_t> RunStep(stowage_runtime* rt, const Plan& plan, DevicePool& pool,
                                 uint64_t step, double compute_scale) {
  const int n = static_cast<int>(plan.layers.size());
  std::vector<std::vector<Saved>> saved(n);
  absl::Status status = Check(stowage_begin_step(rt), "stowage_begin_step");
  if (!status.ok()) return status;

  // Forward: the layer "computes" its outputs into device blocks and hands them to save(); the
  // blocks go back to the pool at the wait the plan gives (Note [Runtime protocol]): before the
  // forward of layer save_wait_before_layer, or when backward starts.
  std::vector<std::vector<std::pair<stowage_tensor_id, DevicePool::Block*>>> draining(n);
  auto wait_before = [&](int j) {
    for (int i = 0; i < n; ++i) {
      if (plan.layers[i].save_wait_before_layer != j) continue;
      for (auto& [id, block] : draining[i]) {
        if (status.ok()) status = Check(stowage_save_wait(rt, id), "stowage_save_wait");
        pool.Give(block);
      }
      draining[i].clear();
    }
  };
  for (int i = 0; i < n && status.ok(); ++i) {
    if (stop_requested.load()) {
      status = Interrupted();
      break;
    }
    wait_before(i);
    const LayerPlan& layer = plan.layers[i];
    SleepSeconds(layer.forward_seconds * compute_scale);
    for (size_t t = 0; t < layer.transfers.size() && status.ok(); ++t) {
      DevicePool::Block* block = pool.Take(layer.transfers[t].bytes);
      std::memset(block->data(), static_cast<int>(Pattern(i, t, step)), layer.transfers[t].bytes);
      stowage_tensor_id id = 0;
      status = Check(stowage_save(rt, i, block->data(), layer.transfers[t].bytes, nullptr, &id),
                     "stowage_save");
      saved[i].push_back({i, t, id, nullptr});
      draining[i].emplace_back(id, block);
    }
  }
  wait_before(n);
  for (auto& layer_draining : draining) {  // only after a failed call
    for (auto& [id, block] : layer_draining) pool.Give(block);
  }

  // Backward, last layer first: when layer j's backward starts, prefetch every layer whose plan
  // says "after j" (highest first); then restore j's own tensors (issuing the H2D if nobody
  // prefetched), recompute and run its backward, and free the blocks.
  for (int j = n - 1; j >= 0 && status.ok(); --j) {
    if (stop_requested.load()) {
      status = Interrupted();
      break;
    }
    for (int i = n - 1; i >= 0 && status.ok(); --i) {  // highest layer first
      if (plan.layers[i].prefetch_after_layer != j) continue;
      for (Saved& s : saved[i]) {
        s.dst = pool.Take(plan.layers[i].transfers[s.transfer].bytes);
        status = Check(stowage_prefetch(rt, s.id, s.dst->data(), nullptr), "stowage_prefetch");
        if (!status.ok()) break;
      }
    }
    const LayerPlan& layer = plan.layers[j];
    for (Saved& s : saved[j]) {
      if (!status.ok()) break;
      if (s.dst == nullptr) s.dst = pool.Take(layer.transfers[s.transfer].bytes);
      status = Check(stowage_restore(rt, s.id, s.dst->data(), nullptr), "stowage_restore");
      if (!status.ok()) break;
      const uint64_t bytes = layer.transfers[s.transfer].bytes;
      const std::byte want = Pattern(j, s.transfer, step);
      const std::byte* data = s.dst->data();
      if (bytes > 0 && (data[0] != want || data[bytes / 2] != want || data[bytes - 1] != want)) {
        status = absl::DataLossError(absl::StrCat("layer ", j, " transfer '",
                                                  layer.transfers[s.transfer].name,
                                                  "' came back different from what was saved"));
      }
    }
    SleepSeconds((layer.recompute_seconds + layer.backward_seconds) * compute_scale);
    for (Saved& s : saved[j]) {
      if (s.dst != nullptr) pool.Give(s.dst);
      s.dst = nullptr;
    }
  }
  for (auto& layer_saved : saved) {
    for (Saved& s : layer_saved) {
      if (s.dst != nullptr) pool.Give(s.dst);
    }
  }
  // end_step always releases the step, also after a failure above (or an interruption: then
  // copies may still be in flight, which end_step drains and reports; that is expected here).
  absl::Status ended = Check(stowage_end_step(rt), "stowage_end_step");
  if (!status.ok()) return status;
  if (!ended.ok()) return ended;
  return pool.TakePeak();
}

}  // namespace

int RunDemoRuntimeCommand(int argc, char** argv) {
  cli::FlagParser flags(
      "stowage demo-runtime [flags]",
      "Runs the runtime's host backend (no GPU needed) through a plan for N steps with the\n"
      "Prometheus endpoint up, the way a trainer drives it through the C ABI: forward saves\n"
      "each planned transfer, backward prefetches at the plan's distance and restores, every\n"
      "restored buffer is checked. Point Prometheus at the printed endpoint and open\n"
      "dashboards/stowage.json in Grafana to watch it.");
  flags.Add({"plan", "PATH", "plan file to carry out (from `stowage plan --out`)",
             "built-in: a reference-shaped GLM-5.3-Flash plan scaled to --tokens"});
  flags.Add({"tokens", "N", "tokens per rank of the built-in plan (each layer input is N x 32 KiB)",
             "256"});
  flags.Add({"steps", "N", "steps to run; 0 runs until interrupted (Ctrl-C, SIGTERM)", "20"});
  flags.Add({"step-interval", "SECONDS", "pause between steps, so scrapes see progress", "1"});
  flags.Add({"compute-scale", "X",
             "multiplies the plan's per-layer compute times (the simulated compute)", "1"});
  flags.Add({"layer-compute", "SECONDS", "forward time per layer in the built-in plan", "0.001"});
  flags.Add({"metrics-address", "HOST:PORT",
             "Prometheus endpoint of this process, taken as given; port 0 picks a free port. "
             "127.0.0.1 unless another host is given. Without it, as the runtime does: the port "
             "of $STOWAGE_METRICS_ADDR (else the default) is the job's base and a rank listens on "
             "base + $LOCAL_RANK",
             absl::StrCat("$STOWAGE_METRICS_ADDR, else ", kDefaultAddress, ", + $LOCAL_RANK")});
  flags.Add({"copy-threads", "N", "host-backend copy threads per direction; 0: automatic", "0"});
  flags.Add({"verify", "", "checksum every save and verify it on restore (integrity mode)", ""});
  flags.Add({"hold", "SECONDS", "keep the endpoint up this long after the last step", "0"});

  absl::Status parsed = flags.Parse(argc, argv, 1);
  if (!parsed.ok()) {
    std::fprintf(stderr, "stowage demo-runtime: %s\n", std::string(parsed.message()).c_str());
    return kExitUsage;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return kExitOk;
  }
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "stowage demo-runtime: unexpected argument '%s'\n",
                 flags.positional().front().c_str());
    return kExitUsage;
  }
  const std::optional<std::string> address_flag = flags.Get("metrics-address");
  absl::StatusOr<uint64_t> tokens = flags.GetCount("tokens", 256);
  absl::StatusOr<int64_t> steps = flags.GetInt("steps", 20, 0, int64_t{1} << 40);
  absl::StatusOr<double> interval = flags.GetDouble("step-interval", 1, 0, 3600);
  absl::StatusOr<double> compute_scale = flags.GetDouble("compute-scale", 1, 0, 1000);
  absl::StatusOr<double> layer_compute = flags.GetDouble("layer-compute", 0.001, 0, 60);
  absl::StatusOr<int64_t> copy_threads =
      flags.GetInt("copy-threads", 0, 0, offload::kMaxCopyThreads);
  absl::StatusOr<double> hold = flags.GetDouble("hold", 0, 0, 86400);
  for (const absl::Status& s :
       {tokens.status(), steps.status(), interval.status(), compute_scale.status(),
        layer_compute.status(), copy_threads.status(), hold.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "stowage demo-runtime: %s\n", std::string(s.message()).c_str());
      return kExitUsage;
    }
  }
  if (*tokens == 0) {
    std::fprintf(stderr, "stowage demo-runtime: --tokens must be at least 1\n");
    return kExitUsage;
  }
  // The endpoint follows the runtime's rule (Note [Rank labels] in runtime/metrics.h), through the
  // same functions: a --metrics-address is this process's own; STOWAGE_METRICS_ADDR (or the
  // default) is one setting for the job, shifted by LOCAL_RANK, so eight demos started like eight
  // ranks listen on eight ports.
  std::string address;
  if (address_flag.has_value()) {
    address = runtime::ResolveMetricsAddress(address_flag->c_str());
  } else {
    const char* env = std::getenv("STOWAGE_METRICS_ADDR");
    const bool from_env = env != nullptr && env[0] != '\0';
    absl::StatusOr<std::string> shifted = runtime::RankMetricsAddress(
        runtime::ResolveMetricsAddress(from_env ? nullptr : kDefaultAddress),
        offload::LocalRankFromEnvironment(),
        from_env ? "STOWAGE_METRICS_ADDR" : "the default endpoint");
    if (!shifted.ok()) {
      std::fprintf(stderr, "stowage demo-runtime: %s\n",
                   std::string(shifted.status().message()).c_str());
      return kExitUsage;
    }
    address = *std::move(shifted);
  }
  if (address.empty()) {
    std::fprintf(stderr,
                 "stowage demo-runtime: --metrics-address is empty; the demo exists to "
                 "serve metrics\n");
    return kExitUsage;
  }

  Plan plan;
  std::string plan_name = "built-in reference-shaped plan";
  if (std::optional<std::string> path = flags.Get("plan"); path.has_value()) {
    absl::StatusOr<Plan> read = ReadPlanFile(*path);
    if (!read.ok()) {
      std::fprintf(stderr, "stowage demo-runtime: %s\n",
                   std::string(read.status().message()).c_str());
      return kExitUsage;
    }
    plan = *std::move(read);
    plan_name = *path;
  } else {
    plan = SyntheticPlan(*tokens, *layer_compute);
    plan_name = absl::StrCat(plan_name, " (", *tokens, " tokens per rank)");
  }
  const std::string plan_json = PlanToJson(plan);

  stowage_options options;
  stowage_options_init(&options);
  options.backend = STOWAGE_BACKEND_HOST;
  options.verify_checksums = flags.GetBool("verify") ? 1 : 0;
  options.copy_threads = static_cast<int32_t>(*copy_threads);
  // The endpoint as it is bound (":9464" is 127.0.0.1:9464), so the URL printed below works.
  // Port 0 asks for a free port; it is resolved here so the demo can print the endpoint (the C
  // ABI, which the demo uses like any trainer, does not report the bound address).
  absl::StatusOr<std::string> canonical = runtime::CanonicalMetricsAddress(address);
  if (!canonical.ok()) {
    std::fprintf(stderr, "stowage demo-runtime: %s\n",
                 std::string(canonical.status().message()).c_str());
    return kExitUsage;
  }
  std::string endpoint = *std::move(canonical);
  if (endpoint.ends_with(":0")) {
    absl::StatusOr<std::string> free = runtime::PickFreePort(endpoint);
    if (!free.ok()) {
      std::fprintf(stderr, "stowage demo-runtime: %s\n",
                   std::string(free.status().message()).c_str());
      return kExitUnavailable;
    }
    endpoint = *free;
  }
  options.metrics_address = endpoint.c_str();

  // Before the runtime exists: a signal during a long arena setup stops the demo right after it.
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  stowage_runtime* rt = nullptr;
  if (stowage_status s = stowage_create(plan_json.data(), plan_json.size(), &options, &rt);
      s != STOWAGE_OK) {
    std::fprintf(stderr, "stowage demo-runtime: stowage_create failed: %s: %s\n",
                 stowage_status_string(s), stowage_last_error());
    return s == STOWAGE_ERROR_INVALID_ARGUMENT ? kExitUsage : kExitUnavailable;
  }
  stowage_stats stats{};
  stowage_get_stats(rt, &stats);
  int offloading = 0;
  uint64_t fixed = plan.predicted.fixed_device_bytes;
  for (const LayerPlan& layer : plan.layers) {
    offloading += PolicyOffloads(layer.policy) ? 1 : 0;
    fixed += layer.device_saved_bytes;
  }
  std::printf("stowage demo-runtime: host backend, %s\n", plan_name.c_str());
  std::printf("  %zu layers, %d offloading; %s pinned on NUMA node %d; prefetch distance %d\n",
              plan.layers.size(), offloading, Mib(stats.arena_capacity_bytes).c_str(),
              stats.numa_node, plan.runtime.prefetch_distance);
  std::printf("metrics endpoint: %s\n", MetricsUrl(endpoint).c_str());
  std::printf("  %s; Ctrl-C stops\n", *steps == 0
                                          ? "running until interrupted"
                                          : absl::StrCat("running ", *steps, " steps").c_str());
  std::fflush(stdout);

  DevicePool pool(fixed);
  int exit_code = kExitOk;
  uint64_t step = 0;
  for (; (*steps == 0 || step < static_cast<uint64_t>(*steps)) && !stop_requested.load(); ++step) {
    absl::StatusOr<uint64_t> peak = RunStep(rt, plan, pool, step, *compute_scale);
    if (peak.status().code() == absl::StatusCode::kCancelled) {
      std::printf("interrupted during step %llu; the step was ended and released\n",
                  static_cast<unsigned long long>(step + 1));
      break;
    }
    if (!peak.ok()) {
      std::fprintf(stderr, "stowage demo-runtime: step %llu: %s\n",
                   static_cast<unsigned long long>(step),
                   std::string(peak.status().message()).c_str());
      exit_code = kExitUnmet;
      break;
    }
    stowage_report_device_peak(rt, *peak);
    stowage_get_stats(rt, &stats);
    std::printf(
        "step %llu: %.3f s (plan %.3f s), D2H %s, H2D %s in all, stall %.3f s, pinned "
        "peak %s, device peak %s\n",
        static_cast<unsigned long long>(stats.steps_completed), stats.last_step_seconds,
        plan.predicted.step_seconds * *compute_scale, Mib(stats.d2h_bytes_total).c_str(),
        Mib(stats.h2d_bytes_total).c_str(), stats.stall_seconds_total,
        Mib(stats.arena_peak_bytes).c_str(), Mib(*peak).c_str());
    std::fflush(stdout);
    // Pause in short slices so a signal ends the demo promptly.
    for (double left = *interval; left > 0 && !stop_requested.load(); left -= 0.05) {
      SleepSeconds(std::min(left, 0.05));
    }
  }
  for (double left = *hold; left > 0 && !stop_requested.load(); left -= 0.05) {
    SleepSeconds(std::min(left, 0.05));
  }
  stowage_get_stats(rt, &stats);
  std::printf("done: %llu steps, %s saved, %s restored, %.3f s stalled, %llu errors\n",
              static_cast<unsigned long long>(stats.steps_completed),
              Mib(stats.d2h_bytes_total).c_str(), Mib(stats.h2d_bytes_total).c_str(),
              stats.stall_seconds_total, static_cast<unsigned long long>(stats.errors_total));
  if (stowage_status s = stowage_destroy(rt); s != STOWAGE_OK) {
    std::fprintf(stderr, "stowage demo-runtime: stowage_destroy: %s\n", stowage_last_error());
    exit_code = kExitUnmet;
  }
  return exit_code;
}

}  // namespace stowage::tools
