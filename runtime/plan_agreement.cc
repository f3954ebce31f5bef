#include "runtime/plan_agreement.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stowage::runtime {

std::string FormatRankList(const std::vector<int>& ranks) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    runs.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(runs, ", ");
}

absl::Status CheckPlanAgreement(const std::vector<uint64_t>& hashes) {
  if (hashes.empty()) {
    return absl::InvalidArgumentError("plan agreement: no ranks' hashes to compare");
  }
  // Hash -> its ranks, in order of first appearance.
  std::vector<std::pair<uint64_t, std::vector<int>>> groups;
  std::map<uint64_t, size_t> index;
  for (size_t r = 0; r < hashes.size(); ++r) {
    auto [it, inserted] = index.emplace(hashes[r], groups.size());
    if (inserted) groups.push_back({hashes[r], {}});
    groups[it->second].second.push_back(static_cast<int>(r));
  }
  if (groups.size() == 1 && hashes[0] != kNoPlanHash) return absl::OkStatus();
  // The reference is the most common valid hash (ties: the one rank 0's side holds first).
  const std::pair<uint64_t, std::vector<int>>* reference = nullptr;
  for (const auto& group : groups) {
    if (group.first == kNoPlanHash) continue;
    if (reference == nullptr || group.second.size() > reference->second.size()) {
      reference = &group;
    }
  }
  std::vector<int> differ;
  std::vector<std::string> held;
  for (const auto& [hash, ranks] : groups) {
    if (&groups[index[hash]] != reference) differ.insert(differ.end(), ranks.begin(), ranks.end());
    held.push_back(absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", FormatRankList(ranks), ": ",
                                hash == kNoPlanHash ? std::string("no valid plan (see the error "
                                                                  "on that rank)")
                                                    : absl::StrFormat("0x%016x", hash)));
  }
  std::sort(differ.begin(), differ.end());
  return absl::FailedPreconditionError(
      absl::StrCat("plan agreement failed over ", hashes.size(),
                   " ranks: ", differ.size() == 1 ? "rank " : "ranks ", FormatRankList(differ),
                   differ.size() == 1 ? " differs" : " differ",
                   reference == nullptr ? " (no rank holds a valid plan)" : "",
                   ". Canonical plan hashes (stowage_plan_hash): ", absl::StrJoin(held, "; ")));
}

}  // namespace stowage::runtime
