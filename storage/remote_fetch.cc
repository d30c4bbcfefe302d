// TierManagerImpl's reads from tier 3 (the remote object store): which
// blocks of a Load this host lacks, and fetching them into tier 1 within the
// staging budget, with every record checked before it is served. The rest
// of Load is in tier_manager.cc.
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/block_validation.h"
#include "common/byte_size.h"
#include "common/fingerprint.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "storage/tier_manager_impl.h"

namespace evoke {

std::vector<size_t> TierManagerImpl::RemoteMisses(absl::Span<const BlockId> ids,
                                                  const v1::LayoutFingerprint& fingerprint,
                                                  const NamespaceScope* scope) {
  std::vector<size_t> out;
  if (core_.options().remote == nullptr || (scope != nullptr && !scope->SeesBlock(fingerprint))) {
    return out;
  }
  absl::MutexLock lock(core_.mu());
  for (size_t i = 0; i < ids.size(); ++i) {
    const IndexEntry* e = FindFor(ids[i], scope);
    if (e == nullptr || !e->bytes_available()) out.push_back(i);
  }
  return out;
}

absl::Status TierManagerImpl::FetchRemote(absl::Span<const BlockId> ids,
                                          absl::Span<const size_t> which,
                                          const v1::LayoutFingerprint& fingerprint) {
  RemoteTier* remote = core_.options().remote;
  const uint64_t max_bytes = core_.options().limits.max_block_bytes;
  std::vector<BlockId> want;
  want.reserve(which.size());
  for (size_t i : which) want.push_back(ids[i]);
  // Sizes first: an object over this host's block limit is never read, and
  // the payloads held at once (read, then saved into tier 1) stay within
  // the staging budget. A size that cannot be had counts as the limit (its
  // read tells what went wrong).
  const std::vector<absl::StatusOr<uint64_t>> sizes =
      remote->Sizes(RemoteTier::RemoteNamespace(fingerprint), want);
  const uint64_t capacity = core_.staging().capacity();
  const absl::Time deadline = absl::Now() + core_.options().max_wait_for_room;
  for (size_t k = 0; k < which.size();) {
    uint64_t bytes = 0;
    size_t end = k;
    for (; end < which.size(); ++end) {
      const uint64_t size = sizes[end].ok() ? *sizes[end] : std::min(max_bytes, capacity);
      if (size > max_bytes) {
        if (end > k) break;  // The blocks before it first.
        remote->CountRefusedRecord();
        return ItemError(absl::StatusCode::kFailedPrecondition, which[end], ItemPart::kId,
                         absl::StrCat(BlockName(ids[which[end]]), ": its remote copy (",
                                      FormatByteSize(size), ") is larger than this host's "
                                      "--max-block-bytes (", FormatByteSize(max_bytes),
                                      "); left in place"));
      }
      if (end > k && bytes + size > capacity) break;
      bytes += size;
    }
    if (!core_.staging().Acquire(bytes, deadline)) {
      return ItemError(absl::StatusCode::kResourceExhausted, which[k], ItemPart::kId,
                       absl::StrCat("the staging budget (", FormatByteSize(capacity),
                                    ", --staging-bytes) for reads from the remote tier stayed "
                                    "held by other loads; retry"));
    }
    absl::Cleanup release = [&] { core_.staging().Release(bytes); };
    EVOKE_RETURN_IF_ERROR(FetchRemoteBatch(ids, which.subspan(k, end - k), fingerprint));
    k = end;
  }
  return absl::OkStatus();
}

namespace {

// One fetched payload, in the pieces the object store received it in.
class PiecesSaveSource final : public SaveSource {
 public:
  explicit PiecesSaveSource(absl::Span<const absl::string_view> pieces) : pieces_(pieces) {}
  absl::string_view HostBytes(size_t) override {
    return pieces_.size() == 1 ? pieces_[0] : absl::string_view();
  }
  absl::Span<const absl::string_view> HostPieces(size_t) override {
    return pieces_.size() > 1 ? pieces_ : absl::Span<const absl::string_view>();
  }

 private:
  absl::Span<const absl::string_view> pieces_;
};

}  // namespace

absl::Status TierManagerImpl::FetchRemoteBatch(absl::Span<const BlockId> ids,
                                               absl::Span<const size_t> which,
                                               const v1::LayoutFingerprint& fingerprint) {
  RemoteTier* remote = core_.options().remote;
  const std::string ns = RemoteTier::RemoteNamespace(fingerprint);
  std::vector<BlockId> want;
  want.reserve(which.size());
  for (size_t i : which) want.push_back(ids[i]);
  const FingerprintDigest expected = DigestFingerprint(fingerprint);
  // Each block is checked and saved into tier 1 as its read completes,
  // while the reads after it are still in flight; its outcome (an item
  // error, final) is kept. The first failure in the order of the Load is
  // its answer, as if the blocks had been taken one after another.
  std::vector<std::optional<absl::Status>> saved(which.size());
  const std::vector<absl::Status> got = remote->FetchEach(
      ns, want, core_.options().limits.max_block_bytes,
      [&](size_t k, storage::SpillRecord& record, absl::Span<const absl::string_view> payload,
          uint64_t bytes) {
        saved[k] = SaveFetched(ids, which[k], ns, expected, fingerprint, record, payload, bytes);
        return *saved[k];
      });
  for (size_t k = 0; k < which.size(); ++k) {
    const size_t i = which[k];
    if (saved[k].has_value()) {
      if (!saved[k]->ok()) return *saved[k];
      continue;
    }
    const absl::Status& s = got[k];
    switch (s.code()) {
      case absl::StatusCode::kOk:
        break;
      case absl::StatusCode::kNotFound:
        core_.CountMiss();
        // The same answer as for a block no tier holds.
        return ItemError(absl::StatusCode::kNotFound, i, ItemPart::kId,
                         absl::StrCat(BlockName(ids[i]), " not found"));
      case absl::StatusCode::kUnavailable:
        return ItemError(absl::StatusCode::kUnavailable, i, ItemPart::kId,
                         absl::StrCat(BlockName(ids[i]), " is not on this host, and the remote "
                                      "tier that may hold it cannot be reached: ", s.message()));
      case absl::StatusCode::kDataLoss:
        DropRemoteCopy(ns, ids[i], s);
        core_.CountChecksumFailure();
        return ItemError(absl::StatusCode::kDataLoss, i, ItemPart::kId,
                         absl::StrCat(BlockName(ids[i]), ": its remote copy was refused: ",
                                      s.message()));
      case absl::StatusCode::kFailedPrecondition:  // Over the limit; never read.
        remote->CountRefusedRecord();
        return ItemError(absl::StatusCode::kFailedPrecondition, i, ItemPart::kId,
                         absl::StrCat(BlockName(ids[i]), ": its remote copy is larger than this "
                                      "host's --max-block-bytes (left in place): ", s.message()));
      default:
        return WithItem(s, i, ItemPart::kId);
    }
  }
  return absl::OkStatus();
}

absl::Status TierManagerImpl::SaveFetched(absl::Span<const BlockId> ids, size_t i,
                                          const std::string& ns,
                                          const FingerprintDigest& expected,
                                          const v1::LayoutFingerprint& fingerprint,
                                          const storage::SpillRecord& record,
                                          absl::Span<const absl::string_view> payload,
                                          uint64_t bytes) {
  RemoteTier* remote = core_.options().remote;
  const v1::BlockMeta& meta = record.meta();
  // A record that is bad for every host is removed (so that the next host
  // to compute the block writes a good one); one that only this host's
  // limits refuse is left for the hosts that accept it.
  absl::Status valid = CheckRecordIdentity(ids[i], meta);
  if (valid.ok() && RemoteTier::RemoteNamespace(meta.fingerprint()) != ns) {
    valid = absl::DataLossError("its record names another namespace or trust group");
  }
  if (valid.ok()) {
    if (absl::Status limits = ValidateRecord(ids[i], meta); !limits.ok()) {
      remote->CountRefusedRecord();
      return ItemError(absl::StatusCode::kFailedPrecondition, i, ItemPart::kId,
                       absl::StrCat(BlockName(ids[i]), ": its remote record is outside this "
                                    "host's limits (left in place): ", limits.message()));
    }
  }
  if (!valid.ok()) {
    remote->CountChecksumFailure();
    DropRemoteCopy(ns, ids[i], valid);
    core_.CountChecksumFailure();
    return ItemError(absl::StatusCode::kDataLoss, i, ItemPart::kId,
                     absl::StrCat(BlockName(ids[i]), ": its remote record was refused: ",
                                  valid.message()));
  }
  if (DigestFingerprint(meta.fingerprint()) != expected) {
    return ItemError(absl::StatusCode::kFailedPrecondition, i, ItemPart::kFingerprint,
                     absl::StrCat(BlockName(ids[i]), " was saved with another layout: ",
                                  FingerprintMismatch(meta.fingerprint(), fingerprint)));
  }
  // Save hashes its own tier-1 copy against the record's checksum: a remote
  // payload that does not match is refused there (DATA_LOSS), never served.
  const SaveItem item{&meta, bytes, /*pin=*/false, /*from_remote=*/true};
  PiecesSaveSource source(payload);
  absl::StatusOr<std::vector<SavedBlock>> stored =
      Save({&item, 1}, source, /*durable=*/false, absl::InfiniteFuture(), /*owner=*/0);
  if (stored.ok()) return absl::OkStatus();
  const absl::Status s = stored.status();
  if (s.code() == absl::StatusCode::kDataLoss) {
    remote->CountChecksumFailure();
    DropRemoteCopy(ns, ids[i], s);
    core_.CountChecksumFailure();
    return ItemError(absl::StatusCode::kDataLoss, i, ItemPart::kId,
                     absl::StrCat(BlockName(ids[i]), ": its remote copy fails its checksum and was "
                                  "refused: ", s.message()));
  }
  return WithItem(s, i, ItemPart::kId);
}

void TierManagerImpl::DropRemoteCopy(absl::string_view ns, const BlockId& id,
                                     const absl::Status& why) {
  // The one remote object is the only copy tier 3 has, and exclusive writes
  // would never replace it: remove it, so the next host that computes the
  // block writes a good one.
  const BlockId ids[] = {id};
  const absl::Status removed = core_.options().remote->Remove(ns, ids);
  // Per request: at most one line a second (the count says how many).
  EVOKE_LOG_ERROR_EVERY_N_SEC(1, "remote copy of ", BlockName(id), " in namespace '", ns,
                              "' refused: ", why.message(),
                              removed.ok() ? "; removed" : "; could not remove it: ",
                              removed.message());
}

}  // namespace evoke
