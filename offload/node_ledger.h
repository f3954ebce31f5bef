// The node ledger: ranks sharing a machine admit their pinned arenas against its RAM together.
//
// Note [Node ledger]. Each rank checking free memory alone lets eight ranks started at once all
// pass (none has touched its arena yet) and then be OOM-killed one by one. So every admission
// reads, checks and appends under one lock, to one small file per job on the node:
//   <dir>/stowage-<uid>-<job>.ledger  one line per live reservation: pid, the pid's start time
//                                     (field 22 of /proc/PID/stat), rank, local rank, NUMA node,
//                                     CPU slot, bytes, resident or pending, pid namespace;
//   <dir>/stowage-<uid>-<job>.lock    flock()ed for each read-check-write, never held between;
//                                     removed with the ledger when the job's last rank leaves
//                                     (Note [Ledger lock] in node_ledger.cc).
// <dir> is STOWAGE_LEDGER_DIR or /dev/shm (node-local tmpfs, gone at reboot with every process
// that could hold a reservation). The job is STOWAGE_JOB_ID, else TORCHELASTIC_RUN_ID (torchrun),
// else SLURM_JOB_ID, else "node" (every stowage runtime of this user on the machine). The ledger
// is replaced by rename() under the lock, so a process killed mid-write leaves the old ledger, not
// half a new one; a file that still does not parse is an error naming its path and line (it
// was not written by this version), never silently rebuilt: forgetting reservations is the
// over-admission this exists to prevent.
//
// A reservation lives as long as its NodeReservation (the runtime's lifetime); a rank killed
// without running destructors (SIGKILL, OOM kill) leaves its line, and the next admission
// reclaims it: its pid is gone, or the pid now belongs to a younger process (start time differs).
// Every admission also reclaims the dead lines of this user's other jobs in <dir>, whatever their
// job id (Note [Reclaiming other jobs] in node_ledger.cc), so a killed job leaves nothing behind.
// Lines from another pid namespace (a container sharing /dev/shm but not pids) cannot be checked
// and are kept.
//
// The check itself is CheckAdmission's (offload/host_memory.h, Note [Admission with other ranks]).
// STOWAGE_NODE_MEMORY_BYTES sets a fixed budget for all arenas of the job on the node together
// (containers whose limits /proc and the cgroup do not show; tests).
#ifndef STOWAGE_OFFLOAD_NODE_LEDGER_H_
#define STOWAGE_OFFLOAD_NODE_LEDGER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/host_memory.h"
#include "offload/topology.h"

namespace stowage::offload {

struct LedgerOptions {
  std::string dir;      // "": $STOWAGE_LEDGER_DIR, else /dev/shm
  std::string job_id;   // "": $STOWAGE_JOB_ID, $TORCHELASTIC_RUN_ID, $SLURM_JOB_ID, else "node"
  int rank = -1;        // -1: $RANK, else $SLURM_PROCID, else unknown
  int local_rank = -1;  // -1: $LOCAL_RANK, else $SLURM_LOCALID, else unknown
  // The job's ranks on this machine (Note [Local world size]); -1: $LOCAL_WORLD_SIZE (torchrun),
  // else unknown.
  int local_world_size = -1;
  // The job's ranks, which bound local_world_size; -1: $WORLD_SIZE, else $SLURM_NTASKS, else
  // unknown.
  int world_size = -1;
  // nullopt: $STOWAGE_NODE_MEMORY_BYTES (a decimal byte count), else no fixed budget.
  std::optional<uint64_t> node_budget_bytes;
};

// The options with every empty field filled from the environment as documented above.
// INVALID_ARGUMENT naming the variable (or the option) and its value for a malformed
// STOWAGE_NODE_MEMORY_BYTES, RANK, LOCAL_RANK, WORLD_SIZE or LOCAL_WORLD_SIZE, for a local world
// size above the world size, and for a local rank not below the local world size.
absl::StatusOr<LedgerOptions> ResolveLedgerOptions(const LedgerOptions& options);

// Note [Local world size]. How many ranks share this rank's NUMA node (its CPUs, for Note [CPU
// shares] in runtime/runtime.cc), when the launcher says how many ranks of the job run on this
// machine (torchrun's LOCAL_WORLD_SIZE): without it the runtime knows only the plan's
// gpus_per_numa_node and the reservations the ledger holds when it admits, so the first rank to
// start on a node planned with one GPU per node took all of the node's CPUs, and the ranks after
// it shared what it already used. With it:
//  - a machine of one NUMA node (or without NUMA information): every local rank is on it;
//  - several nodes, with the GPUs on this node counted (Placement::gpus_sharing_node, from sysfs):
//    each rank drives its own GPU, so at most that many of the local ranks are here;
//  - several nodes and no GPUs counted (the host backend on a CPU machine): every local rank may
//    be here, so the count is all of them (a thinner slice than needed, never a shared one).
// Always at least 1. The runtime takes the most of this and the ledger's live count (several
// runtimes in one process each hold a reservation).
int RanksSharingNumaNode(int local_world_size, const Placement& placement);

// The rank and local rank of this process from the launcher's environment (RANK/LOCAL_RANK, else
// SLURM_PROCID/SLURM_LOCALID); -1 where unset. The same reading as ResolveLedgerOptions.
int RankFromEnvironment();
int LocalRankFromEnvironment();

struct LedgerEntry {
  int64_t pid = 0;
  uint64_t start_time = 0;  // clock ticks after boot (/proc/PID/stat field 22)
  uint64_t id = 0;          // distinguishes reservations of one process
  int rank = -1;
  int local_rank = -1;
  int numa_node = -1;
  int slot = 0;  // this reservation's share of the node's CPUs (smallest free when admitted)
  uint64_t bytes = 0;
  bool resident = false;
  uint64_t pid_namespace = 0;  // inode of /proc/PID/ns/pid; 0 unknown
};

// The ledger's text. Parse errors name `path`, the line number and the line.
std::string FormatLedger(const std::vector<LedgerEntry>& entries);
absl::StatusOr<std::vector<LedgerEntry>> ParseLedger(std::string_view text,
                                                     const std::string& path);

// Start time of `pid` (clock ticks after boot); NOT_FOUND when there is no such process.
absl::StatusOr<uint64_t> ProcessStartTime(int64_t pid, const std::string& proc = "/proc");
// The pid namespace inode of `pid` (0 when unreadable).
uint64_t PidNamespace(int64_t pid, const std::string& proc = "/proc");
// Whether the reservation's process still runs: same pid, same start time. An entry of another
// pid namespace than ours counts as alive (it cannot be checked).
bool ReservationAlive(const LedgerEntry& entry, const std::string& proc = "/proc");

// The `slot`-th of `share` near-equal slices of `cpus` (all of them when share <= 1 or there are
// fewer CPUs than shares, so that no rank gets none).
std::vector<int> CpuShare(const std::vector<int>& cpus, int slot, int share);

// One rank's reservation (RAII): admitted against the node's memory together with every live
// reservation of the job's other ranks, removed from the ledger when destroyed. Thread-safe:
// reservations of one process (several runtimes) serialise on the ledger's lock like those of
// other processes.
class NodeReservation {
 public:
  // Under the ledger's lock: reclaims dead reservations, reads host memory (ReadHostMemory with
  // `roots`), checks `request` with the others' shares (CheckAdmission), and records this one as
  // pending. RESOURCE_EXHAUSTED naming every rank's share when it does not fit;
  // FAILED_PRECONDITION for a ledger that does not parse, and (within a second) when the lock's
  // holder is a stopped process, naming it (Note [Ledger lock]); DEADLINE_EXCEEDED when the lock
  // is not free within kLedgerLockTimeoutSeconds; INTERNAL for a filesystem error (naming the
  // file).
  static absl::StatusOr<std::unique_ptr<NodeReservation>> Admit(const AdmissionRequest& request,
                                                                const LedgerOptions& options,
                                                                const HostRoots& roots = {});
  NodeReservation(const NodeReservation&) = delete;
  NodeReservation& operator=(const NodeReservation&) = delete;
  // Removes the reservation; failures are logged to stderr.
  ~NodeReservation();

  // The arena is touched: from now on the host memory readings include it
  // (Note [Admission with other ranks]).
  absl::Status MarkResident();

  int slot() const { return entry_.slot; }
  // Live reservations on this reservation's NUMA node when it was admitted, itself included.
  int ranks_on_node() const { return ranks_on_node_; }
  const std::string& ledger_path() const { return ledger_path_; }
  const LedgerEntry& entry() const { return entry_; }

 private:
  NodeReservation() = default;

  std::string ledger_path_;
  std::string lock_path_;
  LedgerEntry entry_;
  int ranks_on_node_ = 1;
  // Whether entry_ was written to the ledger: only then does the destructor remove it.
  bool recorded_ = false;
};

// How long an admission waits for the ledger's lock. The lock is held only for a read, a check
// and a rename of a file of one line per rank (microseconds); a holder stopped mid-update
// (SIGSTOP, a debugger) is named within a second instead (Note [Ledger lock]), so this bounds
// only a holder that runs but does not finish.
inline constexpr double kLedgerLockTimeoutSeconds = 30;

}  // namespace stowage::offload

#endif  // STOWAGE_OFFLOAD_NODE_LEDGER_H_
