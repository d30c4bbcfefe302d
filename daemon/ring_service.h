// The command rings' transport: decodes ring submissions
// (common/ring_format.h) into plain commands and runs them on the
// BlockService (daemon/block_service.h), the same body as the Save and Load
// RPCs, so that validation, access checks, error messages and the data paths
// are one code. No protobuf request or response is built on this path; a
// Save entry's metadata is a serialized BlockMeta (the store's record type).
#ifndef EVOKE_DAEMON_RING_SERVICE_H_
#define EVOKE_DAEMON_RING_SERVICE_H_

#include <cstdint>
#include <memory>

#include "daemon/access_policy.h"
#include "daemon/block_service.h"
#include "daemon/lease_manager.h"
#include "daemon/ring_server.h"
#include "daemon/rpc_metrics.h"

namespace evoke {

// MakeServiceRingHandler serves the ring in region `region_id` of `lease`
// for `caller` (the identity that attached it). The lease stays resolved
// and the regions entries name stay mapped from one batch to the next (until
// the lease's regions change). Consecutive submissions of one kind run as
// one batch; when such a batch fails, its entries run again one at a time,
// so that each gets its own status. `metrics` (may be null) counts each
// entry as a call of "ring.Save" or "ring.Load"; it and `service` must
// outlive the handler.
std::unique_ptr<RingHandler> MakeServiceRingHandler(BlockService* service, RpcMetrics* metrics,
                                                    std::shared_ptr<const Caller> caller,
                                                    const Lease& lease, uint64_t region_id);

}  // namespace evoke

#endif  // EVOKE_DAEMON_RING_SERVICE_H_
