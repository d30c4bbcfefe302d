// GoogleTest matchers for absl::Status and absl::StatusOr<T>:
//   EXPECT_THAT(s, IsOk());
//   EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
//   EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
//                           HasSubstr("n_tokens")));
//   EXPECT_THAT(statusor, IsOkAndHolds(42));
//   ASSERT_OK_AND_ASSIGN(auto v, FunctionReturningStatusOr());
#ifndef EVOKE_TESTING_STATUS_MATCHERS_H_
#define EVOKE_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace evoke::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s;
  return s.ok();
}

MATCHER_P(StatusIs, code,
          std::string("has code ") + absl::StatusCodeToString(code)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher,
           std::string("has code ") + absl::StatusCodeToString(code)) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         ::testing::Matches(message_matcher)(std::string(s.message()));
}

// IsOkAndHolds(m): a StatusOr<T> that is OK and whose value matches `m`.
MATCHER_P(IsOkAndHolds, value_matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

}  // namespace evoke::testing

#define EVOKE_TESTING_CONCAT_INNER_(a, b) a##b
#define EVOKE_TESTING_CONCAT_(a, b) EVOKE_TESTING_CONCAT_INNER_(a, b)

#define ASSERT_OK(expr) ASSERT_THAT((expr), ::evoke::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::evoke::testing::IsOk())

// ASSERT_OK_AND_ASSIGN(lhs, expr): asserts that the StatusOr `expr` is OK and
// moves its value into `lhs` (a declaration or an lvalue).
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                        \
  ASSERT_OK_AND_ASSIGN_IMPL_(EVOKE_TESTING_CONCAT_(evoke_or_, __LINE__), lhs, \
                             rexpr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                               \
  ASSERT_TRUE(statusor.ok()) << statusor.status();       \
  lhs = std::move(statusor).value()

#endif  // EVOKE_TESTING_STATUS_MATCHERS_H_
