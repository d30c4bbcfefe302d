// The options of each part that Daemon::Start assembles, built from its
// group of DaemonOptions: one function per part, so that Start reads as
// "build part X from options.x" and what a flag turns into is found here,
// next to its siblings, not in the middle of the start-up sequence.
//
// Only what the options decide is filled in. How the parts are wired to one
// another (the TierManager's observer and tier-3 pointer, the service's
// caller identification, the fd socket's admission) is Start's, since those
// exist only once the parts do.
#ifndef EVOKE_DAEMON_DAEMON_PARTS_H_
#define EVOKE_DAEMON_DAEMON_PARTS_H_

#include "absl/time/time.h"
#include "daemon/daemon_options.h"
#include "daemon/fd_channel.h"
#include "daemon/kvtier_service.h"
#include "daemon/lease_manager.h"
#include "daemon/ring_server.h"
#include "storage/pinned_arena.h"
#include "storage/remote/remote_tier.h"
#include "storage/tier2/spill_store.h"
#include "storage/tier_manager.h"
#ifdef EVOKE_HAVE_RADOS
#include "storage/remote/rados_store.h"
#endif

namespace evoke {

// Tier 1, the pinned arena: its size, mlock and prefaulting.
PinnedArenaOptions ToArenaOptions(const DaemonOptions::Tier1& tier1);

// Tier 2, the spill store: data_dir (resolved against the working
// directory) and WAL syncing.
SpillStoreOptions ToSpillStoreOptions(const DaemonOptions::Tier2& tier2);

// The TierManager, from the groups of every tier it drives: the
// watermarks (tier1), the disk budget and spill batches (tier2), block
// limits, staging, the metadata budget, the save wait, copy threads and the
// MEAN_KEYS summaries of canonical blocks (tiers), and tier 3's write-behind
// (remote). Left unset: observer, quota and remote.
TierManagerOptions ToTierManagerOptions(const DaemonOptions& options);

// Tier 3's breaker, pool budget and expiry sweep.
RemoteTierOptions ToRemoteTierOptions(const DaemonOptions::Remote& remote);
#ifdef EVOKE_HAVE_RADOS
// Tier 3's connection to the Ceph cluster.
RadosOptions ToRadosOptions(const DaemonOptions::Remote& remote);
#endif

// The LeaseManager's caps and idle timeout.
LeaseManagerOptions ToLeaseManagerOptions(const DaemonOptions::Leases& leases);
// How often the daemon looks for leases idle past leases.idle_ms: a quarter
// of it, between 50 ms and 5 s, so that a lease outlives its timeout by at
// most a quarter. Meaningful only when idle_ms > 0 (no reaper otherwise).
absl::Duration LeaseReaperInterval(const DaemonOptions::Leases& leases);

// The fd socket's connection deadline. Left unset: admit.
FdChannelOptions ToFdChannelOptions(const DaemonOptions::Fd& fd);

// The command rings' polling.
RingOptions ToRingOptions(const DaemonOptions::Rings& rings);

// KvTierService: its request limits, message size, rings, per-uid call cap,
// version, and the data dir and fd socket it reports (absolute). Left unset:
// gpu_stats, identify, policy, rpc_metrics and metrics_address.
KvTierServiceOptions ToServiceOptions(const DaemonOptions& options);

}  // namespace evoke

#endif  // EVOKE_DAEMON_DAEMON_PARTS_H_
