#include "storage/host_tier.h"

#include <utility>

namespace evoke {

ArenaReservation& ArenaReservation::operator=(ArenaReservation&& other) noexcept {
  if (this != &other) {
    Release();
    host_ = std::exchange(other.host_, nullptr);
    extent_ = other.extent_;
    committed_ = other.committed_;
  }
  return *this;
}

uint8_t* ArenaReservation::data() const { return host_->Data(extent_); }

void ArenaReservation::Commit() {
  if (host_ == nullptr || committed_) return;
  committed_ = true;
  host_->Committed(extent_);
}

void ArenaReservation::Release() {
  if (host_ == nullptr) return;
  HostTier* host = std::exchange(host_, nullptr);
  host->Free(extent_, committed_);
  committed_ = false;
}

HostTier::HostTier(std::unique_ptr<PinnedArena> arena, std::function<void()> on_freed)
    : arena_(std::move(arena)), on_freed_(std::move(on_freed)) {}

ArenaReservation HostTier::Wrap(const Extent& extent) {
  pending_.fetch_add(extent.length, std::memory_order_relaxed);
  return ArenaReservation(this, extent);
}

void HostTier::Free(const Extent& extent, bool committed) {
  if (!committed) pending_.fetch_sub(extent.length, std::memory_order_relaxed);
  arena_->Free(extent);
  if (on_freed_) on_freed_();
}

std::optional<ArenaReservation> HostTier::Reserve(uint64_t size) {
  absl::StatusOr<Extent> extent = arena_->Allocate(size);
  if (!extent.ok()) return std::nullopt;
  return Wrap(*extent);
}

std::optional<ArenaReservation> HostTier::ReserveBelow(uint64_t size, uint64_t limit) {
  // Racy by design (another reservation may land between the check and the
  // allocation): the limit is a soft guard against spill storms, not a bound.
  if (arena_->UsedBytes() + arena_->RoundedSize(size) > limit) return std::nullopt;
  return Reserve(size);
}

bool HostTier::ReserveAll(absl::Span<const uint64_t> sizes,
                          std::vector<ArenaReservation>* out) {
  out->clear();
  if (sizes.empty()) return true;
  if (sizes.size() > 1) {
    absl::StatusOr<std::vector<Extent>> run = arena_->AllocateContiguous(sizes);
    if (run.ok()) {
      out->reserve(run->size());
      for (const Extent& e : *run) out->push_back(Wrap(e));
      return true;
    }
  }
  out->reserve(sizes.size());
  for (uint64_t size : sizes) {
    std::optional<ArenaReservation> r = Reserve(size);
    if (!r) {
      out->clear();  // Releases what was reserved.
      return false;
    }
    out->push_back(std::move(*r));
  }
  return true;
}

}  // namespace evoke
