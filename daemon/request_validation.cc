#include "daemon/request_validation.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"

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

uint64_t PayloadRef::Length() const {
  switch (kind) {
    case Kind::kInline:
      return inline_pieces.empty() ? inline_bytes.size() : PiecesSize(inline_pieces);
    case Kind::kRegion:
      return region.length;
    case Kind::kGather: {
      uint64_t total = 0;
      for (const SliceRef& slice : gather) {
        if (__builtin_add_overflow(total, slice.length, &total)) return UINT64_MAX;
      }
      return total;
    }
    case Kind::kNone:
      break;
  }
  return 0;
}

namespace {

// ValidateSlices checks a gather or scatter list named `field`: 1..max
// slices, each of length > 0. Where the slices lie is the regions' to say.
absl::Status ValidateSlices(absl::Span<const SliceRef> list, const std::string& field,
                            uint32_t max) {
  if (list.empty() || list.size() > max) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".slices: has ", list.size(), " slices, expected 1..", max));
  }
  for (size_t j = 0; j < list.size(); ++j) {
    if (list[j].length == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".slices[", j, "].length: must be > 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBatch(size_t n, uint32_t max) {
  if (n == 0 || n > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("blocks: has ", n, " blocks, expected 1..", max));
  }
  return absl::OkStatus();
}

SliceRef ToSliceRef(const v1::RegionSlice& slice) {
  return SliceRef{slice.region_id(), slice.offset(), slice.length()};
}

void ToSliceRefs(const v1::RegionSlices& list, std::vector<SliceRef>* out) {
  out->clear();
  out->reserve(list.slices_size());
  for (const v1::RegionSlice& slice : list.slices()) out->push_back(ToSliceRef(slice));
}

}  // namespace

absl::Status ValidateSaveCommand(const SaveCommand& command, const RequestLimits& limits) {
  if (absl::Status s = CheckBatch(command.blocks.size(), limits.max_batch_blocks); !s.ok()) {
    return s;
  }
  const bool lease = command.lease.present();
  absl::flat_hash_map<absl::string_view, size_t> seen;
  seen.reserve(command.blocks.size());
  for (size_t i = 0; i < command.blocks.size(); ++i) {
    const SaveCommandBlock& block = command.blocks[i];
    const std::string field = absl::StrCat("blocks[", i, "]");
    if (block.meta == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".meta: is required"));
    }
    const PayloadRef& payload = block.payload;
    if (payload.kind == PayloadRef::Kind::kRegion && !lease) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lease_id: is required when ", field, ".region names a region"));
    }
    if (payload.kind == PayloadRef::Kind::kGather) {
      if (!lease) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lease_id: is required when ", field, ".gather names regions"));
      }
      absl::Status s = ValidateSlices(payload.gather, absl::StrCat(field, ".gather"),
                                      limits.max_slices);
      if (!s.ok()) return s;
    }
    if (payload.kind == PayloadRef::Kind::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".payload: is required (inline_bytes, region or gather)"));
    }
    if (block.pin && !lease) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lease_id: is required when ", field, ".pin is set (pins belong to a lease)"));
    }
    absl::Status s = ValidateBlockForSave(*block.meta, payload.Length(), limits.block, field);
    if (!s.ok() && payload.kind == PayloadRef::Kind::kGather) {
      // The payload is the slices' total: say so.
      const std::string named = absl::StrCat(field, ".payload");
      if (absl::StartsWith(s.message(), named)) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".gather.slices (their total length)",
                         s.message().substr(named.size())));
      }
    }
    if (!s.ok()) return s;
    auto [it, inserted] = seen.emplace(block.meta->id(), i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".meta.id: duplicate of blocks[", it->second, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLoadCommand(const LoadCommand& command, const RequestLimits& limits) {
  const size_t n = command.ids.size();
  if (n == 0 || n > limits.max_batch_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids: has ", n, " ids, expected 1..", limits.max_batch_blocks));
  }
  absl::flat_hash_map<BlockId, size_t> seen;
  seen.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto [it, inserted] = seen.emplace(command.ids[i], i);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("ids[", i, "]: duplicate of ids[", it->second, "]"));
    }
  }
  if (command.fingerprint == nullptr) {
    return absl::InvalidArgumentError(
        "fingerprint: is required (the reader's layout; loads are fail-closed)");
  }
  absl::Status s = ValidateFingerprint(*command.fingerprint, limits.block, "fingerprint");
  if (!s.ok()) return s;
  if (!command.reanchor.empty() && command.reanchor.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reanchor: has ", command.reanchor.size(), " entries, expected none or one per id (", n,
        ")"));
  }
  const bool lease = command.lease.present();
  if (!command.destinations.empty()) {
    if (command.destinations.size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "destinations: has ", command.destinations.size(),
          " slices, expected none or one per id (", n, ")"));
    }
    if (!lease) {
      return absl::InvalidArgumentError(
          "lease_id: is required with destinations (regions belong to a lease)");
    }
  }
  if (!command.scatter.empty()) {
    if (!command.destinations.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scatter: give destinations or scatter, not both (destinations has ",
          command.destinations.size(), " slices, scatter ", command.scatter.size(),
          " lists)"));
    }
    if (command.scatter.size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scatter: has ", command.scatter.size(), " lists, expected none or one per id (", n,
          ")"));
    }
    if (!lease) {
      return absl::InvalidArgumentError(
          "lease_id: is required with scatter (regions belong to a lease)");
    }
    for (size_t i = 0; i < command.scatter.size(); ++i) {
      const std::string field = absl::StrCat("scatter[", i, "]");
      s = ValidateSlices(command.scatter[i], field, limits.max_slices);
      if (!s.ok()) return s;
      // No list can be longer than the largest block; the exact length is
      // the payload's, checked once it is known.
      uint64_t total = 0;
      for (const SliceRef& slice : command.scatter[i]) {
        if (__builtin_add_overflow(total, slice.length, &total)) {
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
  return absl::OkStatus();
}

absl::Status DecodeSaveRequest(const v1::SaveRequest& request, const RequestLimits& limits,
                               SaveCommand* command) {
  // Before anything is built for them.
  if (absl::Status s = CheckBatch(request.blocks_size(), limits.max_batch_blocks); !s.ok()) {
    return s;
  }
  command->lease = LeaseRef{request.lease_id(), nullptr};
  command->durable = request.durable();
  command->blocks.resize(request.blocks_size());
  for (int i = 0; i < request.blocks_size(); ++i) {
    const v1::SaveBlock& block = request.blocks(i);
    SaveCommandBlock& out = command->blocks[i];
    out.meta = block.has_meta() ? &block.meta() : nullptr;
    out.pin = block.pin();
    PayloadRef& payload = out.payload;
    switch (block.payload_case()) {
      case v1::SaveBlock::kInlineBytes:
        payload.kind = PayloadRef::Kind::kInline;
        payload.inline_bytes = block.inline_bytes();
        break;
      case v1::SaveBlock::kRegion:
        payload.kind = PayloadRef::Kind::kRegion;
        payload.region = ToSliceRef(block.region());
        break;
      case v1::SaveBlock::kGather:
        payload.kind = PayloadRef::Kind::kGather;
        ToSliceRefs(block.gather(), &payload.gather);
        break;
      case v1::SaveBlock::PAYLOAD_NOT_SET:
        payload.kind = PayloadRef::Kind::kNone;
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeLoadRequest(const v1::LoadRequest& request, const RequestLimits& limits,
                               LoadCommand* command) {
  absl::StatusOr<std::vector<BlockId>> ids =
      ParseIds(request.ids(), "ids", 1, limits.max_batch_blocks, /*unique=*/false);
  if (!ids.ok()) return ids.status();
  command->lease = LeaseRef{request.lease_id(), nullptr};
  command->ids = *std::move(ids);
  command->fingerprint = request.has_fingerprint() ? &request.fingerprint() : nullptr;
  command->destinations.clear();
  command->destinations.reserve(request.destinations_size());
  for (const v1::RegionSlice& slice : request.destinations()) {
    command->destinations.push_back(ToSliceRef(slice));
  }
  command->scatter.resize(request.scatter_size());
  for (int i = 0; i < request.scatter_size(); ++i) {
    ToSliceRefs(request.scatter(i), &command->scatter[i]);
  }
  command->reanchor.clear();
  command->reanchor.reserve(request.reanchor_size());
  for (const v1::Reanchor& r : request.reanchor()) {
    ReanchorRef ref;
    if (r.has_first_position()) ref.first_position = r.first_position();
    ref.positions = absl::MakeConstSpan(r.positions().data(), r.positions_size());
    command->reanchor.push_back(ref);
  }
  return absl::OkStatus();
}

absl::Status ValidateSaveRequest(const v1::SaveRequest& request,
                                 const RequestLimits& limits) {
  SaveCommand command;
  if (absl::Status s = DecodeSaveRequest(request, limits, &command); !s.ok()) return s;
  return ValidateSaveCommand(command, limits);
}

absl::StatusOr<std::vector<BlockId>> ValidateLoadRequest(
    const v1::LoadRequest& request, const RequestLimits& limits) {
  LoadCommand command;
  if (absl::Status s = DecodeLoadRequest(request, limits, &command); !s.ok()) return s;
  if (absl::Status s = ValidateLoadCommand(command, limits); !s.ok()) return s;
  return std::move(command.ids);
}

}  // namespace evoke
