// evoke::Client: the C++ client of evoked.
//
//   auto client = evoke::Client::Connect({.target = "/run/evoke/evoked.sock"});
//   evoke::v1::BlockMeta meta = evoke::SessionBlockMeta(fp, "sess-1", 0, 64, 0, 32, 0);
//   auto saved = (*client)->Save({{meta, bytes}});
//   auto loaded = (*client)->Load({evoke::BlockIdOf(meta)}, fp);
//
// Every call returns absl::Status / absl::StatusOr; the daemon's gRPC status
// codes come back unchanged (see proto/evoke/v1/kvtier.proto for the table).
#ifndef EVOKE_CLIENT_CLIENT_H_
#define EVOKE_CLIENT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "evoke/chain_hash.h"   // PrefixBlockId, PrefixChain, SessionBlockId
#include "evoke/fingerprint.h"  // MakeFingerprint, DigestFingerprint, ...
#include "evoke/hash128.h"      // BlockId
#include "evoke/v1/kvtier.pb.h"

namespace evoke {

struct ClientOptions {
  // Where evoked listens: a socket path ("/run/evoke/evoked.sock", relative
  // paths resolve against the working directory), "unix:PATH", or
  // "HOST:PORT". Empty: $EVOKE_SOCKET, else "evoked.sock".
  std::string target;
  // Deadline of each call. Default: 60 s.
  absl::Duration call_timeout = absl::Seconds(60);
  // How long Connect waits for the daemon to answer. Default: 10 s.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Longest wait between reconnection attempts once the daemon went away
  // (e.g. restarted); at least 100 ms. Default: 1 s.
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
  // Largest message sent or received; must match the daemon's
  // --max-message-bytes. Save and Load split batches to stay under it.
  // Default: 80 MiB.
  uint64_t max_message_bytes = 80ull << 20;
  // Save sends at most this many payload bytes per request (a request with
  // one larger block is still sent). Smaller requests fit in a small tier 1
  // and are acknowledged sooner. Default: 16 MiB.
  uint64_t max_batch_bytes = 16ull << 20;
  // TCP only (a "HOST:PORT" target; evoked serves TCP only with TLS and a
  // bearer token per principal, see --tcp-listen). PEM root certificates
  // that evoked's certificate must chain to (for a self-signed certificate,
  // that certificate). Non-empty turns TLS on. Default: "" (plain text, for
  // the Unix socket).
  std::string tls_root_cert_pem;
  // TCP only: the principal's bearer token (its token_file's line), sent as
  // "authorization: Bearer <token>" with every call. Needs
  // tls_root_cert_pem: a token is never sent in the clear. Default: "".
  std::string bearer_token;
  // Blocks whose payloads are region slices travel through a command ring
  // (a shared-memory queue beside the regions, no RPC per block) once this
  // client has a shared region: the first CreateSharedRegion also creates
  // and attaches the ring. Where the ring cannot be had (an older daemon,
  // ring limits), the RPCs are used. Default: true.
  bool use_ring = true;
  // Submission queue entries of the ring (a power of two, 1..4096); the
  // completion queue has twice as many. Default: 256.
  uint32_t ring_entries = 256;
  // How long a thread waiting for a ring completion spins before it sleeps:
  // twice the recent mean time the daemon took to answer while that is under
  // half of ring_spin_max (so that a synchronous caller does not pay two
  // futex wake-ups per small operation), ring_spin otherwise (large
  // operations; ring_spin_max <= ring_spin: always ring_spin).
  // Defaults: 20 us, 500 us.
  absl::Duration ring_spin = absl::Microseconds(20);
  absl::Duration ring_spin_max = absl::Microseconds(500);
};

// ResolveTarget turns ClientOptions::target (or $EVOKE_SOCKET, or the
// default) into a gRPC target string such as "unix:/abs/path/evoked.sock".
std::string ResolveTarget(absl::string_view target);

// A block to save: its payload either inline (`payload`, valid during the
// Save call) or in a registered region (`region` set; the daemon copies it
// from there, once).
struct BlockToSave {
  BlockToSave() = default;
  BlockToSave(v1::BlockMeta m, absl::string_view bytes, bool pin_it = false)
      : meta(std::move(m)), payload(bytes), pin(pin_it) {}
  BlockToSave(v1::BlockMeta m, v1::RegionSlice slice, bool pin_it = false)
      : meta(std::move(m)), pin(pin_it), region(std::move(slice)) {}

  v1::BlockMeta meta;
  absl::string_view payload;
  bool pin = false;
  std::optional<v1::RegionSlice> region;
  // Instead of `payload` or `region`: slices of registered regions gathered,
  // in order, into one payload (e.g. the pages of every layer of a paged
  // cache). 1..4096 slices, all on the host or all on one CUDA device.
  std::vector<v1::RegionSlice> gather;
};

// SharedRegion: host memory shared with the daemon (a sealed memfd mapped in
// both processes). Save and Load can name slices of it instead of carrying
// bytes in messages. Move-only; unmapped here on destruction (the daemon
// unmaps its side when the region is unregistered or the lease ends).
class SharedRegion {
 public:
  SharedRegion(uint64_t id, uint8_t* data, uint64_t size, int fd)
      : id_(id), data_(data), size_(size), fd_(fd) {}
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  uint64_t id() const { return id_; }
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Slice names [offset, offset + length) of this region for Save or Load.
  v1::RegionSlice Slice(uint64_t offset, uint64_t length) const;

 private:
  uint64_t id_;
  uint8_t* data_;
  uint64_t size_;
  int fd_;
};

struct LoadedBlock {
  v1::BlockMeta meta;  // payload_bytes and checksum set.
  std::string payload;
  v1::Tier served_from = v1::TIER_UNSPECIFIED;
};

// What a ring operation (Client::SubmitSave / SubmitLoad) came to.
struct RingCompletion {
  absl::Status status;
  uint64_t checksum = 0;       // xxHash3-64 of the payload.
  uint64_t payload_bytes = 0;
  v1::Tier tier = v1::TIER_UNSPECIFIED;  // Stored in (save), served from (load).
  bool deduplicated = false;   // Save: the block was already stored.
  // Load with want_meta: the block's metadata (new positions when
  // re-anchored; summaries cleared).
  std::optional<v1::BlockMeta> meta;
  // Acquire: the tier of each held block (the handle is in `checksum`, the
  // count in `payload_bytes`).
  std::vector<v1::Tier> tiers;
};

// Client is thread-safe: one Client may serve every thread of an engine.
// BlockWatch: one WatchBlocks stream (Client::WatchBlocks). Not
// thread-safe, except Cancel, which may be called from any thread.
class BlockWatch {
 public:
  virtual ~BlockWatch() = default;
  // Next blocks until the next message and returns true, or returns false
  // when the stream ended (then Finish says why).
  virtual bool Next(v1::BlockEvents* events) = 0;
  // Cancel ends the stream from the client's side (Next then returns false).
  virtual void Cancel() = 0;
  // Finish, after Next returned false: the stream's status (CANCELLED after
  // Cancel, or when the daemon dropped a watcher that fell behind).
  virtual absl::Status Finish() = 0;
};

class Client {
 public:
  // Connect opens a channel and waits until the daemon answers (or
  // connect_timeout passes: UNAVAILABLE).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Save stores blocks, splitting them into as many requests as the message
  // size requires. Each request is all-or-nothing; when a later request
  // fails, blocks of earlier requests stay stored. When every block's
  // payload is a region slice (or gather list) and the client has a ring,
  // the blocks go through the ring, each stored or refused on its own; the
  // first error is returned.
  absl::StatusOr<std::vector<v1::SaveResult>> Save(absl::Span<const BlockToSave> blocks,
                                                   bool durable = false);

  // Load returns the payloads of `ids`, which must all have been saved with
  // `fingerprint` (FAILED_PRECONDITION otherwise). A batch whose payloads
  // exceed the message size is refused by the daemon (RESOURCE_EXHAUSTED);
  // the client then splits it in halves and retries, so any number of ids
  // can be asked for at once.
  absl::StatusOr<std::vector<LoadedBlock>> Load(absl::Span<const BlockId> ids,
                                                const v1::LayoutFingerprint& fingerprint);

  // LoadReanchored loads blocks at new positions: block i's first token
  // moves to new_first_positions[i] (the others follow), its K rotated by
  // the position delta with the block's RoPE parameters, V byte-identical.
  // The returned metas carry the new positions. Canonical blocks only.
  absl::StatusOr<std::vector<LoadedBlock>> LoadReanchored(
      absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
      absl::Span<const int32_t> new_first_positions);

  // LoadWith is the general form: `reanchor` empty or one per id (see
  // LoadRequest.reanchor), `destinations` empty (inline) or one per id.
  absl::StatusOr<std::vector<LoadedBlock>> LoadWith(
      absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
      absl::Span<const v1::Reanchor> reanchor,
      absl::Span<const v1::RegionSlice> destinations);

  // LoadInto loads blocks into region slices (one per id, each at least the
  // block's payload long) instead of into messages; the daemon copies each
  // payload once. Returns each block's metadata (payload_bytes tells how
  // much of the slice was written) and source tier. Needs a lease.
  absl::StatusOr<std::vector<LoadedBlock>> LoadInto(
      absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
      absl::Span<const v1::RegionSlice> destinations);

  // LoadScatter loads each block into a list of region slices (one list per
  // id; the lengths of a list add up to exactly the block's payload), e.g.
  // back into the pages of a paged cache. `reanchor` as in LoadWith.
  absl::StatusOr<std::vector<LoadedBlock>> LoadScatter(
      absl::Span<const BlockId> ids, const v1::LayoutFingerprint& fingerprint,
      absl::Span<const std::vector<v1::RegionSlice>> scatter,
      absl::Span<const v1::Reanchor> reanchor = {});

  // Asynchronous block operations through the command ring: each Submit
  // queues one block and returns a ticket at once (waiting only while the
  // ring's submission queue is full); Wait returns what became of it. Many
  // operations may be in flight, from any number of threads; consecutive
  // operations of one kind are run as one batch by the daemon. Each block is
  // stored or refused on its own. FAILED_PRECONDITION when this client has
  // no ring (see ClientOptions::use_ring); UNAVAILABLE when the daemon went
  // away (the lease ended: open a new one and create regions again).
  //
  // SubmitSave: the block's payload must be `region` or `gather`.
  absl::StatusOr<uint64_t> SubmitSave(const BlockToSave& block, bool durable = false);
  // SubmitLoad: `destination` is one slice at least the payload long, or
  // several that the payload is scattered into (exactly its length).
  // `first_position` re-anchors the block there (as LoadReanchored).
  absl::StatusOr<uint64_t> SubmitLoad(const BlockId& id, const v1::LayoutFingerprint& fingerprint,
                                      absl::Span<const v1::RegionSlice> destination,
                                      std::optional<int32_t> first_position = std::nullopt,
                                      bool want_meta = false);
  // Wait blocks until the ticket's operation completes (or call_timeout:
  // DEADLINE_EXCEEDED, the ticket stays valid). Each ticket is waited once
  // (NOT_FOUND afterwards). The returned status is the call's; the
  // operation's own is RingCompletion::status.
  absl::StatusOr<RingCompletion> Wait(uint64_t ticket);
  // has_ring: the ring is attached and serving.
  bool has_ring() const;

  // OpenLease opens this client's lease (once; later calls are no-ops while
  // it lasts). The lease owns its registered regions and pins; it ends when
  // the Client is destroyed, the process dies or the daemon stops, and the
  // daemon then unmaps the regions and releases the pins. After it ended
  // (has_lease() false), OpenLease opens a new one; regions must then be
  // created again. Regions and pins need a lease.
  absl::Status OpenLease(absl::string_view client_name = "");
  bool has_lease() const;

  // CreateSharedRegion creates a memfd of `size` bytes, seals it against
  // shrinking and growing, maps it here and hands it to the daemon over the
  // fd socket. Needs a lease. Errors from the daemon come back as they are
  // (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...).
  absl::StatusOr<std::unique_ptr<SharedRegion>> CreateSharedRegion(uint64_t size);

  // RegisterCudaRegion registers a device allocation of this process by its
  // cudaIpcMemHandle_t (64 bytes, from cudaIpcGetMemHandle) and returns the
  // region id. Needs a lease.
  absl::StatusOr<uint64_t> RegisterCudaRegion(absl::string_view ipc_handle,
                                              int device, uint64_t size);

  // UnregisterRegion ends a region of this client's lease.
  absl::Status UnregisterRegion(uint64_t region_id);

  // Recover asks which stored blocks of a scope best match the engine's
  // queries (see RecoverRequest in kvtier.proto).
  absl::StatusOr<v1::RecoverResponse> Recover(const v1::RecoverRequest& request);

  // Lookup returns the tiers of the longest present prefix of `ids`.
  absl::StatusOr<std::vector<v1::Tier>> Lookup(absl::Span<const BlockId> ids);
  // Lookup with a namespace is fleet-wide: past what this host holds, the
  // run goes on with the blocks evoked's remote tier holds in `ns`
  // (TIER_REMOTE; a Load fetches them). Without a remote tier it is the
  // local Lookup.
  absl::StatusOr<std::vector<v1::Tier>> Lookup(absl::Span<const BlockId> ids,
                                               absl::string_view ns);
  // The same for the copies of trust group `trust_group` (the fingerprint's
  // trust_group, required in a shared namespace; see docs/ACCESS.md).
  absl::StatusOr<std::vector<v1::Tier>> Lookup(absl::Span<const BlockId> ids,
                                               absl::string_view ns,
                                               absl::string_view trust_group);

  absl::Status Delete(absl::Span<const BlockId> ids);
  absl::StatusOr<uint32_t> DropSession(absl::string_view ns,
                                       absl::string_view session_id);
  // Pin and Unpin act for this client's lease (FAILED_PRECONDITION without
  // one): its pins go when the lease ends.
  absl::Status Pin(absl::Span<const BlockId> ids);
  absl::Status Unpin(absl::Span<const BlockId> ids);
  // Acquire looks up `ids` and holds what it finds loadable in one step
  // (see AcquireRequest in kvtier.proto): the longest run of leading ids
  // whose bytes the daemon holds (ACQUIRE_MODE_PREFIX), or every id
  // (ACQUIRE_MODE_ALL: NOT_FOUND and nothing held otherwise). Blocks held
  // stay loadable, whatever evicts around them, until Release(handle) or
  // the end of this client's lease (FAILED_PRECONDITION without one).
  // Through the command ring when the client has one, else an RPC.
  struct Acquired {
    uint64_t handle = 0;  // 0 when nothing is held.
    std::vector<v1::Tier> tiers;  // One per held block, in order.
  };
  absl::StatusOr<Acquired> Acquire(absl::Span<const BlockId> ids,
                                   v1::AcquireMode mode = v1::ACQUIRE_MODE_PREFIX);
  // Release returns how many holds the handle had (blocks deleted meanwhile
  // not counted). NOT_FOUND for a handle this lease does not have.
  absl::StatusOr<uint32_t> Release(uint64_t handle);
  // KeepSession keeps a session's blocks where they are for `seconds` (an
  // agent's tool call): neither tier evicts them while anything else can go.
  // 0 ends the keep. Returns the session's blocks now (see
  // KeepSessionRequest in kvtier.proto).
  absl::StatusOr<uint32_t> KeepSession(absl::string_view ns, absl::string_view session_id,
                                       uint32_t seconds);
  // Prefetch brings `ids` (the likeliest first) into tier 1 ahead of the
  // Loads that will want them (see PrefetchRequest in kvtier.proto). By
  // default it returns once the daemon queued the work (done = false; poll
  // with Lookup); with `options.wait`, when it is done, with what it did.
  // With a fingerprint and a remote tier, blocks this host lacks are
  // fetched from it.
  struct PrefetchOptions {
    bool wait = false;
    const v1::LayoutFingerprint* fingerprint = nullptr;
    uint32_t room_wait_ms = 0;  // 0: the daemon's default (1 s).
  };
  absl::StatusOr<v1::PrefetchResponse> Prefetch(absl::Span<const BlockId> ids,
                                                const PrefetchOptions& options);
  absl::StatusOr<v1::PrefetchResponse> Prefetch(absl::Span<const BlockId> ids) {
    return Prefetch(ids, PrefetchOptions());
  }
  // SetRetention gives `ids` a retention class for `ttl_seconds` (0: until
  // changed; RETENTION_NORMAL ends a class): LOW blocks are evicted first,
  // HIGH last (see SetRetentionRequest in kvtier.proto).
  absl::Status SetRetention(absl::Span<const BlockId> ids, v1::RetentionClass retention,
                            uint32_t ttl_seconds);
  // WatchBlocks opens a stream of block events (see WatchBlocks in
  // kvtier.proto): the first message comes at once, with a resume token.
  // No call deadline applies to it.
  absl::StatusOr<std::unique_ptr<BlockWatch>> WatchBlocks(const v1::WatchBlocksRequest& request);
  absl::StatusOr<v1::BlockInfo> Describe(const BlockId& id);
  absl::StatusOr<v1::ListResponse> List(const v1::ListRequest& request);
  absl::StatusOr<v1::StatResponse> Stat();
  absl::StatusOr<v1::VerifyResponse> Verify(absl::Span<const BlockId> ids);
  absl::StatusOr<v1::FlushResponse> Flush(bool evict);

  // HealthCheck asks grpc.health.v1 whether evoke.v1.KvTier is SERVING.
  absl::Status HealthCheck();

  const std::string& target() const;

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// BlockIdOf returns the id of a block's metadata (meta.id() must be 16
// bytes, as the helpers below make it).
BlockId BlockIdOf(const v1::BlockMeta& meta);

// SessionBlockMeta fills the metadata of session block `sequence` of
// `session_id`: kind, fingerprint, id, token count, layer range and
// contiguous original positions starting at `first_position`.
v1::BlockMeta SessionBlockMeta(const v1::LayoutFingerprint& fingerprint,
                               absl::string_view session_id, uint64_t sequence,
                               uint32_t n_tokens, uint32_t layer_begin,
                               uint32_t layer_end, int32_t first_position);

// PrefixBlockMeta fills the metadata of a prefix block holding `tokens`
// after `parent` (BlockId() for the first block), with its chain id and
// contiguous positions starting at `first_position`. Tokens are included so
// that the daemon can verify the chain.
v1::BlockMeta PrefixBlockMeta(const v1::LayoutFingerprint& fingerprint,
                              const BlockId& parent,
                              absl::Span<const int32_t> tokens,
                              uint32_t layer_begin, uint32_t layer_end,
                              int32_t first_position);

}  // namespace evoke

#endif  // EVOKE_CLIENT_CLIENT_H_
