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
#include "client/client_impl.h"
#include "client/inline_calls.h"
#include "client/ring_client.h"
#include "common/fd_passing.h"
#include "common/status_macros.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace evoke {
using client_internal::FromGrpc;
using client_internal::kMaxBatchBlocks;
using client_internal::kOverheadPerBlock;

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
  std::vector<Impl::MissingMeta> missing;
  EVOKE_ASSIGN_OR_RETURN(std::vector<LoadedBlock> out,
                         LoadThroughRing(*ring, ids, fingerprint, where, first, &missing));
  // A meta too large for a completion's message (thousands of tokens and
  // positions): Describe returns it without the bytes. It is the loaded
  // block's when it names the checksum and length the completion reported;
  // it is then shaped as the Load returns a meta (no summaries, the new
  // positions). Otherwise (the block was replaced meanwhile, or Describe
  // failed) the block is loaded again through the RPC, which returns its
  // meta with it (the same bytes land in the same place).
  for (const Impl::MissingMeta& m : missing) {
    const size_t i = m.index;
    absl::StatusOr<v1::BlockInfo> info = Describe(ids[i]);
    if (info.ok() && info->meta().checksum() == m.checksum &&
        info->meta().payload_bytes() == m.payload_bytes) {
      v1::BlockMeta meta = std::move(*info->mutable_meta());
      meta.clear_summaries();
      if (!first.empty() && first[i].has_value()) {
        meta.clear_positions();
        meta.set_first_position(*first[i]);
      }
      out[i].meta = std::move(meta);
      continue;
    }
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

}  // namespace evoke
