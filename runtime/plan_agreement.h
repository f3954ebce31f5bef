// Plan agreement: ranks of one job check, before step 0, that they hold the same plan. Each rank
// contributes the hash of its canonical plan (CanonicalPlanHash, include/stowage/plan.h) over
// the trainer's own process group -- torch.distributed in Python (stowage.agree), an NCCL
// communicator in C++ (stowage_agree_nccl) -- and every rank then applies CheckPlanAgreement to
// the same gathered list, so a mismatch fails every rank with the same message.
//
// When plans carry pipeline stages, a job's ranks still share one plan (every stage in it), so
// the whole plan's hash is what they compare; the stage a rank runs is its own choice within it.
#ifndef STOWAGE_RUNTIME_PLAN_AGREEMENT_H_
#define STOWAGE_RUNTIME_PLAN_AGREEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace stowage::runtime {

// A rank that has no valid plan contributes this (its own error is reported on that rank).
inline constexpr uint64_t kNoPlanHash = 0;

// `hashes[r]` is rank r's. OK when every rank holds the same valid plan; else FAILED_PRECONDITION
// naming the ranks that differ from the most common hash and what every rank holds, e.g.
// "plan agreement failed over 4 ranks: rank 2 differs. Canonical plan hashes: ranks 0-1, 3:
// 0x9f...; rank 2: 0x1c..." -- a pure function of `hashes`, so identical on every rank.
// INVALID_ARGUMENT for an empty list.
absl::Status CheckPlanAgreement(const std::vector<uint64_t>& hashes);

// "0-3, 5, 7-8".
std::string FormatRankList(const std::vector<int>& ranks);

// All-gathers `hash` over `nccl_comm` (an ncclComm_t) and checks it with CheckPlanAgreement.
// NCCL's symbols are taken from the process (the library that made the communicator), else from
// libnccl.so.2. UNAVAILABLE when stowage was built without NCCL (STOWAGE_HAVE_NCCL) or no NCCL is
// loadable; INTERNAL naming the failed CUDA or NCCL call.
absl::Status AgreeOverNccl(uint64_t hash, void* nccl_comm);

}  // namespace stowage::runtime

#endif  // STOWAGE_RUNTIME_PLAN_AGREEMENT_H_
