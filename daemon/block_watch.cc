#include "daemon/block_watch.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/block_service.h"
#include "daemon/storage_mapping.h"

namespace evoke {

std::string ResumeToken(uint64_t epoch, uint64_t seq) {
  std::string out(16, '\0');
  std::memcpy(out.data(), &epoch, 8);
  std::memcpy(out.data() + 8, &seq, 8);
  return out;
}

grpc::ServerWriteReactor<v1::BlockEvents>* RefusedWatch(const absl::Status& status) {
  class Refused final : public grpc::ServerWriteReactor<v1::BlockEvents> {
   public:
    explicit Refused(const absl::Status& s) {
      Finish(grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message())));
    }
    void OnDone() override { delete this; }
  };
  return new Refused(status);
}

namespace {

v1::BlockEventKind ToProto(BlockEventKind kind) {
  switch (kind) {
    case BlockEventKind::kStored: return v1::BLOCK_EVENT_STORED;
    case BlockEventKind::kSpilled: return v1::BLOCK_EVENT_SPILLED;
    case BlockEventKind::kDemoted: return v1::BLOCK_EVENT_DEMOTED;
    case BlockEventKind::kPromoted: return v1::BLOCK_EVENT_PROMOTED;
    case BlockEventKind::kEvicted: return v1::BLOCK_EVENT_EVICTED;
    case BlockEventKind::kRemoved: return v1::BLOCK_EVENT_REMOVED;
    case BlockEventKind::kExpired: return v1::BLOCK_EVENT_EXPIRED;
  }
  return v1::BLOCK_EVENT_KIND_UNSPECIFIED;
}

}  // namespace

// One stream. Owns itself (self_) until OnDone; the hub holds a weak
// reference. Everything but the log is guarded by mu_.
class WatchHub::Watcher final : public grpc::ServerWriteReactor<v1::BlockEvents> {
 public:
  Watcher(WatchHub* hub, grpc::CallbackServerContext* context,
          std::shared_ptr<const Caller> caller, std::string ns, uint32_t kinds, uint64_t from,
          bool lost_unknown)
      : hub_(hub),
        context_(context),
        caller_(std::move(caller)),
        ns_(std::move(ns)),
        kinds_(kinds),
        cursor_(from) {
    first_.set_lost_unknown(lost_unknown);
  }

  void Start(std::shared_ptr<Watcher> self) {
    absl::MutexLock lock(&mu_);
    self_ = std::move(self);
    // The first message at once: the watcher has a token, and hears of
    // what it lost, before any event. (writing_ is true from the start,
    // so that the pump, which may see this watcher first, waits.)
    Fill(&first_);
    StartWrite(&first_);
  }

  // Pump sends the next batch, unless a write is in flight (then it checks
  // whether the watcher fell too far behind). Writes and cancels start
  // under mu_, so never after the stream finished (the call is gone once
  // OnDone has run); their reactions never run inline, so this cannot
  // deadlock.
  void Pump() {
    absl::MutexLock lock(&mu_);
    if (finished_ || done_ || dropped_) return;
    if (writing_) {
      // It stopped reading: drop it (its token will report the loss). Not
      // before its first message was written: a resuming watcher starts
      // behind by design.
      if (started_ &&
          hub_->log_->next_seq() - cursor_ > hub_->options_.backlog_events) {
        dropped_ = true;
        context_->TryCancel();
      }
      return;
    }
    batch_.Clear();
    Fill(&batch_);
    if (batch_.events_size() == 0 && batch_.lost_events() == 0) return;
    writing_ = true;
    StartWrite(&batch_);  // batch_ stays untouched while writing_.
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      started_ = true;
      if (!ok) {
        CloseLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch stream broken"));
        return;
      }
    }
    Pump();
  }
  void OnCancel() override { Close(grpc::Status::CANCELLED); }
  void OnDone() override {
    bool dropped;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      dropped = dropped_;
    }
    hub_->Forget(this, OwnerUid(*caller_), dropped);
    std::shared_ptr<Watcher> self = std::move(self_);  // May delete this.
  }
  void Close(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    CloseLocked(status);
  }
  const Caller* caller() const { return caller_.get(); }

 private:
  void CloseLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || done_) return;
    finished_ = true;
    Finish(status);
  }

  bool Visible(const BlockEvent& e) {
    if (!ns_.empty() && e.ns != ns_) return false;
    if ((kinds_ & (1u << static_cast<int>(e.kind))) == 0) return false;
    auto key = std::make_pair(e.ns, e.trust_group);
    auto it = seen_.find(key);
    if (it == seen_.end()) {
      if (seen_.size() > 1024) seen_.clear();
      it = seen_.emplace(std::move(key), caller_->Sees(e.ns) &&
                                             caller_->InTrustGroup(e.ns, e.trust_group))
               .first;
    }
    return it->second;
  }

  // Fill adds the events from cursor_ on that this watcher may see (reading
  // on past batches it may not see, so that a filtered watcher never waits
  // for the pump), and the token after them.
  void Fill(v1::BlockEvents* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    do {
      uint64_t lost = 0;
      cursor_ = hub_->log_->Read(cursor_, hub_->options_.max_batch, &events_, &lost);
      out->set_lost_events(out->lost_events() + lost);
      AddVisible(out);
    } while (out->events_size() == 0 && !events_.empty());
    out->set_resume_token(ResumeToken(hub_->log_->epoch(), cursor_));
  }

  void AddVisible(v1::BlockEvents* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const BlockEvent& e : events_) {
      if (!Visible(e)) continue;
      v1::BlockEvent* p = out->add_events();
      p->set_seq(e.seq);
      p->set_kind(ToProto(e.kind));
      p->set_id(e.id.ToBytes());
      p->set_namespace_(e.ns);
      p->set_trust_group(e.trust_group);
      p->set_block_kind(e.block_kind);
      p->set_tier(evoke::ToProto(e.tier));
      p->set_location(evoke::ToProto(e.location));
      p->set_unix_micros(e.unix_us);
    }
  }

  WatchHub* const hub_;
  grpc::CallbackServerContext* const context_;
  const std::shared_ptr<const Caller> caller_;
  const std::string ns_;
  const uint32_t kinds_;  // Bit per BlockEventKind.
  absl::Mutex mu_;
  uint64_t cursor_ ABSL_GUARDED_BY(mu_);
  v1::BlockEvents first_ ABSL_GUARDED_BY(mu_);
  v1::BlockEvents batch_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockEvent> events_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<std::string, std::string>, bool> seen_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Watcher> self_;
  bool writing_ ABSL_GUARDED_BY(mu_) = true;  // The first message.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool dropped_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // The first message was written.
};

WatchHub::WatchHub(BlockEventLog* log, WatchHubOptions options)
    : log_(log), options_(options) {}

WatchHub::~WatchHub() {
  CloseAll();
  if (pump_.joinable()) pump_.join();
}

grpc::ServerWriteReactor<v1::BlockEvents>* WatchHub::Watch(
    grpc::CallbackServerContext* context, std::shared_ptr<const Caller> caller,
    const v1::WatchBlocksRequest& request) {
  uint32_t kinds = 0;
  absl::Status bad;
  for (int k : request.kinds()) {
    if (k < v1::BLOCK_EVENT_STORED || k > v1::BLOCK_EVENT_EXPIRED) {
      bad = absl::InvalidArgumentError(absl::StrCat("kinds: unknown value ", k));
      break;
    }
    kinds |= 1u << k;
  }
  if (kinds == 0) kinds = ~0u;
  // Where to start: now, or right after the token's message.
  uint64_t from = log_->next_seq();
  bool lost_unknown = false;
  const std::string& token = request.resume_token();
  if (bad.ok() && !token.empty()) {
    uint64_t epoch = 0, seq = 0;
    if (token.size() != 16) {
      bad = absl::InvalidArgumentError(
          absl::StrCat("resume_token: has ", token.size(), " bytes, expected 16 (a token "
                       "from a BlockEvents message)"));
    } else {
      std::memcpy(&epoch, token.data(), 8);
      std::memcpy(&seq, token.data() + 8, 8);
      if (epoch != log_->epoch()) {
        lost_unknown = true;  // An earlier run's: its events are gone.
      } else if (seq == 0 || seq > from) {
        bad = absl::InvalidArgumentError(
            "resume_token: names events this daemon has not had (not one of its tokens)");
      } else {
        from = seq;  // Read reports what the log no longer holds.
      }
    }
  }
  if (!bad.ok()) return RefusedWatch(bad);
  auto w = std::make_shared<Watcher>(this, context, std::move(caller), request.namespace_(),
                                     kinds, from, lost_unknown);
  {
    absl::MutexLock lock(&mu_);
    if (closing_) return RefusedWatch(absl::UnavailableError("evoked is shutting down"));
    if (watchers_.size() >= options_.max_watchers) {
      return RefusedWatch(absl::ResourceExhaustedError(absl::StrCat(
          "watchers: ", watchers_.size(), " streams are open, the limit (--max-watchers)")));
    }
    const uid_t uid = OwnerUid(*w->caller());
    const size_t per_uid = std::max<size_t>(1, options_.max_watchers / 4);
    if (per_uid_[uid] >= per_uid) {
      return RefusedWatch(absl::ResourceExhaustedError(absl::StrCat(
          "watchers: uid ", uid, " has ", per_uid_[uid], " streams open, its share (a quarter "
          "of --max-watchers)")));
    }
    ++per_uid_[uid];
    watchers_.emplace(w.get(), w);
    log_->Enable();
    if (!pump_.joinable()) pump_ = std::thread([this] { PumpLoop(); });
  }
  Watcher* raw = w.get();
  raw->Start(std::move(w));
  return raw;
}

void WatchHub::PumpLoop() {
  for (;;) {
    const uint64_t seen = log_->next_seq();
    std::vector<std::shared_ptr<Watcher>> live;
    {
      absl::MutexLock lock(&mu_);
      if (closing_) return;
      for (const auto& [raw, weak] : watchers_) {
        if (std::shared_ptr<Watcher> w = weak.lock()) live.push_back(std::move(w));
      }
    }
    for (const std::shared_ptr<Watcher>& w : live) w->Pump();
    live.clear();
    log_->WaitForNew(seen, absl::Milliseconds(100));
  }
}

void WatchHub::Forget(Watcher* w, uid_t uid, bool dropped) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(w);
  if (auto it = per_uid_.find(uid); it != per_uid_.end() && --it->second == 0) {
    per_uid_.erase(it);
  }
  if (dropped) ++dropped_;
}

void WatchHub::CloseAll() {
  std::vector<std::shared_ptr<Watcher>> open;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    for (const auto& [raw, weak] : watchers_) {
      if (std::shared_ptr<Watcher> w = weak.lock()) open.push_back(std::move(w));
    }
  }
  for (const std::shared_ptr<Watcher>& w : open) {
    w->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "evoked is shutting down"));
  }
}

size_t WatchHub::watchers() const {
  absl::MutexLock lock(&mu_);
  return watchers_.size();
}

uint64_t WatchHub::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace evoke
