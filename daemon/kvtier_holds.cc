// KvTierService's calls that say where blocks should be: Acquire and
// Release (holds on blocks, between a lookup and a load) and KeepSession
// (a session kept through a pause), memory only, finished on the reactor;
// Prefetch (blocks brought into tier 1 ahead of their Loads), which reads
// disk on the executor; WatchBlocks (where blocks go, as a stream).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/block_validation.h"
#include "common/status_macros.h"
#include "daemon/kvtier_calls.h"
#include "daemon/kvtier_service.h"
#include "daemon/storage_mapping.h"

namespace evoke {

using kvtier_calls::FinishInline;
using kvtier_calls::ToGrpc;
using kvtier_calls::TooManyCalls;

namespace {

void SetCounts(const PrefetchResult& r, v1::PrefetchResponse* out) {
  out->set_in_tier1(r.in_tier1);
  out->set_promoted(r.promoted);
  out->set_fetched(r.fetched);
  out->set_missing(r.missing);
  out->set_no_room(r.no_room);
  out->set_failed(r.failed);
}

}  // namespace

grpc::ServerWriteReactor<v1::BlockEvents>* KvTierService::WatchBlocks(
    grpc::CallbackServerContext* context, const v1::WatchBlocksRequest* request) {
  absl::StatusOr<std::shared_ptr<const Caller>> caller = Identify(*context);
  if (!caller.ok()) return RefusedWatch(caller.status());
  if (options_.watch == nullptr) {
    return RefusedWatch(absl::UnavailableError("this evoked does not serve WatchBlocks"));
  }
  if (!request->namespace_().empty()) {
    absl::Status s = NeedsNamespace(**caller, "namespace", request->namespace_());
    if (!s.ok()) return RefusedWatch(s);
  }
  return options_.watch->Watch(context, *std::move(caller), *request);
}

grpc::ServerUnaryReactor* KvTierService::Prefetch(grpc::CallbackServerContext* context,
                                                  const v1::PrefetchRequest* request,
                                                  v1::PrefetchResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  struct Work {
    std::vector<BlockId> ids;
    std::optional<v1::LayoutFingerprint> fingerprint;
    absl::Time deadline;
  };
  auto work = std::make_shared<Work>();
  const absl::Status valid = [&]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(work->ids,
                           ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, true));
    if (request->has_fingerprint()) {
      const v1::LayoutFingerprint& fp = request->fingerprint();
      EVOKE_RETURN_IF_ERROR(ValidateFingerprint(fp, options_.limits.block, "fingerprint"));
      EVOKE_RETURN_IF_ERROR(NeedsNamespace(*caller, "fingerprint.namespace", fp.namespace_()));
      EVOKE_RETURN_IF_ERROR(NeedsTrustGroup(*caller, "fingerprint", fp));
      work->fingerprint = fp;
    }
    constexpr uint32_t kMaxRoomWaitMs = 60'000;
    if (request->room_wait_ms() > kMaxRoomWaitMs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "room_wait_ms: ", request->room_wait_ms(), " is past the limit of ", kMaxRoomWaitMs));
    }
    const uint32_t wait_ms = request->room_wait_ms() == 0 ? 1000 : request->room_wait_ms();
    work->deadline = std::min(kvtier_calls::DeadlineOf(context),
                              absl::Now() + absl::Milliseconds(wait_ms));
    return absl::OkStatus();
  }();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!valid.ok()) {
    reactor->Finish(ToGrpc(valid));
    return reactor;
  }
  TierManager* tiers = tiers_;
  const CallLane lane = LaneOf(*caller);
  const bool wait = request->wait();
  // Runs in the caller's lane of the executor, so that a uid's prefetches
  // count against its calls in flight.
  auto run = [tiers, caller, work]() {
    return tiers->Prefetch(work->ids, work->fingerprint ? &*work->fingerprint : nullptr,
                           work->deadline, caller.get());
  };
  if (wait) {
    if (!executor_->TrySubmit(lane.uid, lane.limit, [reactor, response, run]() {
          absl::StatusOr<PrefetchResult> r = run();
          if (r.ok()) {
            response->set_done(true);
            SetCounts(*r, response);
          }
          reactor->Finish(ToGrpc(r.status()));
        })) {
      reactor->Finish(ToGrpc(TooManyCalls(lane)));
    }
    return reactor;
  }
  const bool queued = executor_->TrySubmit(lane.uid, lane.limit, [run]() { (void)run(); });
  reactor->Finish(ToGrpc(queued ? absl::OkStatus() : TooManyCalls(lane)));
  return reactor;
}

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

// PERMISSION_DENIED when the policy caps namespace `ns`'s retention class
// below `wanted` (v1::RetentionClass); `field` names what asked for it.
absl::Status KvTierService::CheckRetentionCap(absl::string_view field, absl::string_view ns,
                                              int wanted) const {
  const v1::NamespacePolicy* p =
      options_.policy != nullptr ? options_.policy->Namespace(ns) : nullptr;
  // NORMAL, the class every block has, is never refused.
  if (p == nullptr || p->max_retention() == 0 || wanted <= v1::RETENTION_NORMAL ||
      wanted <= static_cast<int>(p->max_retention())) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      field, ": namespace ", ns, " allows retention classes up to ",
      v1::RetentionClass_Name(static_cast<v1::RetentionClass>(p->max_retention())),
      " (its policy's max_retention)"));
}

grpc::ServerUnaryReactor* KvTierService::SetRetention(grpc::CallbackServerContext* context,
                                                      const v1::SetRetentionRequest* request,
                                                      v1::SetRetentionResponse*) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishInline(context, [&]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(std::vector<BlockId> ids,
                           ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, true));
    const v1::RetentionClass c = request->retention();
    if (c != v1::RETENTION_LOW && c != v1::RETENTION_NORMAL && c != v1::RETENTION_HIGH) {
      return absl::InvalidArgumentError(
          absl::StrCat("retention: ", static_cast<int>(c), " is not LOW, NORMAL or HIGH"));
    }
    if (request->ttl_seconds() > options_.limits.max_keep_seconds) {
      return absl::InvalidArgumentError(absl::StrCat("ttl_seconds: ", request->ttl_seconds(),
                                                     " is past the limit of ",
                                                     options_.limits.max_keep_seconds));
    }
    // The policy's cap, for the blocks the caller may see (the others are
    // NOT_FOUND below, as absent ones).
    absl::Status capped;
    tiers_->VisitMetas(ids, [&](size_t i, const v1::BlockMeta& meta) {
      if (!capped.ok() || !caller->SeesBlock(meta.fingerprint())) return;
      capped = CheckRetentionCap(absl::StrCat("ids[", i, "]"), meta.fingerprint().namespace_(),
                                 c);
    });
    EVOKE_RETURN_IF_ERROR(capped);
    const RetentionClass cls = c == v1::RETENTION_LOW    ? RetentionClass::kLow
                               : c == v1::RETENTION_HIGH ? RetentionClass::kHigh
                                                         : RetentionClass::kNormal;
    return WithFieldPath(tiers_->SetRetention(ids, cls, absl::Seconds(request->ttl_seconds()),
                                              caller.get()),
                         ItemsField::kIds);
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
    if (request->seconds() > 0) {
      // A keep is class high.
      EVOKE_RETURN_IF_ERROR(
          CheckRetentionCap("namespace", request->namespace_(), v1::RETENTION_HIGH));
    }
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
