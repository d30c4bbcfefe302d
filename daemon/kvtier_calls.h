// Helpers shared by the files that implement KvTierService's methods
// (kvtier_service.cc, kvtier_holds.cc): status translation, where a call
// runs (the reactor, or the executor in its uid's lane) and who called.
// Internal to the daemon.
#ifndef EVOKE_DAEMON_KVTIER_CALLS_H_
#define EVOKE_DAEMON_KVTIER_CALLS_H_

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "daemon/executor.h"
#include "daemon/kvtier_service.h"

namespace evoke::kvtier_calls {

// ToGrpc translates an absl::Status for the wire; the codes share numbering.
inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  if (s.code() == absl::StatusCode::kDataLoss ||
      s.code() == absl::StatusCode::kInternal ||
      s.code() == absl::StatusCode::kUnavailable) {
    // Per request: at most one line a second (the rest counted).
    EVOKE_LOG_WARNING_EVERY_N_SEC(1, s.ToString());
  } else {
    EVOKE_LOG_DEBUG(s.ToString());
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

inline absl::Time DeadlineOf(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline >= std::chrono::system_clock::time_point::max() -
                      std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// Finishes on the calling (reactor) thread: for memory-only work.
template <typename Fn>
grpc::ServerUnaryReactor* FinishInline(grpc::CallbackServerContext* context,
                                       Fn&& fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(fn()));
  return reactor;
}

using Lane = KvTierService::CallLane;

// RESOURCE_EXHAUSTED for a call past its uid's cap on calls in flight.
inline absl::Status TooManyCalls(const Lane& lane) {
  return absl::ResourceExhaustedError(
      absl::StrCat("uid ", lane.uid, " has ", lane.limit,
                   " calls queued or running, the limit per uid (--max-calls-per-uid); "
                   "retry when one finishes"));
}

// Runs `task` on the executor in `lane`'s turn, or finishes `reactor` with
// TooManyCalls.
inline void SubmitOrRefuse(Executor* executor, const Lane& lane, grpc::ServerUnaryReactor* reactor,
                    Executor::Task task) {
  if (!executor->TrySubmit(lane.uid, lane.limit, std::move(task))) {
    reactor->Finish(ToGrpc(TooManyCalls(lane)));
  }
}

// Runs `fn` on the executor and finishes the reactor from there.
template <typename Fn>
grpc::ServerUnaryReactor* FinishOnExecutor(Executor* executor, const Lane& lane,
                                           grpc::CallbackServerContext* context,
                                           Fn fn) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  SubmitOrRefuse(executor, lane, reactor, [reactor, fn = std::move(fn)]() mutable {
    reactor->Finish(ToGrpc(fn()));
  });
  return reactor;
}

// Identifies the caller of `context` into `caller` (a shared_ptr<const
// Caller>), or finishes the call with the reason it may not call.
#define EVOKE_CALLER_OR_FINISH(caller, context)                                  \
  absl::StatusOr<std::shared_ptr<const Caller>> caller##_or = Identify(*context); \
  if (!caller##_or.ok()) {                                                      \
    return ::evoke::kvtier_calls::FinishInline(                                 \
        context, [&] { return caller##_or.status(); });                         \
  }                                                                             \
  std::shared_ptr<const Caller> caller = *std::move(caller##_or)

}  // namespace evoke::kvtier_calls

#endif  // EVOKE_DAEMON_KVTIER_CALLS_H_
