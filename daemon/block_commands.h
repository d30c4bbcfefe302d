// The data plane's plain commands: what every transport (the gRPC methods,
// the inline wire, the command rings) decodes its Save and Load requests
// into, and what BlockService (daemon/block_service.h) runs. They hold no
// transport's types: a block's identity and layout are its BlockMeta (the
// store's record type), its payload a reference to bytes the transport
// already holds, or to slices of the caller's registered regions.
//
// Field names in errors follow the gRPC request's ("blocks[2].gather
// .slices[7]", "destinations[0]", "reanchor[1].first_position"), whatever
// the transport: a ring entry's index in a batch is its block's index.
#ifndef EVOKE_DAEMON_BLOCK_COMMANDS_H_
#define EVOKE_DAEMON_BLOCK_COMMANDS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash128.h"
#include "evoke/v1/kvtier.pb.h"

namespace evoke {

struct Lease;   // daemon/lease_manager.h
class Region;   // daemon/region.h

// A byte range of a region the caller registered under its lease.
struct SliceRef {
  uint64_t region_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Where one block's payload is.
struct PayloadRef {
  enum class Kind : uint8_t { kNone, kInline, kRegion, kGather };
  Kind kind = Kind::kNone;
  absl::string_view inline_bytes;  // kInline: bytes the transport holds...
  // ...or, when not empty, the pieces they are in, in order (a payload
  // left in the buffers it was received in; inline_bytes is then unused).
  std::vector<absl::string_view> inline_pieces;
  SliceRef region;                 // kRegion.
  std::vector<SliceRef> gather;    // kGather: the slices, in order.

  // The payload's length: the inline bytes (or pieces), the slice, or the
  // sum of the gather slices (saturating at UINT64_MAX, which no limit
  // admits).
  uint64_t Length() const;
};

struct SaveCommandBlock {
  const v1::BlockMeta* meta = nullptr;  // Null: the request had none.
  PayloadRef payload;
  bool pin = false;
};

// How a command names its lease: by the request's lease_id bytes (resolved,
// and checked to be the caller's, by BlockService), or already resolved by
// the transport (a ring resolves its lease once, when it attaches).
struct LeaseRef {
  absl::string_view id;           // Empty and no `resolved`: no lease.
  const Lease* resolved = nullptr;
  bool present() const { return resolved != nullptr || !id.empty(); }
};

class RegionResolver;

struct SaveCommand {
  LeaseRef lease;
  bool durable = false;
  absl::Time deadline = absl::InfiniteFuture();
  std::vector<SaveCommandBlock> blocks;
  // How region ids resolve; null: per command, against the lease (as
  // LeaseRegions does).
  RegionResolver* regions = nullptr;
};

// Where one loaded block's K goes, logically (re-anchoring): at a first
// position (contiguous), or at one position per token.
struct ReanchorRef {
  std::optional<int32_t> first_position;
  absl::Span<const int32_t> positions;
  bool set() const { return first_position.has_value() || !positions.empty(); }
};

struct LoadCommand {
  LeaseRef lease;
  std::vector<BlockId> ids;
  const v1::LayoutFingerprint* fingerprint = nullptr;  // Null: missing.
  // At most one of these is non-empty (none: the payloads are returned
  // inline), with one entry per id.
  std::vector<SliceRef> destinations;
  std::vector<std::vector<SliceRef>> scatter;
  // Empty, or one per id (an unset entry leaves its block where it was).
  std::vector<ReanchorRef> reanchor;
  RegionResolver* regions = nullptr;  // As SaveCommand::regions.
};

// RegionResolver resolves the region ids a command names. Get returns the
// region (the reference keeps it mapped), NOT_FOUND naming `field` when it
// is not the lease's.
class RegionResolver {
 public:
  virtual ~RegionResolver() = default;
  virtual absl::StatusOr<std::shared_ptr<Region>> Get(uint64_t region_id,
                                                      absl::string_view field) = 0;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_BLOCK_COMMANDS_H_
