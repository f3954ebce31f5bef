// The one pair of early-return macros for absl::Status and absl::StatusOr, used by every module.
#ifndef STOWAGE_BASE_STATUS_MACROS_H_
#define STOWAGE_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"    // IWYU pragma: export
#include "absl/status/statusor.h"  // IWYU pragma: export

// Returns the status of `expr` from the enclosing function when it is not OK.
#define STOWAGE_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    const absl::Status stowage_status_ = (expr);       \
    if (!stowage_status_.ok()) return stowage_status_; \
  } while (0)

// Declares `const auto lhs` holding the value of the StatusOr `expr`, or returns its status from
// the enclosing function. One use per name in a scope (it declares `lhs##_or` too).
#define STOWAGE_ASSIGN_OR_RETURN(lhs, expr)     \
  auto lhs##_or = (expr);                       \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  const auto lhs = *lhs##_or

#endif  // STOWAGE_BASE_STATUS_MACROS_H_
