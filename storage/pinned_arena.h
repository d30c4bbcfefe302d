// PinnedArena: tier 1, one region of host memory allocated at start and
// carved into extents by a size-class allocator.
#ifndef EVOKE_STORAGE_PINNED_ARENA_H_
#define EVOKE_STORAGE_PINNED_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace evoke {

struct PinnedArenaOptions {
  // Size of the region. Rounded down to a multiple of granule_bytes; must be
  // at least one granule. Default: 1 GiB.
  uint64_t capacity_bytes = 1ull << 30;
  // Allocation unit and alignment of every extent. Power of two, >= 4096.
  // Default: 4 KiB.
  uint64_t granule_bytes = 4096;
  // Try to mlock the region so it is never swapped (and can later be
  // registered with CUDA cheaply). Best effort: failure is reported in
  // Stats, not returned. Default: true.
  bool lock_memory = true;
  // When the region is not locked (mlock faults every page in itself), fault
  // its pages in on a background thread (MADV_POPULATE_WRITE, Linux 5.14+),
  // so that Saves into fresh extents do not pay for the kernel zeroing each
  // page on first touch (half of a 1 MiB shared-memory Save's time, measured).
  // Commits capacity_bytes of memory up front, as mlock does. Default: true.
  bool prefault = true;
};

// An allocated piece of the arena. `length` is the reserved length (the
// request rounded up to its size class).
struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// PinnedArena owns one anonymous mapping of capacity_bytes and hands out
// extents. Allocation is segregated best fit over size classes: a request is
// rounded up to its class (granule multiples up to 8 granules, then 8 classes
// per power of two, so at most 12.5% internal waste), the smallest free range
// that fits is split, and freed ranges coalesce with their neighbours.
// The arena never hands out more than its capacity.
//
// Thread-safe: every method may be called concurrently. The bytes of an
// extent belong to whoever allocated it until Free().
class PinnedArena {
 public:
  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t used_bytes = 0;          // Sum of allocated extent lengths.
    uint64_t largest_free_bytes = 0;  // Longest free range.
    uint64_t extents = 0;             // Live allocations.
    bool locked = false;              // mlock succeeded.
    std::string lock_error;           // Why not, when !locked.
    // Bytes faulted in so far (capacity_bytes once done; all of them at
    // once when locked), and why prefaulting stopped short, if it did.
    uint64_t prefaulted_bytes = 0;
    std::string prefault_error;
  };

  // Create maps the region, locks it or starts prefaulting it. INVALID_ARGUMENT for bad options,
  // RESOURCE_EXHAUSTED when the mapping fails (ENOMEM).
  static absl::StatusOr<std::unique_ptr<PinnedArena>> Create(
      const PinnedArenaOptions& options);
  ~PinnedArena();
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;

  // Allocate reserves an extent of at least `size` bytes (size > 0).
  // RESOURCE_EXHAUSTED when no free range is large enough (the arena may
  // still have that many free bytes in total: see Stats.largest_free_bytes);
  // INVALID_ARGUMENT for size 0.
  absl::StatusOr<Extent> Allocate(uint64_t size);

  // AllocateContiguous reserves one extent per size, all inside one free
  // range and in order (each rounded up to the granule, not to its size
  // class), so that copies into consecutive extents can be coalesced.
  // RESOURCE_EXHAUSTED when no single range is large enough (callers may then
  // fall back to Allocate per block). Each extent is freed on its own.
  absl::StatusOr<std::vector<Extent>> AllocateContiguous(
      absl::Span<const uint64_t> sizes);

  // Free returns an extent obtained from Allocate or AllocateContiguous.
  // Freeing anything else is a programming error (checked in debug builds).
  void Free(const Extent& extent);

  // RoundedSize returns the length Allocate would reserve for `size` bytes.
  uint64_t RoundedSize(uint64_t size) const;

  // Data returns the address of an extent's first byte. Valid until the
  // arena is destroyed.
  uint8_t* Data(const Extent& extent) const { return base_ + extent.offset; }
  uint8_t* base() const { return base_; }
  uint64_t capacity_bytes() const { return capacity_; }

  Stats GetStats() const;
  // UsedBytes and LargestFreeBytes are cheap views of GetStats().
  uint64_t UsedBytes() const;
  uint64_t LargestFreeBytes() const;
  // WaitForPrefault blocks until the background prefault has ended (at
  // once when there is none) or `timeout` passed; true when it ended.
  bool WaitForPrefault(absl::Duration timeout) const;

 private:
  PinnedArena(uint8_t* base, uint64_t capacity, uint64_t granule, bool locked,
              std::string lock_error);
  // The background prefault: populates the region a slice at a time, so
  // that the destructor can stop it between slices.
  void Prefault();

  uint8_t* const base_;
  const uint64_t capacity_;
  const uint64_t granule_;
  const bool locked_;
  const std::string lock_error_;

  mutable absl::Mutex mu_;
  // Free ranges by offset (for coalescing) and by (length, offset) (for best
  // fit). Both always describe the same set.
  absl::btree_map<uint64_t, uint64_t> free_by_offset_ ABSL_GUARDED_BY(mu_);
  absl::btree_set<std::pair<uint64_t, uint64_t>> free_by_size_
      ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t extents_ ABSL_GUARDED_BY(mu_) = 0;

  mutable absl::Mutex prefault_mu_;
  uint64_t prefaulted_ ABSL_GUARDED_BY(prefault_mu_) = 0;
  std::string prefault_error_ ABSL_GUARDED_BY(prefault_mu_);
  bool prefault_done_ ABSL_GUARDED_BY(prefault_mu_) = true;
  bool stop_prefault_ ABSL_GUARDED_BY(prefault_mu_) = false;
  std::thread prefault_thread_;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_PINNED_ARENA_H_
