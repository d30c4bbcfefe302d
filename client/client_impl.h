// Client::Impl, private to the client library: the channel and stubs, the
// lease and its command ring. client.cc holds the data path (Save, the Loads,
// the ring, leases and regions); client_calls.cc the metadata and operator
// calls and the block helpers.
#ifndef EVOKE_CLIENT_CLIENT_IMPL_H_
#define EVOKE_CLIENT_CLIENT_IMPL_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/synchronization/mutex.h"
#include "client/inline_calls.h"
#include "client/ring_client.h"
#include "common/status_macros.h"
#include "evoke/client.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace evoke {
namespace client_internal {

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Per-request overhead allowance (metadata, framing).
inline constexpr uint64_t kOverheadPerBlock = 4096;
inline constexpr size_t kMaxBatchBlocks = 4096;

}  // namespace client_internal

class Client::Impl {
 public:
  ClientOptions options;
  std::string target;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::KvTier::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  // Save and Load with inline payloads, without copies into fresh buffers.
  std::unique_ptr<InlineCalls> inline_calls;

  // The lease: a server stream held open by `lease_thread`.
  mutable absl::Mutex lease_mu;
  std::string lease_id ABSL_GUARDED_BY(lease_mu);
  std::string fd_socket ABSL_GUARDED_BY(lease_mu);
  std::unique_ptr<grpc::ClientContext> lease_context;
  std::unique_ptr<grpc::ClientReader<v1::LeaseEvent>> lease_reader;
  std::thread lease_thread;
  // The command ring of the current lease; null until the first shared
  // region (or when it could not be had: ring_error says why).
  std::shared_ptr<RingClient> ring ABSL_GUARDED_BY(lease_mu);
  std::string ring_error ABSL_GUARDED_BY(lease_mu);

  ~Impl() {
    if (lease_context != nullptr) lease_context->TryCancel();
    if (lease_thread.joinable()) lease_thread.join();
  }

  std::string LeaseId() const {
    absl::MutexLock lock(&lease_mu);
    return lease_id;
  }

  // Ring returns the live ring of this lease, or null.
  std::shared_ptr<RingClient> Ring() const {
    absl::MutexLock lock(&lease_mu);
    if (ring != nullptr && ring->alive()) return ring;
    return nullptr;
  }

  absl::Time Deadline() const { return absl::Now() + options.call_timeout; }

  absl::Status NoRing() const {
    absl::MutexLock lock(&lease_mu);
    if (!options.use_ring) return absl::FailedPreconditionError("no ring: use_ring is off");
    if (ring != nullptr) {
      return absl::UnavailableError(
          "ring: the lease ended (the daemon went away or stopped); open a new lease");
    }
    if (lease_id.empty()) return absl::FailedPreconditionError("no ring: no lease (OpenLease)");
    if (!ring_error.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("no ring: ", ring_error));
    }
    return absl::FailedPreconditionError("no ring: create a shared region first");
  }

  absl::StatusOr<std::vector<LoadedBlock>> LoadWithRpc(
      absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
      absl::Span<const v1::Reanchor> reanchor, absl::Span<const v1::RegionSlice> destinations,
      absl::Span<const std::vector<v1::RegionSlice>> scatter);
  // LoadToRegions loads into region slices (destinations, or scatter lists),
  // through the ring when there is one.
  absl::StatusOr<std::vector<LoadedBlock>> LoadToRegions(
      absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
      absl::Span<const v1::Reanchor> reanchor, absl::Span<const v1::RegionSlice> destinations,
      absl::Span<const std::vector<v1::RegionSlice>> scatter);

  absl::StatusOr<std::unique_ptr<SharedRegion>> CreateRegion(uint64_t size);
  // AttachRing creates and attaches the ring of the current lease when it
  // has none; failures are remembered in ring_error, not returned.
  void AttachRing();

  void Prepare(grpc::ClientContext* context) const {
    context->set_deadline(std::chrono::system_clock::now() +
                          absl::ToChronoMilliseconds(options.call_timeout));
  }

  absl::Status SaveOne(const v1::SaveRequest& request,
                       std::vector<v1::SaveResult>* results) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::SaveResponse response;
    // Inline payloads are copied into the request by Client::Save: the
    // referencing InlineCalls::Save measured slower (issue #12 notes).
    EVOKE_RETURN_IF_ERROR(client_internal::FromGrpc(stub->Save(&context, request, &response)));
    for (v1::SaveResult& r : *response.mutable_results()) {
      results->push_back(std::move(r));
    }
    return absl::OkStatus();
  }

  // SaveThroughRing submits every block, then waits for all of them; the
  // first error is returned (after every block completed). OUT_OF_RANGE
  // before anything was submitted when a block's arguments do not fit in
  // the ring (the caller then uses the RPC).
  absl::StatusOr<std::vector<v1::SaveResult>> SaveThroughRing(
      RingClient& ring, absl::Span<const BlockToSave> blocks, bool durable) {
    const absl::Time deadline = Deadline();
    std::vector<uint64_t> tickets;
    tickets.reserve(blocks.size());
    absl::Status first;
    for (const BlockToSave& block : blocks) {
      absl::StatusOr<uint64_t> t = ring.SubmitSave(block, durable, deadline);
      if (!t.ok()) {
        if (tickets.empty() && t.status().code() == absl::StatusCode::kInvalidArgument) {
          return absl::OutOfRangeError(t.status().message());
        }
        first = t.status();
        break;
      }
      tickets.push_back(*t);
    }
    std::vector<v1::SaveResult> results;
    results.reserve(tickets.size());
    for (size_t i = 0; i < tickets.size(); ++i) {
      absl::StatusOr<RingCompletion> c = ring.Wait(tickets[i], deadline);
      absl::Status s = c.ok() ? c->status : c.status();
      if (!s.ok()) {
        if (first.ok()) first = s;
        continue;
      }
      v1::SaveResult& r = results.emplace_back();
      r.set_id(blocks[i].meta.id());
      r.set_deduplicated(c->deduplicated);
      r.set_checksum(c->checksum);
      r.set_tier(c->tier);
    }
    if (!first.ok()) return first;
    return results;
  }

  // A block a ring Load served whose meta did not fit in its completion:
  // what the completion said of the bytes it loaded.
  struct MissingMeta {
    size_t index = 0;
    uint64_t checksum = 0;
    uint64_t payload_bytes = 0;
  };
  // LoadThroughRing loads block i into destinations[i] (one slice, or a
  // scatter list), re-anchored to first_positions[i] when set. Blocks whose
  // meta did not fit in a completion are listed in `missing_meta`.
  absl::StatusOr<std::vector<LoadedBlock>> LoadThroughRing(
      RingClient& ring, absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
      absl::Span<const absl::Span<const v1::RegionSlice>> destinations,
      absl::Span<const std::optional<int32_t>> first_positions,
      std::vector<MissingMeta>* missing_meta) {
    const absl::Time deadline = Deadline();
    const std::string fp = fingerprint.SerializeAsString();
    std::vector<uint64_t> tickets;
    tickets.reserve(ids.size());
    absl::Status first;
    for (size_t i = 0; i < ids.size(); ++i) {
      absl::StatusOr<uint64_t> t =
          ring.SubmitLoad(ids[i], fp, destinations[i],
                          first_positions.empty() ? std::nullopt : first_positions[i],
                          /*want_meta=*/true, deadline);
      if (!t.ok()) {
        first = t.status();
        break;
      }
      tickets.push_back(*t);
    }
    std::vector<LoadedBlock> out(tickets.size());
    for (size_t i = 0; i < tickets.size(); ++i) {
      absl::StatusOr<RingCompletion> c = ring.Wait(tickets[i], deadline);
      absl::Status s = c.ok() ? c->status : c.status();
      if (!s.ok()) {
        if (first.ok()) first = absl::Status(s.code(), absl::StrCat("ids[", i, "]: ", s.message()));
        continue;
      }
      out[i].served_from = c->tier;
      if (c->meta) {
        out[i].meta = std::move(*c->meta);
      } else {
        missing_meta->push_back({i, c->checksum, c->payload_bytes});
      }
    }
    if (!first.ok()) return first;
    return out;
  }

  absl::StatusOr<v1::BlockInfo> Describe(const BlockId& id) {
    v1::DescribeRequest request;
    request.set_id(id.ToBytes());
    grpc::ClientContext context;
    Prepare(&context);
    v1::BlockInfo response;
    EVOKE_RETURN_IF_ERROR(
        client_internal::FromGrpc(stub->Describe(&context, request, &response)));
    return response;
  }

  absl::Status LoadRange(absl::Span<const BlockId> ids,
                         const v1::LayoutFingerprint& fingerprint,
                         std::vector<LoadedBlock>* out) {
    v1::LoadRequest request;
    for (const BlockId& id : ids) request.add_ids(id.ToBytes());
    *request.mutable_fingerprint() = fingerprint;
    grpc::ClientContext context;
    Prepare(&context);
    absl::Status s = client_internal::FromGrpc(inline_calls->Load(&context, request, out));
    if (s.code() == absl::StatusCode::kResourceExhausted && ids.size() > 1) {
      const size_t half = ids.size() / 2;
      EVOKE_RETURN_IF_ERROR(LoadRange(ids.subspan(0, half), fingerprint, out));
      return LoadRange(ids.subspan(half), fingerprint, out);
    }
    return s;
  }
};

}  // namespace evoke

#endif  // EVOKE_CLIENT_CLIENT_IMPL_H_
