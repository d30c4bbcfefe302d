// Executor: a fixed pool of threads that runs RPC work which must not run on
// gRPC's reactor threads (copies of large payloads, disk I/O, waiting for
// room). Reactors hand work here and Finish() when it is done.
//
// Work is queued per key (the daemon keys by the caller's uid) and workers
// take keys in turn (round robin over the keys with work queued), so a key
// with many tasks queued delays another key's task by at most one task of
// its own per worker; TrySubmit also caps each key's tasks queued or running.
#ifndef EVOKE_DAEMON_EXECUTOR_H_
#define EVOKE_DAEMON_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace evoke {

// Thread-safe. One key's tasks start in submission order.
class Executor {
 public:
  using Task = absl::AnyInvocable<void() &&>;
  // Submit's key: tasks with no owner share it.
  static constexpr uint64_t kNoKey = UINT64_MAX;

  explicit Executor(int threads);
  // Runs every task already submitted, then joins the workers.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Submit queues `task` under kNoKey. Never blocks; never runs it inline.
  void Submit(Task task) { TrySubmit(kNoKey, 0, std::move(task)); }
  // TrySubmit queues `task` under `key` unless `limit` (0: none) of the
  // key's tasks are queued or running already; then it returns false and
  // leaves `task` unmoved.
  bool TrySubmit(uint64_t key, uint32_t limit, Task&& task);
  // Tasks of `key` queued or running now.
  uint32_t InFlight(uint64_t key) const;

 private:
  struct Lane {
    std::deque<Task> tasks;
    uint32_t in_flight = 0;  // Queued or running.
  };
  void Work();

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Lane> lanes_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> turns_ ABSL_GUARDED_BY(mu_);  // Keys with tasks queued, in turn.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_EXECUTOR_H_
