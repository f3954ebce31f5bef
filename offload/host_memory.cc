#include "offload/host_memory.h"

#include <numa.h>
#include <numaif.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/bytes.h"
#include "offload/topology.h"

namespace stowage::offload {
namespace {

namespace fs = std::filesystem;

constexpr int kCapIpcLock = 14;  // linux/capability.h
// cgroup v1 reports "no limit" as a page-rounded LONG_MAX; anything this large is no limit.
constexpr uint64_t kUnlimitedThreshold = uint64_t{1} << 62;

std::optional<uint64_t> ReadU64(const fs::path& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path.string());
  if (!text.ok()) return std::nullopt;
  uint64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) return std::nullopt;
  return value;
}

// "key value" lines (memory.stat).
std::optional<uint64_t> StatField(const std::string& text, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t value = 0;
    if (words.size() == 2 && words[0] == key && absl::SimpleAtoi(words[1], &value)) return value;
  }
  return std::nullopt;
}

// One cgroup directory's limit, usage and inactive file pages.
struct CgroupLevel {
  std::optional<uint64_t> limit;
  uint64_t usage = 0;
  uint64_t inactive_file = 0;
};

CgroupLevel ReadCgroupLevel(const fs::path& dir, int version) {
  CgroupLevel level;
  if (version == 2) {
    if (absl::StatusOr<std::string> max = ReadSmallFile((dir / "memory.max").string()); max.ok()) {
      uint64_t value = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(*max), &value)) level.limit = value;
    }
    level.usage = ReadU64(dir / "memory.current").value_or(0);
    if (absl::StatusOr<std::string> stat = ReadSmallFile((dir / "memory.stat").string());
        stat.ok()) {
      level.inactive_file = StatField(*stat, "inactive_file").value_or(0);
    }
  } else {
    std::optional<uint64_t> limit = ReadU64(dir / "memory.limit_in_bytes");
    if (limit.has_value() && *limit < kUnlimitedThreshold) level.limit = limit;
    level.usage = ReadU64(dir / "memory.usage_in_bytes").value_or(0);
    if (absl::StatusOr<std::string> stat = ReadSmallFile((dir / "memory.stat").string());
        stat.ok()) {
      level.inactive_file = StatField(*stat, "total_inactive_file")
                                .value_or(StatField(*stat, "inactive_file").value_or(0));
    }
  }
  return level;
}

uint64_t HeadroomOf(const CgroupLevel& level) {
  const uint64_t working_set =
      level.usage > level.inactive_file ? level.usage - level.inactive_file : 0;
  return *level.limit > working_set ? *level.limit - working_set : 0;
}

CgroupMemory ReadCgroup(const HostRoots& roots) {
  CgroupMemory cgroup;
  absl::StatusOr<std::string> self = ReadSmallFile(roots.proc + "/self/cgroup");
  if (!self.ok()) return cgroup;
  // "4:memory:/path" (v1) wins over "0::/path" (v2) when both are present (hybrid hierarchies
  // keep the memory controller on v1).
  fs::path base;
  for (absl::string_view line : absl::StrSplit(*self, '\n')) {
    std::vector<std::string> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    std::vector<std::string> controllers = absl::StrSplit(fields[1], ',');
    if (std::find(controllers.begin(), controllers.end(), "memory") != controllers.end()) {
      cgroup.version = 1;
      cgroup.path = fields[2];
      base = fs::path(roots.cgroup) / "memory";
      break;
    }
    if (fields[0] == "0" && fields[1].empty() &&
        fs::exists(fs::path(roots.cgroup) / "cgroup.controllers")) {
      cgroup.version = 2;
      cgroup.path = fields[2];
      base = fs::path(roots.cgroup);
    }
  }
  if (cgroup.version == 0) return cgroup;
  // In a cgroup namespace (containers) the path may not exist under the mount: the mount's root
  // is then the process's own cgroup.
  std::string path = cgroup.path.empty() ? "/" : cgroup.path;
  if (path != "/" && !fs::exists(base / path.substr(1))) path = "/";
  // Walk from the leaf to the root; the tightest headroom binds.
  std::optional<uint64_t> best;
  std::string current = path;
  CgroupLevel leaf;
  bool first = true;
  while (true) {
    const std::string relative = current == "/" ? "" : current.substr(1);
    const CgroupLevel level =
        ReadCgroupLevel(relative.empty() ? base : base / relative, cgroup.version);
    if (first) leaf = level;
    first = false;
    if (level.limit.has_value()) {
      const uint64_t headroom = HeadroomOf(level);
      if (!best.has_value() || headroom < *best) {
        best = headroom;
        cgroup.limit_bytes = level.limit;
        cgroup.limiting_path = current;
        cgroup.usage_bytes = level.usage;
        cgroup.reclaimable_bytes = level.inactive_file;
      }
    }
    if (current == "/" || current.empty()) break;
    const size_t slash = current.find_last_of('/');
    current = slash == 0 ? "/" : current.substr(0, slash);
  }
  if (!cgroup.limit_bytes.has_value()) {
    cgroup.usage_bytes = leaf.usage;
    cgroup.reclaimable_bytes = leaf.inactive_file;
    cgroup.limiting_path = path;
  }
  return cgroup;
}

std::string Limit(const std::optional<uint64_t>& bytes) {
  return bytes.has_value() ? FormatBytesExact(*bytes) : std::string("unlimited");
}

}  // namespace

std::optional<uint64_t> CgroupMemory::headroom_bytes() const {
  if (!limit_bytes.has_value()) return std::nullopt;
  CgroupLevel level;
  level.limit = limit_bytes;
  level.usage = usage_bytes;
  level.inactive_file = reclaimable_bytes;
  return HeadroomOf(level);
}

absl::StatusOr<HostMemorySnapshot> ReadHostMemory(int numa_node, const HostRoots& roots) {
  HostMemorySnapshot snapshot;
  absl::StatusOr<std::string> meminfo = ReadSmallFile(roots.proc + "/meminfo");
  if (!meminfo.ok()) return meminfo.status();
  snapshot.mem_total_bytes = MeminfoField(*meminfo, "MemTotal").value_or(0);
  // Kernels before 3.14 lack MemAvailable: MemFree is the conservative stand-in.
  snapshot.mem_available_bytes = MeminfoField(*meminfo, "MemAvailable")
                                     .value_or(MeminfoField(*meminfo, "MemFree").value_or(0));

  snapshot.cgroup = ReadCgroup(roots);

  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    snapshot.memlock_limit_bytes = static_cast<uint64_t>(limit.rlim_cur);
  }
  if (absl::StatusOr<std::string> status = ReadSmallFile(roots.proc + "/self/status");
      status.ok()) {
    snapshot.memlock_used_bytes = MeminfoField(*status, "VmLck").value_or(0);
    for (absl::string_view line : absl::StrSplit(*status, '\n')) {
      if (!absl::ConsumePrefix(&line, "CapEff:")) continue;
      uint64_t caps = 0;
      if (absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line), &caps)) {
        snapshot.cap_ipc_lock = (caps >> kCapIpcLock) & 1;
      }
    }
  }

  const MachineNodes machine = ReadSysfsNodes(roots.sys);
  snapshot.online_nodes = static_cast<int>(machine.nodes.size());
  snapshot.node = numa_node;
  if (numa_node >= 0) {
    absl::StatusOr<std::string> node_meminfo =
        ReadSmallFile(absl::StrCat(roots.sys, "/devices/system/node/node", numa_node, "/meminfo"));
    if (node_meminfo.ok()) {
      snapshot.node_total_bytes = MeminfoField(*node_meminfo, "MemTotal");
      const std::optional<uint64_t> free = MeminfoField(*node_meminfo, "MemFree");
      if (free.has_value()) {
        snapshot.node_available_bytes = *free +
                                        MeminfoField(*node_meminfo, "Inactive(file)").value_or(0) +
                                        MeminfoField(*node_meminfo, "KReclaimable").value_or(0);
      }
    }
  }
  return snapshot;
}

std::string DescribeHostMemory(const HostMemorySnapshot& s) {
  std::string out = absl::StrCat("MemAvailable ", FormatBytesExact(s.mem_available_bytes), " of ",
                                 FormatBytesExact(s.mem_total_bytes));
  if (s.cgroup.version == 0) {
    absl::StrAppend(&out, "; no memory cgroup");
  } else if (!s.cgroup.limit_bytes.has_value()) {
    absl::StrAppend(&out, "; cgroup v", s.cgroup.version, " ", s.cgroup.path, " unlimited");
  } else {
    absl::StrAppend(&out, "; cgroup v", s.cgroup.version, " ", s.cgroup.limiting_path, " limit ",
                    FormatBytesExact(*s.cgroup.limit_bytes), ", usage ",
                    FormatBytesExact(s.cgroup.usage_bytes), " of which reclaimable ",
                    FormatBytesExact(s.cgroup.reclaimable_bytes), ", headroom ",
                    FormatBytesExact(*s.cgroup.headroom_bytes()));
  }
  absl::StrAppend(&out, "; RLIMIT_MEMLOCK ", Limit(s.memlock_limit_bytes), " (locked ",
                  FormatBytesExact(s.memlock_used_bytes), s.cap_ipc_lock ? ", CAP_IPC_LOCK" : "",
                  ")");
  if (s.node >= 0) {
    absl::StrAppend(&out, "; node ", s.node, " of ", s.online_nodes, " available ",
                    Limit(s.node_available_bytes), " of ", Limit(s.node_total_bytes));
  } else {
    absl::StrAppend(&out, "; not bound to a node (", s.online_nodes, " nodes)");
  }
  return out;
}

uint64_t AdmissionMarginBytes(uint64_t total_bytes) {
  const double fraction = kAdmissionMarginFraction * static_cast<double>(total_bytes);
  return std::max(kAdmissionMarginMinBytes, static_cast<uint64_t>(fraction));
}

namespace {

std::string RankName(int rank, int local_rank) {
  std::string who = rank >= 0 ? absl::StrCat("rank ", rank) : std::string("rank ?");
  if (local_rank >= 0) absl::StrAppend(&who, " (local rank ", local_rank, ")");
  return who;
}

std::string DescribeShare(const RankShare& share) {
  return absl::StrCat(RankName(share.rank, share.local_rank), " pid ", share.pid, " node ",
                      share.numa_node, ": ", FormatBytesExact(share.bytes),
                      share.resident ? " resident" : " pending");
}

}  // namespace

absl::Status CheckAdmission(const HostMemorySnapshot& s, const AdmissionRequest& request,
                            const NodeShares& shares) {
  const std::string where =
      request.numa_node >= 0 ? absl::StrCat(" on NUMA node ", request.numa_node) : "";
  if (request.numa_node >= 0 && s.online_nodes > 0 && !s.node_total_bytes.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        request.what, " of ", FormatBytesExact(request.bytes), where, ": the machine has no node ",
        request.numa_node, " (", s.online_nodes, " nodes)"));
  }
  // What the other ranks add to the request, per limit (Note [Admission with other ranks]).
  // Sums of values each bounded by a host's memory: checked anyway, a corrupt share must not wrap.
  uint64_t pending = 0, pending_on_node = 0, reserved = 0;
  bool wrapped = false;
  auto add = [&wrapped](uint64_t& sum, uint64_t bytes) {
    wrapped = wrapped || sum > UINT64_MAX - bytes;
    sum = wrapped ? UINT64_MAX : sum + bytes;
  };
  for (const RankShare& other : shares.others) {
    add(reserved, other.bytes);
    if (other.resident) continue;
    add(pending, other.bytes);
    if (other.numa_node == request.numa_node) add(pending_on_node, other.bytes);
  }
  uint64_t with_pending = request.bytes, with_pending_on_node = request.bytes;
  uint64_t with_reserved = request.bytes;
  add(with_pending, pending);
  add(with_pending_on_node, pending_on_node);
  add(with_reserved, reserved);
  auto others_text = [](uint64_t bytes, const char* what) {
    return bytes == 0
               ? std::string()
               : absl::StrCat(" (with ", FormatBytesExact(bytes), " ", what, " by other ranks)");
  };
  std::vector<std::string> binding;
  // `available` less the margin of `total` (Note [Admission margin]); the request must fit in it.
  auto usable = [](uint64_t available, uint64_t total) {
    const uint64_t margin = AdmissionMarginBytes(total);
    return available > margin ? available - margin : 0;
  };
  auto kept = [](uint64_t total, const char* of) {
    return absl::StrCat(", of which ", FormatBytesExact(AdmissionMarginBytes(total)),
                        " is kept as the admission margin (5% of ", of, ", at least 1 GiB)");
  };
  if (with_pending > usable(s.mem_available_bytes, s.mem_total_bytes)) {
    binding.push_back(absl::StrCat("MemAvailable is ", FormatBytesExact(s.mem_available_bytes),
                                   kept(s.mem_total_bytes, "MemTotal"),
                                   others_text(pending, "admitted and not yet resident")));
  }
  if (const std::optional<uint64_t> headroom = s.cgroup.headroom_bytes();
      headroom.has_value() && with_pending > usable(*headroom, *s.cgroup.limit_bytes)) {
    binding.push_back(absl::StrCat(
        "cgroup ", s.cgroup.limiting_path, " limit ", FormatBytesExact(*s.cgroup.limit_bytes),
        " leaves ", FormatBytesExact(*headroom), kept(*s.cgroup.limit_bytes, "the limit"),
        others_text(pending, "admitted and not yet resident")));
  }
  if (request.numa_node >= 0 && s.online_nodes > 1 && s.node_available_bytes.has_value() &&
      with_pending_on_node >
          usable(*s.node_available_bytes, s.node_total_bytes.value_or(*s.node_available_bytes))) {
    binding.push_back(absl::StrCat(
        "node ", request.numa_node, " has ", FormatBytesExact(*s.node_available_bytes),
        " available",
        kept(s.node_total_bytes.value_or(*s.node_available_bytes), "the node's memory"),
        others_text(pending_on_node, "admitted on it and not yet resident")));
  }
  if (shares.node_budget_bytes.has_value() &&
      with_reserved > usable(*shares.node_budget_bytes, *shares.node_budget_bytes)) {
    binding.push_back(absl::StrCat("the node budget (STOWAGE_NODE_MEMORY_BYTES) is ",
                                   FormatBytesExact(*shares.node_budget_bytes),
                                   kept(*shares.node_budget_bytes, "the budget"),
                                   others_text(reserved, "reserved")));
  }
  if (request.memlock == MemlockUse::kLocked && !s.cap_ipc_lock &&
      s.memlock_limit_bytes.has_value()) {
    const uint64_t left = *s.memlock_limit_bytes > s.memlock_used_bytes
                              ? *s.memlock_limit_bytes - s.memlock_used_bytes
                              : 0;
    if (request.bytes > left) {
      binding.push_back(absl::StrCat("RLIMIT_MEMLOCK ", FormatBytesExact(*s.memlock_limit_bytes),
                                     " leaves ", FormatBytesExact(left),
                                     " (raise `ulimit -l` or grant CAP_IPC_LOCK)"));
    }
  }
  if (binding.empty()) return absl::OkStatus();
  std::string ranks;
  if (!shares.ledger.empty()) {
    std::vector<std::string> listed;
    for (const RankShare& other : shares.others) listed.push_back(DescribeShare(other));
    ranks =
        absl::StrCat(". Reservations on this node (", shares.ledger,
                     "): ", listed.empty() ? std::string("none") : absl::StrJoin(listed, "; "),
                     "; this request: ", RankName(shares.rank, shares.local_rank), " pid ",
                     getpid(), " node ", request.numa_node, ": ", FormatBytesExact(request.bytes));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(request.what, " of ", FormatBytesExact(request.bytes), where, " does not fit: ",
                   absl::StrJoin(binding, "; "), ranks, ". Host memory: ", DescribeHostMemory(s)));
}

absl::Status AdmitHostMemory(const AdmissionRequest& request, const HostRoots& roots) {
  absl::StatusOr<HostMemorySnapshot> snapshot = ReadHostMemory(request.numa_node, roots);
  if (!snapshot.ok()) return snapshot.status();
  return CheckAdmission(*snapshot, request);
}

absl::StatusOr<uint64_t> ResidentBytesOfMapping(const void* begin, uint64_t bytes,
                                                const HostRoots& roots) {
  absl::StatusOr<MappingResidency> residency = ReadMappingResidency(begin, bytes, roots);
  if (!residency.ok()) return residency.status();
  return residency->resident_bytes;
}

absl::StatusOr<MappingResidency> ReadMappingResidency(const void* begin, uint64_t bytes,
                                                      const HostRoots& roots) {
  absl::StatusOr<std::string> smaps = ReadSmallFile(roots.proc + "/self/smaps");
  if (!smaps.ok()) return smaps.status();
  const uint64_t lo = reinterpret_cast<uintptr_t>(begin);
  const uint64_t hi = lo + bytes;
  MappingResidency residency;
  bool inside = false;
  bool any = false;
  for (absl::string_view line : absl::StrSplit(*smaps, '\n')) {
    // A mapping header starts with "start-end " in hex; field lines start with "Name:".
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    uint64_t start = 0;
    uint64_t end = 0;
    if (dash != absl::string_view::npos && space != absl::string_view::npos && dash < space &&
        absl::SimpleHexAtoi(line.substr(0, dash), &start) &&
        absl::SimpleHexAtoi(line.substr(dash + 1, space - dash - 1), &end)) {
      inside = start < hi && end > lo;
      any = any || inside;
      continue;
    }
    if (!inside) continue;
    uint64_t* field = nullptr;
    if (absl::ConsumePrefix(&line, "Rss:")) {
      field = &residency.resident_bytes;
    } else if (absl::ConsumePrefix(&line, "AnonHugePages:")) {
      field = &residency.huge_page_bytes;
    }
    if (field != nullptr) {
      std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
      uint64_t kib = 0;
      if (!words.empty() && absl::SimpleAtoi(words[0], &kib)) *field += kib * 1024;
    }
  }
  if (!any) {
    return absl::NotFoundError(absl::StrFormat("no mapping overlaps [%p, +%d) in %s/self/smaps",
                                               begin, bytes, roots.proc));
  }
  return residency;
}

absl::StatusOr<std::map<int, uint64_t>> BytesByNode(const void* begin, uint64_t bytes,
                                                    uint64_t stride) {
  if (numa_available() < 0) {
    return absl::UnavailableError("page placement: the kernel has no NUMA support");
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  stride = std::max(page, stride / page * page);
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) / page * page;
  std::vector<void*> pages;
  for (uint64_t offset = 0; first + offset < reinterpret_cast<uintptr_t>(begin) + bytes;
       offset += stride) {
    pages.push_back(reinterpret_cast<void*>(first + offset));
  }
  std::vector<int> status(pages.size(), -1);
  std::map<int, uint64_t> by_node;
  // Queried in batches: move_pages with nodes == nullptr only reports.
  constexpr size_t kBatch = 4096;
  for (size_t at = 0; at < pages.size(); at += kBatch) {
    const size_t n = std::min(kBatch, pages.size() - at);
    if (numa_move_pages(0, n, pages.data() + at, nullptr, status.data() + at, 0) != 0) {
      const int error = errno;
      return absl::InternalError(absl::StrCat(
          "move_pages query of ", n, " pages: ", std::strerror(error), " (errno ", error, ")"));
    }
  }
  for (int node : status) by_node[node < 0 ? -1 : node] += stride;
  return by_node;
}

}  // namespace stowage::offload
