// The daemon's side of the command rings (common/ring_format.h): one thread
// per attached ring takes submissions, runs them through a RingHandler and
// posts completions.
#ifndef EVOKE_DAEMON_RING_SERVER_H_
#define EVOKE_DAEMON_RING_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/ring_format.h"
#include "daemon/region.h"

namespace evoke {

struct RingOptions {
  // Rings attached at once, over all clients and per peer uid; each costs
  // the daemon one thread (RESOURCE_EXHAUSTED past them). Defaults: 256, 64.
  uint32_t max_rings = 256;
  uint32_t max_rings_per_uid = 64;
  // How long a ring's thread keeps polling an empty queue before it sleeps
  // on the futex (a busy ring then costs no system call): twice the recent
  // mean gap between the client's submissions while that is under half of
  // spin_max, so that a client that submits every few hundred microseconds
  // finds the thread awake; `spin` for slower clients (common/adaptive_spin.h).
  // spin_max <= spin: always `spin`. Defaults: 50 us, 1 ms.
  absl::Duration spin = absl::Microseconds(50);
  absl::Duration spin_max = absl::Milliseconds(1);
  // How often a sleeping ring's thread wakes to check that its lease and
  // region still exist. Default: 100 ms.
  absl::Duration liveness_interval = absl::Milliseconds(100);
  // Most submissions taken in one pass. Default: 64.
  uint32_t max_batch = 64;
};

// One submission as the handler sees it: the daemon's own copies of the
// entry and of its argument bytes.
struct RingRequest {
  ring::RingSqe sqe;
  absl::string_view meta;                  // The serialized protobuf (Acquire: the ids).
  absl::Span<const ring::RingSlice> slices;  // n_slices entries, or empty.
};

// What a completion carries.
struct RingResult {
  absl::Status status;
  uint32_t flags = 0;  // ring::CqeFlags.
  uint64_t checksum = 0;
  uint64_t payload_bytes = 0;
  uint32_t tier = 0;
  std::string meta;  // Load with kLoadWantMeta: the serialized BlockMeta.
};

// RingHandler runs ring submissions. Called on the ring's thread, one
// submission at a time, in order.
class RingHandler {
 public:
  virtual ~RingHandler() = default;
  // Execute runs a batch of valid-looking requests (opcode known, arguments
  // inside the slot) and fills one result per request; it may combine them.
  virtual void Execute(absl::Span<const RingRequest> requests,
                       absl::Span<RingResult> results) = 0;
  // Alive says whether the ring's lease and region still exist; a ring
  // whose owner went stops (kBrokenClosed). Called between batches and on
  // every liveness_interval while idle.
  virtual bool Alive() = 0;
};

// ValidateRingGeometry checks a header as the client wrote it, against the
// size of its region; INVALID_ARGUMENT naming the header field.
absl::StatusOr<ring::RingGeometry> ValidateRingGeometry(const ring::RingHeader& header,
                                                        uint64_t region_bytes);

// RingSet owns the attached rings and their threads. Thread-safe.
class RingSet {
 public:
  explicit RingSet(RingOptions options);
  // Stops every ring (as StopAll) and waits for their threads.
  ~RingSet();
  RingSet(const RingSet&) = delete;
  RingSet& operator=(const RingSet&) = delete;

  // Attach starts serving the ring in `region` (a shared-memory region whose
  // header the client initialized) for a client of `uid`, running entries
  // through `handler`. `key` names the ring (lease and region), so that a
  // region serves at most one ring: FAILED_PRECONDITION for a second.
  // INVALID_ARGUMENT (geometry), RESOURCE_EXHAUSTED (ring limits).
  // `max_for_uid`: the uid's ring cap from the policy (0: max_rings_per_uid).
  absl::StatusOr<ring::RingGeometry> Attach(std::string key, uid_t uid,
                                            std::shared_ptr<Region> region,
                                            std::unique_ptr<RingHandler> handler,
                                            uint32_t max_for_uid = 0);
  // StopAll stops serving every ring (each marked kBrokenClosed) and waits
  // for their threads. Attach fails afterwards (UNAVAILABLE).
  void StopAll();

  struct Counters {
    uint64_t rings = 0;   // Serving now.
    uint64_t ops = 0;     // Completions posted since start.
    uint64_t broken = 0;  // Rings stopped for a corrupt index.
  };
  Counters counters() const;

 private:
  class Ring;
  void Finished(const std::string& key, uid_t uid);

  const RingOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Ring>> rings_ ABSL_GUARDED_BY(mu_);
  // Rings whose thread ended, to be joined (by the next Attach or StopAll).
  std::vector<std::shared_ptr<Ring>> finished_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, uint32_t> per_uid_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> ops_{0};
  std::atomic<uint64_t> broken_{0};
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_RING_SERVER_H_
