// Status propagation macros. Debian's Abseil (20220623) predates
// ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN, so evoke keeps its own.
#ifndef EVOKE_COMMON_STATUS_MACROS_H_
#define EVOKE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// EVOKE_RETURN_IF_ERROR(expr): evaluates `expr` (an absl::Status) once and
// returns it from the enclosing function when it is not OK.
#define EVOKE_RETURN_IF_ERROR(expr)                    \
  do {                                                 \
    ::absl::Status evoke_status_ = (expr);             \
    if (!evoke_status_.ok()) return evoke_status_;     \
  } while (0)

#define EVOKE_STATUS_CONCAT_INNER_(a, b) a##b
#define EVOKE_STATUS_CONCAT_(a, b) EVOKE_STATUS_CONCAT_INNER_(a, b)

// EVOKE_ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>);
// on error returns its status, otherwise moves the value into `lhs`, which
// may be a declaration (`auto x`) or an existing lvalue.
#define EVOKE_ASSIGN_OR_RETURN(lhs, rexpr)                                 \
  EVOKE_ASSIGN_OR_RETURN_IMPL_(                                            \
      EVOKE_STATUS_CONCAT_(evoke_statusor_, __LINE__), lhs, rexpr)

#define EVOKE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // EVOKE_COMMON_STATUS_MACROS_H_
