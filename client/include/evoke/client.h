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
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/chain_hash.h"
#include "common/fingerprint.h"
#include "common/hash128.h"
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
  // Largest message sent or received; must match the daemon's
  // --max-message-bytes. Save and Load split batches to stay under it.
  // Default: 80 MiB.
  uint64_t max_message_bytes = 80ull << 20;
  // Save sends at most this many payload bytes per request (a request with
  // one larger block is still sent). Smaller requests fit in a small tier 1
  // and are acknowledged sooner. Default: 16 MiB.
  uint64_t max_batch_bytes = 16ull << 20;
};

// ResolveTarget turns ClientOptions::target (or $EVOKE_SOCKET, or the
// default) into a gRPC target string such as "unix:/abs/path/evoked.sock".
std::string ResolveTarget(absl::string_view target);

// A block to save. `payload` must stay valid during the Save call.
struct BlockToSave {
  v1::BlockMeta meta;
  absl::string_view payload;
  bool pin = false;
};

struct LoadedBlock {
  v1::BlockMeta meta;  // payload_bytes and checksum set.
  std::string payload;
  v1::Tier served_from = v1::TIER_UNSPECIFIED;
};

// Client is thread-safe: one Client may serve every thread of an engine.
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
  // fails, blocks of earlier requests stay stored.
  absl::StatusOr<std::vector<v1::SaveResult>> Save(absl::Span<const BlockToSave> blocks,
                                                   bool durable = false);

  // Load returns the payloads of `ids`, which must all have been saved with
  // `fingerprint` (FAILED_PRECONDITION otherwise). A batch whose payloads
  // exceed the message size is refused by the daemon (RESOURCE_EXHAUSTED);
  // the client then splits it in halves and retries, so any number of ids
  // can be asked for at once.
  absl::StatusOr<std::vector<LoadedBlock>> Load(absl::Span<const BlockId> ids,
                                                const v1::LayoutFingerprint& fingerprint);

  // Lookup returns the tiers of the longest present prefix of `ids`.
  absl::StatusOr<std::vector<v1::Tier>> Lookup(absl::Span<const BlockId> ids);

  absl::Status Delete(absl::Span<const BlockId> ids);
  absl::StatusOr<uint32_t> DropSession(absl::string_view ns,
                                       absl::string_view session_id);
  absl::Status Pin(absl::Span<const BlockId> ids);
  absl::Status Unpin(absl::Span<const BlockId> ids);
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
