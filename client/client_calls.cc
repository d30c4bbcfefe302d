// The client's metadata and operator calls (Recover, Lookup, Delete, Pin,
// Describe, List, Stat, Verify, Flush, HealthCheck) and the block helpers;
// the data path is in client.cc.
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "client/client_impl.h"
#include "client/ring_client.h"
#include "common/status_macros.h"
#include "evoke/client.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace evoke {

using client_internal::FromGrpc;

absl::StatusOr<v1::RecoverResponse> Client::Recover(const v1::RecoverRequest& request) {
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::RecoverResponse response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->stub->Recover(&context, request, &response)));
  return response;
}

absl::StatusOr<std::vector<v1::Tier>> Client::Lookup(absl::Span<const BlockId> ids) {
  return Lookup(ids, "");
}

absl::StatusOr<std::vector<v1::Tier>> Client::Lookup(absl::Span<const BlockId> ids,
                                                     absl::string_view ns) {
  return Lookup(ids, ns, "");
}

absl::StatusOr<std::vector<v1::Tier>> Client::Lookup(absl::Span<const BlockId> ids,
                                                     absl::string_view ns,
                                                     absl::string_view trust_group) {
  v1::LookupRequest request;
  for (const BlockId& id : ids) request.add_ids(id.ToBytes());
  request.set_namespace_(std::string(ns));
  request.set_trust_group(std::string(trust_group));
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::LookupResponse response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->stub->Lookup(&context, request, &response)));
  std::vector<v1::Tier> tiers;
  tiers.reserve(response.tiers_size());
  for (int t : response.tiers()) tiers.push_back(static_cast<v1::Tier>(t));
  return tiers;
}

absl::Status Client::Delete(absl::Span<const BlockId> ids) {
  v1::DeleteRequest request;
  for (const BlockId& id : ids) request.add_ids(id.ToBytes());
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::DeleteResponse response;
  return FromGrpc(impl_->stub->Delete(&context, request, &response));
}

absl::StatusOr<uint32_t> Client::DropSession(absl::string_view ns,
                                             absl::string_view session_id) {
  v1::DropSessionRequest request;
  request.set_namespace_(std::string(ns));
  request.set_session_id(std::string(session_id));
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::DropSessionResponse response;
  EVOKE_RETURN_IF_ERROR(
      FromGrpc(impl_->stub->DropSession(&context, request, &response)));
  return response.n_deleted();
}

absl::Status Client::Pin(absl::Span<const BlockId> ids) {
  v1::PinRequest request;
  for (const BlockId& id : ids) request.add_ids(id.ToBytes());
  request.set_lease_id(impl_->LeaseId());
  if (request.lease_id().empty()) {
    return absl::FailedPreconditionError("no lease: call OpenLease first (pins belong to a lease)");
  }
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::PinResponse response;
  return FromGrpc(impl_->stub->Pin(&context, request, &response));
}

absl::Status Client::Unpin(absl::Span<const BlockId> ids) {
  v1::PinRequest request;
  for (const BlockId& id : ids) request.add_ids(id.ToBytes());
  request.set_lease_id(impl_->LeaseId());
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::PinResponse response;
  return FromGrpc(impl_->stub->Unpin(&context, request, &response));
}

absl::StatusOr<Client::Acquired> Client::Acquire(absl::Span<const BlockId> ids,
                                                 v1::AcquireMode mode) {
  v1::AcquireRequest request;
  for (const BlockId& id : ids) request.add_ids(id.ToBytes());
  request.set_lease_id(impl_->LeaseId());
  request.set_mode(mode);
  if (request.lease_id().empty()) {
    return absl::FailedPreconditionError(
        "no lease: call OpenLease first (handles belong to a lease)");
  }
  if (std::shared_ptr<RingClient> ring = impl_->Ring();
      ring != nullptr && ring->FitsAcquire(ids.size())) {
    EVOKE_ASSIGN_OR_RETURN(
        uint64_t ticket,
        ring->SubmitAcquire(ids, mode == v1::ACQUIRE_MODE_ALL, impl_->Deadline()));
    EVOKE_ASSIGN_OR_RETURN(RingCompletion done, ring->Wait(ticket, impl_->Deadline()));
    EVOKE_RETURN_IF_ERROR(done.status);
    return Acquired{done.checksum, std::move(done.tiers)};
  }
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::AcquireResponse response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->stub->Acquire(&context, request, &response)));
  Acquired out;
  out.handle = response.handle();
  out.tiers.reserve(response.tiers_size());
  for (int t : response.tiers()) out.tiers.push_back(static_cast<v1::Tier>(t));
  return out;
}

absl::StatusOr<uint32_t> Client::Release(uint64_t handle) {
  if (std::shared_ptr<RingClient> ring = impl_->Ring(); ring != nullptr) {
    EVOKE_ASSIGN_OR_RETURN(uint64_t ticket, ring->SubmitRelease(handle, impl_->Deadline()));
    EVOKE_ASSIGN_OR_RETURN(RingCompletion done, ring->Wait(ticket, impl_->Deadline()));
    EVOKE_RETURN_IF_ERROR(done.status);
    return static_cast<uint32_t>(done.payload_bytes);
  }
  v1::ReleaseRequest request;
  request.set_lease_id(impl_->LeaseId());
  request.set_handle(handle);
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::ReleaseResponse response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->stub->Release(&context, request, &response)));
  return response.n_released();
}

absl::StatusOr<uint32_t> Client::KeepSession(absl::string_view ns, absl::string_view session_id,
                                             uint32_t seconds) {
  v1::KeepSessionRequest request;
  request.set_namespace_(std::string(ns));
  request.set_session_id(std::string(session_id));
  request.set_seconds(seconds);
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::KeepSessionResponse response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->stub->KeepSession(&context, request, &response)));
  return response.n_blocks();
}

absl::Status Client::SetRetention(absl::Span<const BlockId> ids, v1::RetentionClass retention,
                                  uint32_t ttl_seconds) {
  v1::SetRetentionRequest request;
  for (const BlockId& id : ids) request.add_ids(id.ToBytes());
  request.set_retention(retention);
  request.set_ttl_seconds(ttl_seconds);
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::SetRetentionResponse response;
  return FromGrpc(impl_->stub->SetRetention(&context, request, &response));
}

absl::StatusOr<v1::PrefetchResponse> Client::Prefetch(absl::Span<const BlockId> ids,
                                                      const PrefetchOptions& options) {
  v1::PrefetchRequest request;
  for (const BlockId& id : ids) request.add_ids(id.ToBytes());
  if (options.fingerprint != nullptr) *request.mutable_fingerprint() = *options.fingerprint;
  request.set_wait(options.wait);
  request.set_room_wait_ms(options.room_wait_ms);
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::PrefetchResponse response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->stub->Prefetch(&context, request, &response)));
  return response;
}

namespace {

class GrpcBlockWatch final : public BlockWatch {
 public:
  GrpcBlockWatch(std::unique_ptr<grpc::ClientContext> context,
                 std::unique_ptr<grpc::ClientReader<v1::BlockEvents>> reader)
      : context_(std::move(context)), reader_(std::move(reader)) {}
  ~GrpcBlockWatch() override {
    if (!finished_) {
      context_->TryCancel();
      v1::BlockEvents drain;
      while (reader_->Read(&drain)) {
      }
      (void)reader_->Finish();
    }
  }
  bool Next(v1::BlockEvents* events) override { return reader_->Read(events); }
  void Cancel() override { context_->TryCancel(); }
  absl::Status Finish() override {
    finished_ = true;
    return client_internal::FromGrpc(reader_->Finish());
  }

 private:
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReader<v1::BlockEvents>> reader_;
  bool finished_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BlockWatch>> Client::WatchBlocks(
    const v1::WatchBlocksRequest& request) {
  auto context = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::BlockEvents>> reader =
      impl_->stub->WatchBlocks(context.get(), request);
  return std::unique_ptr<BlockWatch>(
      std::make_unique<GrpcBlockWatch>(std::move(context), std::move(reader)));
}

absl::StatusOr<v1::BlockInfo> Client::Describe(const BlockId& id) { return impl_->Describe(id); }

absl::StatusOr<v1::ListResponse> Client::List(const v1::ListRequest& request) {
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::ListResponse response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->stub->List(&context, request, &response)));
  return response;
}

absl::StatusOr<v1::StatResponse> Client::Stat() {
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::StatResponse response;
  EVOKE_RETURN_IF_ERROR(
      FromGrpc(impl_->stub->Stat(&context, v1::StatRequest(), &response)));
  return response;
}

absl::StatusOr<v1::VerifyResponse> Client::Verify(absl::Span<const BlockId> ids) {
  v1::VerifyRequest request;
  for (const BlockId& id : ids) request.add_ids(id.ToBytes());
  grpc::ClientContext context;
  // Verify reads every block: no per-call deadline beyond a generous one.
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(1));
  v1::VerifyResponse response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->stub->Verify(&context, request, &response)));
  return response;
}

absl::StatusOr<v1::FlushResponse> Client::Flush(bool evict) {
  v1::FlushRequest request;
  request.set_evict(evict);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(1));
  v1::FlushResponse response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->stub->Flush(&context, request, &response)));
  return response;
}

absl::Status Client::HealthCheck() {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("evoke.v1.KvTier");
  grpc::ClientContext context;
  impl_->Prepare(&context);
  grpc::health::v1::HealthCheckResponse response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->health->Check(&context, request, &response)));
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError("evoke.v1.KvTier is not serving");
  }
  return absl::OkStatus();
}

BlockId BlockIdOf(const v1::BlockMeta& meta) {
  absl::StatusOr<BlockId> id = BlockId::FromBytes(meta.id());
  return id.ok() ? *id : BlockId();
}

v1::BlockMeta SessionBlockMeta(const v1::LayoutFingerprint& fingerprint,
                               absl::string_view session_id, uint64_t sequence,
                               uint32_t n_tokens, uint32_t layer_begin,
                               uint32_t layer_end, int32_t first_position) {
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = fingerprint;
  meta.set_kind(v1::BLOCK_KIND_SESSION);
  meta.set_session_id(std::string(session_id));
  meta.set_sequence(sequence);
  meta.set_id(SessionBlockId(fingerprint.namespace_(), session_id, sequence).ToBytes());
  meta.set_n_tokens(n_tokens);
  meta.set_layer_begin(layer_begin);
  meta.set_layer_end(layer_end);
  meta.set_first_position(first_position);
  return meta;
}

v1::BlockMeta PrefixBlockMeta(const v1::LayoutFingerprint& fingerprint,
                              const BlockId& parent,
                              absl::Span<const int32_t> tokens,
                              uint32_t layer_begin, uint32_t layer_end,
                              int32_t first_position) {
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = fingerprint;
  meta.set_kind(v1::BLOCK_KIND_PREFIX);
  if (!parent.IsZero()) meta.set_parent_id(parent.ToBytes());
  meta.mutable_tokens()->Add(tokens.begin(), tokens.end());
  meta.set_id(PrefixBlockId(parent, tokens, DigestFingerprint(fingerprint)).ToBytes());
  meta.set_n_tokens(static_cast<uint32_t>(tokens.size()));
  meta.set_layer_begin(layer_begin);
  meta.set_layer_end(layer_end);
  meta.set_first_position(first_position);
  return meta;
}

}  // namespace evoke
