// The KvTierService's RingHandler: runs ring submissions (common/ring_format.h)
// through the same bodies as the Save and Load RPCs, so that validation,
// access checks, error messages and the data paths are one code.
#ifndef EVOKE_DAEMON_RING_SERVICE_H_
#define EVOKE_DAEMON_RING_SERVICE_H_

#include <cstdint>
#include <memory>

#include "daemon/access_policy.h"
#include "daemon/lease_manager.h"
#include "daemon/ring_server.h"

namespace evoke {

class KvTierService;

// MakeServiceRingHandler serves the ring in region `region_id` of `lease`
// for `caller` (the identity that attached it). Consecutive submissions of
// one kind run as one batch against the TierManager; when such a batch fails,
// its entries run again one at a time, so that each gets its own status.
std::unique_ptr<RingHandler> MakeServiceRingHandler(KvTierService* service,
                                                    std::shared_ptr<const Caller> caller,
                                                    const Lease& lease, uint64_t region_id,
                                                    const LeaseManager* leases);

}  // namespace evoke

#endif  // EVOKE_DAEMON_RING_SERVICE_H_
