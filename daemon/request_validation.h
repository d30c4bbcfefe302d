// Validation of KvTier requests before they reach the TierManager. Every
// error is INVALID_ARGUMENT with a message that names the field, e.g.
// "blocks[3].meta.id: duplicate of blocks[1]". Pure functions: no I/O, no
// state; fuzzable.
#ifndef EVOKE_DAEMON_REQUEST_VALIDATION_H_
#define EVOKE_DAEMON_REQUEST_VALIDATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/block_validation.h"
#include "daemon/block_commands.h"
#include "common/hash128.h"
#include "evoke/v1/kvtier.pb.h"
#include "google/protobuf/repeated_field.h"

namespace evoke {

struct RequestLimits {
  BlockLimits block;
  // Blocks in one Save or Load.
  uint32_t max_batch_blocks = 4096;
  // Ids in one Lookup, Delete, Pin, Unpin or Verify.
  uint32_t max_ids = 65536;
  // Slices in one block's gather list (SaveBlock.gather) or scatter list
  // (LoadRequest.scatter).
  uint32_t max_slices = 4096;
  // Longest KeepSession.
  uint32_t max_keep_seconds = 86400;
};

// ParseIds parses a list of 16-byte ids named `field` ("ids"). Checks the
// count is in [min_count, max_count] and, with `unique`, that no id repeats.
absl::StatusOr<std::vector<BlockId>> ParseIds(
    const google::protobuf::RepeatedPtrField<std::string>& ids,
    absl::string_view field, size_t min_count, size_t max_count, bool unique);

// PayloadLength is the length of a SaveBlock's payload: its inline bytes,
// its region slice, or the sum of its gather slices (saturating at
// UINT64_MAX, which no limit admits).
uint64_t PayloadLength(const v1::SaveBlock& block);

// ValidateSaveCommand checks the batch size, each block (identity, shape,
// payload present and of the right length) and that ids are unique. A
// region or gather payload, and a pin, need a lease; a gather list has
// 1..max_slices slices, each of length > 0, and the payload is their total.
// Regions are resolved later (SaveRequestSource).
absl::Status ValidateSaveCommand(const SaveCommand& command, const RequestLimits& limits);

// ValidateLoadCommand checks the ids (1..max_batch_blocks, unique) and the
// fingerprint. `destinations` and `scatter` exclude each other; either needs
// a lease and one entry per id; `reanchor` is empty or one per id; a
// scatter list has 1..max_slices slices, each of length > 0, adding up to
// at most max_block_bytes (that they add up to exactly the payload is
// checked when the payload's size is known: LoadResponseSink::Prepare).
absl::Status ValidateLoadCommand(const LoadCommand& command, const RequestLimits& limits);

// The gRPC decoders: a request's fields into a command that points into
// the request (which must outlive it). They check only what a command
// cannot express: the batch size (before anything is built), a block's
// payload case, the ids' bytes.
absl::Status DecodeSaveRequest(const v1::SaveRequest& request, const RequestLimits& limits,
                               SaveCommand* command);
absl::Status DecodeLoadRequest(const v1::LoadRequest& request, const RequestLimits& limits,
                               LoadCommand* command);

// Decode, then validate (for tests and fuzzing: the service does both).
absl::Status ValidateSaveRequest(const v1::SaveRequest& request,
                                 const RequestLimits& limits);
absl::StatusOr<std::vector<BlockId>> ValidateLoadRequest(
    const v1::LoadRequest& request, const RequestLimits& limits);

}  // namespace evoke

#endif  // EVOKE_DAEMON_REQUEST_VALIDATION_H_
