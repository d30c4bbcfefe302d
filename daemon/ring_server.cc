#include "daemon/ring_server.h"

#include <algorithm>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/adaptive_spin.h"
#include "common/futex.h"
#include "common/log.h"

namespace evoke {
namespace {

using ring::RingCqe;
using ring::RingHeader;
using ring::RingSlice;
using ring::RingSqe;

bool PowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

uint64_t AlignUp8(uint64_t v) { return (v + 7) & ~uint64_t{7}; }

}  // namespace

absl::StatusOr<ring::RingGeometry> ValidateRingGeometry(const RingHeader& header,
                                                        uint64_t region_bytes) {
  if (region_bytes < ring::kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region_id: a ring needs at least ", ring::kHeaderBytes, " bytes, the region has ",
        region_bytes));
  }
  if (header.magic != ring::kMagic) {
    return absl::InvalidArgumentError("ring header magic: is not \"EVOKRNG1\"");
  }
  if (header.version != ring::kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("ring header version: ", header.version,
                                                   " is not supported (expected ",
                                                   ring::kVersion, ")"));
  }
  ring::RingGeometry g;
  g.sq_entries = header.sq_entries;
  g.cq_entries = header.cq_entries;
  g.arg_bytes = header.arg_bytes;
  g.msg_bytes = header.msg_bytes;
  if (!PowerOfTwo(g.sq_entries) || g.sq_entries > ring::kMaxEntries) {
    return absl::InvalidArgumentError(absl::StrCat("ring header sq_entries: ", g.sq_entries,
                                                   " is not a power of two in 1..",
                                                   ring::kMaxEntries));
  }
  if (!PowerOfTwo(g.cq_entries) || g.cq_entries < g.sq_entries ||
      g.cq_entries > ring::kMaxEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ring header cq_entries: ", g.cq_entries, " is not a power of two in sq_entries (",
        g.sq_entries, ")..", ring::kMaxEntries));
  }
  if (g.arg_bytes % 64 != 0 || g.arg_bytes < ring::kMinArgBytes ||
      g.arg_bytes > ring::kMaxArgBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ring header arg_bytes: ", g.arg_bytes,
                                                   " is not a multiple of 64 in ",
                                                   ring::kMinArgBytes, "..",
                                                   ring::kMaxArgBytes));
  }
  if (g.msg_bytes % 64 != 0 || g.msg_bytes < ring::kMinMsgBytes ||
      g.msg_bytes > ring::kMaxMsgBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ring header msg_bytes: ", g.msg_bytes,
                                                   " is not a multiple of 64 in ",
                                                   ring::kMinMsgBytes, "..",
                                                   ring::kMaxMsgBytes));
  }
  if (g.total_bytes() > region_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("region_id: the ring needs ",
                                                   g.total_bytes(), " bytes, the region has ",
                                                   region_bytes));
  }
  if (header.sq_tail.value.load() != 0 || header.sq_head.value.load() != 0 ||
      header.cq_tail.value.load() != 0 || header.cq_head.value.load() != 0) {
    return absl::InvalidArgumentError(
        "ring header sq_tail, sq_head, cq_tail, cq_head: must all be 0 at attach");
  }
  return g;
}

// One attached ring and its thread.
class RingSet::Ring {
 public:
  Ring(RingSet* set, std::string key, uid_t uid, std::shared_ptr<Region> region,
       ring::RingGeometry geometry, std::unique_ptr<RingHandler> handler)
      : set_(set),
        key_(std::move(key)),
        uid_(uid),
        region_(std::move(region)),
        g_(geometry),
        handler_(std::move(handler)),
        base_(region_->host_data()),
        header_(reinterpret_cast<RingHeader*>(base_)) {}

  void Start() { thread_ = std::thread([this] { Serve(); }); }

  void Stop() {
    stop_.store(true, std::memory_order_release);
    // The thread may have ended and unmapped the ring already.
    absl::MutexLock lock(&unmap_mu_);
    if (region_ != nullptr) FutexWake(&header_->sq_need_wake.value);
  }

  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Serve();
  // Idle waits for a submission: spins (for spin_'s window), then sleeps on
  // the futex for at most options.liveness_interval. Returns false when the
  // ring should stop.
  bool Idle();
  void Break(uint32_t reason);
  RingSqe* sqe(uint32_t index) const {
    return reinterpret_cast<RingSqe*>(base_ + g_.sq_offset()) + (index & (g_.sq_entries - 1));
  }
  RingCqe* cqe(uint32_t index) const {
    return reinterpret_cast<RingCqe*>(base_ + g_.cq_offset()) + (index & (g_.cq_entries - 1));
  }
  uint8_t* msg(uint32_t index) const {
    return base_ + g_.msg_offset() + uint64_t{index & (g_.cq_entries - 1)} * g_.msg_bytes;
  }
  const uint8_t* arg(uint32_t index) const {
    return base_ + g_.arg_offset() + uint64_t{index & (g_.sq_entries - 1)} * g_.arg_bytes;
  }
  // Check returns why a submission cannot run, naming the field, or OK.
  absl::Status Check(const RingSqe& e) const;

  RingSet* const set_;
  const std::string key_;
  const uid_t uid_;
  absl::Mutex unmap_mu_;
  // Released when the thread ends.
  std::shared_ptr<Region> region_ ABSL_GUARDED_BY(unmap_mu_);
  const ring::RingGeometry g_;
  const std::unique_ptr<RingHandler> handler_;
  uint8_t* const base_;
  RingHeader* const header_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // The daemon's own indices; never read back from the shared header.
  uint32_t sq_head_ = 0;
  uint32_t cq_tail_ = 0;
  // How long Idle polls, from the gaps between this client's submissions.
  AdaptiveSpin spin_{set_->options_.spin, set_->options_.spin_max};
};

absl::Status RingSet::Ring::Check(const RingSqe& e) const {
  if (e.opcode > ring::kOpRelease) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sqe.opcode: ", e.opcode,
        " is not NOP (0), SAVE (1), LOAD (2), ACQUIRE (3) or RELEASE (4)"));
  }
  if (e.arg_len > g_.arg_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sqe.arg_len: ", e.arg_len, " is past the ring's arg_bytes (", g_.arg_bytes, ")"));
  }
  if (e.meta_len > e.arg_len) {
    return absl::InvalidArgumentError(absl::StrCat("sqe.meta_len: ", e.meta_len,
                                                   " is past sqe.arg_len (", e.arg_len, ")"));
  }
  if (e.n_slices > ring::kMaxSlices) {
    return absl::InvalidArgumentError(absl::StrCat("sqe.n_slices: ", e.n_slices,
                                                   " is past ", ring::kMaxSlices));
  }
  if (e.opcode == ring::kOpAcquire &&
      (e.meta_len == 0 || e.meta_len % 16 != 0 || e.n_slices != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sqe.meta_len: an ACQUIRE carries 1 or more ids of 16 bytes and no slices (meta_len ",
        e.meta_len, ", n_slices ", e.n_slices, ")"));
  }
  if (e.n_slices > 0 &&
      AlignUp8(e.meta_len) + uint64_t{e.n_slices} * sizeof(RingSlice) > e.arg_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sqe.n_slices: ", e.n_slices, " slices after ", e.meta_len,
        " bytes of meta do not fit in sqe.arg_len (", e.arg_len, ")"));
  }
  return absl::OkStatus();
}

void RingSet::Ring::Break(uint32_t reason) {
  uint32_t expected = ring::kNotBroken;
  header_->broken.value.compare_exchange_strong(expected, reason, std::memory_order_acq_rel);
  // Whoever waits for a completion must see it.
  header_->cq_need_wake.value.store(0, std::memory_order_relaxed);
  FutexWake(&header_->cq_need_wake.value);
}

bool RingSet::Ring::Idle() {
  const RingOptions& o = set_->options_;
  const absl::Time start = absl::Now();
  if (PollUntil(start + spin_.window(), [&] {
        return header_->sq_tail.value.load(std::memory_order_acquire) != sq_head_ ||
               stop_.load(std::memory_order_acquire);
      })) {
    if (stop_.load(std::memory_order_acquire)) return false;
    spin_.Record(absl::Now() - start);
    return true;
  }
  header_->sq_need_wake.value.store(1, std::memory_order_seq_cst);
  if (header_->sq_tail.value.load(std::memory_order_seq_cst) == sq_head_ &&
      !stop_.load(std::memory_order_acquire)) {
    FutexWait(&header_->sq_need_wake.value, 1, o.liveness_interval);
  }
  header_->sq_need_wake.value.store(0, std::memory_order_relaxed);
  if (stop_.load(std::memory_order_acquire)) return false;
  // Woken by a submission or for the liveness check: either way the gap so
  // far counts (an idle client counts as slow, so that an idle ring soon
  // polls for `spin` only after each check).
  spin_.Record(absl::Now() - start);
  if (header_->sq_tail.value.load(std::memory_order_acquire) == sq_head_) {
    return handler_->Alive();
  }
  return true;
}

void RingSet::Ring::Serve() {
  const RingOptions& o = set_->options_;
  std::vector<RingSqe> entries(o.max_batch);
  std::vector<std::string> args(o.max_batch);
  std::vector<absl::Status> checks(o.max_batch);
  std::vector<RingRequest> requests;
  std::vector<size_t> request_index;
  std::vector<RingResult> results(o.max_batch);
  std::vector<RingResult> handled;
  uint32_t reason = ring::kBrokenClosed;
  absl::Duration full_backoff = absl::Microseconds(20);
  while (!stop_.load(std::memory_order_acquire)) {
    const uint32_t tail = header_->sq_tail.value.load(std::memory_order_acquire);
    const uint32_t available = tail - sq_head_;
    if (available > g_.sq_entries) {
      reason = ring::kBrokenSqIndex;
      break;
    }
    if (available == 0) {
      if (!Idle()) break;
      continue;
    }
    const uint32_t cq_used = cq_tail_ - header_->cq_head.value.load(std::memory_order_acquire);
    if (cq_used > g_.cq_entries) {
      reason = ring::kBrokenCqIndex;
      break;
    }
    const uint32_t room = g_.cq_entries - cq_used;
    if (room == 0) {
      // The client has not taken its completions: nothing more is taken
      // from it until it does (back-pressure on that client only), polled
      // at a falling rate so that a client that never takes them costs
      // next to nothing.
      if (!handler_->Alive()) break;
      absl::SleepFor(full_backoff);
      full_backoff = std::min(full_backoff * 2, absl::Milliseconds(2));
      continue;
    }
    full_backoff = absl::Microseconds(20);
    const uint32_t n = std::min({available, room, o.max_batch});
    // Copy the entries and their arguments out of the client's reach first.
    for (uint32_t k = 0; k < n; ++k) {
      std::memcpy(&entries[k], sqe(sq_head_ + k), sizeof(RingSqe));
      checks[k] = Check(entries[k]);
      if (checks[k].ok()) {
        args[k].assign(reinterpret_cast<const char*>(arg(sq_head_ + k)), entries[k].arg_len);
      } else {
        args[k].clear();
      }
    }
    sq_head_ += n;
    header_->sq_head.value.store(sq_head_, std::memory_order_release);

    requests.clear();
    request_index.clear();
    for (uint32_t k = 0; k < n; ++k) {
      results[k] = RingResult{};
      if (!checks[k].ok()) {
        results[k].status = checks[k];
        continue;
      }
      if (entries[k].opcode == ring::kOpNop) continue;
      RingRequest r;
      r.sqe = entries[k];
      r.meta = absl::string_view(args[k]).substr(0, entries[k].meta_len);
      if (entries[k].n_slices > 0) {
        // Aligned: std::string's buffer is, and the offset is a multiple of 8.
        r.slices = absl::MakeConstSpan(
            reinterpret_cast<const RingSlice*>(args[k].data() + AlignUp8(entries[k].meta_len)),
            entries[k].n_slices);
      }
      requests.push_back(r);
      request_index.push_back(k);
    }
    if (!requests.empty()) {
      handled.assign(requests.size(), RingResult{});
      handler_->Execute(requests, absl::MakeSpan(handled));
      for (size_t j = 0; j < requests.size(); ++j) {
        results[request_index[j]] = std::move(handled[j]);
      }
    }
    for (uint32_t k = 0; k < n; ++k) {
      const RingResult& r = results[k];
      RingCqe c{};
      c.user_data = entries[k].user_data;
      c.status = static_cast<int32_t>(r.status.code());
      c.flags = r.flags;
      c.checksum = r.checksum;
      c.payload_bytes = r.payload_bytes;
      c.tier = r.tier;
      absl::string_view text = r.status.ok() ? absl::string_view(r.meta) : r.status.message();
      if (r.status.ok() && text.size() > g_.msg_bytes) {
        c.flags |= ring::kCqeMetaOmitted;
        text = {};
      }
      text = text.substr(0, g_.msg_bytes);
      c.msg_len = static_cast<uint32_t>(text.size());
      if (!text.empty()) std::memcpy(msg(cq_tail_), text.data(), text.size());
      std::memcpy(cqe(cq_tail_), &c, sizeof(c));
      ++cq_tail_;
    }
    header_->cq_tail.value.store(cq_tail_, std::memory_order_release);
    set_->ops_.fetch_add(n, std::memory_order_relaxed);
    // Pairs with the client's store of cq_need_wake and re-read of cq_tail.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (header_->cq_need_wake.value.exchange(0, std::memory_order_seq_cst) != 0) {
      FutexWake(&header_->cq_need_wake.value);
    }
    if (!handler_->Alive()) break;
  }
  if (reason != ring::kBrokenClosed) {
    set_->broken_.fetch_add(1, std::memory_order_relaxed);
    // The key is "<lease id hex>/<region id>"; a lease id is a credential
    // (whoever of its uid holds it may use the lease), so only its first 8
    // hex digits are logged.
    const size_t slash = std::min(key_.find('/'), key_.size());
    EVOKE_LOG_WARNING_EVERY_N_SEC(1, "ring ", key_.substr(0, std::min<size_t>(slash, 8)),
                                  key_.substr(slash), " of uid ", uid_, " stopped: ",
                                  reason == ring::kBrokenSqIndex ? "sq_tail" : "cq_head",
                                  " moved outside its queue");
  }
  Break(reason);
  // Unmapped now (when no copy holds it), not when the thread is joined.
  {
    absl::MutexLock lock(&unmap_mu_);
    region_.reset();
  }
  set_->Finished(key_, uid_);
}

RingSet::RingSet(RingOptions options) : options_(options) {}

RingSet::~RingSet() { StopAll(); }

absl::StatusOr<ring::RingGeometry> RingSet::Attach(std::string key, uid_t uid,
                                                   std::shared_ptr<Region> region,
                                                   std::unique_ptr<RingHandler> handler,
                                                   uint32_t max_for_uid) {
  const uint32_t cap = max_for_uid != 0 ? max_for_uid : options_.max_rings_per_uid;
  if (region == nullptr || region->host_data() == nullptr) {
    return absl::FailedPreconditionError("region_id: a ring must be a shared-memory region");
  }
  // Read the geometry once; the client can change the header afterwards
  // without effect on the daemon.
  const auto* header = reinterpret_cast<const RingHeader*>(region->host_data());
  absl::StatusOr<ring::RingGeometry> g = ValidateRingGeometry(*header, region->size());
  if (!g.ok()) return g.status();
  std::shared_ptr<Ring> ring;
  std::vector<std::shared_ptr<Ring>> reap;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("evoked is shutting down");
    if (rings_.contains(key)) {
      return absl::FailedPreconditionError("region_id: the region already serves a ring");
    }
    if (rings_.size() >= options_.max_rings) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rings: ", rings_.size(), " attached, the daemon's limit is ", options_.max_rings));
    }
    uint32_t& mine = per_uid_[uid];
    if (mine >= cap) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rings: uid ", uid, " has ", mine, " attached, the limit per uid is ", cap,
          max_for_uid != 0 ? " (max_rings in the policy)" : ""));
    }
    ring = std::make_shared<Ring>(this, key, uid, std::move(region), *g, std::move(handler));
    try {
      ring->Start();
    } catch (const std::system_error& e) {
      // No thread to be had (a thread or memory limit): refuse, count nothing.
      if (mine == 0) per_uid_.erase(uid);
      return absl::ResourceExhaustedError(
          absl::StrCat("rings: no thread for another ring (", e.what(), ")"));
    }
    ++mine;
    rings_.emplace(std::move(key), ring);
    // Only past every refusal: a vector of unjoined rings must not be
    // destroyed on a return.
    reap.swap(finished_);
  }
  for (const auto& r : reap) r->Join();
  return *g;
}

void RingSet::Finished(const std::string& key, uid_t uid) {
  absl::MutexLock lock(&mu_);
  auto it = rings_.find(key);
  if (it == rings_.end()) return;
  finished_.push_back(std::move(it->second));
  rings_.erase(it);
  auto u = per_uid_.find(uid);
  if (u != per_uid_.end() && --u->second == 0) per_uid_.erase(u);
}

void RingSet::StopAll() {
  std::vector<std::shared_ptr<Ring>> all;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& [key, r] : rings_) all.push_back(r);
    for (auto& r : finished_) all.push_back(std::move(r));
    finished_.clear();
  }
  for (const auto& r : all) r->Stop();
  for (const auto& r : all) r->Join();
  // Rings that finished while we joined.
  std::vector<std::shared_ptr<Ring>> rest;
  {
    absl::MutexLock lock(&mu_);
    rest.swap(finished_);
  }
  for (const auto& r : rest) r->Join();
}

RingSet::Counters RingSet::counters() const {
  Counters c;
  {
    absl::MutexLock lock(&mu_);
    c.rings = rings_.size();
  }
  c.ops = ops_.load(std::memory_order_relaxed);
  c.broken = broken_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace evoke
