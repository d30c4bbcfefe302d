#include "storage/staging_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace evoke {

bool StagingBudget::TryAcquire(uint64_t n) {
  absl::MutexLock lock(&mu_);
  if (stats_.in_use + n > capacity_) return false;
  stats_.in_use += n;
  stats_.peak = std::max(stats_.peak, stats_.in_use);
  return true;
}

bool StagingBudget::Acquire(uint64_t n, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (stats_.in_use + n > capacity_) {
    ++stats_.waits;
    while (stats_.in_use + n > capacity_) {
      if (freed_.WaitWithDeadline(&mu_, deadline) && stats_.in_use + n > capacity_) {
        ++stats_.refusals;
        return false;
      }
    }
  }
  stats_.in_use += n;
  stats_.peak = std::max(stats_.peak, stats_.in_use);
  return true;
}

void StagingBudget::Release(uint64_t n) {
  absl::MutexLock lock(&mu_);
  stats_.in_use -= std::min(n, stats_.in_use);
  freed_.SignalAll();
}

absl::StatusOr<uint8_t*> StagingBudget::Buffers::Take(
    uint64_t n, absl::Time deadline, const std::function<absl::Status()>& drain) {
  if (n > budget_->capacity()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a block of ", FormatByteSize(n), " is larger than the staging budget ",
        FormatByteSize(budget_->capacity()), " (--staging-bytes)"));
  }
  if (!budget_->TryAcquire(n)) {
    if (bytes_ > 0) {
      // Never wait while holding: finish what this call staged, free it.
      if (absl::Status s = drain(); !s.ok()) return s;
      Free();
    }
    if (!budget_->Acquire(n, deadline)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the staging budget (", FormatByteSize(budget_->capacity()),
          ", --staging-bytes) for reads that do not fit in tier 1 stayed held by other "
          "loads; retry"));
    }
  }
  buffers_.emplace_back(new uint8_t[n]);
  bytes_ += n;
  return buffers_.back().get();
}

void StagingBudget::Buffers::Free() {
  buffers_.clear();
  budget_->Release(bytes_);
  bytes_ = 0;
}

StagingBudget::Stats StagingBudget::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace evoke
