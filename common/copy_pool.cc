#include "common/copy_pool.h"

#include <sched.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "common/checksum.h"

namespace evoke {

namespace {

int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

CopyPool::CopyPool(int workers) : cores_(UsableCores()) {
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { Work(); });
}

CopyPool::~CopyPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void CopyPool::Drain(Job& job) {
  for (;;) {
    const size_t i = job.next.fetch_add(1);
    if (i >= job.tasks) return;
    job.task(i);
    job.done.fetch_add(1);
  }
}

void CopyPool::Work() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !jobs_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      job = jobs_.front();
      // Leave the job queued until its tasks are all taken, so several
      // workers can help with it.
      if (job->next.load() + 1 >= job->tasks) jobs_.pop_front();
    }
    Drain(*job);
  }
}

void CopyPool::ParallelFor(size_t tasks, std::function<void(size_t)> task) {
  if (threads_.empty() || tasks <= 1) {
    for (size_t i = 0; i < tasks; ++i) task(i);
    return;
  }
  auto job = std::make_shared<Job>();
  job->task = std::move(task);
  job->tasks = tasks;
  {
    absl::MutexLock lock(&mu_);
    jobs_.push_back(job);
  }
  Drain(*job);
  {
    // Taken by this thread to the end: make sure no worker picks it up late.
    absl::MutexLock lock(&mu_);
    auto it = std::find(jobs_.begin(), jobs_.end(), job);
    if (it != jobs_.end()) jobs_.erase(it);
  }
  while (job->done.load() < tasks) std::this_thread::yield();
}

namespace {

size_t Chunks(size_t size) {
  return (size + kChecksumChunkBytes - 1) / kChecksumChunkBytes;
}

// Pieces of a split copy: small enough that the hasher soon finds the next
// one copied, large enough that a memcpy and an XXH3 update each pay off.
constexpr size_t kSplitPiece = 64 * 1024;
constexpr size_t kMaxSplitPieces = 2 * kChecksumChunkBytes / kSplitPiece;

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

// Two tasks share the pieces: whoever runs task 0 (usually the caller)
// copies pieces and, after each, hashes every piece copied so far in order;
// task 1 only copies. Either may find all pieces taken, so neither waits on
// a task that has not started: task 0 waits only for pieces another thread
// is copying now.
template <bool kHashDestination>
uint64_t CopyPool::SplitCopyHashing(void* dst, const void* src, size_t size) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const uint8_t* hashed = kHashDestination ? d : s;
  const size_t pieces = (size + kSplitPiece - 1) / kSplitPiece;
  std::array<std::atomic<bool>, kMaxSplitPieces> copied{};
  std::atomic<size_t> next{0};
  auto copy_next = [&]() {
    const size_t i = next.fetch_add(1, std::memory_order_relaxed);
    if (i >= pieces) return false;
    const size_t off = i * kSplitPiece;
    std::memcpy(d + off, s + off, std::min(kSplitPiece, size - off));
    copied[i].store(true, std::memory_order_release);
    return true;
  };
  uint64_t checksum = 0;
  ParallelFor(2, [&](size_t task) {
    if (task == 1) {
      while (copy_next()) {
      }
      return;
    }
    PayloadHasher hasher;
    size_t cursor = 0;  // Pieces hashed.
    auto hash_copied = [&]() {
      size_t end = cursor;
      while (end < pieces && copied[end].load(std::memory_order_acquire)) ++end;
      if (end == cursor) return;
      const size_t from = cursor * kSplitPiece;
      hasher.Update(hashed + from, std::min(end * kSplitPiece, size) - from);
      cursor = end;
    };
    while (copy_next()) hash_copied();
    while (cursor < pieces) {
      hash_copied();
      if (cursor < pieces) CpuRelax();
    }
    checksum = hasher.Finish();
  });
  return checksum;
}

bool CopyPool::BeginSplit(size_t size) {
  if (size < kSplitCopyBytes || size > 2 * kChecksumChunkBytes || threads_.empty()) return false;
  // Two threads per split copy, this one's included.
  if (2 * (splitting_.fetch_add(1, std::memory_order_relaxed) + 1) <= cores_) return true;
  EndSplit();
  return false;
}

uint64_t CopyPool::CopyHashingDestination(void* dst, const void* src, size_t size) {
  if (BeginSplit(size)) {
    const uint64_t checksum = SplitCopyHashing<true>(dst, src, size);
    EndSplit();
    return checksum;
  }
  if (size <= 2 * kChecksumChunkBytes || threads_.empty()) {
    return evoke::CopyHashingDestination(dst, src, size);
  }
  std::vector<uint64_t> sums(Chunks(size));
  ParallelFor(sums.size(), [&](size_t i) {
    const size_t off = i * kChecksumChunkBytes;
    sums[i] = CopyHashingDestinationChunk(static_cast<uint8_t*>(dst) + off,
                                          static_cast<const uint8_t*>(src) + off,
                                          std::min(kChecksumChunkBytes, size - off));
  });
  return CombineChunkChecksums(sums, size);
}

uint64_t CopyPool::CopyHashingDestination(void* dst,
                                          absl::Span<const absl::string_view> pieces) {
  const size_t size = PiecesSize(pieces);
  if (size <= 2 * kChecksumChunkBytes || threads_.empty()) {
    return CopyPiecesHashingDestination(dst, pieces);
  }
  std::vector<uint64_t> sums(Chunks(size));
  ParallelFor(sums.size(), [&](size_t i) {
    const size_t off = i * kChecksumChunkBytes;
    sums[i] = CopyPiecesHashingDestinationChunk(static_cast<uint8_t*>(dst) + off, pieces, off,
                                                std::min(kChecksumChunkBytes, size - off));
  });
  return CombineChunkChecksums(sums, size);
}

uint64_t CopyPool::CopyHashingSource(void* dst, const void* src, size_t size) {
  if (BeginSplit(size)) {
    const uint64_t checksum = SplitCopyHashing<false>(dst, src, size);
    EndSplit();
    return checksum;
  }
  if (size <= 2 * kChecksumChunkBytes || threads_.empty()) {
    return evoke::CopyHashingSource(dst, src, size);
  }
  std::vector<uint64_t> sums(Chunks(size));
  ParallelFor(sums.size(), [&](size_t i) {
    const size_t off = i * kChecksumChunkBytes;
    sums[i] = CopyHashingSourceChunk(static_cast<uint8_t*>(dst) + off,
                                     static_cast<const uint8_t*>(src) + off,
                                     std::min(kChecksumChunkBytes, size - off));
  });
  return CombineChunkChecksums(sums, size);
}

uint64_t CopyPool::Checksum(const void* data, size_t size) {
  if (size <= 2 * kChecksumChunkBytes || threads_.empty()) {
    return PayloadChecksum(data, size);
  }
  std::vector<uint64_t> sums(Chunks(size));
  ParallelFor(sums.size(), [&](size_t i) {
    const size_t off = i * kChecksumChunkBytes;
    sums[i] = ChunkChecksum(static_cast<const uint8_t*>(data) + off,
                            std::min(kChecksumChunkBytes, size - off));
  });
  return CombineChunkChecksums(sums, size);
}

}  // namespace evoke
