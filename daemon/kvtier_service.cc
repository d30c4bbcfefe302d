#include "daemon/kvtier_service.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/fingerprint.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/kvtier_calls.h"
#include "daemon/ring_service.h"
#include "daemon/storage_mapping.h"

namespace evoke {
namespace {

using kvtier_calls::DeadlineOf;
using kvtier_calls::FinishInline;
using kvtier_calls::FinishOnExecutor;
using kvtier_calls::Lane;
using kvtier_calls::SubmitOrRefuse;
using kvtier_calls::ToGrpc;

// Parses a request as gRPC's generated handler does.
template <typename Message>
bool ParseWithProtobuf(const grpc::ByteBuffer& bytes, Message* message) {
  grpc::ByteBuffer copy(bytes);  // Deserialize consumes its buffer.
  return grpc::SerializationTraits<Message>::Deserialize(&copy, message).ok();
}

// What gRPC's generated handler answers when a request does not parse.
grpc::Status UnparsableRequest() {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "");
}

}  // namespace

// One open lease: grants it with the first message and holds it until the
// stream ends, however it ends; then the lease's regions and pins go. The
// reactor owns itself (self_) until OnDone; CloseLeases may hold another
// reference for a moment, so Close checks that the stream is not done yet.
class KvTierService::LeaseReactor final
    : public grpc::ServerWriteReactor<v1::LeaseEvent> {
 public:
  LeaseReactor(KvTierService* service, const absl::StatusOr<Lease>& lease,
               const std::string& fd_socket, const LeaseManagerOptions& limits)
      : service_(service) {
    if (lease.ok()) {
      lease_ = *lease;
      v1::LeaseGrant* grant = event_.mutable_grant();
      grant->set_lease_id(lease_->id.ToBytes());
      grant->set_fd_socket(fd_socket);
      grant->set_max_regions(limits.max_regions_per_lease);
      grant->set_max_region_bytes(limits.max_region_bytes);
    } else {
      error_ = lease.status();
    }
  }

  // Start runs once `self` owns the reactor.
  void Start(std::shared_ptr<LeaseReactor> self) {
    self_ = std::move(self);
    if (!error_.ok()) {
      Close(ToGrpc(error_));
      return;
    }
    StartWrite(&event_);
  }

  void OnWriteDone(bool ok) override {
    // Nothing more to write: the stream stays open until the client goes.
    if (!ok) Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "lease stream broken"));
  }
  void OnCancel() override { Close(grpc::Status::CANCELLED); }
  void OnDone() override {
    if (lease_) service_->leases_->End(lease_->id);
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    service_->Forget(this);
    std::shared_ptr<LeaseReactor> self = std::move(self_);  // May delete this.
  }
  // Close finishes the stream once, unless it is already done.
  void Close(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (finished_ || done_) return;
    finished_ = true;
    Finish(status);
  }

 private:
  KvTierService* const service_;
  std::optional<Lease> lease_;
  absl::Status error_;
  v1::LeaseEvent event_;
  std::shared_ptr<LeaseReactor> self_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

KvTierService::KvTierService(TierManager* tiers, Executor* executor,
                             LeaseManager* leases, DeviceCopiers* copiers,
                             const RecoveryIndex* recovery, KvTierServiceOptions options)
    : tiers_(tiers),
      executor_(executor),
      leases_(leases),
      recovery_(recovery),
      options_(std::move(options)),
      blocks_(tiers, leases, copiers,
              BlockServiceOptions{options_.limits, InlineLoadBudget(), options_.policy}),
      payload_pool_(inline_wire::StringPool::Options{options_.inline_pool_bytes,
                                                     options_.inline_pool_buffers}),
      rings_(std::make_unique<RingSet>(options_.rings)) {
  // Methods 0 and 1 of evoke.v1.KvTier (kvtier.proto's order) are Save and
  // Load; their generated typed handlers are replaced by raw ones.
  using RawHandler = grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>;
  MarkMethodRawCallback(
      0, new RawHandler([this](grpc::CallbackServerContext* context,
                               const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
        return SaveBytes(context, request, response);
      }));
  MarkMethodRawCallback(
      1, new RawHandler([this](grpc::CallbackServerContext* context,
                               const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
        return LoadBytes(context, request, response);
      }));
}

absl::StatusOr<std::shared_ptr<const Caller>> KvTierService::Identify(
    const grpc::CallbackServerContext& context) const {
  if (!options_.identify) return Caller::Unrestricted();
  return options_.identify(context);
}

grpc::ServerUnaryReactor* KvTierService::Recover(grpc::CallbackServerContext* context,
                                                 const v1::RecoverRequest* request,
                                                 v1::RecoverResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  // CPU work proportional to the scope's size: off the reactor.
  return FinishOnExecutor(executor_, LaneOf(*caller), context, [=, this]() -> absl::Status {
    RecoveryQuery query;
    switch (request->scope_case()) {
      case v1::RecoverRequest::kSession:
        if (request->session().namespace_().empty()) {
          return absl::InvalidArgumentError("session.namespace: is required");
        }
        EVOKE_RETURN_IF_ERROR(
            NeedsNamespace(*caller, "session.namespace", request->session().namespace_()));
        if (request->session().session_id().empty()) {
          return absl::InvalidArgumentError("session.session_id: is required");
        }
        query.scope = SessionScopeKey(request->session().namespace_(),
                                      request->session().session_id());
        break;
      case v1::RecoverRequest::kModel:
        EVOKE_RETURN_IF_ERROR(ValidateFingerprint(request->model().fingerprint(),
                                                  options_.limits.block, "model.fingerprint"));
        EVOKE_RETURN_IF_ERROR(NeedsNamespace(*caller, "model.fingerprint.namespace",
                                             request->model().fingerprint().namespace_()));
        EVOKE_RETURN_IF_ERROR(
            NeedsTrustGroup(*caller, "model.fingerprint", request->model().fingerprint()));
        query.scope = ModelScopeKey(DigestFingerprint(request->model().fingerprint()));
        break;
      default:
        return absl::InvalidArgumentError("scope: is required (session or model)");
    }
    if (!v1::SummaryKind_IsValid(request->kind()) ||
        request->kind() == v1::SUMMARY_KIND_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          request->kind() == v1::SUMMARY_KIND_UNSPECIFIED
              ? std::string("kind: is required")
              : absl::StrCat("kind: unknown summary kind ", static_cast<int>(request->kind())));
    }
    if (request->k() == 0 || request->k() > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("k: ", request->k(), " is out of range [1, 1024]"));
    }
    if (request->queries().empty()) return absl::InvalidArgumentError("queries: is required");
    if (request->aggregation() != v1::AGGREGATION_MEAN &&
        request->aggregation() != v1::AGGREGATION_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "aggregation: unknown aggregation ", static_cast<int>(request->aggregation())));
    }
    EVOKE_ASSIGN_OR_RETURN(std::vector<BlockId> excluded,
                           ParseIds(request->exclude_ids(), "exclude_ids", 0,
                                    options_.limits.max_ids, false));
    const absl::flat_hash_set<BlockId> exclude(excluded.begin(), excluded.end());
    query.kind = request->kind();
    query.layer = request->layer();
    query.queries = absl::MakeConstSpan(request->queries().data(), request->queries_size());
    query.n_query_heads = request->n_query_heads();
    query.aggregate_max = request->aggregation() == v1::AGGREGATION_MAX;
    query.exclude = &exclude;
    if (request->has_min_score() && !std::isfinite(request->min_score())) {
      return absl::InvalidArgumentError(
          absl::StrCat("min_score: must be finite, got ", request->min_score()));
    }
    query.has_min_score = request->has_min_score();
    query.min_score = request->min_score();
    // Ask for more than k when breadcrumbs may be skipped; widen until k
    // blocks with bytes are found or the scope is exhausted.
    uint32_t want = request->k();
    for (;;) {
      query.k = want;
      uint64_t candidates = 0;
      EVOKE_ASSIGN_OR_RETURN(std::vector<RecoveryHit> hits,
                             recovery_->Search(query, &candidates));
      response->Clear();
      response->set_candidates(candidates);
      for (const RecoveryHit& hit : hits) {
        absl::StatusOr<BlockInfo> info = tiers_->Describe(hit.id, caller.get());
        if (!info.ok()) continue;  // Deleted since it was scored.
        if (request->require_bytes() && !info->bytes_available) continue;
        v1::RecoveredBlock* out = response->add_blocks();
        out->set_id(hit.id.ToBytes());
        out->set_score(hit.score);
        out->set_tier(ToProto(info->location));
        out->set_bytes_available(info->bytes_available);
        *out->mutable_meta() = std::move(info->meta);
        out->mutable_meta()->clear_summaries();
        if (static_cast<uint32_t>(response->blocks_size()) == request->k()) break;
      }
      if (static_cast<uint32_t>(response->blocks_size()) == request->k() ||
          hits.size() < want || want >= candidates) {
        if (options_.rpc_metrics != nullptr) {
          options_.rpc_metrics->RecordRecoverCandidates(candidates);
        }
        return absl::OkStatus();
      }
      want = static_cast<uint32_t>(std::min<uint64_t>(candidates, want * 4ull));
    }
  });
}

KvTierService::~KvTierService() = default;

void KvTierService::CloseLeases() {
  if (options_.watch != nullptr) options_.watch->CloseAll();
  std::vector<std::shared_ptr<LeaseReactor>> open;
  {
    absl::MutexLock lock(&reactors_mu_);
    closing_ = true;
    for (const auto& [raw, weak] : reactors_) {
      if (std::shared_ptr<LeaseReactor> r = weak.lock()) open.push_back(std::move(r));
    }
  }
  rings_->StopAll();
  for (const auto& r : open) {
    r->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "evoked is shutting down"));
  }
}

void KvTierService::Forget(LeaseReactor* reactor) {
  absl::MutexLock lock(&reactors_mu_);
  reactors_.erase(reactor);
}

KvTierService::CallLane KvTierService::LaneOf(const Caller& caller) const {
  return CallLane{OwnerUid(caller),
                  caller.caps().calls != 0 ? caller.caps().calls : options_.max_calls_per_uid};
}

grpc::ServerWriteReactor<v1::LeaseEvent>* KvTierService::OpenLease(
    grpc::CallbackServerContext* context, const v1::OpenLeaseRequest* request) {
  absl::StatusOr<Lease> lease;
  absl::StatusOr<std::shared_ptr<const Caller>> caller = Identify(*context);
  if (!caller.ok()) {
    lease = caller.status();
  } else {
    absl::MutexLock lock(&reactors_mu_);
    lease = closing_ ? absl::StatusOr<Lease>(
                           absl::UnavailableError("evoked is shutting down"))
                     : leases_->Grant(request->client_name(), OwnerUid(**caller),
                                      (*caller)->caps().leases, (*caller)->caps().mapped_bytes);
  }
  auto reactor = std::make_shared<LeaseReactor>(this, lease, options_.fd_socket,
                                                leases_->options());
  LeaseReactor* raw = reactor.get();
  if (lease.ok()) {
    absl::MutexLock lock(&reactors_mu_);
    reactors_.emplace(raw, reactor);
  }
  raw->Start(std::move(reactor));
  return raw;
}

grpc::ServerUnaryReactor* KvTierService::RegisterCudaRegion(
    grpc::CallbackServerContext* context, const v1::RegisterCudaRegionRequest* request,
    v1::RegisterRegionResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishOnExecutor(executor_, LaneOf(*caller), context, [=, this]() -> absl::Status {
    if (!caller->may_register_cuda()) {
      return absl::PermissionDeniedError(absl::StrCat(
          caller->name(), " may not register CUDA regions over TCP (the access policy's "
                          "cuda_regions is not set for it)"));
    }
    EVOKE_ASSIGN_OR_RETURN(Lease lease, blocks_.FindLease(*caller, request->lease_id()));
    if (request->size() > leases_->options().max_region_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "size: ", request->size(), " exceeds the region limit of ",
          leases_->options().max_region_bytes, " bytes"));
    }
    EVOKE_ASSIGN_OR_RETURN(
        std::shared_ptr<CudaIpcMapping> mapping,
        cuda_mappings_.Get(lease.owner_uid, request->ipc_handle(),
                           static_cast<int>(request->device()), request->size()));
    EVOKE_ASSIGN_OR_RETURN(
        uint64_t id,
        leases_->AddRegion(lease.id,
                           std::make_shared<CudaRegion>(std::move(mapping), request->size())));
    response->set_region_id(id);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::UnregisterRegion(
    grpc::CallbackServerContext* context, const v1::UnregisterRegionRequest* request,
    v1::UnregisterRegionResponse*) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishOnExecutor(executor_, LaneOf(*caller), context, [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(Lease lease, blocks_.FindLease(*caller, request->lease_id()));
    return leases_->RemoveRegion(lease.id, request->region_id());
  });
}

grpc::ServerUnaryReactor* KvTierService::AttachRing(grpc::CallbackServerContext* context,
                                                    const v1::AttachRingRequest* request,
                                                    v1::AttachRingResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishOnExecutor(executor_, LaneOf(*caller), context, [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(Lease lease, blocks_.FindLease(*caller, request->lease_id()));
    EVOKE_ASSIGN_OR_RETURN(std::shared_ptr<Region> region,
                           leases_->GetRegion(lease.id, request->region_id(), "ring"));
    if (region->kind() != Region::Kind::kSharedMemory) {
      return absl::FailedPreconditionError(
          "region_id: a ring must be a shared-memory region, not a CUDA one");
    }
    EVOKE_ASSIGN_OR_RETURN(
        ring::RingGeometry g,
        rings_->Attach(absl::StrCat(lease.id.ToHex(), "/", request->region_id()),
                       lease.owner_uid, std::move(region),
                       MakeServiceRingHandler(&blocks_, options_.rpc_metrics, caller, lease,
                                              request->region_id()),
                       caller->caps().rings));
    response->set_sq_entries(g.sq_entries);
    response->set_cq_entries(g.cq_entries);
    response->set_arg_bytes(g.arg_bytes);
    response->set_msg_bytes(g.msg_bytes);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::SaveBytes(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  const absl::Time deadline = DeadlineOf(context);
  EVOKE_CALLER_OR_FINISH(caller, context);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  SubmitOrRefuse(executor_, LaneOf(*caller), reactor, [=, this] {
    reactor->Finish(SaveRaw(*caller, *request, deadline, response));
  });
  return reactor;
}

grpc::ServerUnaryReactor* KvTierService::LoadBytes(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  SubmitOrRefuse(executor_, LaneOf(*caller), reactor,
                 [=, this] { reactor->Finish(LoadRaw(*caller, *request, response)); });
  return reactor;
}

grpc::Status KvTierService::SaveRaw(const Caller& caller, const grpc::ByteBuffer& bytes,
                                    absl::Time deadline, grpc::ByteBuffer* out) {
  v1::SaveRequest request;
  // Large payloads stay in the received slices (`views`), copied from there
  // straight into tier 1.
  inline_wire::SavePayloadViews views;
  if (!inline_wire::ParseSaveRequest(bytes, &request, &views) &&
      !ParseWithProtobuf(bytes, &request)) {
    return UnparsableRequest();
  }
  absl::StatusOr<std::vector<SavedBlock>> saved = [&]() -> absl::StatusOr<std::vector<SavedBlock>> {
    SaveCommand command;
    EVOKE_RETURN_IF_ERROR(DecodeSaveRequest(request, options_.limits, &command));
    for (size_t i = 0; i < views.blocks.size() && i < command.blocks.size(); ++i) {
      command.blocks[i].payload.inline_pieces = std::move(views.blocks[i]);
    }
    command.deadline = deadline;
    return blocks_.Save(caller, command);
  }();
  if (!saved.ok()) return ToGrpc(saved.status());
  v1::SaveResponse response;
  response.mutable_results()->Reserve(saved->size());
  for (const SavedBlock& r : *saved) ToProto(r, response.add_results());
  bool own_buffer;
  return grpc::SerializationTraits<v1::SaveResponse>::Serialize(response, out, &own_buffer);
}

grpc::Status KvTierService::LoadRaw(const Caller& caller, const grpc::ByteBuffer& bytes,
                                    grpc::ByteBuffer* out) {
  v1::LoadRequest request;
  if (!ParseWithProtobuf(bytes, &request)) return UnparsableRequest();
  LoadCommand command;
  absl::Status s = DecodeLoadRequest(request, options_.limits, &command);
  if (!s.ok()) return ToGrpc(s);
  LoadResult result;
  if (command.destinations.empty() && command.reanchor.empty() && command.scatter.empty()) {
    // Leave room for metadata in the response message.
    inline_wire::InlineLoadSink sink(&payload_pool_, InlineLoadBudget());
    s = blocks_.LoadInto(caller, command, sink, &result);
    if (!s.ok()) return ToGrpc(s);
    std::vector<v1::Tier> served_from;
    served_from.reserve(result.infos.size());
    for (const LoadedInfo& info : result.infos) served_from.push_back(ToProto(info.served_from));
    sink.Encode(served_from, out);
    return grpc::Status::OK;
  }
  std::vector<std::string> inline_payloads;
  s = blocks_.Load(caller, command, &inline_payloads, &result);
  if (!s.ok()) return ToGrpc(s);
  v1::LoadResponse response;
  for (size_t i = 0; i < command.ids.size(); ++i) {
    v1::LoadedBlock* block = response.add_blocks();
    *block->mutable_meta() = std::move(result.metas[i]);
    block->set_served_from(ToProto(result.infos[i].served_from));
    if (i < inline_payloads.size()) block->set_inline_bytes(std::move(inline_payloads[i]));
  }
  bool own_buffer;
  return grpc::SerializationTraits<v1::LoadResponse>::Serialize(response, out, &own_buffer);
}

grpc::ServerUnaryReactor* KvTierService::Lookup(grpc::CallbackServerContext* context,
                                                const v1::LookupRequest* request,
                                                v1::LookupResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  auto lookup = [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, false));
    // A namespace the caller may not use gets this host's answer only, the
    // same as for a namespace the remote tier does not hold.
    const std::vector<BlockLocation> found =
        request->namespace_().empty()
            ? tiers_->Lookup(ids, caller.get())
            : tiers_->LookupFleet(ids, request->namespace_(), request->trust_group(),
                                  caller.get());
    response->set_n_present(found.size());
    for (BlockLocation where : found) response->add_tiers(ToProto(where));
    return absl::OkStatus();
  };
  // A local lookup never blocks (memory only): it runs on the reactor; a
  // fleet-wide one waits for the network and goes to the executor.
  if (request->namespace_().empty()) return FinishInline(context, lookup);
  return FinishOnExecutor(executor_, LaneOf(*caller), context, lookup);
}

grpc::ServerUnaryReactor* KvTierService::Delete(grpc::CallbackServerContext* context,
                                                const v1::DeleteRequest* request,
                                                v1::DeleteResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishOnExecutor(executor_, LaneOf(*caller), context, [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, true));
    EVOKE_RETURN_IF_ERROR(WithFieldPath(tiers_->Delete(ids, caller.get()), ItemsField::kIds));
    response->set_n_deleted(ids.size());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::DropSession(
    grpc::CallbackServerContext* context, const v1::DropSessionRequest* request,
    v1::DropSessionResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishOnExecutor(executor_, LaneOf(*caller), context, [=, this]() -> absl::Status {
    if (request->namespace_().empty()) {
      return absl::InvalidArgumentError("namespace: is required");
    }
    EVOKE_RETURN_IF_ERROR(NeedsNamespace(*caller, "namespace", request->namespace_()));
    if (request->session_id().empty()) {
      return absl::InvalidArgumentError("session_id: is required");
    }
    EVOKE_ASSIGN_OR_RETURN(
        uint32_t n, tiers_->DropSession(request->namespace_(), request->session_id()));
    response->set_n_deleted(n);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Pin(grpc::CallbackServerContext* context,
                                             const v1::PinRequest* request,
                                             v1::PinResponse*) {
  const absl::Time deadline = DeadlineOf(context);
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishOnExecutor(executor_, LaneOf(*caller), context, [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, true));
    EVOKE_ASSIGN_OR_RETURN(Lease lease, blocks_.FindLease(*caller, request->lease_id()));
    return WithFieldPath(tiers_->Pin(ids, lease.owner, deadline, caller.get()), ItemsField::kIds);
  });
}

grpc::ServerUnaryReactor* KvTierService::Unpin(grpc::CallbackServerContext* context,
                                               const v1::PinRequest* request,
                                               v1::PinResponse*) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishInline(context, [&]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 1, options_.limits.max_ids, true));
    EVOKE_ASSIGN_OR_RETURN(Lease lease, blocks_.FindLease(*caller, request->lease_id()));
    return WithFieldPath(tiers_->Unpin(ids, lease.owner, caller.get()), ItemsField::kIds);
  });
}

grpc::ServerUnaryReactor* KvTierService::List(grpc::CallbackServerContext* context,
                                              const v1::ListRequest* request,
                                              v1::ListResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishInline(context, [&]() -> absl::Status {
    const uint32_t page_size = request->page_size() == 0 ? 100 : request->page_size();
    if (page_size > 1000) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_size: ", page_size, " exceeds 1000"));
    }
    if (!request->session_id().empty() && request->namespace_().empty()) {
      return absl::InvalidArgumentError(
          "namespace: is required when session_id is given");
    }
    if (request->namespace_().empty()) {
      EVOKE_RETURN_IF_ERROR(NeedsAdmin(*caller, "List without a namespace"));
    } else {
      EVOKE_RETURN_IF_ERROR(NeedsNamespace(*caller, "namespace", request->namespace_()));
    }
    if (!v1::Tier_IsValid(request->tier())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tier: unknown tier ", static_cast<int>(request->tier())));
    }
    BlockId after;
    const bool has_after = !request->page_token().empty();
    if (has_after) {
      absl::StatusOr<BlockId> parsed = BlockId::FromHex(request->page_token());
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "page_token: not a token from ListResponse (", parsed.status().message(),
            ")"));
      }
      after = *parsed;
    }
    ListFilter filter;
    filter.ns = request->namespace_();
    filter.session_id = request->session_id();
    filter.location = LocationFromProto(request->tier());
    filter.scope = caller.get();  // Other trust groups' blocks are not listed.
    bool more = false;
    const std::vector<BlockInfo> blocks =
        tiers_->List(filter, has_after ? &after : nullptr, page_size, &more);
    // Paged by bytes as well: metadata-heavy blocks (summaries, tokens) end
    // a page early rather than overflow the message limit for everyone.
    const uint64_t budget = options_.max_message_bytes / 2;
    uint64_t bytes = 0;
    for (const BlockInfo& b : blocks) {
      v1::BlockInfo info;
      ToProto(b, &info);
      if (!caller->SeesTokensOf(b.meta)) info.mutable_meta()->clear_tokens();
      const uint64_t size = info.ByteSizeLong() + 8;
      if (response->blocks_size() > 0 && bytes + size > budget) {
        more = true;
        break;
      }
      bytes += size;
      *response->add_blocks() = std::move(info);
    }
    if (more && response->blocks_size() > 0) {
      response->set_next_page_token(
          BlockId::FromBytes(response->blocks().rbegin()->meta().id())->ToHex());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Describe(grpc::CallbackServerContext* context,
                                                  const v1::DescribeRequest* request,
                                                  v1::BlockInfo* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishInline(context, [&]() -> absl::Status {
    absl::StatusOr<BlockId> id = BlockId::FromBytes(request->id());
    if (!id.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("id: ", id.status().message()));
    }
    absl::StatusOr<BlockInfo> info = tiers_->Describe(*id, caller.get());
    if (!info.ok()) return WithFieldPath(info.status(), ItemsField::kId);
    ToProto(*info, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Stat(grpc::CallbackServerContext* context,
                                              const v1::StatRequest*,
                                              v1::StatResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishInline(context, [&]() -> absl::Status {
    response->set_version(options_.version);
    auto add_namespace = [&](const std::string& ns, const NamespaceUsage& usage) {
      const AccessPolicy* policy = options_.policy;
      ToProto(ns, usage, policy != nullptr ? policy->QuotaOf(ns) : NamespaceQuota(),
              policy != nullptr && policy->IsShared(ns), response->add_namespaces());
    };
    // The daemon-wide figures say how much other tenants store: admins only.
    if (!caller->admin()) {
      std::vector<std::string> mine;
      if (caller->SeesAll()) {
        for (const auto& [ns, usage] : tiers_->Stats().namespaces) mine.push_back(ns);
      } else {
        mine.assign(caller->namespaces().begin(), caller->namespaces().end());
      }
      std::sort(mine.begin(), mine.end());
      for (const std::string& ns : mine) add_namespace(ns, tiers_->Usage(ns));
      return absl::OkStatus();
    }
    AdminStat(response);
    return absl::OkStatus();
  });
}

void KvTierService::AdminStat(v1::StatResponse* response) const {
  TierStats stats = tiers_->Stats();
  std::sort(stats.namespaces.begin(), stats.namespaces.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  const AccessPolicy* policy = options_.policy;
  for (const auto& [ns, usage] : stats.namespaces) {
    v1::NamespaceStat* n = response->add_namespaces();
    ToProto(ns, usage, policy != nullptr ? policy->QuotaOf(ns) : NamespaceQuota(),
            policy != nullptr && policy->IsShared(ns), n);
    const v1::NamespacePolicy* p = policy != nullptr ? policy->Namespace(ns) : nullptr;
    if (p != nullptr) n->set_max_retention(p->max_retention());
  }
  ToProto(stats, response);
  response->set_version(options_.version);
  response->set_data_dir(options_.data_dir);
  response->set_pid(static_cast<uint32_t>(getpid()));
  if (options_.watch != nullptr) {
    response->set_watchers(static_cast<uint32_t>(options_.watch->watchers()));
    response->set_watchers_dropped(options_.watch->dropped());
  }
  const uint64_t lease_pins = response->leases().lease_pins();
  *response->mutable_leases() = leases_->Stats();
  const RingSet::Counters rings = rings_->counters();
  response->mutable_leases()->set_rings(rings.rings);
  response->mutable_leases()->set_ring_ops(rings.ops);
  response->mutable_leases()->set_rings_broken(rings.broken);
  response->mutable_leases()->set_lease_pins(lease_pins);
  if (options_.gpu_stats) options_.gpu_stats(response);
  if (options_.rpc_metrics != nullptr) options_.rpc_metrics->FillStat(response->mutable_rpcs());
  response->set_metrics_address(options_.metrics_address);
}

grpc::ServerUnaryReactor* KvTierService::Verify(grpc::CallbackServerContext* context,
                                                const v1::VerifyRequest* request,
                                                v1::VerifyResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishOnExecutor(executor_, LaneOf(*caller), context, [=, this]() -> absl::Status {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<BlockId> ids,
        ParseIds(request->ids(), "ids", 0, options_.limits.max_ids, true));
    if (ids.empty()) EVOKE_RETURN_IF_ERROR(NeedsAdmin(*caller, "Verify without ids (every block)"));
    EVOKE_ASSIGN_OR_RETURN(const VerifyReport report, tiers_->Verify(ids, caller.get()));
    ToProto(report, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* KvTierService::Flush(grpc::CallbackServerContext* context,
                                               const v1::FlushRequest* request,
                                               v1::FlushResponse* response) {
  EVOKE_CALLER_OR_FINISH(caller, context);
  return FinishOnExecutor(executor_, LaneOf(*caller), context, [=, this]() -> absl::Status {
    EVOKE_RETURN_IF_ERROR(NeedsAdmin(*caller, "Flush"));
    EVOKE_ASSIGN_OR_RETURN(const FlushResult flushed, tiers_->Flush(request->evict()));
    ToProto(flushed, response);
    return absl::OkStatus();
  });
}

}  // namespace evoke
