#include "daemon/request_validation.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace evoke {

absl::StatusOr<std::vector<BlockId>> ParseIds(
    const google::protobuf::RepeatedPtrField<std::string>& ids,
    absl::string_view field, size_t min_count, size_t max_count, bool unique) {
  if (static_cast<size_t>(ids.size()) < min_count ||
      static_cast<size_t>(ids.size()) > max_count) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": has ", ids.size(), " ids, expected ", min_count,
                     "..", max_count));
  }
  std::vector<BlockId> out;
  out.reserve(ids.size());
  absl::flat_hash_map<BlockId, int> seen;
  for (int i = 0; i < ids.size(); ++i) {
    absl::StatusOr<BlockId> id = BlockId::FromBytes(ids[i]);
    if (!id.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: ", id.status().message()));
    }
    if (unique) {
      auto [it, inserted] = seen.emplace(*id, i);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, "[", i, "]: duplicate of ", field, "[", it->second, "]"));
      }
    }
    out.push_back(*id);
  }
  return out;
}

uint64_t PayloadLength(const v1::SaveBlock& block) {
  switch (block.payload_case()) {
    case v1::SaveBlock::kInlineBytes:
      return block.inline_bytes().size();
    case v1::SaveBlock::kRegion:
      return block.region().length();
    case v1::SaveBlock::kGather: {
      uint64_t total = 0;
      for (const v1::RegionSlice& slice : block.gather().slices()) {
        if (__builtin_add_overflow(total, slice.length(), &total)) return UINT64_MAX;
      }
      return total;
    }
    case v1::SaveBlock::PAYLOAD_NOT_SET:
      break;
  }
  return 0;
}

namespace {

// ValidateSlices checks a gather or scatter list named `field`: 1..max
// slices, each of length > 0. Where the slices lie is the regions' to say.
absl::Status ValidateSlices(const v1::RegionSlices& list, const std::string& field,
                            uint32_t max) {
  if (list.slices().empty() || static_cast<uint32_t>(list.slices_size()) > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".slices: has ", list.slices_size(), " slices, expected 1..", max));
  }
  for (int j = 0; j < list.slices_size(); ++j) {
    if (list.slices(j).length() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".slices[", j, "].length: must be > 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSaveRequest(const v1::SaveRequest& request,
                                 const RequestLimits& limits) {
  if (request.blocks().empty() ||
      static_cast<uint32_t>(request.blocks_size()) > limits.max_batch_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("blocks: has ", request.blocks_size(), " blocks, expected 1..",
                     limits.max_batch_blocks));
  }
  absl::flat_hash_map<std::string, int> seen;
  for (int i = 0; i < request.blocks_size(); ++i) {
    const v1::SaveBlock& block = request.blocks(i);
    const std::string field = absl::StrCat("blocks[", i, "]");
    if (!block.has_meta()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".meta: is required"));
    }
    uint64_t size = 0;
    if (block.payload_case() == v1::SaveBlock::kInlineBytes) {
      size = block.inline_bytes().size();
    } else if (block.payload_case() == v1::SaveBlock::kRegion) {
      size = block.region().length();
      if (request.lease_id().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lease_id: is required when ", field, ".region names a region"));
      }
    } else if (block.payload_case() == v1::SaveBlock::kGather) {
      if (request.lease_id().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lease_id: is required when ", field, ".gather names regions"));
      }
      absl::Status s = ValidateSlices(block.gather(), absl::StrCat(field, ".gather"),
                                      limits.max_slices);
      if (!s.ok()) return s;
      size = PayloadLength(block);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".payload: is required (inline_bytes, region or gather)"));
    }
    if (block.pin() && request.lease_id().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lease_id: is required when ", field, ".pin is set (pins belong to a lease)"));
    }
    absl::Status s = ValidateBlockForSave(block.meta(), size, limits.block, field);
    if (!s.ok() && block.payload_case() == v1::SaveBlock::kGather) {
      // The payload is the slices' total: say so.
      const std::string payload = absl::StrCat(field, ".payload");
      if (absl::StartsWith(s.message(), payload)) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".gather.slices (their total length)",
                         s.message().substr(payload.size())));
      }
    }
    if (!s.ok()) return s;
    auto [it, inserted] = seen.emplace(block.meta().id(), i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".meta.id: duplicate of blocks[", it->second, "]"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BlockId>> ValidateLoadRequest(
    const v1::LoadRequest& request, const RequestLimits& limits) {
  absl::StatusOr<std::vector<BlockId>> ids =
      ParseIds(request.ids(), "ids", 1, limits.max_batch_blocks, true);
  if (!ids.ok()) return ids.status();
  if (!request.has_fingerprint()) {
    return absl::InvalidArgumentError(
        "fingerprint: is required (the reader's layout; loads are fail-closed)");
  }
  absl::Status s = ValidateFingerprint(request.fingerprint(), limits.block,
                                       "fingerprint");
  if (!s.ok()) return s;
  if (!request.reanchor().empty() && request.reanchor_size() != request.ids_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reanchor: has ", request.reanchor_size(), " entries, expected none or one per id (",
        request.ids_size(), ")"));
  }
  if (!request.destinations().empty()) {
    if (request.destinations_size() != request.ids_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "destinations: has ", request.destinations_size(),
          " slices, expected none or one per id (", request.ids_size(), ")"));
    }
    if (request.lease_id().empty()) {
      return absl::InvalidArgumentError(
          "lease_id: is required with destinations (regions belong to a lease)");
    }
  }
  if (!request.scatter().empty()) {
    if (!request.destinations().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scatter: give destinations or scatter, not both (destinations has ",
          request.destinations_size(), " slices, scatter ", request.scatter_size(), " lists)"));
    }
    if (request.scatter_size() != request.ids_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scatter: has ", request.scatter_size(), " lists, expected none or one per id (",
          request.ids_size(), ")"));
    }
    if (request.lease_id().empty()) {
      return absl::InvalidArgumentError(
          "lease_id: is required with scatter (regions belong to a lease)");
    }
    for (int i = 0; i < request.scatter_size(); ++i) {
      const std::string field = absl::StrCat("scatter[", i, "]");
      s = ValidateSlices(request.scatter(i), field, limits.max_slices);
      if (!s.ok()) return s;
      // No list can be longer than the largest block; the exact length is
      // the payload's, checked once it is known.
      uint64_t total = 0;
      for (const v1::RegionSlice& slice : request.scatter(i).slices()) {
        if (__builtin_add_overflow(total, slice.length(), &total)) {
          total = UINT64_MAX;
          break;
        }
      }
      if (total > limits.block.max_block_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".slices: lengths add up to ", total, " bytes, more than any block (",
            limits.block.max_block_bytes, " bytes, --max-block-bytes)"));
      }
    }
  }
  return ids;
}

}  // namespace evoke
