#include "client/ring_client.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/futex.h"

namespace evoke {
namespace {

using ring::RingCqe;
using ring::RingHeader;
using ring::RingSlice;
using ring::RingSqe;

// Arguments of one submission: the serialized protobuf, then its slices at
// the next multiple of 8.
uint32_t PackArgs(absl::string_view proto, absl::Span<const v1::RegionSlice> slices,
                  std::string* out) {
  const size_t slices_at = (proto.size() + 7) & ~size_t{7};
  out->assign(slices_at + slices.size() * sizeof(RingSlice), '\0');
  std::memcpy(out->data(), proto.data(), proto.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    const RingSlice s{slices[i].region_id(), slices[i].offset(), slices[i].length()};
    std::memcpy(out->data() + slices_at + i * sizeof(RingSlice), &s, sizeof(s));
  }
  return static_cast<uint32_t>(out->size());
}

RingSlice ToRing(const v1::RegionSlice& s) { return {s.region_id(), s.offset(), s.length()}; }

}  // namespace

ring::RingGeometry ClientRingGeometry(uint32_t entries) {
  ring::RingGeometry g;
  g.sq_entries = entries;
  g.cq_entries = std::min(entries * 2, ring::kMaxEntries);
  // Room for a block's meta with its summaries (a few KiB), and for the
  // meta a load returns.
  g.arg_bytes = 16u << 10;
  g.msg_bytes = 4u << 10;
  return g;
}

void RingClient::Init(uint8_t* base, const ring::RingGeometry& g) {
  auto* h = reinterpret_cast<RingHeader*>(base);
  h->magic = ring::kMagic;
  h->version = ring::kVersion;
  h->sq_entries = g.sq_entries;
  h->cq_entries = g.cq_entries;
  h->arg_bytes = g.arg_bytes;
  h->msg_bytes = g.msg_bytes;
}

RingClient::RingClient(std::unique_ptr<SharedRegion> region, const ring::RingGeometry& geometry,
                       absl::Duration spin, absl::Duration spin_max)
    : region_(std::move(region)),
      g_(geometry),
      spin_(spin, spin_max),
      base_(region_->data()),
      header_(reinterpret_cast<RingHeader*>(base_)) {}

bool RingClient::alive() const {
  return !dead_.load(std::memory_order_acquire) &&
         header_->broken.value.load(std::memory_order_acquire) == ring::kNotBroken;
}

absl::Status RingClient::DeadStatus() const {
  const uint32_t broken = header_->broken.value.load(std::memory_order_acquire);
  if (broken == ring::kBrokenSqIndex || broken == ring::kBrokenCqIndex) {
    return absl::UnavailableError("ring: the daemon stopped serving it (corrupt index)");
  }
  return absl::UnavailableError(
      "ring: the lease ended (the daemon went away or stopped); open a new lease");
}

void RingClient::MarkDead() {
  dead_.store(true, std::memory_order_release);
  FutexWake(&header_->cq_need_wake.value);
  absl::MutexLock lock(&mu_);
  reaped_.SignalAll();
}

absl::StatusOr<uint64_t> RingClient::SubmitSave(const BlockToSave& block, bool durable,
                                                absl::Time deadline) {
  thread_local std::string meta, args;
  block.meta.SerializeToString(&meta);
  RingSqe sqe{};
  sqe.opcode = ring::kOpSave;
  sqe.flags = static_cast<uint8_t>((block.pin ? ring::kSavePin : 0) |
                                   (durable ? ring::kSaveDurable : 0));
  if (!block.gather.empty()) {
    if (block.gather.size() > ring::kMaxSlices) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gather: ", block.gather.size(), " slices, the most is ", ring::kMaxSlices));
    }
    sqe.n_slices = static_cast<uint16_t>(block.gather.size());
  } else if (block.region) {
    sqe.slice = ToRing(*block.region);
  } else {
    return absl::InvalidArgumentError("payload: a ring save needs a region slice or gather");
  }
  const uint32_t arg_len = PackArgs(meta, block.gather, &args);
  if (arg_len > g_.arg_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("meta: ", arg_len,
                                                   " bytes of arguments exceed the ring's ",
                                                   g_.arg_bytes));
  }
  sqe.arg_len = arg_len;
  sqe.meta_len = static_cast<uint32_t>(meta.size());
  return Submit(sqe, reinterpret_cast<const uint8_t*>(args.data()), arg_len, Message::kNone,
                deadline);
}

absl::StatusOr<uint64_t> RingClient::SubmitLoad(const BlockId& id, absl::string_view fingerprint,
                                                absl::Span<const v1::RegionSlice> destination,
                                                std::optional<int32_t> first_position,
                                                bool want_meta, absl::Time deadline) {
  thread_local std::string args;
  RingSqe sqe{};
  sqe.opcode = ring::kOpLoad;
  sqe.flags = static_cast<uint8_t>((first_position ? ring::kLoadReanchor : 0) |
                                   (want_meta ? ring::kLoadWantMeta : 0));
  sqe.first_position = first_position.value_or(0);
  const std::string bytes = id.ToBytes();
  std::memcpy(sqe.id, bytes.data(), sizeof(sqe.id));
  absl::Span<const v1::RegionSlice> listed;
  if (destination.empty()) {
    return absl::InvalidArgumentError("destination: a ring load needs at least one slice");
  } else if (destination.size() == 1) {
    sqe.slice = ToRing(destination[0]);
  } else if (destination.size() > ring::kMaxSlices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destination: ", destination.size(), " slices, the most is ", ring::kMaxSlices));
  } else {
    sqe.n_slices = static_cast<uint16_t>(destination.size());
    listed = destination;
  }
  const uint32_t arg_len = PackArgs(fingerprint, listed, &args);
  if (arg_len > g_.arg_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("destination: ", arg_len,
                                                   " bytes of arguments exceed the ring's ",
                                                   g_.arg_bytes));
  }
  sqe.arg_len = arg_len;
  sqe.meta_len = static_cast<uint32_t>(fingerprint.size());
  return Submit(sqe, reinterpret_cast<const uint8_t*>(args.data()), arg_len,
                want_meta ? Message::kMeta : Message::kNone, deadline);
}

absl::StatusOr<uint64_t> RingClient::SubmitAcquire(absl::Span<const BlockId> ids, bool all,
                                                   absl::Time deadline) {
  if (!FitsAcquire(ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ids: ", ids.size(), " ids; a ring acquire carries 1 to ",
        std::min<uint64_t>(g_.arg_bytes / 16, g_.msg_bytes)));
  }
  thread_local std::string args;
  args.clear();
  for (const BlockId& id : ids) args += id.ToBytes();
  RingSqe sqe{};
  sqe.opcode = ring::kOpAcquire;
  sqe.flags = all ? ring::kAcquireAll : 0;
  sqe.arg_len = static_cast<uint32_t>(args.size());
  sqe.meta_len = sqe.arg_len;
  return Submit(sqe, reinterpret_cast<const uint8_t*>(args.data()), sqe.arg_len,
                Message::kTiers, deadline);
}

absl::StatusOr<uint64_t> RingClient::SubmitRelease(uint64_t handle, absl::Time deadline) {
  RingSqe sqe{};
  sqe.opcode = ring::kOpRelease;
  std::memcpy(sqe.id, &handle, sizeof(handle));  // Little endian.
  return Submit(sqe, nullptr, 0, Message::kNone, deadline);
}

absl::StatusOr<uint64_t> RingClient::Submit(RingSqe sqe, const uint8_t* args, uint32_t arg_len,
                                            Message message, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  // Room in the submission queue; and, so that the daemon never waits for
  // room to post, no more in flight than the completion queue holds.
  while (sq_tail_ - header_->sq_head.value.load(std::memory_order_acquire) >= g_.sq_entries ||
         pending_.size() >= g_.cq_entries) {
    if (!alive()) return DeadStatus();
    if (Reap() > 0) {
      reaped_.SignalAll();
      continue;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("ring: the submission queue stayed full");
    }
    mu_.Unlock();
    absl::SleepFor(absl::Microseconds(10));
    mu_.Lock();
  }
  if (!alive()) return DeadStatus();
  const uint64_t ticket = next_ticket_++;
  sqe.user_data = ticket;
  const uint32_t slot = sq_tail_ & (g_.sq_entries - 1);
  if (arg_len > 0) {
    std::memcpy(base_ + g_.arg_offset() + uint64_t{slot} * g_.arg_bytes, args, arg_len);
  }
  std::memcpy(base_ + g_.sq_offset() + uint64_t{slot} * sizeof(RingSqe), &sqe, sizeof(sqe));
  ++sq_tail_;
  header_->sq_tail.value.store(sq_tail_, std::memory_order_release);
  pending_.emplace(ticket, message);
  // Pairs with the daemon's store of sq_need_wake and re-read of sq_tail.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header_->sq_need_wake.value.exchange(0, std::memory_order_seq_cst) != 0) {
    FutexWake(&header_->sq_need_wake.value);
  }
  return ticket;
}

size_t RingClient::Reap() {
  const uint32_t tail = header_->cq_tail.value.load(std::memory_order_acquire);
  size_t n = 0;
  // The daemon never posts more than the queue holds; a tail that says
  // otherwise is not believed.
  if (tail - cq_head_ > g_.cq_entries) return 0;
  while (cq_head_ != tail) {
    const uint32_t slot = cq_head_ & (g_.cq_entries - 1);
    RingCqe c;
    std::memcpy(&c, base_ + g_.cq_offset() + uint64_t{slot} * sizeof(RingCqe), sizeof(c));
    const char* msg =
        reinterpret_cast<const char*>(base_ + g_.msg_offset() + uint64_t{slot} * g_.msg_bytes);
    const uint32_t msg_len = std::min(c.msg_len, g_.msg_bytes);
    auto it = pending_.find(c.user_data);
    if (it != pending_.end()) {
      RingCompletion done;
      if (c.status != 0) {
        done.status = absl::Status(static_cast<absl::StatusCode>(c.status),
                                   absl::string_view(msg, msg_len));
      }
      done.checksum = c.checksum;
      done.payload_bytes = c.payload_bytes;
      done.tier = static_cast<v1::Tier>(c.tier);
      done.deduplicated = (c.flags & ring::kCqeDeduplicated) != 0;
      if (c.status == 0 && (c.flags & ring::kCqeMetaOmitted) == 0) {
        if (it->second == Message::kMeta) {
          v1::BlockMeta meta;
          if (meta.ParseFromArray(msg, static_cast<int>(msg_len))) done.meta = std::move(meta);
        } else if (it->second == Message::kTiers) {
          for (uint32_t k = 0; k < msg_len; ++k) {
            done.tiers.push_back(static_cast<v1::Tier>(static_cast<uint8_t>(msg[k])));
          }
        }
      }
      pending_.erase(it);
      done_.emplace(c.user_data, std::move(done));
    }
    ++cq_head_;
    ++n;
  }
  header_->cq_head.value.store(cq_head_, std::memory_order_release);
  return n;
}

absl::StatusOr<RingCompletion> RingClient::Wait(uint64_t ticket, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (auto it = done_.find(ticket); it != done_.end()) {
      RingCompletion c = std::move(it->second);
      done_.erase(it);
      return c;
    }
    if (!pending_.contains(ticket)) {
      return absl::NotFoundError(
          absl::StrCat("ticket: ", ticket, " is unknown or was already waited for"));
    }
    if (Reap() > 0) {
      reaped_.SignalAll();
      continue;
    }
    if (!alive()) return DeadStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("ring: no completion in time");
    if (sleeper_) {
      // Another thread watches the queue; it wakes us when it reaps.
      reaped_.WaitWithDeadline(&mu_, std::min(deadline, now + absl::Milliseconds(50)));
      continue;
    }
    sleeper_ = true;
    const uint32_t seen = cq_head_;
    const absl::Duration window = spin_.window();
    mu_.Unlock();
    // Spin first: a busy daemon answers within microseconds.
    const absl::Time start = absl::Now();
    const bool posted = PollUntil(start + window, [&] {
      return header_->cq_tail.value.load(std::memory_order_acquire) != seen;
    });
    if (!posted) {
      header_->cq_need_wake.value.store(1, std::memory_order_seq_cst);
      if (header_->cq_tail.value.load(std::memory_order_seq_cst) == seen && alive()) {
        FutexWait(&header_->cq_need_wake.value, 1,
                  std::min(deadline - absl::Now(), absl::Milliseconds(50)));
      }
    }
    mu_.Lock();
    if (header_->cq_tail.value.load(std::memory_order_acquire) != seen) {
      spin_.Record(absl::Now() - start);
    }
    sleeper_ = false;
    reaped_.SignalAll();
  }
}

}  // namespace evoke
