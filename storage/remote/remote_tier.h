// RemoteTier: tier 3, blocks in an object store that several hosts share
// (Ceph RADOS), so that a prefix computed on one host is reused on every
// other and a host's blocks outlive it.
#ifndef EVOKE_STORAGE_REMOTE_TIER_H_
#define EVOKE_STORAGE_REMOTE_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/hash128.h"
#include "storage/remote/object_store.h"
#include "storage/spill_record.pb.h"
#include "storage/tier_types.h"

namespace evoke {

struct RemoteTierOptions {
  // After a failure the breaker opens for `retry`, doubling on each failed
  // probe up to `retry_max`; while open no call reaches the store.
  absl::Duration retry = absl::Seconds(1);
  absl::Duration retry_max = absl::Seconds(30);
  // Consecutive failed calls that open the breaker. A timed-out call opens
  // it at once: a slow store costs one deadline, not one per call.
  int failures_to_open = 3;
  // How often the background thread refreshes the pool's usage, and retries
  // connecting while disconnected (every `retry`).
  absl::Duration usage_refresh = absl::Seconds(10);
  // Write-behind pauses while the pool holds more than this (0: no limit;
  // the pool's own quota still applies).
  uint64_t budget_bytes = 0;
  // Blocks written longer ago than this are removed by a sweep every
  // `sweep_every` (zero: never). Age is since the object was written (RADOS
  // keeps no read time), so a block in use expires too; the next host that
  // saves it writes it again.
  absl::Duration expire_after = absl::ZeroDuration();
  absl::Duration sweep_every = absl::Hours(1);
  const Clock* clock = nullptr;  // Null: the wall clock.
};


// RemoteTier adds to an ObjectStore what the engine needs to rely on it:
// the object layout (one object per block, named by id; its record in an
// attribute), a circuit breaker, counters, and a background thread that
// reconnects and watches the pool's usage. It never verifies payloads: the
// engine hashes what it fetched before it keeps or serves a byte.
//
// Object layout: name `b.<32 hex digits of the id>` in the RADOS namespace
// of the block's evoke namespace; data = the payload; attribute `evoke.rec`
// = "EVR1" + the serialized SpillRecord (meta with checksum, fingerprint,
// positions, summaries). Prefix blocks are written exclusively (create
// only), so two hosts saving the same prefix store it once.
//
// Thread-safe.
class RemoteTier {
 public:
  RemoteTier(std::unique_ptr<ObjectStore> store, const RemoteTierOptions& options);
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // Start tries to connect once (blocking up to the store's connect
  // deadline) and starts the background thread, which keeps retrying while
  // disconnected. Returns the first attempt's status: the caller decides
  // whether to run degraded.
  absl::Status Start();
  void Stop();

  static std::string ObjectName(const BlockId& id);
  // The tier-3 namespace of a block with fingerprint `fp` (of `ns` and
  // `trust_group`): the namespace itself, or for a block of a trust group
  // "NS\x1fGROUP", so that a probe or fetch for one group never reaches
  // another group's objects.
  static std::string RemoteNamespace(absl::string_view ns, absl::string_view trust_group);
  static std::string RemoteNamespace(const v1::LayoutFingerprint& fp) {
    return RemoteNamespace(fp.namespace_(), fp.trust_group());
  }
  static std::string EncodeRecord(const storage::SpillRecord& record);

  struct Block {
    BlockId id;
    std::string ns;
    const storage::SpillRecord* record = nullptr;
    absl::string_view payload;
    bool exclusive = false;  // Prefix blocks: the first writer wins.
  };
  // Write stores blocks; one status each: OK (written, or already there),
  // or UNAVAILABLE (down, slow, breaker open), RESOURCE_EXHAUSTED (full).
  std::vector<absl::Status> Write(absl::Span<const Block> blocks);

  // Fetch reads blocks of namespace `ns`: one status each, OK with the
  // record and payload filled, NOT_FOUND, DATA_LOSS (a record that does not
  // parse or names another block, a payload of the wrong size),
  // FAILED_PRECONDITION (a payload over `max_payload_bytes`, never read), or
  // UNAVAILABLE. Payloads are not verified here.
  std::vector<absl::Status> Fetch(absl::string_view ns, absl::Span<const BlockId> ids,
                                  uint64_t max_payload_bytes,
                                  std::vector<storage::SpillRecord>* records,
                                  std::vector<std::string>* payloads);
  // FetchedVisitor gets block `i`'s checked record (it may take from it) and
  // its payload, in pieces that are valid only during the call, and returns
  // the block's status.
  using FetchedVisitor =
      std::function<absl::Status(size_t i, storage::SpillRecord& record,
                                 absl::Span<const absl::string_view> payload, uint64_t bytes)>;
  // FetchEach reads as Fetch does and hands each block over as its read
  // completes, in order, while the later reads are still in flight (its
  // work overlaps their transfer), without copying the payload out of the
  // store's buffers. One status each: Fetch's errors, or what `got`
  // returned.
  std::vector<absl::Status> FetchEach(absl::string_view ns, absl::Span<const BlockId> ids,
                                      uint64_t max_payload_bytes, const FetchedVisitor& got);
  // Sizes returns the payload size of each block of `ns` without reading it
  // (NOT_FOUND, UNAVAILABLE, or the store's error).
  std::vector<absl::StatusOr<uint64_t>> Sizes(absl::string_view ns,
                                              absl::Span<const BlockId> ids);

  // ProbeRun returns how many leading `ids` exist in namespace `ns`,
  // checking `window` at a time. UNAVAILABLE when the first window cannot
  // be checked.
  absl::StatusOr<size_t> ProbeRun(absl::string_view ns, absl::Span<const BlockId> ids,
                                  size_t window = 32);

  // Remove deletes blocks of namespace `ns` (absent ones are OK).
  absl::Status Remove(absl::string_view ns, absl::Span<const BlockId> ids);

  // Expire removes, in every namespace, the blocks written before `before`
  // and returns how many it removed. Objects not named like blocks are
  // left alone. The background thread calls it when expire_after is set.
  absl::StatusOr<uint64_t> Expire(absl::Time before);

  // Admit says whether a call may reach the store now: UNAVAILABLE with the
  // reason while disconnected or while the breaker is open. In half-open,
  // one caller at a time is admitted (its result closes or reopens it).
  absl::Status Admit();
  // Ready says, without taking the half-open probe, whether Admit would
  // let a call through now; `wait` is how long until it may.
  bool Ready(absl::Duration* wait) const;
  // Write-behind should pause (the pool is past budget_bytes).
  bool OverBudget() const;
  void CountChecksumFailure();
  // A record this host's limits refuse (left in place for other hosts).
  void CountRefusedRecord();
  void CountUnavailable();

  RemoteStats Stats() const;

 private:
  enum class Breaker { kClosed, kOpen, kHalfOpen };
  // Record updates the breaker and counters from a call's statuses; `ops`
  // is how many operations there were.
  void Record(absl::Span<const absl::Status> statuses);
  absl::Status Unavailable(absl::string_view what, const absl::Status& cause) const;
  void Loop();

  const std::unique_ptr<ObjectStore> store_;
  const RemoteTierOptions options_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  absl::CondVar stop_cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Breaker breaker_ ABSL_GUARDED_BY(mu_) = Breaker::kClosed;
  bool probe_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time open_until_ ABSL_GUARDED_BY(mu_);
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_);
  int consecutive_failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  RemoteStats counters_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_REMOTE_TIER_H_
