#include "storage/remote/remote_tier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace evoke {
namespace {

constexpr absl::string_view kRecordMagic = "EVR1";

bool IsOutage(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded;
}

absl::string_view BreakerName(bool connected, int breaker) {
  if (!connected) return "disconnected";
  switch (breaker) {
    case 0: return "closed";
    case 1: return "open";
    default: return "half-open";
  }
}

}  // namespace

RemoteTier::RemoteTier(std::unique_ptr<ObjectStore> store, const RemoteTierOptions& options)
    : store_(std::move(store)),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      backoff_(options.retry) {
  counters_.store = store_->Describe();
}

RemoteTier::~RemoteTier() { Stop(); }

absl::Status RemoteTier::Start() {
  absl::Status s = store_->Connect();
  if (!s.ok()) {
    absl::MutexLock lock(&mu_);
    last_error_ = std::string(s.message());
  } else if (absl::StatusOr<ObjectStoreUsage> u = store_->Usage(); u.ok()) {
    absl::MutexLock lock(&mu_);
    counters_.pool_used_bytes = u->bytes;
    counters_.pool_objects = u->objects;
  }
  thread_ = std::thread([this] { Loop(); });
  return s;
}

void RemoteTier::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    stop_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void RemoteTier::Loop() {
  const bool expires = options_.expire_after > absl::ZeroDuration();
  absl::Time next_usage = clock_->Now() + options_.usage_refresh;
  absl::Time next_sweep = clock_->Now() + options_.sweep_every;
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    stop_cv_.WaitWithTimeout(&mu_, std::min(options_.retry, options_.usage_refresh));
    if (stop_) break;
    const bool connected = store_->connected();
    const absl::Time now = clock_->Now();
    if (connected && expires && now >= next_sweep && breaker_ == Breaker::kClosed) {
      next_sweep = now + options_.sweep_every;
      mu_.Unlock();
      absl::StatusOr<uint64_t> n = Expire(now - options_.expire_after);
      if (!n.ok()) EVOKE_LOG_WARNING("remote tier expiry sweep stopped: ", n.status().ToString());
      if (n.ok() && *n > 0) {
        EVOKE_LOG_INFO("remote tier expiry: removed ", *n, " blocks written before ",
                       absl::FormatTime(now - options_.expire_after));
      }
      mu_.Lock();
      continue;
    }
    const bool due = now >= next_usage && breaker_ == Breaker::kClosed;
    if (connected && !due) continue;
    mu_.Unlock();
    if (!connected) {
      absl::Status s = store_->Connect();
      mu_.Lock();
      if (s.ok()) {
        EVOKE_LOG_INFO("remote tier connected: ", store_->Describe());
        last_error_.clear();
      } else {
        last_error_ = std::string(s.message());
      }
      continue;
    }
    absl::StatusOr<ObjectStoreUsage> u = store_->Usage();
    mu_.Lock();
    next_usage = clock_->Now() + options_.usage_refresh;
    if (u.ok()) {
      counters_.pool_used_bytes = u->bytes;
      counters_.pool_objects = u->objects;
    }
  }
}

std::string RemoteTier::ObjectName(const BlockId& id) { return absl::StrCat("b.", id.ToHex()); }

std::string RemoteTier::RemoteNamespace(absl::string_view ns, absl::string_view trust_group) {
  return trust_group.empty() ? std::string(ns) : absl::StrCat(ns, "\x1f", trust_group);
}

std::string RemoteTier::EncodeRecord(const storage::SpillRecord& record) {
  std::string out(kRecordMagic);
  record.AppendToString(&out);
  return out;
}

absl::Status RemoteTier::Unavailable(absl::string_view what, const absl::Status& cause) const {
  return absl::UnavailableError(absl::StrCat("remote tier (", counters_.store, ") ", what,
                                             cause.ok() ? "" : ": ", cause.message()));
}

absl::Status RemoteTier::Admit() {
  absl::MutexLock lock(&mu_);
  if (!store_->connected()) {
    ++counters_.unavailable;
    return absl::UnavailableError(absl::StrCat("remote tier (", counters_.store,
                                               ") is not connected: ", last_error_));
  }
  if (breaker_ == Breaker::kClosed) return absl::OkStatus();
  const absl::Time now = clock_->Now();
  if (breaker_ == Breaker::kOpen && now >= open_until_) breaker_ = Breaker::kHalfOpen;
  if (breaker_ == Breaker::kHalfOpen && !probe_in_flight_) {
    probe_in_flight_ = true;  // This caller's result decides.
    return absl::OkStatus();
  }
  ++counters_.unavailable;
  return absl::UnavailableError(absl::StrCat(
      "remote tier (", counters_.store, ") is unavailable (retrying in ",
      absl::ToInt64Milliseconds(std::max(open_until_ - now, absl::ZeroDuration())),
      " ms) after: ", last_error_));
}

void RemoteTier::Record(absl::Span<const absl::Status> statuses) {
  absl::MutexLock lock(&mu_);
  probe_in_flight_ = false;
  bool failed = false, timed_out = false, succeeded = false;
  std::string error;
  for (const absl::Status& s : statuses) {
    if (IsOutage(s)) {
      failed = true;
      ++counters_.errors;
      if (s.code() == absl::StatusCode::kDeadlineExceeded) {
        timed_out = true;
        ++counters_.timeouts;
      }
      if (error.empty()) error = std::string(s.message());
    } else if (s.ok() || s.code() == absl::StatusCode::kNotFound ||
               s.code() == absl::StatusCode::kAlreadyExists ||
               s.code() == absl::StatusCode::kFailedPrecondition) {  // Over a size limit.
      succeeded = true;
    } else {
      ++counters_.errors;  // Full, denied: the store answered; not an outage.
      if (error.empty()) error = std::string(s.message());
    }
  }
  if (!error.empty()) last_error_ = error;
  if (!failed) {
    if (succeeded) {
      if (breaker_ != Breaker::kClosed) {
        EVOKE_LOG_INFO("remote tier (", counters_.store, ") is back; breaker closed");
      }
      breaker_ = Breaker::kClosed;
      backoff_ = options_.retry;
      consecutive_failures_ = 0;
    }
    return;
  }
  ++consecutive_failures_;
  if (breaker_ == Breaker::kClosed && !timed_out &&
      consecutive_failures_ < options_.failures_to_open) {
    return;
  }
  if (breaker_ == Breaker::kClosed) {
    ++counters_.breaker_opens;
    EVOKE_LOG_WARNING("remote tier (", counters_.store, ") unavailable, breaker open for ",
                      absl::FormatDuration(backoff_), ": ", last_error_);
  }
  breaker_ = Breaker::kOpen;
  open_until_ = clock_->Now() + backoff_;
  backoff_ = std::min(backoff_ * 2, options_.retry_max);
}

std::vector<absl::Status> RemoteTier::Write(absl::Span<const Block> blocks) {
  std::vector<absl::Status> out(blocks.size());
  if (blocks.empty()) return out;
  if (absl::Status admitted = Admit(); !admitted.ok()) {
    std::fill(out.begin(), out.end(), admitted);
    return out;
  }
  // Content-addressed blocks another host already wrote are found by one
  // batched existence check, so their payloads never cross the network
  // (an exclusive create alone would refuse them only once sent).
  std::vector<absl::Status> got(blocks.size());
  std::vector<ObjectKey> shared;
  std::vector<size_t> shared_at;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!blocks[i].exclusive) continue;
    shared.push_back(ObjectKey{blocks[i].ns, ObjectName(blocks[i].id)});
    shared_at.push_back(i);
  }
  std::vector<bool> present(blocks.size(), false);
  if (!shared.empty()) {
    const std::vector<absl::Status> exists = store_->Exists(shared);
    Record(exists);
    for (size_t k = 0; k < shared.size(); ++k) {
      if (exists[k].ok()) {
        present[shared_at[k]] = true;
        got[shared_at[k]] = absl::AlreadyExistsError("present");
      } else if (exists[k].code() != absl::StatusCode::kNotFound) {
        got[shared_at[k]] = exists[k];  // Down: do not send the payload either.
        present[shared_at[k]] = true;
      }
    }
  }
  std::vector<std::string> records;
  std::vector<ObjectWrite> writes;
  std::vector<size_t> write_at;
  records.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (present[i]) continue;
    records.push_back(EncodeRecord(*blocks[i].record));
    writes.push_back(ObjectWrite{ObjectKey{blocks[i].ns, ObjectName(blocks[i].id)},
                                 blocks[i].payload, records.back(), blocks[i].exclusive});
    write_at.push_back(i);
  }
  if (!writes.empty()) {
    const std::vector<absl::Status> wrote = store_->Write(writes);
    Record(wrote);
    for (size_t k = 0; k < writes.size(); ++k) got[write_at[k]] = wrote[k];
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const absl::Status& s = got[i];
    if (s.ok()) {
      ++counters_.objects_written;
      counters_.bytes_written += blocks[i].payload.size();
    } else if (s.code() == absl::StatusCode::kAlreadyExists) {
      ++counters_.dedups;
      continue;  // OK.
    } else if (IsOutage(s)) {
      out[i] = Unavailable(absl::StrCat("write of block ", blocks[i].id.ToHex()), s);
      continue;
    } else {
      out[i] = s;
      continue;
    }
  }
  return out;
}

std::vector<absl::StatusOr<uint64_t>> RemoteTier::Sizes(absl::string_view ns,
                                                        absl::Span<const BlockId> ids) {
  if (absl::Status admitted = Admit(); !admitted.ok()) {
    return std::vector<absl::StatusOr<uint64_t>>(ids.size(), admitted);
  }
  std::vector<ObjectKey> keys;
  keys.reserve(ids.size());
  for (const BlockId& id : ids) keys.push_back(ObjectKey{std::string(ns), ObjectName(id)});
  std::vector<absl::StatusOr<uint64_t>> got = store_->Stat(keys);
  std::vector<absl::Status> statuses;
  statuses.reserve(got.size());
  for (const absl::StatusOr<uint64_t>& s : got) statuses.push_back(s.status());
  Record(statuses);
  return got;
}

std::vector<absl::Status> RemoteTier::Fetch(absl::string_view ns, absl::Span<const BlockId> ids,
                                            uint64_t max_payload_bytes,
                                            std::vector<storage::SpillRecord>* records,
                                            std::vector<std::string>* payloads) {
  records->assign(ids.size(), storage::SpillRecord());
  payloads->assign(ids.size(), std::string());
  return FetchEach(ns, ids, max_payload_bytes,
                   [&](size_t i, storage::SpillRecord& record,
                       absl::Span<const absl::string_view> payload, uint64_t bytes) {
                     (*records)[i] = std::move(record);
                     std::string& out = (*payloads)[i];
                     out.reserve(bytes);
                     for (absl::string_view piece : payload) out.append(piece.data(), piece.size());
                     return absl::OkStatus();
                   });
}

std::vector<absl::Status> RemoteTier::FetchEach(absl::string_view ns,
                                                absl::Span<const BlockId> ids,
                                                uint64_t max_payload_bytes,
                                                const FetchedVisitor& got) {
  std::vector<absl::Status> out(ids.size());
  if (ids.empty()) return out;
  if (absl::Status admitted = Admit(); !admitted.ok()) {
    std::fill(out.begin(), out.end(), admitted);
    return out;
  }
  std::vector<ObjectKey> keys;
  keys.reserve(ids.size());
  for (const BlockId& id : ids) keys.push_back(ObjectKey{std::string(ns), ObjectName(id)});
  storage::SpillRecord record;
  const std::vector<absl::Status> read =
      store_->ReadEach(keys, max_payload_bytes, [&](size_t i, const ObjectReadView& r) {
        // The block's name only for an error: the path of every fetched object.
        auto refused = [&](absl::string_view why) {
          return absl::DataLossError(absl::StrCat("remote block ", ids[i].ToHex(), ": ", why));
        };
        record.Clear();
        absl::Status checked;
        if (!absl::StartsWith(r.record, kRecordMagic) ||
            !record.ParseFromArray(r.record.data() + kRecordMagic.size(),
                                   static_cast<int>(r.record.size() - kRecordMagic.size()))) {
          checked = refused("its record does not parse");
        } else if (record.meta().id() != ids[i].ToBytes()) {
          checked = refused("its record names another block");
        } else if (r.data_bytes != record.meta().payload_bytes()) {
          checked = refused(absl::StrCat("payload is ", r.data_bytes, " bytes, its record says ",
                                         record.meta().payload_bytes()));
        }
        {
          absl::MutexLock lock(&mu_);
          if (checked.ok()) {
            ++counters_.fetches;
            counters_.fetched_bytes += r.data_bytes;
          } else {
            ++counters_.checksum_failures;
          }
        }
        out[i] = checked.ok() ? got(i, record, r.data, r.data_bytes) : checked;
      });
  Record(read);
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < ids.size(); ++i) {
    const absl::Status& s = read[i];
    if (s.ok()) continue;
    if (s.code() == absl::StatusCode::kNotFound) {
      ++counters_.misses;
      out[i] = absl::NotFoundError(absl::StrCat("remote block ", ids[i].ToHex(), " not found"));
    } else if (IsOutage(s)) {
      ++counters_.unavailable;
      out[i] = Unavailable(absl::StrCat("read of block ", ids[i].ToHex()), s);
    } else {
      // DATA_LOSS: an object without a record.
      if (s.code() == absl::StatusCode::kDataLoss) ++counters_.checksum_failures;
      out[i] = s;
    }
  }
  return out;
}

absl::StatusOr<size_t> RemoteTier::ProbeRun(absl::string_view ns, absl::Span<const BlockId> ids,
                                            size_t window) {
  size_t found = 0;
  window = std::max<size_t>(window, 1);
  while (found < ids.size()) {
    if (absl::Status admitted = Admit(); !admitted.ok()) {
      if (found == 0) return admitted;
      return found;
    }
    const size_t n = std::min(window, ids.size() - found);
    std::vector<ObjectKey> keys;
    keys.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      keys.push_back(ObjectKey{std::string(ns), ObjectName(ids[found + i])});
    }
    std::vector<absl::Status> got = store_->Exists(keys);
    Record(got);
    {
      absl::MutexLock lock(&mu_);
      counters_.probes += n;
    }
    size_t run = 0;
    while (run < n && got[run].ok()) ++run;
    found += run;
    if (run < n) {
      if (found == 0 && IsOutage(got[0])) return Unavailable("lookup", got[0]);
      break;
    }
  }
  return found;
}

absl::Status RemoteTier::Remove(absl::string_view ns, absl::Span<const BlockId> ids) {
  if (ids.empty()) return absl::OkStatus();
  if (absl::Status admitted = Admit(); !admitted.ok()) return admitted;
  std::vector<ObjectKey> keys;
  for (const BlockId& id : ids) keys.push_back(ObjectKey{std::string(ns), ObjectName(id)});
  std::vector<absl::Status> got = store_->Remove(keys);
  Record(got);
  for (const absl::Status& s : got) {
    if (!s.ok() && s.code() != absl::StatusCode::kNotFound) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RemoteTier::Expire(absl::Time before) {
  constexpr size_t kPage = 1024;
  uint64_t removed = 0;
  std::string cursor;
  do {
    if (absl::Status admitted = Admit(); !admitted.ok()) return admitted;
    std::string next;
    absl::StatusOr<std::vector<ListedObject>> page = store_->List(cursor, kPage, &next);
    Record({&page.status(), 1});  // Closes (or reopens) a half-open breaker.
    if (!page.ok()) return page.status();
    std::vector<ObjectKey> old;
    for (ListedObject& o : *page) {
      // Only blocks: "b." and 32 hex digits; anything else in the pool is
      // not ours to remove.
      const absl::string_view name = o.key.name;
      if (o.mtime >= before || !absl::StartsWith(name, "b.") ||
          !BlockId::FromHex(name.substr(2)).ok()) {
        continue;
      }
      old.push_back(std::move(o.key));
    }
    if (!old.empty()) {
      const std::vector<absl::Status> got = store_->Remove(old);
      Record(got);
      uint64_t n = 0;
      for (const absl::Status& s : got) n += s.ok() ? 1 : 0;
      removed += n;
      absl::MutexLock lock(&mu_);
      counters_.expired_objects += n;
    }
    cursor = std::move(next);
  } while (!cursor.empty());
  return removed;
}

bool RemoteTier::Ready(absl::Duration* wait) const {
  absl::MutexLock lock(&mu_);
  *wait = options_.retry;
  if (!store_->connected()) return false;
  if (breaker_ == Breaker::kClosed) return true;
  if (probe_in_flight_) return false;
  const absl::Time now = clock_->Now();
  if (breaker_ == Breaker::kOpen && now < open_until_) {
    *wait = open_until_ - now;
    return false;
  }
  return true;
}

bool RemoteTier::OverBudget() const {
  absl::MutexLock lock(&mu_);
  return options_.budget_bytes != 0 && counters_.pool_used_bytes > options_.budget_bytes;
}

void RemoteTier::CountChecksumFailure() {
  absl::MutexLock lock(&mu_);
  ++counters_.checksum_failures;
}

void RemoteTier::CountRefusedRecord() {
  absl::MutexLock lock(&mu_);
  ++counters_.refused_records;
}

void RemoteTier::CountUnavailable() {
  absl::MutexLock lock(&mu_);
  ++counters_.unavailable;
}

RemoteStats RemoteTier::Stats() const {
  absl::MutexLock lock(&mu_);
  RemoteStats s = counters_;
  s.connected = store_->connected() && breaker_ == Breaker::kClosed;
  s.state = std::string(BreakerName(store_->connected(), static_cast<int>(breaker_)));
  s.last_error = last_error_;
  return s;
}

}  // namespace evoke
