// KvTierService's calls that hold blocks where they are: Acquire and
// Release (holds on blocks, between a lookup and a load) and KeepSession
// (a session kept through a pause). Memory only: they finish on the
// reactor.
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "daemon/kvtier_calls.h"
#include "daemon/kvtier_service.h"
#include "daemon/storage_mapping.h"

namespace evoke {

using kvtier_calls::FinishInline;

grpc::ServerUnaryReactor* KvTierService::Acquire(grpc::CallbackServerContext* context,
                                                 const v1::AcquireRequest* request,
                                                 v1::AcquireResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishInline(context, [&]() -> absl::Status {
    if (request->mode() != v1::ACQUIRE_MODE_UNSPECIFIED &&
        request->mode() != v1::ACQUIRE_MODE_PREFIX && request->mode() != v1::ACQUIRE_MODE_ALL) {
      return absl::InvalidArgumentError(
          absl::StrCat("mode: unknown value ", static_cast<int>(request->mode())));
    }
    const bool all = request->mode() == v1::ACQUIRE_MODE_ALL;
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, all));
    EVOKE_ASSIGN_OR_RETURN(Lease lease, blocks_.FindLease(*caller, request->lease_id()));
    EVOKE_ASSIGN_OR_RETURN(BlockService::Acquired acquired,
                           blocks_.Acquire(*caller, lease, ids, all));
    response->set_handle(acquired.handle);
    response->set_n_held(acquired.held.size());
    for (BlockLocation where : acquired.held) response->add_tiers(ToProto(where));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Release(grpc::CallbackServerContext* context,
                                                 const v1::ReleaseRequest* request,
                                                 v1::ReleaseResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishInline(context, [&]() -> absl::Status {
    if (request->handle() == 0) {
      return absl::InvalidArgumentError("handle: is required (0 is no handle)");
    }
    EVOKE_ASSIGN_OR_RETURN(Lease lease, blocks_.FindLease(*caller, request->lease_id()));
    EVOKE_ASSIGN_OR_RETURN(uint64_t released, blocks_.Release(lease, request->handle()));
    response->set_n_released(static_cast<uint32_t>(released));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::KeepSession(grpc::CallbackServerContext* context,
                                                     const v1::KeepSessionRequest* request,
                                                     v1::KeepSessionResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishInline(context, [&]() -> absl::Status {
    if (request->namespace_().empty()) {
      return absl::InvalidArgumentError("namespace: is required");
    }
    EVOKE_RETURN_IF_ERROR(NeedsNamespace(*caller, "namespace", request->namespace_()));
    if (request->session_id().empty()) {
      return absl::InvalidArgumentError("session_id: is required");
    }
    if (request->seconds() > options_.limits.max_keep_seconds) {
      return absl::InvalidArgumentError(absl::StrCat("seconds: ", request->seconds(),
                                                     " is past the limit of ",
                                                     options_.limits.max_keep_seconds));
    }
    EVOKE_ASSIGN_OR_RETURN(size_t n,
                           tiers_->KeepSession(request->namespace_(), request->session_id(),
                                               absl::Seconds(request->seconds())));
    response->set_n_blocks(static_cast<uint32_t>(n));
    return absl::OkStatus();
  });
}

}  // namespace evoke
