#include "evoke/client.h"

#include <algorithm>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/synchronization/mutex.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/inline_calls.h"
#include "client/ring_client.h"
#include "common/fd_passing.h"
#include "common/status_macros.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace evoke {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

// Per-request overhead allowance (metadata, framing).
constexpr uint64_t kOverheadPerBlock = 4096;
constexpr size_t kMaxBatchBlocks = 4096;

}  // namespace

std::string ResolveTarget(absl::string_view target) {
  std::string t(target);
  if (t.empty()) {
    const char* env = std::getenv("EVOKE_SOCKET");
    t = (env != nullptr && *env != '\0') ? env : "evoked.sock";
  }
  if (absl::StartsWith(t, "unix:") || absl::StartsWith(t, "dns:") ||
      absl::StartsWith(t, "ipv4:") || absl::StartsWith(t, "ipv6:")) {
    return t;
  }
  // host:port (no slash) is TCP; anything else is a socket path.
  if (t.find('/') == std::string::npos && t.find(':') != std::string::npos) {
    return t;
  }
  return "unix:" + std::filesystem::absolute(t).string();
}

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
    EVOKE_RETURN_IF_ERROR(FromGrpc(stub->Save(&context, request, &response)));
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

  // LoadThroughRing loads block i into destinations[i] (one slice, or a
  // scatter list), re-anchored to first_positions[i] when set. Blocks whose
  // meta did not fit in a completion are described by `missing_meta`.
  absl::StatusOr<std::vector<LoadedBlock>> LoadThroughRing(
      RingClient& ring, absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
      absl::Span<const absl::Span<const v1::RegionSlice>> destinations,
      absl::Span<const std::optional<int32_t>> first_positions, std::vector<size_t>* missing_meta) {
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
        missing_meta->push_back(i);
      }
    }
    if (!first.ok()) return first;
    return out;
  }

  absl::Status LoadRange(absl::Span<const BlockId> ids,
                         const v1::LayoutFingerprint& fingerprint,
                         std::vector<LoadedBlock>* out) {
    v1::LoadRequest request;
    for (const BlockId& id : ids) request.add_ids(id.ToBytes());
    *request.mutable_fingerprint() = fingerprint;
    grpc::ClientContext context;
    Prepare(&context);
    absl::Status s = FromGrpc(inline_calls->Load(&context, request, out));
    if (s.code() == absl::StatusCode::kResourceExhausted && ids.size() > 1) {
      const size_t half = ids.size() / 2;
      EVOKE_RETURN_IF_ERROR(LoadRange(ids.subspan(0, half), fingerprint, out));
      return LoadRange(ids.subspan(half), fingerprint, out);
    }
    return s;
  }
};

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->target = ResolveTarget(options.target);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  // evoked is local: after it restarts, reconnect within a second instead of
  // gRPC's default backoff of up to two minutes.
  const int max_backoff_ms =
      static_cast<int>(std::max<int64_t>(100, absl::ToInt64Milliseconds(options.max_reconnect_backoff)));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // Not lowered: gRPC uses this as the shortest deadline of one connection
  // attempt (handshake included), so at 100 ms a daemon slow to send its
  // first SETTINGS frame (starting up, or on a loaded host) timed every
  // attempt out and reconnection took seconds. Refused connections (the
  // daemon is down) fail at once, so the backoff above still governs them.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  const bool tls = !options.tls_root_cert_pem.empty();
  if (tls) {
    if (absl::StartsWith(impl->target, "unix:")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tls_root_cert_pem: TLS is for TCP targets (HOST:PORT), not ", impl->target));
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_cert_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!options.bearer_token.empty()) {
      // Call credentials of this kind are sent only over TLS.
      credentials = grpc::CompositeChannelCredentials(
          credentials, grpc::AccessTokenCredentials(options.bearer_token));
    }
  } else if (!options.bearer_token.empty()) {
    return absl::InvalidArgumentError(
        "bearer_token: needs tls_root_cert_pem (a token is never sent in the clear)");
  }
  impl->channel = grpc::CreateCustomChannel(impl->target, credentials, args);
  const auto deadline = std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(options.connect_timeout);
  if (!impl->channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach evoked at ", impl->target,
        tls ? " (is it serving TCP there? does its certificate chain to "
              "tls_root_cert_pem and name that host?)"
            : " (is it running? set --socket or EVOKE_SOCKET)"));
  }
  impl->stub = v1::KvTier::NewStub(impl->channel);
  impl->inline_calls = std::make_unique<InlineCalls>(impl->channel);
  impl->health = grpc::health::v1::Health::NewStub(impl->channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

const std::string& Client::target() const { return impl_->target; }

absl::StatusOr<std::vector<v1::SaveResult>> Client::Save(
    absl::Span<const BlockToSave> blocks, bool durable) {
  std::vector<v1::SaveResult> results;
  results.reserve(blocks.size());
  if (std::shared_ptr<RingClient> ring = impl_->Ring();
      ring != nullptr && !blocks.empty() &&
      std::all_of(blocks.begin(), blocks.end(), [](const BlockToSave& b) {
        return b.region.has_value() || !b.gather.empty();
      })) {
    absl::StatusOr<std::vector<v1::SaveResult>> through_ring =
        impl_->SaveThroughRing(*ring, blocks, durable);
    // Arguments too large for the ring's slots go through the RPC instead.
    if (through_ring.ok() || through_ring.status().code() != absl::StatusCode::kOutOfRange) {
      return through_ring;
    }
  }
  const uint64_t budget = std::min(impl_->options.max_batch_bytes,
                                   impl_->options.max_message_bytes - (1u << 20));
  v1::SaveRequest request;
  request.set_durable(durable);
  request.set_lease_id(impl_->LeaseId());
  uint64_t bytes = 0;
  for (const BlockToSave& block : blocks) {
    // Region payloads cost the message nothing; count them as small.
    const uint64_t size = (block.region || !block.gather.empty() ? 0 : block.payload.size()) +
                          kOverheadPerBlock + block.gather.size() * 32;
    if (request.blocks_size() > 0 &&
        (bytes + size > budget ||
         static_cast<size_t>(request.blocks_size()) == kMaxBatchBlocks)) {
      EVOKE_RETURN_IF_ERROR(impl_->SaveOne(request, &results));
      request.clear_blocks();
      bytes = 0;
    }
    v1::SaveBlock* b = request.add_blocks();
    *b->mutable_meta() = block.meta;
    if (!block.gather.empty()) {
      for (const v1::RegionSlice& slice : block.gather) {
        *b->mutable_gather()->add_slices() = slice;
      }
    } else if (block.region) {
      *b->mutable_region() = *block.region;
    } else {
      b->set_inline_bytes(block.payload.data(), block.payload.size());
    }
    b->set_pin(block.pin);
    bytes += size;
  }
  if (request.blocks_size() > 0) {
    EVOKE_RETURN_IF_ERROR(impl_->SaveOne(request, &results));
  }
  return results;
}

absl::StatusOr<std::vector<LoadedBlock>> Client::Load(
    absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint) {
  std::vector<LoadedBlock> out;
  out.reserve(ids.size());
  for (size_t begin = 0; begin < ids.size(); begin += kMaxBatchBlocks) {
    EVOKE_RETURN_IF_ERROR(impl_->LoadRange(
        ids.subspan(begin, std::min(kMaxBatchBlocks, ids.size() - begin)),
        fingerprint, &out));
  }
  if (ids.empty()) {
    return absl::InvalidArgumentError("ids: has 0 ids, expected at least 1");
  }
  return out;
}

absl::StatusOr<std::vector<LoadedBlock>> Client::LoadReanchored(
    absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
    absl::Span<const int32_t> new_first_positions) {
  std::vector<v1::Reanchor> reanchor(new_first_positions.size());
  for (size_t i = 0; i < reanchor.size(); ++i) {
    reanchor[i].set_first_position(new_first_positions[i]);
  }
  return LoadWith(ids, fingerprint, reanchor, {});
}

absl::StatusOr<std::vector<LoadedBlock>> Client::Impl::LoadWithRpc(
    absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
    absl::Span<const v1::Reanchor> reanchor, absl::Span<const v1::RegionSlice> destinations,
    absl::Span<const std::vector<v1::RegionSlice>> scatter) {
  std::vector<LoadedBlock> out;
  out.reserve(ids.size());
  for (size_t begin = 0; begin < ids.size(); begin += kMaxBatchBlocks) {
    const size_t end = std::min(ids.size(), begin + kMaxBatchBlocks);
    v1::LoadRequest request;
    for (size_t i = begin; i < end; ++i) {
      request.add_ids(ids[i].ToBytes());
      if (!reanchor.empty()) *request.add_reanchor() = reanchor[i];
      if (!destinations.empty()) *request.add_destinations() = destinations[i];
      if (!scatter.empty()) {
        v1::RegionSlices* list = request.add_scatter();
        for (const v1::RegionSlice& slice : scatter[i]) *list->add_slices() = slice;
      }
    }
    *request.mutable_fingerprint() = fingerprint;
    request.set_lease_id(LeaseId());
    grpc::ClientContext context;
    Prepare(&context);
    EVOKE_RETURN_IF_ERROR(FromGrpc(inline_calls->Load(&context, request, &out)));
  }
  return out;
}

absl::StatusOr<std::vector<LoadedBlock>> Client::Impl::LoadToRegions(
    absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
    absl::Span<const v1::Reanchor> reanchor, absl::Span<const v1::RegionSlice> destinations,
    absl::Span<const std::vector<v1::RegionSlice>> scatter) {
  std::shared_ptr<RingClient> ring = Ring();
  // The ring carries a first position per block, not a list of positions.
  const bool ring_can = ring != nullptr && !ids.empty() &&
                        std::all_of(reanchor.begin(), reanchor.end(), [](const v1::Reanchor& r) {
                          return r.positions().empty();
                        });
  if (!ring_can) return LoadWithRpc(ids, fingerprint, reanchor, destinations, scatter);
  std::vector<absl::Span<const v1::RegionSlice>> where(ids.size());
  std::vector<std::optional<int32_t>> first(reanchor.empty() ? 0 : ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    where[i] = scatter.empty() ? destinations.subspan(i, 1) : absl::MakeConstSpan(scatter[i]);
    if (!reanchor.empty() && reanchor[i].has_first_position()) {
      first[i] = reanchor[i].first_position();
    }
  }
  std::vector<size_t> missing;
  EVOKE_ASSIGN_OR_RETURN(std::vector<LoadedBlock> out,
                         LoadThroughRing(*ring, ids, fingerprint, where, first, &missing));
  // A meta too large for a completion's message: load those blocks again
  // through the RPC, which returns it (the same bytes land in the same place).
  for (size_t i : missing) {
    EVOKE_ASSIGN_OR_RETURN(
        std::vector<LoadedBlock> again,
        LoadWithRpc(ids.subspan(i, 1), fingerprint,
                    reanchor.empty() ? reanchor : reanchor.subspan(i, 1),
                    destinations.empty() ? destinations : destinations.subspan(i, 1),
                    scatter.empty() ? scatter : scatter.subspan(i, 1)));
    out[i] = std::move(again[0]);
  }
  return out;
}

absl::StatusOr<std::vector<LoadedBlock>> Client::LoadWith(
    absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
    absl::Span<const v1::Reanchor> reanchor, absl::Span<const v1::RegionSlice> destinations) {
  if ((!reanchor.empty() && reanchor.size() != ids.size()) ||
      (!destinations.empty() && destinations.size() != ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reanchor, destinations: need none or one per id (", ids.size(), ")"));
  }
  if (!destinations.empty()) {
    return impl_->LoadToRegions(ids, fingerprint, reanchor, destinations, {});
  }
  return impl_->LoadWithRpc(ids, fingerprint, reanchor, {}, {});
}

absl::StatusOr<std::vector<LoadedBlock>> Client::LoadScatter(
    absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
    absl::Span<const std::vector<v1::RegionSlice>> scatter,
    absl::Span<const v1::Reanchor> reanchor) {
  if (scatter.size() != ids.size() || (!reanchor.empty() && reanchor.size() != ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scatter, reanchor: need one list per id (", ids.size(), "), reanchor none or one per id"));
  }
  return impl_->LoadToRegions(ids, fingerprint, reanchor, {}, scatter);
}

absl::StatusOr<uint64_t> Client::SubmitSave(const BlockToSave& block, bool durable) {
  std::shared_ptr<RingClient> ring = impl_->Ring();
  if (ring == nullptr) return impl_->NoRing();
  return ring->SubmitSave(block, durable, impl_->Deadline());
}

absl::StatusOr<uint64_t> Client::SubmitLoad(const BlockId& id,
                                            const v1::LayoutFingerprint& fingerprint,
                                            absl::Span<const v1::RegionSlice> destination,
                                            std::optional<int32_t> first_position,
                                            bool want_meta) {
  std::shared_ptr<RingClient> ring = impl_->Ring();
  if (ring == nullptr) return impl_->NoRing();
  return ring->SubmitLoad(id, fingerprint.SerializeAsString(), destination, first_position,
                          want_meta, impl_->Deadline());
}

absl::StatusOr<RingCompletion> Client::Wait(uint64_t ticket) {
  std::shared_ptr<RingClient> ring;
  {
    absl::MutexLock lock(&impl_->lease_mu);
    ring = impl_->ring;
  }
  if (ring == nullptr) return impl_->NoRing();
  return ring->Wait(ticket, impl_->Deadline());
}

bool Client::has_ring() const { return impl_->Ring() != nullptr; }

absl::StatusOr<std::vector<LoadedBlock>> Client::LoadInto(
    absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
    absl::Span<const v1::RegionSlice> destinations) {
  if (ids.size() != destinations.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destinations: ", destinations.size(), " slices for ", ids.size(), " ids"));
  }
  return LoadWith(ids, fingerprint, {}, destinations);
}

absl::Status Client::OpenLease(absl::string_view client_name) {
  {
    absl::MutexLock lock(&impl_->lease_mu);
    if (!impl_->lease_id.empty()) return absl::OkStatus();
  }
  // A lease that ended (the daemon restarted, say) left its thread finishing
  // or finished: reap it before opening the next one.
  if (impl_->lease_thread.joinable()) impl_->lease_thread.join();
  v1::OpenLeaseRequest request;
  request.set_client_name(client_name.empty()
                              ? absl::StrCat("pid-", getpid())
                              : std::string(client_name));
  auto context = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<grpc::ClientReader<v1::LeaseEvent>> reader =
      impl_->stub->OpenLease(context.get(), request);
  v1::LeaseEvent event;
  if (!reader->Read(&event) || !event.has_grant()) {
    // Finish may be called once per stream.
    absl::Status finished = FromGrpc(reader->Finish());
    return finished.ok() ? absl::UnavailableError("lease stream ended before the grant")
                         : finished;
  }
  {
    absl::MutexLock lock(&impl_->lease_mu);
    impl_->lease_id = event.grant().lease_id();
    impl_->fd_socket = event.grant().fd_socket();
    // A ring belongs to one lease: the next region makes a new one.
    impl_->ring.reset();
    impl_->ring_error.clear();
  }
  impl_->lease_context = std::move(context);
  impl_->lease_reader = std::move(reader);
  // Holds the stream open; returns when the daemon or this client ends it.
  impl_->lease_thread = std::thread([impl = impl_.get()] {
    v1::LeaseEvent ignored;
    while (impl->lease_reader->Read(&ignored)) {
    }
    impl->lease_reader->Finish();
    absl::MutexLock lock(&impl->lease_mu);
    impl->lease_id.clear();
    if (impl->ring != nullptr) impl->ring->MarkDead();
  });
  return absl::OkStatus();
}

bool Client::has_lease() const { return !impl_->LeaseId().empty(); }

SharedRegion::~SharedRegion() {
  munmap(data_, size_);
  close(fd_);
}

v1::RegionSlice SharedRegion::Slice(uint64_t offset, uint64_t length) const {
  v1::RegionSlice s;
  s.set_region_id(id_);
  s.set_offset(offset);
  s.set_length(length);
  return s;
}

absl::StatusOr<std::unique_ptr<SharedRegion>> Client::CreateSharedRegion(uint64_t size) {
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<SharedRegion> region, impl_->CreateRegion(size));
  if (impl_->options.use_ring) impl_->AttachRing();
  return region;
}

void Client::Impl::AttachRing() {
  std::string lease;
  {
    absl::MutexLock lock(&lease_mu);
    if (ring != nullptr && ring->alive()) return;
    lease = lease_id;
  }
  const uint32_t entries = options.ring_entries;
  if (entries == 0 || (entries & (entries - 1)) != 0 || entries > ring::kMaxEntries) {
    absl::MutexLock lock(&lease_mu);
    ring_error = absl::StrCat("ring_entries: ", entries, " is not a power of two in 1..",
                              ring::kMaxEntries);
    return;
  }
  const ring::RingGeometry g = ClientRingGeometry(entries);
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = CreateRegion(g.total_bytes());
  absl::Status s = region.status();
  if (s.ok()) {
    RingClient::Init((*region)->data(), g);
    v1::AttachRingRequest request;
    request.set_lease_id(lease);
    request.set_region_id((*region)->id());
    grpc::ClientContext context;
    Prepare(&context);
    v1::AttachRingResponse response;
    s = FromGrpc(stub->AttachRing(&context, request, &response));
  }
  absl::MutexLock lock(&lease_mu);
  if (!s.ok()) {
    // Blocks then travel through the RPCs.
    ring_error = std::string(s.message());
    return;
  }
  if (lease_id != lease) return;  // The lease ended meanwhile.
  ring = std::make_shared<RingClient>(std::move(*region), g, options.ring_spin,
                                        options.ring_spin_max);
  ring_error.clear();
}

absl::StatusOr<std::unique_ptr<SharedRegion>> Client::Impl::CreateRegion(uint64_t size) {
  std::string lease, fd_socket;
  {
    absl::MutexLock lock(&lease_mu);
    lease = lease_id;
    fd_socket = this->fd_socket;
  }
  if (lease.empty()) {
    return absl::FailedPreconditionError("no lease: call OpenLease first");
  }
  const int fd = memfd_create("evoke-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  }
  auto fail = [fd](absl::string_view what) {
    const std::string err = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat(what, ": ", err));
  };
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) return fail("ftruncate");
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail("seal");
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail("mmap");
  // Owns the mapping and the fd until the daemon accepts the region.
  struct Pending {
    void* data;
    uint64_t size;
    int fd;
    ~Pending() {
      if (data != nullptr) {
        munmap(data, size);
        close(fd);
      }
    }
  } pending{data, size, fd};

  EVOKE_ASSIGN_OR_RETURN(
      const FdChannelReply reply,
      SendFdChannelRequest(fd_socket, EncodeFdChannelRequest(lease, size), {fd}));
  if (!reply.status.ok()) return reply.status;
  const uint64_t region_id = reply.region_id;
  pending.data = nullptr;  // The SharedRegion owns them now.
  return std::make_unique<SharedRegion>(region_id, static_cast<uint8_t*>(data), size, fd);
}

absl::StatusOr<uint64_t> Client::RegisterCudaRegion(absl::string_view ipc_handle,
                                                    int device, uint64_t size) {
  v1::RegisterCudaRegionRequest request;
  request.set_lease_id(impl_->LeaseId());
  if (request.lease_id().empty()) {
    return absl::FailedPreconditionError("no lease: call OpenLease first");
  }
  request.set_ipc_handle(std::string(ipc_handle));
  request.set_device(static_cast<uint32_t>(device));
  request.set_size(size);
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::RegisterRegionResponse response;
  EVOKE_RETURN_IF_ERROR(
      FromGrpc(impl_->stub->RegisterCudaRegion(&context, request, &response)));
  return response.region_id();
}

absl::Status Client::UnregisterRegion(uint64_t region_id) {
  v1::UnregisterRegionRequest request;
  request.set_lease_id(impl_->LeaseId());
  request.set_region_id(region_id);
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::UnregisterRegionResponse response;
  return FromGrpc(impl_->stub->UnregisterRegion(&context, request, &response));
}

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

absl::StatusOr<v1::BlockInfo> Client::Describe(const BlockId& id) {
  v1::DescribeRequest request;
  request.set_id(id.ToBytes());
  grpc::ClientContext context;
  impl_->Prepare(&context);
  v1::BlockInfo response;
  EVOKE_RETURN_IF_ERROR(FromGrpc(impl_->stub->Describe(&context, request, &response)));
  return response;
}

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
