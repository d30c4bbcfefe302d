#include "storage/verifier.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/checksum.h"
#include "common/status_macros.h"

namespace evoke {

absl::StatusOr<VerifyReport> VerifyBlocks(EngineCore* core,
                                          absl::Span<const BlockId> requested) {
  VerifyReport out;
  std::vector<BlockId> ids(requested.begin(), requested.end());
  // Records that failed validation at start are reported and removed.
  std::vector<std::pair<BlockId, std::string>> invalid;
  core->VerifyTargets(&ids, &invalid);
  for (const auto& [id, reason] : invalid) {
    ++out.blocks_checked;
    ++out.copies_checked;
    out.corrupt.push_back(CorruptCopy{
        id, BlockLocation::kDisk, absl::StrCat("record failed validation at start: ", reason)});
    EVOKE_RETURN_IF_ERROR(core->RemoveInvalidRecord(id));
  }
  absl::flat_hash_set<BlockId> handled;
  for (const auto& [id, reason] : invalid) handled.insert(id);
  std::string scratch;
  for (const BlockId& id : ids) {
    if (handled.contains(id)) continue;
    const std::optional<EngineCore::ReadHold> hold = core->HoldVisible(id);
    if (!hold) {
      ++out.missing;
      continue;
    }
    ++out.blocks_checked;
    if (hold->ram != nullptr) {
      const uint64_t got = PayloadChecksum(hold->ram->ram.data(), hold->payload_bytes);
      const bool ok = got == hold->checksum;
      ++out.copies_checked;
      if (ok) {
        ++out.copies_ok;
      } else {
        out.corrupt.push_back(CorruptCopy{
            id, BlockLocation::kHost,
            absl::StrCat("tier-1 copy hashes to ", absl::Hex(got), ", stored ",
                         absl::Hex(hold->checksum))});
      }
      core->ReleaseReader(hold->ram, /*corrupt=*/!ok);  // A corrupt copy is quarantined.
    }
    if (!hold->on_disk) continue;
    scratch.resize(hold->payload_bytes);
    absl::Status s = core->ReadFromDisk(id, hold->checksum, hold->payload_bytes,
                                        reinterpret_cast<uint8_t*>(scratch.data()));
    if (s.code() == absl::StatusCode::kNotFound) continue;  // Changed meanwhile.
    if (s.code() == absl::StatusCode::kUnavailable) return s;
    ++out.copies_checked;
    if (s.ok()) {
      ++out.copies_ok;
      continue;
    }
    out.corrupt.push_back(CorruptCopy{id, BlockLocation::kDisk, std::string(s.message())});
    core->DropCorruptDiskCopy(id, hold->gen);
  }
  return out;
}

}  // namespace evoke
