// CopyPool: copies (and checksums) large payloads on several threads.
#ifndef EVOKE_COMMON_COPY_POOL_H_
#define EVOKE_COMMON_COPY_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "absl/synchronization/mutex.h"

namespace evoke {

// CopyPool splits a payload larger than two checksum chunks (1 MiB each, see
// common/checksum.h) across its worker threads and the calling thread, a
// chunk per task. A payload of kSplitCopyBytes up to two chunks is copied in
// pieces by the caller and one worker while the caller hashes the pieces in
// order as they land (one chunk cannot be hashed in parallel, but its copy
// can), when the host has a core to spare for each such copy in progress
// (on two cores, two concurrent copies are faster each on its own thread).
// The result is identical to the serial functions. Smaller payloads are
// copied on the calling thread. When every worker is busy (many concurrent calls), the
// caller does the work itself, so the pool never queues a copy behind
// another. Thread-safe.
class CopyPool {
 public:
  // `workers` extra threads; 0 makes every copy serial.
  explicit CopyPool(int workers);
  ~CopyPool();
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;

  static constexpr size_t kSplitCopyBytes = 512 * 1024;

  // CopyHashingDestination / CopyHashingSource as in common/checksum.h.
  uint64_t CopyHashingDestination(void* dst, const void* src, size_t size);
  uint64_t CopyHashingSource(void* dst, const void* src, size_t size);
  // The same from a payload in pieces (common/checksum.h):
  // CopyPiecesHashingDestination, one 1 MiB chunk per task.
  uint64_t CopyHashingDestination(void* dst, absl::Span<const absl::string_view> pieces);
  // Checksum as PayloadChecksum.
  uint64_t Checksum(const void* data, size_t size);
  // ParallelFor runs task(0..tasks-1) on the workers and this thread and
  // returns when all have run. `task` must be safe to call concurrently.
  void ParallelFor(size_t tasks, std::function<void(size_t)> task);

 private:
  struct Job {
    std::function<void(size_t)> task;
    size_t tasks = 0;
    std::atomic<size_t> next{0};
    std::atomic<size_t> done{0};
  };
  static void Drain(Job& job);
  // Whether a copy of `size` bytes should be split, and if so counts it in
  // splitting_ (the caller must call EndSplit after it).
  bool BeginSplit(size_t size);
  void EndSplit() { splitting_.fetch_sub(1, std::memory_order_relaxed); }
  template <bool kHashDestination>
  uint64_t SplitCopyHashing(void* dst, const void* src, size_t size);
  void Work();

  absl::Mutex mu_;
  std::deque<std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
  const int cores_;                  // Those this process may run on.
  std::atomic<int> splitting_{0};  // Split copies in progress.
};

}  // namespace evoke

#endif  // EVOKE_COMMON_COPY_POOL_H_
