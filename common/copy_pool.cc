#include "common/copy_pool.h"

#include <algorithm>

#include "common/checksum.h"

namespace evoke {

CopyPool::CopyPool(int workers) {
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

}  // namespace

uint64_t CopyPool::CopyHashingDestination(void* dst, const void* src, size_t size) {
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
