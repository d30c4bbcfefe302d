// fuzz_spill_record: what a start reads back from the spill store. A record
// on disk (storage/spill_record.proto) was written by an earlier evoked, a
// different version, a failing disk, or anyone with access to the data dir;
// every start reads all of them, so one that crashes is a crash loop.
//
// Input (FuzzedDataProvider): 1..4 stored blocks, each a key (the record's
// own id, or bytes of any length), the record's bytes, a payload, and two
// repair bits that make the record more likely to pass the checks (set
// meta.id to the key, set meta.checksum to the payload's); then the
// TierManager is opened over them, with the daemon's RecoveryIndex feed,
// and every call a client can make without saving is made: Stats, List
// (unfiltered and by namespace and session), Describe, Lookup, Load, Recover
// (RecoveryIndex::Search with each record's summaries), Verify, Delete.
//
// The store is an in-memory Tier that reads records as SpillStore does
// (storage/tier2/spill_store.cc: a key that is not 16 bytes or a record that does
// not parse is skipped and counted).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/fingerprint.h"
#include "google/protobuf/stubs/logging.h"
#include "recovery/recovery_index.h"
#include "storage/spill_record.pb.h"
#include "storage/tier.h"
#include "storage/tier_manager.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_engine.h"

namespace evoke {
namespace {

// Keys and values as RocksDB holds them: serialized records, raw payloads.
struct Stored {
  std::string record;
  std::string payload;
};

class FuzzTier final : public Tier {
 public:
  explicit FuzzTier(std::map<std::string, Stored> blocks) : blocks_(std::move(blocks)) {}

  absl::string_view name() const override { return "fuzz tier"; }
  TierLevel level() const override { return TierLevel::kDisk; }

  absl::Status Put(absl::Span<const TierWrite> writes, bool) override {
    absl::MutexLock lock(&mu_);
    for (const TierWrite& w : writes) {
      storage::SpillRecord record = *w.record;
      record.set_payload_present(!w.payload.empty());
      blocks_[w.id.ToBytes()] = {record.SerializeAsString(), std::string(w.payload)};
    }
    return absl::OkStatus();
  }
  absl::Status DropPayloads(absl::Span<const TierWrite> breadcrumbs) override {
    absl::MutexLock lock(&mu_);
    for (const TierWrite& w : breadcrumbs) {
      storage::SpillRecord record = *w.record;
      record.set_payload_present(false);
      blocks_[w.id.ToBytes()] = {record.SerializeAsString(), ""};
    }
    return absl::OkStatus();
  }
  absl::Status Delete(absl::Span<const BlockId> ids) override {
    absl::MutexLock lock(&mu_);
    for (const BlockId& id : ids) blocks_.erase(id.ToBytes());
    return absl::OkStatus();
  }
  absl::Status Read(const BlockId& id,
                    const std::function<absl::Status(const storage::SpillRecord&,
                                                     absl::string_view)>& consume) override {
    Stored copy;
    {
      absl::MutexLock lock(&mu_);
      auto it = blocks_.find(id.ToBytes());
      if (it == blocks_.end()) return absl::NotFoundError("absent");
      copy = it->second;
    }
    storage::SpillRecord record;
    if (!record.ParseFromString(copy.record)) return absl::DataLossError("unreadable record");
    if (!record.payload_present()) return absl::NotFoundError("no payload");
    return consume(record, copy.payload);
  }
  absl::Status ForEachRecord(const RecordVisitor& visit,
                             std::vector<std::string>* skipped) override {
    std::map<std::string, Stored> snapshot;
    {
      absl::MutexLock lock(&mu_);
      snapshot = blocks_;
    }
    for (const auto& [key, stored] : snapshot) {
      absl::StatusOr<BlockId> id = BlockId::FromBytes(key);
      storage::SpillRecord record;
      if (!id.ok() || !record.ParseFromString(stored.record)) {
        if (skipped != nullptr) skipped->push_back("unreadable record");
        continue;
      }
      absl::Status s = visit(*id, record);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  uint64_t UsedBytes() override { return 0; }
  absl::Status Persist() override { return absl::OkStatus(); }

 private:
  absl::Mutex mu_;
  std::map<std::string, Stored> blocks_ ABSL_GUARDED_BY(mu_);
};

class RecoveryFeed final : public BlockObserver {
 public:
  explicit RecoveryFeed(RecoveryIndex* index) : index_(index) {}
  void Added(const BlockId& id, const v1::BlockMeta& meta) override { index_->Add(id, meta); }
  void Removed(const BlockId& id, const v1::BlockMeta& meta) override {
    index_->Remove(id, meta);
  }

 private:
  RecoveryIndex* const index_;
};

void Run(FuzzedDataProvider& in) {
  std::map<std::string, Stored> blocks;
  std::vector<storage::SpillRecord> parsed;  // Records that parse, for the queries.
  const int n = in.ConsumeIntegralInRange<int>(1, 4);
  for (int i = 0; i < n; ++i) {
    const uint8_t how = in.ConsumeIntegral<uint8_t>();
    std::string key = in.ConsumeBytesAsString(in.ConsumeIntegralInRange<size_t>(0, 24));
    std::string record_bytes = in.ConsumeRandomLengthString(1 << 16);
    std::string payload = in.ConsumeRandomLengthString(1 << 16);
    storage::SpillRecord record;
    if (record.ParseFromString(record_bytes)) {
      if (how & 1) record.mutable_meta()->set_id(key);
      if (how & 2) record.mutable_meta()->set_checksum(PayloadChecksum(payload.data(), payload.size()));
      if (how & 4) record.mutable_meta()->set_payload_bytes(payload.size());
      if (how & 8) record.set_payload_present(true);
      if (how & 15) record_bytes = record.SerializeAsString();
      parsed.push_back(record);
    }
    blocks[key] = {std::move(record_bytes), std::move(payload)};
  }

  RecoveryIndex recovery;
  RecoveryFeed feed(&recovery);
  TierManagerOptions options;
  options.observer = &feed;
  options.copy_threads = 0;
  options.max_wait_for_room = absl::Milliseconds(10);
  // A start never fails because of what is on disk.
  std::unique_ptr<TierManager> opened = fuzz::OpenMemoryEngine(options,
                                                               std::make_unique<FuzzTier>(blocks));
  TierManager& tm = *opened;

  (void)tm.Stats();
  bool more = false;
  std::vector<BlockInfo> all = tm.List(ListFilter(), nullptr, 1000, &more);
  std::vector<BlockId> ids;
  for (const BlockInfo& info : all) {
    absl::StatusOr<BlockId> id = BlockId::FromBytes(info.meta.id());
    FUZZ_CHECK(id.ok());  // Only records with a valid id are served.
    ids.push_back(*id);
  }
  for (const storage::SpillRecord& record : parsed) {
    const v1::BlockMeta& meta = record.meta();
    ListFilter by_ns;
    by_ns.ns = meta.fingerprint().namespace_();
    (void)tm.List(by_ns, nullptr, 10, &more);
    by_ns.session_id = meta.session_id();
    (void)tm.List(by_ns, nullptr, 10, &more);
    if (absl::StatusOr<BlockId> id = BlockId::FromBytes(meta.id()); id.ok()) {
      (void)tm.Describe(*id);
      (void)tm.Lookup({id.value()});
      StringLoadSink sink;
      std::vector<v1::BlockMeta> metas;
      std::vector<LoadedInfo> infos;
      absl::Status loaded = tm.Load({id.value()}, meta.fingerprint(), sink, &metas, &infos);
      if (loaded.ok()) {
        // What is served matches its checksum.
        FUZZ_CHECK(metas.size() == 1 && sink.payloads().size() == 1);
        FUZZ_CHECK(PayloadChecksum(sink.payloads()[0].data(), sink.payloads()[0].size()) ==
                   metas[0].checksum());
      }
    }
    for (const v1::Summary& s : meta.summaries()) {
      RecoveryQuery query;
      query.scope = meta.kind() == v1::BLOCK_KIND_SESSION
                        ? SessionScopeKey(meta.fingerprint().namespace_(), meta.session_id())
                        : ModelScopeKey(DigestFingerprint(meta.fingerprint()));
      query.kind = s.kind();
      query.layer = s.layer();
      query.queries = absl::MakeConstSpan(s.values().data(), s.values_size());
      query.n_query_heads = s.heads() == 0 ? 1 : s.heads();
      query.k = 3;
      uint64_t candidates = 0;
      absl::StatusOr<std::vector<RecoveryHit>> hits = recovery.Search(query, &candidates);
      if (hits.ok()) {
        for (const RecoveryHit& h : *hits) FUZZ_CHECK(!std::isnan(h.score));
      }
    }
  }
  (void)tm.Verify({});
  if (!ids.empty()) (void)tm.Delete(ids);
  (void)tm.Shutdown();
}

}  // namespace
}  // namespace evoke

// protobuf logs every string field with invalid UTF-8 it parses; thousands
// of lines a second would drown the fuzzer's own output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  evoke::Run(in);
  return 0;
}
