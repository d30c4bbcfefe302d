// Executor: a fixed pool of threads that runs RPC work which must not run on
// gRPC's reactor threads (copies of large payloads, disk I/O, waiting for
// room). Reactors hand work here and Finish() when it is done.
#ifndef EVOKE_DAEMON_EXECUTOR_H_
#define EVOKE_DAEMON_EXECUTOR_H_

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace evoke {

// Thread-safe. Tasks run in submission order across `threads` workers.
class Executor {
 public:
  explicit Executor(int threads);
  // Runs every task already submitted, then joins the workers.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Submit queues `task`. Never blocks; never runs the task inline.
  void Submit(absl::AnyInvocable<void() &&> task);

 private:
  void Work();

  absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_EXECUTOR_H_
