// LeaseManager: client leases and what they own (regions and pins).
#ifndef EVOKE_DAEMON_LEASE_MANAGER_H_
#define EVOKE_DAEMON_LEASE_MANAGER_H_

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/hash128.h"
#include "daemon/region.h"
#include "evoke/v1/kvtier.pb.h"
#include "storage/tier_manager.h"

namespace evoke {

struct LeaseManagerOptions {
  // Open leases at once. Default: 4096.
  uint32_t max_leases = 4096;
  // Open leases of one uid (TCP principals share one), so that no uid can
  // take every lease. 0: a quarter of max_leases (at least 1).
  uint32_t max_leases_per_uid = 0;
  // Regions one lease may register. Default: 256.
  uint32_t max_regions_per_lease = 256;
  // Acquire handles one lease may hold at once.
  uint32_t max_handles_per_lease = 4096;
  // Largest region. Default: 64 GiB.
  uint64_t max_region_bytes = 64ull << 30;
  // Caps on the shared-memory regions mapped at once, over all leases and
  // per peer uid (RESOURCE_EXHAUSTED past them; see MappingLimits). A
  // region counts until it is unmapped, i.e. until its last copy finishes.
  // Mapped bytes of all clients. Default: 4 TiB.
  uint64_t max_mapped_bytes = 4ull << 40;
  // Mapped bytes of one uid. Default: 2 TiB.
  uint64_t max_mapped_bytes_per_uid = 2ull << 40;
  // Mappings of all clients; each is a VMA of the daemon, so this must stay
  // well under vm.max_map_count. 0: DefaultMaxMappings(), i.e. min(16384,
  // vm.max_map_count / 4); larger values are lowered to it too.
  uint64_t max_mappings = 0;
  // Mappings of one uid. 0: a quarter of max_mappings (at least 1).
  uint64_t max_mappings_per_uid = 0;
  // A lease unused for this long (no request resolved it, see Find) is
  // ended by ExpireIdle. Default: infinite (a lease ends with its stream).
  absl::Duration idle_timeout = absl::InfiniteDuration();
  // Where grant and last-use times are read. Never null; must outlive the
  // LeaseManager. Default: the wall clock.
  const Clock* clock = Clock::Real();
};

struct Lease {
  BlockId id;      // The capability (16 random bytes).
  PinOwner owner;  // Its pins in the TierManager.
  uid_t owner_uid = 0;  // Of the process that opened it (see Grant).
};

// What LeaseManager::Describe reports of one open lease.
struct LeaseInfo {
  std::string client_name;
  uid_t owner_uid = 0;
  absl::Time granted;    // By options.clock.
  absl::Time last_used;  // Grant, or the last Find / region call naming it.
  size_t regions = 0;
};

// LeaseManager hands out leases and tracks their regions; pins are counted
// in the TierManager under the lease's PinOwner. Ending a lease removes its
// regions (each unmapped once the last copy using it finishes) and releases
// its pins. Thread-safe.
class LeaseManager {
 public:
  LeaseManager(const LeaseManagerOptions& options, TierManager* tiers);

  // Grant opens a lease for a client running as `owner_uid` (the peer's
  // uid, from SO_PEERCRED): only that uid may register shared memory under
  // it (AddSharedMemoryRegion). The default, the daemon's own uid, is for
  // callers that do not know the peer. RESOURCE_EXHAUSTED past max_leases
  // or max_leases_per_uid;
  // UNAVAILABLE if the system cannot provide randomness.
  // `max_for_uid`: the owner's lease cap from the policy (0: the default);
  // `max_mapped_bytes`: its mapped-bytes cap from the policy (0: the
  // default), applied to the regions registered in this lease.
  absl::StatusOr<Lease> Grant(absl::string_view client_name, uid_t owner_uid = geteuid(),
                              uint32_t max_for_uid = 0, uint64_t max_mapped_bytes = 0);
  // End closes a lease (idempotent).
  void End(const BlockId& id);
  // Find resolves the `lease_id` field of a request and marks the lease
  // used (now, by options.clock). INVALID_ARGUMENT when malformed or empty,
  // NOT_FOUND when unknown or ended.
  absl::StatusOr<Lease> Find(absl::string_view lease_id) const;
  // Touch marks an open lease used (as Find does) and returns how many
  // regions it has had removed so far: a transport that keeps the lease's
  // regions resolved (a ring) drops them when that count changes. NOT_FOUND
  // when unknown or ended.
  absl::StatusOr<uint64_t> Touch(const BlockId& id) const;
  // Describe reports an open lease. NOT_FOUND when unknown or ended.
  absl::StatusOr<LeaseInfo> Describe(const BlockId& id) const;
  // ExpireIdle ends (as End does) every lease whose last use is
  // options.idle_timeout or more before now, by options.clock, and returns
  // how many. Does nothing under an infinite idle_timeout. Cheap enough for
  // a timer (e.g. every second): one pass over the open leases (at most
  // max_leases) under the lock; pins and regions are released outside it.
  size_t ExpireIdle();

  // AddRegion registers a region under a lease and returns its id.
  // NOT_FOUND (lease), RESOURCE_EXHAUSTED (max_regions_per_lease). Region
  // calls mark the lease used, as Find does.
  absl::StatusOr<uint64_t> AddRegion(const BlockId& lease, std::shared_ptr<Region> region);
  // AddSharedMemoryRegion maps the memfd `fd` (ShmRegion::Map: its checks,
  // and the mapping caps charged to `peer_uid`) and registers it under the
  // lease named by the `lease_id` field of an FdChannel request. A lease
  // opened by another uid is answered exactly as an unknown one (NOT_FOUND),
  // so that lease ids cannot be probed. Takes ownership of `fd`. Errors: as
  // Find, ShmRegion::Map and AddRegion.
  absl::StatusOr<uint64_t> AddSharedMemoryRegion(absl::string_view lease_id, uid_t peer_uid,
                                                 int fd, uint64_t size);
  // GetRegion returns a region of the lease (the reference keeps it mapped).
  // NOT_FOUND naming `field` when the region is unknown or not the lease's.
  absl::StatusOr<std::shared_ptr<Region>> GetRegion(const BlockId& lease,
                                                    uint64_t region_id,
                                                    const std::string& field) const;
  // HasRegion says whether the lease is open and holds the region, without
  // marking the lease used (a ring's idle liveness check); with
  // `regions_removed`, also what Touch would return.
  bool HasRegion(const BlockId& lease, uint64_t region_id,
                 uint64_t* regions_removed = nullptr) const;
  // RemoveRegion unregisters a region. NOT_FOUND.
  absl::Status RemoveRegion(const BlockId& lease, uint64_t region_id);

  // Handles (Acquire): each has a PinOwner of its own, so that releasing
  // one leaves the lease's other pins and handles alone; ending the lease
  // releases them all.
  struct Handle {
    uint64_t id;
    PinOwner owner;
  };
  // NewHandle registers a handle under the lease. NOT_FOUND (lease),
  // RESOURCE_EXHAUSTED (max_handles_per_lease).
  absl::StatusOr<Handle> NewHandle(const BlockId& lease);
  // HasHandle says whether the handle is still registered (the lease may
  // have ended, and released its handles, while a caller was pinning).
  bool HasHandle(const BlockId& lease, uint64_t handle) const;
  // TakeHandle unregisters a handle and returns its owner, for the caller
  // to release. NOT_FOUND naming `handle` when the lease has no such handle.
  absl::StatusOr<PinOwner> TakeHandle(const BlockId& lease, uint64_t handle);

  const LeaseManagerOptions& options() const { return options_; }
  // The per-uid lease cap in force (max_leases_per_uid resolved).
  uint32_t max_leases_per_uid() const { return max_leases_per_uid_; }
  v1::LeaseStat Stats() const;
  // What the shared-memory regions map now, in all and per uid, and the caps
  // in force (max_mappings resolved).
  const MappingBudget& mapping_budget() const { return budget_; }

 private:
  struct LeaseState {
    PinOwner owner;
    uid_t owner_uid = 0;
    uint64_t max_mapped_bytes = 0;  // The owner's cap from the policy (0: default).
    std::string client_name;
    absl::Time granted;
    // Mutable: const lookups (Find, GetRegion) mark the lease used.
    mutable absl::Time last_used;
    absl::flat_hash_map<uint64_t, std::shared_ptr<Region>> regions;
    uint64_t regions_removed = 0;  // See Touch.
    absl::flat_hash_map<uint64_t, PinOwner> handles;
  };

  // Release releases the pins and regions of an ended lease; call without
  // mu_ held.
  void Release(LeaseState state);

  // Forget drops an ended lease's entry and its uid's count.
  void Forget(absl::flat_hash_map<BlockId, LeaseState>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LeaseManagerOptions options_;
  const uint32_t max_leases_per_uid_;
  const Clock* const clock_;
  TierManager* const tiers_;
  MappingBudget budget_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<BlockId, LeaseState> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, uint32_t> leases_per_uid_ ABSL_GUARDED_BY(mu_);
  PinOwner next_owner_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_region_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t expired_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pins_released_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_LEASE_MANAGER_H_
