// MemoryObjectStore: an in-memory ObjectStore (storage/remote/object_store.h) for
// the remote tier's tests and fuzz target: it can be taken down (every call
// fails UNAVAILABLE or times out), counts calls, and lets a test reach into
// an object (flip a byte, replace its data or record). SharedStore lets
// several RemoteTiers ("hosts") share one.
#ifndef EVOKE_TESTING_MEMORY_OBJECT_STORE_H_
#define EVOKE_TESTING_MEMORY_OBJECT_STORE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "storage/remote/object_store.h"
#include "storage/remote/remote_tier.h"

namespace evoke::testing {

class MemoryObjectStore final : public ObjectStore {
 public:
  struct Object {
    std::string data, record;
    absl::Time mtime;
  };
  enum class Mode { kUp, kDown, kSlow };

  std::string Describe() const override { return "memory store"; }
  absl::Status Connect() override {
    absl::MutexLock lock(&mu_);
    if (refuse_connect) return absl::UnavailableError("injected: monitors unreachable");
    connected_ = true;
    return absl::OkStatus();
  }
  bool connected() const override {
    absl::MutexLock lock(&mu_);
    return connected_;
  }

  std::vector<absl::Status> Write(absl::Span<const ObjectWrite> writes) override {
    absl::MutexLock lock(&mu_);
    std::vector<absl::Status> out;
    for (const ObjectWrite& w : writes) {
      ++write_ops;
      if (absl::Status s = Outage(); !s.ok()) {
        out.push_back(s);
        continue;
      }
      auto [it, fresh] = objects_.try_emplace(Key(w.key));
      if (!fresh && w.exclusive) {
        out.push_back(absl::AlreadyExistsError("exists"));
        continue;
      }
      payload_bytes_sent += w.data.size();
      it->second = Object{std::string(w.data), std::string(w.record),
                          clock ? clock->Now() : absl::Now()};
      out.push_back(absl::OkStatus());
    }
    return out;
  }
  std::vector<ObjectRead> Read(absl::Span<const ObjectKey> keys,
                               uint64_t max_data_bytes) override {
    absl::MutexLock lock(&mu_);
    std::vector<ObjectRead> out;
    for (const ObjectKey& k : keys) {
      ++read_ops;
      ObjectRead r;
      if (r.status = Outage(); r.status.ok()) {
        auto it = objects_.find(Key(k));
        if (it == objects_.end()) {
          r.status = absl::NotFoundError("no such object");
        } else if (it->second.data.size() > max_data_bytes) {
          r.status = absl::FailedPreconditionError("data is larger than the limit (not read)");
        } else {
          r.data = it->second.data;
          r.record = it->second.record;
          read_bytes += r.data.size();
        }
      }
      out.push_back(std::move(r));
    }
    return out;
  }
  std::vector<absl::StatusOr<uint64_t>> Stat(absl::Span<const ObjectKey> keys) override {
    absl::MutexLock lock(&mu_);
    std::vector<absl::StatusOr<uint64_t>> out;
    for (const ObjectKey& k : keys) {
      absl::Status s = Outage();
      auto it = objects_.find(Key(k));
      if (s.ok() && it == objects_.end()) s = absl::NotFoundError("no such object");
      out.push_back(s.ok() ? absl::StatusOr<uint64_t>(it->second.data.size())
                           : absl::StatusOr<uint64_t>(s));
    }
    return out;
  }
  std::vector<absl::Status> Exists(absl::Span<const ObjectKey> keys) override {
    absl::MutexLock lock(&mu_);
    std::vector<absl::Status> out;
    for (const ObjectKey& k : keys) {
      ++exists_ops;
      absl::Status s = Outage();
      if (s.ok() && !objects_.contains(Key(k))) s = absl::NotFoundError("no such object");
      out.push_back(s);
    }
    return out;
  }
  std::vector<absl::Status> Remove(absl::Span<const ObjectKey> keys) override {
    absl::MutexLock lock(&mu_);
    std::vector<absl::Status> out;
    for (const ObjectKey& k : keys) {
      absl::Status s = Outage();
      if (s.ok()) objects_.erase(Key(k));
      out.push_back(s);
    }
    return out;
  }
  absl::StatusOr<std::vector<ListedObject>> List(const std::string& cursor, size_t max,
                                                 std::string* next) override {
    absl::MutexLock lock(&mu_);
    next->clear();
    if (absl::Status s = Outage(); !s.ok()) return s;
    std::vector<ListedObject> out;
    for (auto it = objects_.upper_bound(cursor); it != objects_.end(); ++it) {
      if (out.size() == max) {
        *next = out.back().key.ns + "/" + out.back().key.name;
        break;
      }
      const size_t slash = it->first.find('/');
      out.push_back(ListedObject{ObjectKey{it->first.substr(0, slash), it->first.substr(slash + 1)},
                                 it->second.mtime});
    }
    return out;
  }
  absl::StatusOr<ObjectStoreUsage> Usage() override {
    absl::MutexLock lock(&mu_);
    ObjectStoreUsage u;
    for (const auto& [k, o] : objects_) {
      ++u.objects;
      u.bytes += o.data.size();
    }
    return u;
  }

  void SetMode(Mode m) {
    absl::MutexLock lock(&mu_);
    mode_ = m;
  }
  bool Has(const std::string& ns, const BlockId& id) {
    absl::MutexLock lock(&mu_);
    return objects_.contains(ns + "/" + RemoteTier::ObjectName(id));
  }
  void FlipByte(const std::string& ns, const BlockId& id) {
    absl::MutexLock lock(&mu_);
    objects_.at(ns + "/" + RemoteTier::ObjectName(id)).data[7] ^= 0x40;
  }
  void SetData(const std::string& ns, const BlockId& id, std::string data) {
    absl::MutexLock lock(&mu_);
    objects_.at(ns + "/" + RemoteTier::ObjectName(id)).data = std::move(data);
  }
  std::string RecordOf(const std::string& ns, const BlockId& id) {
    absl::MutexLock lock(&mu_);
    return objects_.at(ns + "/" + RemoteTier::ObjectName(id)).record;
  }
  void SetRecord(const std::string& ns, const BlockId& id, std::string record) {
    absl::MutexLock lock(&mu_);
    objects_.at(ns + "/" + RemoteTier::ObjectName(id)).record = std::move(record);
  }
  size_t size() {
    absl::MutexLock lock(&mu_);
    return objects_.size();
  }

  // Counters (read under no lock by tests once the store is quiet).
  uint64_t write_ops = 0, read_ops = 0, exists_ops = 0, payload_bytes_sent = 0, read_bytes = 0;
  std::atomic<bool> refuse_connect{false};
  const Clock* clock = nullptr;  // Write times (null: the wall clock).

  // Put stores an object that is not a block (someone else's, in the pool).
  void Put(const std::string& ns, const std::string& name) {
    absl::MutexLock lock(&mu_);
    objects_[ns + "/" + name] = Object{"x", "", absl::UnixEpoch()};
  }
  bool HasObject(const std::string& ns, const std::string& name) {
    absl::MutexLock lock(&mu_);
    return objects_.contains(ns + "/" + name);
  }

 private:
  static std::string Key(const ObjectKey& k) { return k.ns + "/" + k.name; }
  absl::Status Outage() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    switch (mode_) {
      case Mode::kDown: return absl::UnavailableError("injected: connection refused");
      case Mode::kSlow: return absl::DeadlineExceededError("injected: timed out");
      default: return absl::OkStatus();
    }
  }

  mutable absl::Mutex mu_;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kUp;
  std::map<std::string, Object> objects_ ABSL_GUARDED_BY(mu_);
};

// A store shared by several RemoteTiers (one per "host").
class SharedStore final : public ObjectStore {
 public:
  explicit SharedStore(MemoryObjectStore* s) : s_(s) {}
  std::string Describe() const override { return s_->Describe(); }
  absl::Status Connect() override { return s_->Connect(); }
  bool connected() const override { return s_->connected(); }
  std::vector<absl::Status> Write(absl::Span<const ObjectWrite> w) override {
    return s_->Write(w);
  }
  std::vector<ObjectRead> Read(absl::Span<const ObjectKey> k, uint64_t max) override {
    return s_->Read(k, max);
  }
  std::vector<absl::StatusOr<uint64_t>> Stat(absl::Span<const ObjectKey> k) override {
    return s_->Stat(k);
  }
  std::vector<absl::Status> Exists(absl::Span<const ObjectKey> k) override {
    return s_->Exists(k);
  }
  std::vector<absl::Status> Remove(absl::Span<const ObjectKey> k) override {
    return s_->Remove(k);
  }
  absl::StatusOr<ObjectStoreUsage> Usage() override { return s_->Usage(); }
  absl::StatusOr<std::vector<ListedObject>> List(const std::string& cursor, size_t max,
                                                 std::string* next) override {
    return s_->List(cursor, max, next);
  }

 private:
  MemoryObjectStore* s_;
};

}  // namespace evoke::testing

#endif  // EVOKE_TESTING_MEMORY_OBJECT_STORE_H_
