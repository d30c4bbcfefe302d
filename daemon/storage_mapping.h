// The daemon's side of the storage boundary: storage's plain results become
// evoke.v1 messages, and storage errors (which name an item by index and a
// limit by kind) gain the request's field paths and the daemon's flag names.
#ifndef EVOKE_DAEMON_STORAGE_MAPPING_H_
#define EVOKE_DAEMON_STORAGE_MAPPING_H_

#include <optional>

#include "absl/status/status.h"
#include "evoke/v1/kvtier.pb.h"
#include "storage/tier_types.h"

namespace evoke {

v1::Tier ToProto(BlockLocation location);
// LocationFromProto: TIER_UNSPECIFIED (and unknown values) mean "any".
std::optional<BlockLocation> LocationFromProto(v1::Tier tier);
void ToProto(const BlockInfo& in, v1::BlockInfo* out);
void ToProto(const SavedBlock& in, v1::SaveResult* out);
void ToProto(const TierStats& in, v1::StatResponse* out);
// A namespace's line of Stat.
void ToProto(absl::string_view ns, const NamespaceUsage& usage, const NamespaceQuota& quota,
             bool shared, v1::NamespaceStat* out);
void ToProto(const VerifyReport& in, v1::VerifyResponse* out);
void ToProto(const FlushResult& in, v1::FlushResponse* out);

// How a request names the items a storage call received.
enum class ItemsField {
  kSaveBlocks,  // SaveRequest.blocks: "blocks[i].meta.id", ".meta.checksum".
  kIds,         // A repeated `ids` field: "ids[i]".
  kId,          // A single `id` field: "id".
};

// WithFieldPath prefixes a storage error with the wire path of the item it
// names (when it names one) and appends the flag that raises the limit it
// hit (when it hit one). OK stays OK; other errors pass unchanged.
absl::Status WithFieldPath(const absl::Status& status, ItemsField field);

}  // namespace evoke

#endif  // EVOKE_DAEMON_STORAGE_MAPPING_H_
