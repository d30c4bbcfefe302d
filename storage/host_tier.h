// HostTier: tier 1, the pinned arena, handed out only as RAII reservations.
#ifndef EVOKE_STORAGE_HOST_TIER_H_
#define EVOKE_STORAGE_HOST_TIER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "storage/pinned_arena.h"

namespace evoke {

class HostTier;

// ArenaReservation holds one extent of tier 1. It is the only way to hold
// tier-1 bytes: the extent returns to the arena when the reservation is
// destroyed or Release()d, so no path can leak or double-free it.
//
// A reservation starts *pending* (being filled by a Save or a promotion; the
// bytes are counted in HostTier::pending_bytes(), which the spiller adds to
// what it could free once those writes land) and becomes *resident* with
// Commit() when a block owns it. Move-only.
class ArenaReservation {
 public:
  ArenaReservation() = default;
  ~ArenaReservation() { Release(); }
  ArenaReservation(ArenaReservation&& other) noexcept { *this = std::move(other); }
  ArenaReservation& operator=(ArenaReservation&& other) noexcept;
  ArenaReservation(const ArenaReservation&) = delete;
  ArenaReservation& operator=(const ArenaReservation&) = delete;

  explicit operator bool() const { return host_ != nullptr; }
  const Extent& extent() const { return extent_; }
  // Reserved length (the request rounded up), what the arena accounts.
  uint64_t length() const { return extent_.length; }
  uint8_t* data() const;
  bool committed() const { return committed_; }

  // Commit turns a pending reservation into a resident one. Idempotent.
  void Commit();
  // Release returns the extent to the arena now (and tells the HostTier's
  // listener that room was freed). No-op on an empty reservation.
  void Release();

 private:
  friend class HostTier;
  ArenaReservation(HostTier* host, const Extent& extent)
      : host_(host), extent_(extent) {}

  HostTier* host_ = nullptr;
  Extent extent_;
  bool committed_ = false;
};

// HostTier wraps the PinnedArena: reservations (one at a time, or a batch in
// one contiguous range so copies coalesce), the pending-bytes count, and a
// listener called whenever bytes return to the arena (the engine wakes saves
// waiting for room). Thread-safe; reservations must not outlive it.
class HostTier {
 public:
  HostTier(std::unique_ptr<PinnedArena> arena, std::function<void()> on_freed);
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Reserve reserves at least `size` bytes. nullopt when no free range is
  // large enough.
  std::optional<ArenaReservation> Reserve(uint64_t size);
  // ReserveBelow reserves `size` bytes only if tier 1 then stays at or under
  // `limit` used bytes (promotions must never cause a spill storm).
  std::optional<ArenaReservation> ReserveBelow(uint64_t size, uint64_t limit);
  // ReserveAll reserves one extent per size, all or none: in one contiguous
  // range when one is free, else one by one. Returns false (and reserves
  // nothing) when they do not all fit.
  bool ReserveAll(absl::Span<const uint64_t> sizes, std::vector<ArenaReservation>* out);

  uint64_t RoundedSize(uint64_t size) const { return arena_->RoundedSize(size); }
  uint64_t capacity_bytes() const { return arena_->capacity_bytes(); }
  uint64_t used_bytes() const { return arena_->UsedBytes(); }
  uint64_t largest_free_bytes() const { return arena_->LargestFreeBytes(); }
  // Bytes of reservations not yet committed (saves and promotions in flight).
  uint64_t pending_bytes() const { return pending_.load(std::memory_order_relaxed); }
  PinnedArena::Stats arena_stats() const { return arena_->GetStats(); }
  uint8_t* Data(const Extent& extent) const { return arena_->Data(extent); }

 private:
  friend class ArenaReservation;
  ArenaReservation Wrap(const Extent& extent);
  void Free(const Extent& extent, bool committed);
  void Committed(const Extent& extent) {
    pending_.fetch_sub(extent.length, std::memory_order_relaxed);
  }

  const std::unique_ptr<PinnedArena> arena_;
  const std::function<void()> on_freed_;
  std::atomic<uint64_t> pending_{0};
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_HOST_TIER_H_
