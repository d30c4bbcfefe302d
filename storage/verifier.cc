#include "storage/verifier.h"

#include <string>
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
  {
    absl::MutexLock lock(&core->mu);
    if (ids.empty()) {
      ids = core->index.VisibleIds();
      invalid.assign(core->invalid_records.begin(), core->invalid_records.end());
    } else {
      for (const BlockId& id : ids) {
        auto it = core->invalid_records.find(id);
        if (it != core->invalid_records.end()) invalid.emplace_back(it->first, it->second);
      }
    }
  }
  for (const auto& [id, reason] : invalid) {
    ++out.blocks_checked;
    ++out.copies_checked;
    out.corrupt.push_back(CorruptCopy{
        id, BlockLocation::kDisk, absl::StrCat("record failed validation at start: ", reason)});
    absl::MutexLock disk(&core->disk_mu);
    const BlockId one[] = {id};
    EVOKE_RETURN_IF_ERROR(core->disk->Delete(one));
    absl::MutexLock lock(&core->mu);
    core->invalid_records.erase(id);
  }
  absl::flat_hash_set<BlockId> handled;
  for (const auto& [id, reason] : invalid) handled.insert(id);
  std::string scratch;
  for (const BlockId& id : ids) {
    if (handled.contains(id)) continue;
    IndexEntry* reader = nullptr;
    uint64_t gen = 0, checksum = 0, bytes = 0;
    bool on_disk = false;
    {
      absl::MutexLock lock(&core->mu);
      IndexEntry* e = core->index.FindVisible(id);
      if (e == nullptr) {
        ++out.missing;
        continue;
      }
      gen = e->gen;
      checksum = e->checksum;
      bytes = e->payload_bytes;
      on_disk = e->on_disk();
      if (e->ram_readable()) {
        core->index.AddReader(e);
        reader = e;
      }
    }
    ++out.blocks_checked;
    if (reader != nullptr) {
      const uint64_t got = PayloadChecksum(reader->ram.data(), bytes);
      absl::MutexLock lock(&core->mu);
      ++out.copies_checked;
      if (got == checksum) {
        ++out.copies_ok;
      } else {
        ++core->counters.checksum_failures;
        out.corrupt.push_back(CorruptCopy{
            id, BlockLocation::kHost,
            absl::StrCat("tier-1 copy hashes to ", absl::Hex(got), ", stored ",
                         absl::Hex(checksum))});
        core->index.Quarantine(reader);
      }
      core->index.ReleaseReader(reader);
    }
    if (!on_disk) continue;
    scratch.resize(bytes);
    absl::Status s =
        core->ReadFromDisk(id, checksum, bytes, reinterpret_cast<uint8_t*>(scratch.data()));
    if (s.code() == absl::StatusCode::kNotFound) continue;  // Changed meanwhile.
    if (s.code() == absl::StatusCode::kUnavailable) return s;
    ++out.copies_checked;
    if (s.ok()) {
      ++out.copies_ok;
      continue;
    }
    {
      absl::MutexLock lock(&core->mu);
      ++core->counters.checksum_failures;
    }
    out.corrupt.push_back(CorruptCopy{id, BlockLocation::kDisk, std::string(s.message())});
    absl::MutexLock disk(&core->disk_mu);
    core->QuarantineDisk(id, gen);
  }
  return out;
}

}  // namespace evoke
