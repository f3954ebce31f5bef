#include "offload/node_ledger.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "offload/topology.h"

namespace stowage::offload {
namespace {

constexpr char kHeader[] = "stowage node ledger v1";
constexpr char kDefaultDir[] = "/dev/shm";
constexpr char kDefaultJob[] = "node";
// Job ids go into a file name: anything else becomes '_', and they are cut to this length.
constexpr size_t kMaxJobIdChars = 96;

std::string Errno(int error) { return absl::StrCat(std::strerror(error), " (errno ", error, ")"); }

const char* Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// An integer setting and where it came from, for messages: "environment variable LOCAL_RANK"
// or "local_world_size" (the option); empty when unknown (value -1).
struct Sourced {
  int value = -1;
  std::string source;
};

// The first of `names` that is set, as an int of at least `min`; -1 when none is. `what` says
// what the variable is, in the error.
absl::StatusOr<Sourced> IntFromEnv(std::initializer_list<const char*> names, int min = 0,
                                   const char* what = "the launcher's rank") {
  for (const char* name : names) {
    const char* value = Env(name);
    if (value == nullptr) continue;
    int parsed = 0;
    if (!absl::SimpleAtoi(value, &parsed) || parsed < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", name, " is '", value, "'; allowed: a ",
                       min > 0 ? "positive" : "non-negative", " integer (", what, ")"));
    }
    return Sourced{parsed, absl::StrCat("environment variable ", name)};
  }
  return Sourced{};
}

// `option` when set (>= 0), else the environment's, as IntFromEnv reads it.
absl::StatusOr<Sourced> OptionOrEnv(int option, const char* option_name,
                                    std::initializer_list<const char*> names, int min,
                                    const char* what) {
  if (option >= 0) {
    if (option < min) {
      return absl::InvalidArgumentError(absl::StrCat(option_name, " is ", option,
                                                     "; allowed: -1 (from ", *names.begin(),
                                                     ") or a positive integer (", what, ")"));
    }
    return Sourced{option, option_name};
  }
  return IntFromEnv(names, min, what);
}

std::string SanitizeJobId(absl::string_view job) {
  std::string out;
  for (char ch : job.substr(0, kMaxJobIdChars)) {
    out.push_back(absl::ascii_isalnum(ch) || ch == '-' || ch == '.' || ch == '_' ? ch : '_');
  }
  return out;
}

bool SameFile(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// The pid /proc/locks names as holding a flock on `file`; 0 when none is listed (or the holder is
// outside our pid namespace, where /proc/locks shows 0).
int64_t FlockHolder(const struct stat& file) {
  absl::StatusOr<std::string> locks = ReadSmallFile("/proc/locks");
  if (!locks.ok()) return 0;
  // "1: FLOCK  ADVISORY  WRITE 4242 00:1a:123456 0 EOF"; waiters' lines have "->" after the id.
  const std::string device =
      absl::StrFormat("%02x:%02x:%d", major(file.st_dev), minor(file.st_dev), file.st_ino);
  for (absl::string_view line : absl::StrSplit(*locks, '\n')) {
    const std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (fields.size() < 6 || fields[1] != "FLOCK" || fields[5] != device) continue;
    int64_t pid = 0;
    if (absl::SimpleAtoi(fields[4], &pid) && pid > 0) return pid;
  }
  return 0;
}

// The state letter of /proc/PID/stat ('R', 'S', 'T' stopped, 't' stopped by a tracer); '?' when
// unreadable.
char ProcessState(int64_t pid) {
  absl::StatusOr<std::string> stat = ReadSmallFile(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat.ok()) return '?';
  const size_t close = stat->rfind(')');
  return close != std::string::npos && close + 2 < stat->size() ? (*stat)[close + 2] : '?';
}

// Note [Ledger lock]. The lock file is flock()ed around each read-check-write of its ledger
// (microseconds) and removed, under the lock, together with the ledger when the job's last
// reservation goes, so a job id leaves nothing in the directory. Since the file may be removed
// (and another created) between our open and our flock, a lock counts only when the path still
// names the file locked; otherwise it is taken again.
//
// A holder that is stopped (SIGSTOP, a debugger) keeps the flock: the kernel drops it only when
// the holder's descriptor closes. Taking the lock from it (removing the file, locking another)
// would let two processes update the ledger at once: resumed, the stopped holder renames in the
// ledger it computed before it stopped, dropping every reservation admitted meanwhile -- the
// over-admission the ledger exists to prevent. So a waiter that finds the holder (/proc/locks)
// stopped for kStoppedHolderSeconds gives up with FAILED_PRECONDITION naming the process, and a
// releasing rank gives up likewise (its line is reclaimed once it has exited): neither waits out
// kLedgerLockTimeoutSeconds, which remains for a holder that runs but does not finish.
constexpr double kStoppedHolderSeconds = 0.5;

// The lock file's descriptor and its flock(LOCK_EX), released together.
class LockedFile {
 public:
  // `wait`: false gives UNAVAILABLE at once when another process holds the lock.
  static absl::StatusOr<LockedFile> Acquire(const std::string& path, bool wait = true) {
    const auto begin = std::chrono::steady_clock::now();
    const auto deadline = begin + std::chrono::duration<double>(kLedgerLockTimeoutSeconds);
    // When the holder was first seen stopped; the epoch while it is not.
    std::chrono::steady_clock::time_point stopped_since{};
    while (true) {
      const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0) {
        const int error = errno;
        return absl::InternalError(
            absl::StrCat("node ledger lock ", path, ": cannot open: ", Errno(error),
                         error == EACCES ? " (another user's job? set STOWAGE_JOB_ID or "
                                           "STOWAGE_LEDGER_DIR)"
                                         : ""));
      }
      LockedFile file(fd, path);
      struct stat held {};
      if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        struct stat named {};
        if (fstat(fd, &held) == 0 && stat(path.c_str(), &named) == 0 && SameFile(held, named)) {
          return file;
        }
        continue;  // removed by its last holder (Note [Ledger lock]): lock the one there now
      }
      const int error = errno;
      if (error != EWOULDBLOCK && error != EINTR) {
        return absl::InternalError(
            absl::StrCat("node ledger lock ", path, ": flock: ", Errno(error)));
      }
      if (!wait) return absl::UnavailableError(absl::StrCat("node ledger lock ", path, " is held"));
      const auto now = std::chrono::steady_clock::now();
      const int64_t holder = fstat(fd, &held) == 0 ? FlockHolder(held) : 0;
      const char state = holder > 0 ? ProcessState(holder) : '?';
      if (state == 'T' || state == 't') {
        if (stopped_since == std::chrono::steady_clock::time_point{}) stopped_since = now;
        if (now - stopped_since >= std::chrono::duration<double>(kStoppedHolderSeconds)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "node ledger lock ", path, " is held by process ", holder, ", which is stopped (",
              state == 'T' ? "SIGSTOP" : "a debugger",
              "): its update of the ledger is unfinished, so no other can start; resume it (`kill "
              "-CONT ",
              holder, "`) or end it, then retry"));
        }
      } else {
        stopped_since = {};
      }
      if (now > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "node ledger lock ", path, " was not free within ", kLedgerLockTimeoutSeconds,
            " s: process ", holder > 0 ? absl::StrCat(holder) : std::string("(unknown)"),
            " holds it (`fuser ", path, "` names it)"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  LockedFile(LockedFile&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}
  LockedFile& operator=(LockedFile&&) = delete;
  ~LockedFile() {
    if (fd_ < 0) return;
    // Released explicitly: a child forked meanwhile (a data loader worker) shares the open file
    // description, and close() alone would leave the lock held until that child exits.
    flock(fd_, LOCK_UN);
    close(fd_);
  }

  // Removes the lock file while holding it (Note [Ledger lock]): when its ledger is gone.
  void RemoveIfLedgerGone(const std::string& ledger) {
    struct stat st {};
    if (fd_ >= 0 && stat(ledger.c_str(), &st) != 0 && errno == ENOENT) unlink(path_.c_str());
  }

 private:
  LockedFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

absl::StatusOr<std::vector<LedgerEntry>> ReadLedgerFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) return std::vector<LedgerEntry>{};
    return absl::InternalError(absl::StrCat("node ledger ", path, ": cannot open: ", Errno(error)));
  }
  std::string text;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("node ledger ", path, ": read: ", Errno(error)));
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return ParseLedger(text, path);
}

// Replaces the ledger by rename (Note [Node ledger]); no entries: removes it.
absl::Status WriteLedgerFile(const std::string& path, const std::vector<LedgerEntry>& entries) {
  if (entries.empty()) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      const int error = errno;
      return absl::InternalError(absl::StrCat("node ledger ", path, ": unlink: ", Errno(error)));
    }
    return absl::OkStatus();
  }
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;
    return absl::InternalError(
        absl::StrCat("node ledger ", temp, ": cannot create: ", Errno(error)));
  }
  const std::string text = FormatLedger(entries);
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      close(fd);
      unlink(temp.c_str());
      return absl::InternalError(absl::StrCat("node ledger ", temp, ": write: ", Errno(error)));
    }
    written += static_cast<size_t>(n);
  }
  close(fd);
  if (rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temp.c_str());
    return absl::InternalError(
        absl::StrCat("node ledger ", path, ": rename from ", temp, ": ", Errno(error)));
  }
  return absl::OkStatus();
}

std::atomic<uint64_t> next_reservation_id{1};

struct Paths {
  std::string ledger;
  std::string lock;
};

Paths PathsFor(const LedgerOptions& options) {
  const std::string stem =
      absl::StrCat(options.dir, "/stowage-", getuid(), "-", SanitizeJobId(options.job_id));
  return {absl::StrCat(stem, ".ledger"), absl::StrCat(stem, ".lock")};
}

// A temporary ledger (WriteLedgerFile's "<ledger>.tmp.<pid>") this old was left by a writer killed
// between its create and its rename, which take microseconds.
constexpr int kStaleTempSeconds = 60;

// Note [Reclaiming other jobs]. A job's ledger kept the lines of its SIGKILLed ranks until the same
// job id admitted again, which a new job id never does. So every admission first visits this
// user's other ledgers in the directory: under each one's lock, taken only if free (a busy one
// is being updated, and nobody waits on another job's lock), the lines of dead processes are
// dropped, and a ledger left empty goes with its lock file. A lock file without a ledger (its
// job's last admission was refused) goes too, and so does an old temporary ledger. Ledgers that do
// not parse belong to another version and are left alone.
void ReclaimOtherJobs(const std::string& dir, const Paths& ours, const std::string& proc) {
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return;
  const std::string prefix = absl::StrCat("stowage-", getuid(), "-");
  std::vector<std::string> names;
  while (const dirent* entry = readdir(listing)) {
    if (absl::StartsWith(entry->d_name, prefix)) names.emplace_back(entry->d_name);
  }
  closedir(listing);
  const auto now = std::chrono::system_clock::now();
  for (const std::string& name : names) {
    const std::string path = absl::StrCat(dir, "/", name);
    if (path == ours.ledger || path == ours.lock) continue;
    absl::string_view stem = name;
    if (absl::StrContains(name, ".ledger.tmp.")) {
      struct stat st {};
      if (stat(path.c_str(), &st) == 0 &&
          now - std::chrono::system_clock::from_time_t(st.st_mtime) >
              std::chrono::seconds(kStaleTempSeconds)) {
        unlink(path.c_str());
      }
      continue;
    }
    if (!absl::ConsumeSuffix(&stem, ".ledger") && !absl::ConsumeSuffix(&stem, ".lock")) continue;
    const std::string ledger = absl::StrCat(dir, "/", stem, ".ledger");
    const std::string lock_path = absl::StrCat(dir, "/", stem, ".lock");
    if (ledger == ours.ledger) continue;
    absl::StatusOr<LockedFile> lock = LockedFile::Acquire(lock_path, /*wait=*/false);
    if (!lock.ok()) continue;
    absl::StatusOr<std::vector<LedgerEntry>> entries = ReadLedgerFile(ledger);
    if (entries.ok()) {
      std::vector<LedgerEntry> live;
      for (const LedgerEntry& e : *entries) {
        if (ReservationAlive(e, proc)) live.push_back(e);
      }
      if (live.size() != entries->size()) WriteLedgerFile(ledger, live).IgnoreError();
    }
    lock->RemoveIfLedgerGone(ledger);
  }
}

}  // namespace

int RankFromEnvironment() { return IntFromEnv({"RANK", "SLURM_PROCID"}).value_or(Sourced{}).value; }
int LocalRankFromEnvironment() {
  return IntFromEnv({"LOCAL_RANK", "SLURM_LOCALID"}).value_or(Sourced{}).value;
}

int RanksSharingNumaNode(int local_world_size, const Placement& placement) {
  if (local_world_size < 1) return 1;
  if (placement.node_count <= 1 || placement.gpus_sharing_node < 1) return local_world_size;
  return std::min(local_world_size, placement.gpus_sharing_node);
}

absl::StatusOr<LedgerOptions> ResolveLedgerOptions(const LedgerOptions& options) {
  LedgerOptions out = options;
  if (out.dir.empty())
    out.dir = Env("STOWAGE_LEDGER_DIR") ? Env("STOWAGE_LEDGER_DIR") : kDefaultDir;
  if (out.job_id.empty()) {
    for (const char* name : {"STOWAGE_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
      if (const char* value = Env(name); value != nullptr) {
        out.job_id = value;
        break;
      }
    }
    if (out.job_id.empty()) out.job_id = kDefaultJob;
  }
  if (out.rank < 0) {
    absl::StatusOr<Sourced> rank = IntFromEnv({"RANK", "SLURM_PROCID"});
    if (!rank.ok()) return rank.status();
    out.rank = rank->value;
  }
  Sourced local_rank{out.local_rank, "local_rank"};
  if (out.local_rank < 0) {
    absl::StatusOr<Sourced> local = IntFromEnv({"LOCAL_RANK", "SLURM_LOCALID"});
    if (!local.ok()) return local.status();
    local_rank = *local;
    out.local_rank = local->value;
  }
  // Note [Local world size]: torchrun's ranks on this machine, no more than the job's ranks and
  // more than this rank's local rank. Slurm's per-node task count (SLURM_TASKS_PER_NODE,
  // "2(x3),1") is not one integer and is not read; srun users set LOCAL_WORLD_SIZE.
  absl::StatusOr<Sourced> world = OptionOrEnv(options.world_size, "world_size",
                                              {"WORLD_SIZE", "SLURM_NTASKS"}, 1, "the job's ranks");
  if (!world.ok()) return world.status();
  absl::StatusOr<Sourced> local_world =
      OptionOrEnv(options.local_world_size, "local_world_size", {"LOCAL_WORLD_SIZE"}, 1,
                  "the job's ranks on this machine");
  if (!local_world.ok()) return local_world.status();
  if (local_world->value > 0 && world->value > 0 && local_world->value > world->value) {
    return absl::InvalidArgumentError(absl::StrCat(local_world->source, " is ", local_world->value,
                                                   "; allowed: a positive integer no larger "
                                                   "than the world size (",
                                                   world->source, " is ", world->value, ")"));
  }
  if (local_world->value > 0 && local_rank.value >= local_world->value) {
    return absl::InvalidArgumentError(
        absl::StrCat(local_world->source, " is ", local_world->value, " but ", local_rank.source,
                     " is ", local_rank.value,
                     "; allowed: a local world size above the local rank (local ranks are 0 "
                     "to LOCAL_WORLD_SIZE - 1)"));
  }
  out.world_size = world->value;
  out.local_world_size = local_world->value;
  if (!out.node_budget_bytes.has_value()) {
    if (const char* value = Env("STOWAGE_NODE_MEMORY_BYTES"); value != nullptr) {
      uint64_t bytes = 0;
      if (!absl::SimpleAtoi(value, &bytes) || bytes == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("environment variable STOWAGE_NODE_MEMORY_BYTES is '", value,
                         "'; allowed: a positive decimal byte count"));
      }
      out.node_budget_bytes = bytes;
    }
  }
  return out;
}

std::string FormatLedger(const std::vector<LedgerEntry>& entries) {
  std::string out = absl::StrCat(kHeader, "\n");
  for (const LedgerEntry& e : entries) {
    absl::StrAppend(&out, "pid=", e.pid, " start=", e.start_time, " id=", e.id, " rank=", e.rank,
                    " local_rank=", e.local_rank, " node=", e.numa_node, " slot=", e.slot,
                    " bytes=", e.bytes, " resident=", e.resident ? 1 : 0,
                    " pidns=", e.pid_namespace, "\n");
  }
  return out;
}

absl::StatusOr<std::vector<LedgerEntry>> ParseLedger(std::string_view text,
                                                     const std::string& path) {
  const std::string remedy =
      " -- it was not written by this version of stowage; with no stowage runtime of this job "
      "running on the node, remove it";
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(text.data(), text.size()), '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty() || lines[0] != kHeader) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ledger ", path, " line 1 is '",
                     lines.empty() ? std::string() : std::string(lines[0].substr(0, 80)),
                     "', expected '", kHeader, "'", remedy));
  }
  std::vector<LedgerEntry> entries;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<absl::string_view> fields = absl::StrSplit(lines[i], ' ');
    LedgerEntry e;
    int resident = -1;
    bool ok = fields.size() == 10;
    const std::pair<const char*, std::function<bool(absl::string_view)>> keys[] = {
        {"pid=", [&](absl::string_view v) { return absl::SimpleAtoi(v, &e.pid) && e.pid > 0; }},
        {"start=", [&](absl::string_view v) { return absl::SimpleAtoi(v, &e.start_time); }},
        {"id=", [&](absl::string_view v) { return absl::SimpleAtoi(v, &e.id); }},
        {"rank=",
         [&](absl::string_view v) { return absl::SimpleAtoi(v, &e.rank) && e.rank >= -1; }},
        {"local_rank=",
         [&](absl::string_view v) {
           return absl::SimpleAtoi(v, &e.local_rank) && e.local_rank >= -1;
         }},
        {"node=",
         [&](absl::string_view v) {
           return absl::SimpleAtoi(v, &e.numa_node) && e.numa_node >= -1;
         }},
        {"slot=", [&](absl::string_view v) { return absl::SimpleAtoi(v, &e.slot) && e.slot >= 0; }},
        {"bytes=", [&](absl::string_view v) { return absl::SimpleAtoi(v, &e.bytes); }},
        {"resident=",
         [&](absl::string_view v) {
           return absl::SimpleAtoi(v, &resident) && (resident | 1) == 1;
         }},
        {"pidns=", [&](absl::string_view v) { return absl::SimpleAtoi(v, &e.pid_namespace); }},
    };
    for (size_t k = 0; ok && k < std::size(keys); ++k) {
      absl::string_view field = fields[k];
      ok = absl::ConsumePrefix(&field, keys[k].first) && keys[k].second(field);
    }
    if (!ok) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ledger ", path, " line ", i + 1, " is not a reservation: '",
          std::string(lines[i].substr(0, 200)),
          "' (expected pid= start= id= rank= local_rank= node= slot= bytes= resident=0|1 pidns=)",
          remedy));
    }
    e.resident = resident == 1;
    entries.push_back(e);
  }
  return entries;
}

absl::StatusOr<uint64_t> ProcessStartTime(int64_t pid, const std::string& proc) {
  absl::StatusOr<std::string> stat = ReadSmallFile(absl::StrCat(proc, "/", pid, "/stat"));
  if (!stat.ok()) return absl::NotFoundError(absl::StrCat("no process ", pid));
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so fields are counted
  // from the last ')'. starttime is field 22; field 3 (state) is the first after it.
  const size_t close = stat->rfind(')');
  if (close == std::string::npos) {
    return absl::InternalError(absl::StrCat(proc, "/", pid, "/stat has no ')'"));
  }
  const std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(*stat).substr(close + 1), ' ', absl::SkipEmpty());
  constexpr size_t kStartTimeAfterComm = 22 - 3;
  uint64_t start = 0;
  if (fields.size() <= kStartTimeAfterComm ||
      !absl::SimpleAtoi(fields[kStartTimeAfterComm], &start)) {
    return absl::InternalError(absl::StrCat(proc, "/", pid, "/stat: no start time"));
  }
  return start;
}

uint64_t PidNamespace(int64_t pid, const std::string& proc) {
  struct stat st {};
  if (stat(absl::StrCat(proc, "/", pid, "/ns/pid").c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

bool ReservationAlive(const LedgerEntry& entry, const std::string& proc) {
  const uint64_t ours = PidNamespace(getpid(), proc);
  if (entry.pid_namespace != 0 && ours != 0 && entry.pid_namespace != ours) return true;
  absl::StatusOr<uint64_t> start = ProcessStartTime(entry.pid, proc);
  return start.ok() && *start == entry.start_time;
}

std::vector<int> CpuShare(const std::vector<int>& cpus, int slot, int share) {
  const size_t n = cpus.size();
  if (share <= 1 || n < static_cast<size_t>(share)) return cpus;
  const size_t s = static_cast<size_t>(slot % share);
  const size_t begin = s * n / static_cast<size_t>(share);
  const size_t end = (s + 1) * n / static_cast<size_t>(share);
  return std::vector<int>(cpus.begin() + static_cast<std::ptrdiff_t>(begin),
                          cpus.begin() + static_cast<std::ptrdiff_t>(end));
}

absl::StatusOr<std::unique_ptr<NodeReservation>> NodeReservation::Admit(
    const AdmissionRequest& request, const LedgerOptions& options, const HostRoots& roots) {
  absl::StatusOr<LedgerOptions> resolved = ResolveLedgerOptions(options);
  if (!resolved.ok()) return resolved.status();
  const Paths paths = PathsFor(*resolved);
  std::unique_ptr<NodeReservation> reservation(new NodeReservation());
  reservation->ledger_path_ = paths.ledger;
  reservation->lock_path_ = paths.lock;
  LedgerEntry& self = reservation->entry_;
  self.pid = getpid();
  absl::StatusOr<uint64_t> start = ProcessStartTime(self.pid, roots.proc);
  if (!start.ok()) {
    return absl::InternalError(absl::StrCat("node ledger: cannot read this process's start time: ",
                                            start.status().message()));
  }
  self.start_time = *start;
  self.id = next_reservation_id.fetch_add(1);
  self.rank = resolved->rank;
  self.local_rank = resolved->local_rank;
  self.numa_node = request.numa_node;
  self.bytes = request.bytes;
  self.pid_namespace = PidNamespace(self.pid, roots.proc);

  // Before taking our own lock, so that no lock is ever taken under another.
  ReclaimOtherJobs(resolved->dir, paths, roots.proc);
  absl::StatusOr<LockedFile> lock = LockedFile::Acquire(paths.lock);
  if (!lock.ok()) return lock.status();
  // However this admission ends, a lock file without a ledger does not stay (Note [Ledger lock]).
  struct RemoveLockIfLedgerGone {
    LockedFile& lock;
    const std::string& ledger;
    ~RemoveLockIfLedgerGone() { lock.RemoveIfLedgerGone(ledger); }
  } remove_lock_if_ledger_gone{*lock, paths.ledger};
  absl::StatusOr<std::vector<LedgerEntry>> entries = ReadLedgerFile(paths.ledger);
  if (!entries.ok()) return entries.status();
  std::vector<LedgerEntry> live;
  for (const LedgerEntry& e : *entries) {
    if (ReservationAlive(e, roots.proc)) live.push_back(e);  // the dead are reclaimed here
  }
  // Read under the lock: the reservations already resident are in these readings.
  absl::StatusOr<HostMemorySnapshot> snapshot = ReadHostMemory(request.numa_node, roots);
  if (!snapshot.ok()) return snapshot.status();
  NodeShares shares;
  shares.node_budget_bytes = resolved->node_budget_bytes;
  shares.ledger = paths.ledger;
  shares.rank = self.rank;
  shares.local_rank = self.local_rank;
  std::set<int> slots_taken;
  for (const LedgerEntry& e : live) {
    shares.others.push_back({e.rank, e.local_rank, e.pid, e.numa_node, e.bytes, e.resident});
    if (e.numa_node == self.numa_node) slots_taken.insert(e.slot);
  }
  if (absl::Status s = CheckAdmission(*snapshot, request, shares); !s.ok()) {
    // Still write back what was reclaimed, so the next reader has less to check.
    if (live.size() != entries->size()) WriteLedgerFile(paths.ledger, live).IgnoreError();
    return s;
  }
  while (slots_taken.count(self.slot) > 0) ++self.slot;
  reservation->ranks_on_node_ = static_cast<int>(slots_taken.size()) + 1;
  live.push_back(self);
  if (absl::Status s = WriteLedgerFile(paths.ledger, live); !s.ok()) return s;
  reservation->recorded_ = true;
  return reservation;
}

absl::Status NodeReservation::MarkResident() {
  absl::StatusOr<LockedFile> lock = LockedFile::Acquire(lock_path_);
  if (!lock.ok()) return lock.status();
  absl::StatusOr<std::vector<LedgerEntry>> entries = ReadLedgerFile(ledger_path_);
  if (!entries.ok()) return entries.status();
  entry_.resident = true;
  bool found = false;
  for (LedgerEntry& e : *entries) {
    if (e.pid == entry_.pid && e.start_time == entry_.start_time && e.id == entry_.id) {
      e.resident = true;
      found = true;
    }
  }
  // Someone removed the file meanwhile: put this reservation back, it still holds the memory.
  if (!found) entries->push_back(entry_);
  recorded_ = true;
  return WriteLedgerFile(ledger_path_, *entries);
}

NodeReservation::~NodeReservation() {
  // A forked child (a data loader worker) holds a copy of this object, not the reservation.
  if (getpid() != entry_.pid) return;
  // An admission that failed made no reservation, and has none to release.
  if (!recorded_) return;
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<LockedFile> lock = LockedFile::Acquire(lock_path_);
    if (!lock.ok()) return lock.status();
    absl::StatusOr<std::vector<LedgerEntry>> entries = ReadLedgerFile(ledger_path_);
    if (!entries.ok()) return entries.status();
    std::erase_if(*entries, [&](const LedgerEntry& e) {
      return e.pid == entry_.pid && e.start_time == entry_.start_time && e.id == entry_.id;
    });
    // The job's last reservation: its ledger and lock file go (Note [Ledger lock]).
    absl::Status written = WriteLedgerFile(ledger_path_, *entries);
    lock->RemoveIfLedgerGone(ledger_path_);
    return written;
  }();
  if (!status.ok()) {
    std::fprintf(stderr, "stowage: releasing the node reservation of %s: %s\n",
                 ledger_path_.c_str(), std::string(status.message()).c_str());
  }
}

}  // namespace stowage::offload
