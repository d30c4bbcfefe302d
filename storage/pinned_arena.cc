#include "storage/pinned_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/base/macros.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/background_thread.h"
#include "common/byte_size.h"

namespace evoke {
namespace {

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older C libraries lack the name.
#endif

// The background prefault populates this much per madvise call: small
// enough that a stopping daemon waits at most a few milliseconds for it.
constexpr uint64_t kPrefaultSlice = 64ull << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<PinnedArena>> PinnedArena::Create(
    const PinnedArenaOptions& options) {
  if (!IsPowerOfTwo(options.granule_bytes) || options.granule_bytes < 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "granule_bytes: ", options.granule_bytes,
        " must be a power of two >= 4096"));
  }
  const uint64_t capacity =
      options.capacity_bytes / options.granule_bytes * options.granule_bytes;
  if (capacity == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pinned_bytes: ", options.capacity_bytes,
        " is smaller than one granule (", options.granule_bytes, " bytes)"));
  }
  void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pinned_bytes: cannot map ", FormatByteSize(capacity), ": ",
        std::strerror(errno)));
  }
  // Transparent huge pages cut TLB misses on large copies; children forked
  // by the daemon (none today) must not share the region.
  madvise(p, capacity, MADV_HUGEPAGE);
  madvise(p, capacity, MADV_DONTFORK);
  bool locked = false;
  std::string lock_error = "not requested (lock_memory=false)";
  if (options.lock_memory) {
    if (mlock(p, capacity) == 0) {
      locked = true;
      lock_error.clear();
    } else {
      lock_error = absl::StrCat("mlock: ", std::strerror(errno),
                                " (raise RLIMIT_MEMLOCK or grant CAP_IPC_LOCK)");
    }
  }
  std::unique_ptr<PinnedArena> arena(new PinnedArena(
      static_cast<uint8_t*>(p), capacity, options.granule_bytes, locked,
      std::move(lock_error)));
  {
    absl::MutexLock lock(&arena->prefault_mu_);
    if (locked) {
      arena->prefaulted_ = capacity;  // mlock faulted every page in.
    } else if (options.prefault) {
      arena->prefault_done_ = false;
    } else {
      arena->prefault_error_ = "not requested (prefault=false)";
    }
  }
  if (!locked && options.prefault) {
    // Not MADV_WILLNEED, which does nothing for anonymous pages never
    // touched. A page a Save touches first is simply skipped by the kernel.
    arena->prefault_thread_ = std::thread([a = arena.get()] { a->Prefault(); });
  }
  return arena;
}

void PinnedArena::Prefault() {
  // The lowest CPU priority: the prefault takes only what the start (the
  // index rebuild) and the first clients leave.
  BecomeBackgroundThread("evoke-prefault", kPrefaultNice);
  for (uint64_t off = 0; off < capacity_;) {
    {
      absl::MutexLock lock(&prefault_mu_);
      if (stop_prefault_) {
        prefault_error_ = "stopped";
        break;
      }
    }
    const uint64_t n = std::min(kPrefaultSlice, capacity_ - off);
    if (madvise(base_ + off, n, MADV_POPULATE_WRITE) != 0) {
      const int err = errno;
      absl::MutexLock lock(&prefault_mu_);
      // EINVAL: a kernel before 5.14; ENOMEM: no memory to commit. Either
      // way Saves fault pages in as they go, as without prefaulting.
      prefault_error_ = absl::StrCat("madvise(MADV_POPULATE_WRITE): ", std::strerror(err));
      break;
    }
    off += n;
    absl::MutexLock lock(&prefault_mu_);
    prefaulted_ = off;
  }
  absl::MutexLock lock(&prefault_mu_);
  prefault_done_ = true;
}

bool PinnedArena::WaitForPrefault(absl::Duration timeout) const {
  absl::MutexLock lock(&prefault_mu_);
  return prefault_mu_.AwaitWithTimeout(absl::Condition(&prefault_done_), timeout);
}

PinnedArena::PinnedArena(uint8_t* base, uint64_t capacity, uint64_t granule,
                         bool locked, std::string lock_error)
    : base_(base),
      capacity_(capacity),
      granule_(granule),
      locked_(locked),
      lock_error_(std::move(lock_error)) {
  free_by_offset_.emplace(0, capacity_);
  free_by_size_.emplace(capacity_, 0);
}

PinnedArena::~PinnedArena() {
  if (prefault_thread_.joinable()) {
    {
      absl::MutexLock lock(&prefault_mu_);
      stop_prefault_ = true;
    }
    prefault_thread_.join();
  }
  if (locked_) munlock(base_, capacity_);
  munmap(base_, capacity_);
}

uint64_t PinnedArena::RoundedSize(uint64_t size) const {
  uint64_t granules = (size + granule_ - 1) / granule_;
  if (granules <= 8) return granules * granule_;
  // 8 classes per power of two: round up to a multiple of 2^(floor(log2) - 3).
  const int log2 = 63 - __builtin_clzll(granules);
  const uint64_t step = 1ull << (log2 - 3);
  granules = (granules + step - 1) / step * step;
  return granules * granule_;
}

absl::StatusOr<Extent> PinnedArena::Allocate(uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("size: must be > 0");
  if (size > capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(FormatByteSize(size), " exceeds the arena capacity ",
                     FormatByteSize(capacity_)));
  }
  uint64_t length = RoundedSize(size);
  if (length > capacity_) length = (size + granule_ - 1) / granule_ * granule_;
  absl::MutexLock lock(&mu_);
  auto it = free_by_size_.lower_bound({length, 0});
  if (it == free_by_size_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no free range of ", FormatByteSize(length), " (", FormatByteSize(used_),
        " of ", FormatByteSize(capacity_), " in use)"));
  }
  const auto [range_len, range_off] = *it;
  free_by_size_.erase(it);
  free_by_offset_.erase(range_off);
  if (range_len > length) {
    free_by_offset_.emplace(range_off + length, range_len - length);
    free_by_size_.emplace(range_len - length, range_off + length);
  }
  used_ += length;
  ++extents_;
  return Extent{range_off, length};
}

absl::StatusOr<std::vector<Extent>> PinnedArena::AllocateContiguous(
    absl::Span<const uint64_t> sizes) {
  uint64_t total = 0;
  for (uint64_t size : sizes) {
    if (size == 0) return absl::InvalidArgumentError("size: must be > 0");
    total += (size + granule_ - 1) / granule_ * granule_;
  }
  if (total == 0 || total > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no free range of ", FormatByteSize(total), " (capacity ",
        FormatByteSize(capacity_), ")"));
  }
  absl::MutexLock lock(&mu_);
  auto it = free_by_size_.lower_bound({total, 0});
  if (it == free_by_size_.end()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no free range of ", FormatByteSize(total)));
  }
  const auto [range_len, range_off] = *it;
  free_by_size_.erase(it);
  free_by_offset_.erase(range_off);
  if (range_len > total) {
    free_by_offset_.emplace(range_off + total, range_len - total);
    free_by_size_.emplace(range_len - total, range_off + total);
  }
  std::vector<Extent> out;
  out.reserve(sizes.size());
  uint64_t off = range_off;
  for (uint64_t size : sizes) {
    const uint64_t len = (size + granule_ - 1) / granule_ * granule_;
    out.push_back(Extent{off, len});
    off += len;
  }
  used_ += total;
  extents_ += sizes.size();
  return out;
}

void PinnedArena::Free(const Extent& extent) {
  absl::MutexLock lock(&mu_);
  uint64_t off = extent.offset;
  uint64_t len = extent.length;
  ABSL_HARDENING_ASSERT(len > 0 && off + len <= capacity_ && used_ >= len);
  used_ -= len;
  --extents_;
  // Coalesce with the following free range.
  auto next = free_by_offset_.lower_bound(off);
  ABSL_HARDENING_ASSERT(next == free_by_offset_.end() || next->first >= off + len);
  if (next != free_by_offset_.end() && next->first == off + len) {
    free_by_size_.erase({next->second, next->first});
    len += next->second;
    next = free_by_offset_.erase(next);
  }
  // Coalesce with the preceding free range.
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    ABSL_HARDENING_ASSERT(prev->first + prev->second <= off);
    if (prev->first + prev->second == off) {
      free_by_size_.erase({prev->second, prev->first});
      off = prev->first;
      len += prev->second;
      free_by_offset_.erase(prev);
    }
  }
  free_by_offset_.emplace(off, len);
  free_by_size_.emplace(len, off);
}

uint64_t PinnedArena::UsedBytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

uint64_t PinnedArena::LargestFreeBytes() const {
  absl::MutexLock lock(&mu_);
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

PinnedArena::Stats PinnedArena::GetStats() const {
  absl::MutexLock lock(&mu_);
  Stats s;
  s.capacity_bytes = capacity_;
  s.used_bytes = used_;
  s.largest_free_bytes =
      free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.extents = extents_;
  s.locked = locked_;
  s.lock_error = lock_error_;
  absl::MutexLock prefault(&prefault_mu_);
  s.prefaulted_bytes = prefaulted_;
  s.prefault_error = prefault_error_;
  return s;
}

}  // namespace evoke
