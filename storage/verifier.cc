#include "storage/verifier.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"

namespace evoke {

absl::StatusOr<VerifyReport> VerifyBlocks(EngineCore* core,
                                          absl::Span<const BlockId> requested) {
  VerifyReport out;
  std::vector<BlockId> ids(requested.begin(), requested.end());
  if (ids.empty()) {
    absl::MutexLock lock(&core->mu);
    ids = core->index.VisibleIds();
  }
  std::string scratch;
  for (const BlockId& id : ids) {
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
