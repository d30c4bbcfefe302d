#include "storage/remote/uploader.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/background_thread.h"
#include "common/log.h"

namespace evoke {
namespace {

// Payload bytes copied out per batch, at most (besides the block count).
constexpr uint64_t kBatchBytes = 64ull << 20;

}  // namespace

Uploader::Uploader(EngineCore* core, RemoteTier* remote)
    : core_(core),
      remote_(remote),
      budget_(core->options().remote_write_bytes_per_s,
              core->options().remote_write_burst_bytes, absl::Now()) {}

void Uploader::Start() {
  thread_ = std::thread([this] {
    // Below serving: under CPU contention the RPC threads get several times
    // its share (its copies and checksums cost per byte).
    BecomeBackgroundThread("evoke-upload", kWriteBehindNice);
    Loop();
  });
}

void Uploader::Stop() {
  {
    absl::MutexLock lock(core_->mu());
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock lock(core_->mu());
  if (!queue_.empty()) {
    EVOKE_LOG_WARNING("write-behind stopped with ", queue_.size(),
                      " blocks not written to the remote tier (their local copies remain)");
  }
  dropped_ += queue_.size();
  queue_.clear();
  queue_bytes_ = 0;
  removals_dropped_ += removals_.size();
  removals_.clear();
  idle_cv_.SignalAll();
}

void Uploader::Enqueue(const IndexEntry& e) {
  if (stop_) return;
  // A full queue refuses the newest block, not the oldest: chains are saved
  // head first, and a fleet-wide lookup stops at the first missing block,
  // so a tail whose head was dropped could never be found.
  if (queue_bytes_ + e.payload_bytes > core_->options().remote_queue_bytes) {
    ++dropped_;
    return;
  }
  queue_.push_back(Item{e.id, e.gen, e.payload_bytes});
  queue_bytes_ += e.payload_bytes;
  cv_.Signal();
}

void Uploader::EnqueueRemoval(absl::string_view ns, const BlockId& id) {
  if (stop_) return;
  if (removals_.size() >= kMaxRemovals) {
    ++removals_dropped_;
    return;
  }
  removals_.push_back(Removal{std::string(ns), id});
  cv_.Signal();
}

bool Uploader::WaitForIdle(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(core_->mu());
  while (!queue_.empty() || !removals_.empty() || inflight_ != 0) {
    if (idle_cv_.WaitWithDeadline(core_->mu(), deadline)) {
      return queue_.empty() && removals_.empty() && inflight_ == 0;
    }
  }
  return true;
}

void Uploader::Fill(RemoteStats* stats) {
  stats->queue_blocks = queue_.size();
  stats->queue_bytes = queue_bytes_;
  stats->dropped_blocks = dropped_;
  stats->inflight = inflight_;
  stats->removals_queued = removals_.size();
  stats->removals_dropped = removals_dropped_;
  stats->paced = paced_;
}

void Uploader::Loop() {
  absl::MutexLock lock(core_->mu());
  while (!stop_) {
    if (queue_.empty() && removals_.empty()) {
      idle_cv_.SignalAll();
      cv_.Wait(core_->mu());
      continue;
    }
    absl::Duration wait;
    const bool ready = remote_->Ready(&wait);
    if (!ready || (removals_.empty() && remote_->OverBudget())) {
      // Down, or past budget: keep the queue (it refuses the newest past
      // its bound) and look again when the breaker may let a probe through.
      // Removals go on past the budget: they free space.
      cv_.WaitWithTimeout(core_->mu(), std::clamp(wait, absl::Milliseconds(10),
                                                  absl::Seconds(1)));
      continue;
    }
    if (!removals_.empty()) {
      RemoveRound();
      continue;
    }
    if (const absl::Duration pace = budget_.Wait(absl::Now()); pace > absl::ZeroDuration()) {
      // Past the budget: the next batch waits (removals still go).
      ++paced_;
      cv_.WaitWithTimeout(core_->mu(), std::min(pace, absl::Seconds(1)));
      continue;
    }
    Round();
  }
}

void Uploader::RemoveRound() {
  // The front run of one namespace, up to 256 blocks (a session's blocks
  // are queued together, so runs are long; popping only at the front keeps
  // a round O(blocks) however the namespaces interleave).
  const std::string ns = removals_.front().ns;
  std::vector<BlockId> ids;
  while (!removals_.empty() && ids.size() < 256 && removals_.front().ns == ns) {
    ids.push_back(removals_.front().id);
    removals_.pop_front();
  }
  inflight_ = ids.size();
  core_->mu()->Unlock();
  const absl::Status s = remote_->Remove(ns, ids);
  core_->mu()->Lock();
  inflight_ = 0;
  if (s.ok()) return;
  if (s.code() == absl::StatusCode::kUnavailable && !stop_ &&
      removals_.size() + ids.size() <= kMaxRemovals) {
    for (size_t i = ids.size(); i-- > 0;) removals_.push_front(Removal{ns, ids[i]});
    return;
  }
  EVOKE_LOG_WARNING("remote tier: ", ids.size(), " deleted session blocks of namespace ", ns,
                    " keep their remote copies (", s.ToString(), "); expiry removes them");
  removals_dropped_ += ids.size();
}

void Uploader::Round() {
  struct Job {
    Item item;
    storage::SpillRecord record;
    std::string ns;
    bool exclusive = false;
    IndexEntry* held = nullptr;  // Tier-1 copy we hold a reader on.
    bool from_disk = false;
    uint64_t checksum = 0;
    std::string bytes;
    absl::Status status;
  };
  std::vector<Job> jobs;
  uint64_t batch_bytes = 0;
  const size_t max_blocks =
      static_cast<size_t>(std::max(1, core_->options().remote_batch_blocks));
  while (!queue_.empty() && jobs.size() < max_blocks &&
         (jobs.empty() || batch_bytes + queue_.front().bytes <= kBatchBytes)) {
    Item item = queue_.front();
    queue_.pop_front();
    queue_bytes_ -= item.bytes;
    Job job;
    job.item = item;
    const std::optional<EngineCore::ReadHold> hold =
        core_->HoldGen(item.id, item.gen, &job.record);
    if (!hold) {
      ++dropped_;  // Deleted, replaced or dropped before its turn.
      continue;
    }
    job.ns = RemoteTier::RemoteNamespace(job.record.meta().fingerprint());
    job.exclusive = job.record.meta().kind() != v1::BLOCK_KIND_SESSION;
    job.checksum = hold->checksum;
    job.held = hold->ram;
    job.from_disk = hold->ram == nullptr;
    batch_bytes += item.bytes;
    jobs.push_back(std::move(job));
  }
  if (jobs.empty()) return;
  budget_.Take(batch_bytes, absl::Now());
  inflight_ = jobs.size();
  core_->mu()->Unlock();

  // Copy each payload out and check the copy: a block whose bytes fail
  // their checksum is never written to a store other hosts read.
  for (Job& job : jobs) {
    job.bytes.resize(job.item.bytes);
    uint8_t* dest = reinterpret_cast<uint8_t*>(job.bytes.data());
    if (job.held != nullptr) {
      const uint64_t got =
          core_->copier().CopyHashingSource(dest, job.held->ram.data(), job.item.bytes);
      if (got != job.checksum) {
        job.status = absl::DataLossError("tier-1 copy fails its checksum");
      }
    } else {
      job.status = core_->ReadFromDisk(job.item.id, job.checksum, job.item.bytes, dest);
    }
  }
  std::vector<IndexEntry*> held;
  for (Job& job : jobs) {
    if (job.held != nullptr) held.push_back(job.held);
    job.held = nullptr;
  }
  core_->ReleaseReaders(held);
  std::vector<RemoteTier::Block> blocks;
  std::vector<size_t> which;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!jobs[i].status.ok()) continue;
    blocks.push_back(RemoteTier::Block{jobs[i].item.id, jobs[i].ns, &jobs[i].record,
                                       jobs[i].bytes, jobs[i].exclusive});
    which.push_back(i);
  }
  std::vector<absl::Status> written = remote_->Write(blocks);
  for (size_t k = 0; k < which.size(); ++k) jobs[which[k]].status = written[k];

  core_->mu()->Lock();
  inflight_ = 0;
  // Outages go back to the front of the queue (in their order), to be
  // retried once the breaker lets calls through; anything else is dropped.
  for (size_t i = jobs.size(); i-- > 0;) {
    const Job& job = jobs[i];
    if (job.status.ok()) continue;
    if (job.status.code() == absl::StatusCode::kUnavailable && !stop_ &&
        queue_bytes_ + job.item.bytes <= core_->options().remote_queue_bytes) {
      queue_.push_front(job.item);
      queue_bytes_ += job.item.bytes;
      continue;
    }
    ++dropped_;
  }
  if (queue_.empty()) idle_cv_.SignalAll();
}

}  // namespace evoke
