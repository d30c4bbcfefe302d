// StagingBudget: the bytes that reads from tier 2 (and tier 3) may hold in
// heap buffers outside tier 1, across every call at once. A Load whose
// blocks cannot land in tier 1 or in the caller's own memory stages them
// here; a call that has used its share drains its sink (the deliveries so
// far complete, and their buffers go) before it stages more, so a call
// never waits while holding staging bytes, and the daemon's memory stays
// within tier 1 + the budget whatever the mix of calls.
#ifndef EVOKE_STORAGE_STAGING_BUDGET_H_
#define EVOKE_STORAGE_STAGING_BUDGET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace evoke {

class StagingBudget {
 public:
  explicit StagingBudget(uint64_t capacity) : capacity_(capacity) {}
  StagingBudget(const StagingBudget&) = delete;
  StagingBudget& operator=(const StagingBudget&) = delete;

  uint64_t capacity() const { return capacity_; }

  // TryAcquire takes `n` bytes if they are free now.
  bool TryAcquire(uint64_t n);
  // Acquire waits until `n` bytes are free or `deadline` passes (false).
  // n must be at most capacity().
  bool Acquire(uint64_t n, absl::Time deadline);
  void Release(uint64_t n);

  struct Stats {
    uint64_t in_use = 0;
    uint64_t peak = 0;     // Most bytes held at once since start.
    uint64_t waits = 0;    // Acquires that had to wait.
    uint64_t refusals = 0; // Acquires that gave up at their deadline.
  };
  Stats stats() const;

  // Buffers: one call's staging buffers, released (with their bytes) when it
  // is destroyed or drained.
  class Buffers {
   public:
    explicit Buffers(StagingBudget* budget) : budget_(budget) {}
    ~Buffers() { Free(); }
    Buffers(const Buffers&) = delete;
    Buffers& operator=(const Buffers&) = delete;

    // Take returns a buffer of `n` bytes. When the budget has no room and
    // this call holds buffers, `drain` runs first (it must end every use of
    // them) and they are freed; then it waits for room until `deadline`.
    // RESOURCE_EXHAUSTED naming --staging-bytes when `n` exceeds the
    // budget or no room came in time; drain's error as it is.
    absl::StatusOr<uint8_t*> Take(uint64_t n, absl::Time deadline,
                                  const std::function<absl::Status()>& drain);
    uint64_t bytes() const { return bytes_; }

   private:
    void Free();
    StagingBudget* const budget_;
    std::vector<std::unique_ptr<uint8_t[]>> buffers_;
    uint64_t bytes_ = 0;
  };

 private:
  const uint64_t capacity_;
  mutable absl::Mutex mu_;
  absl::CondVar freed_;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_STAGING_BUDGET_H_
