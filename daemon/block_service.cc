#include "daemon/block_service.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/storage_mapping.h"

namespace evoke {

uid_t OwnerUid(const Caller& caller) { return caller.uid().value_or(static_cast<uid_t>(-1)); }

absl::Status NeedsAdmin(const Caller& caller, absl::string_view what) {
  if (caller.admin()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(what, " needs admin rights; ", caller.name(), " is not an admin"));
}

absl::Status NeedsNamespace(const Caller& caller, absl::string_view field,
                            absl::string_view ns) {
  if (caller.Sees(ns)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(field, ": ", caller.name(),
                                                  " may not use namespace \"", ns, "\""));
}

absl::Status NeedsTrustGroup(const Caller& caller, absl::string_view field,
                             const v1::LayoutFingerprint& fp) {
  const std::string& ns = fp.namespace_();
  const std::string& group = fp.trust_group();
  if (caller.InTrustGroup(ns, group)) return absl::OkStatus();
  if (group.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".trust_group: is required in shared namespace \"", ns, "\"; ", caller.name(),
        " is in ", caller.TrustGroupsIn(ns)));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      field, ".trust_group: ", caller.name(), " is not in trust group \"", group,
      "\" of namespace \"", ns, "\" (it is in ", caller.TrustGroupsIn(ns), ")"));
}

BlockService::BlockService(TierManager* tiers, LeaseManager* leases, DeviceCopiers* copiers,
                           BlockServiceOptions options)
    : tiers_(tiers), leases_(leases), copiers_(copiers), options_(std::move(options)) {}

absl::StatusOr<Lease> BlockService::FindLease(const Caller& caller,
                                              absl::string_view lease_id) const {
  EVOKE_ASSIGN_OR_RETURN(Lease lease, leases_->Find(lease_id));
  // Another uid's lease answers as an unknown one: leases cannot be probed.
  if (lease.owner_uid != OwnerUid(caller)) {
    return absl::NotFoundError("lease_id: unknown or ended lease");
  }
  return lease;
}

absl::StatusOr<BlockService::Acquired> BlockService::Acquire(const Caller& caller,
                                                             const Lease& lease,
                                                             absl::Span<const BlockId> ids,
                                                             bool all) {
  EVOKE_ASSIGN_OR_RETURN(LeaseManager::Handle handle, leases_->NewHandle(lease.id));
  absl::StatusOr<std::vector<BlockLocation>> held =
      tiers_->Acquire(ids, handle.owner, all, &caller);
  if (!held.ok() || held->empty()) {
    (void)leases_->TakeHandle(lease.id, handle.id);
    if (!held.ok()) return WithFieldPath(held.status(), ItemsField::kIds);
    return Acquired{};
  }
  // The lease may have ended while the blocks were pinned: its handles were
  // released before these pins existed.
  if (!leases_->HasHandle(lease.id, handle.id)) {
    tiers_->ReleaseOwner(handle.owner);
    return absl::NotFoundError("lease_id: unknown or ended lease");
  }
  return Acquired{handle.id, *std::move(held)};
}

absl::StatusOr<uint64_t> BlockService::Release(const Lease& lease, uint64_t handle) {
  EVOKE_ASSIGN_OR_RETURN(PinOwner owner, leases_->TakeHandle(lease.id, handle));
  return tiers_->ReleaseOwner(owner);
}

absl::StatusOr<std::optional<Lease>> BlockService::ResolveLease(const Caller& caller,
                                                                const LeaseRef& ref) const {
  if (ref.resolved != nullptr) return std::optional<Lease>(*ref.resolved);
  if (ref.id.empty()) return std::optional<Lease>();
  EVOKE_ASSIGN_OR_RETURN(Lease lease, FindLease(caller, ref.id));
  return std::optional<Lease>(std::move(lease));
}

absl::Status BlockService::CheckSaveAccess(const SaveCommand& command,
                                           const Caller& caller) const {
  for (size_t i = 0; i < command.blocks.size(); ++i) {
    const v1::BlockMeta& meta = *command.blocks[i].meta;
    const std::string& ns = meta.fingerprint().namespace_();
    if (!caller.Sees(ns)) {
      return NeedsNamespace(caller, absl::StrCat("blocks[", i, "].meta.fingerprint.namespace"),
                            ns);
    }
    // Only a member writes for a group: its copy is what the group loads.
    if (!caller.InTrustGroup(ns, meta.fingerprint().trust_group())) {
      return NeedsTrustGroup(caller, absl::StrCat("blocks[", i, "].meta.fingerprint"),
                             meta.fingerprint());
    }
    // A prefix id is only trusted when it is verified against its token
    // chain; an unverified one could name another writer's block.
    if (meta.kind() == v1::BLOCK_KIND_PREFIX && meta.tokens().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "blocks[", i, "].meta.tokens: is required for prefix blocks (the id is "
          "verified against parent_id, tokens and fingerprint)"));
    }
    if (options_.policy != nullptr && options_.policy->IsShared(ns) &&
        meta.kind() != v1::BLOCK_KIND_PREFIX) {
      return absl::InvalidArgumentError(absl::StrCat(
          "blocks[", i, "].meta.kind: namespace \"", ns,
          "\" is shared; it holds prefix blocks only"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SavedBlock>> BlockService::Save(const Caller& caller,
                                                           const SaveCommand& command) {
  EVOKE_RETURN_IF_ERROR(ValidateSaveCommand(command, options_.limits));
  EVOKE_RETURN_IF_ERROR(CheckSaveAccess(command, caller));
  EVOKE_ASSIGN_OR_RETURN(std::optional<Lease> lease, ResolveLease(caller, command.lease));
  std::optional<LeaseRegions> own_regions;
  RegionResolver* regions = command.regions;
  if (regions == nullptr && lease) regions = &own_regions.emplace(lease->id, leases_);
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<SaveRequestSource> source,
                         SaveRequestSource::Create(command, regions, copiers_));
  std::vector<SaveItem> items;
  items.reserve(command.blocks.size());
  for (const SaveCommandBlock& block : command.blocks) {
    items.push_back(SaveItem{block.meta, block.payload.Length(), block.pin});
    items.back().writer = caller.writer();
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<SavedBlock>> results = tiers_->Save(
      items, *source, command.durable, command.deadline, lease ? lease->owner : PinOwner{0});
  if (!results.ok()) return WithFieldPath(results.status(), ItemsField::kSaveBlocks);
  EVOKE_LOG_DEBUG("Save: ", items.size(), " blocks in ", absl::FormatDuration(absl::Now() - start));
  return results;
}

absl::Status BlockService::Load(const Caller& caller, const LoadCommand& command,
                                std::vector<std::string>* inline_out, LoadResult* result) {
  EVOKE_RETURN_IF_ERROR(ValidateLoadCommand(command, options_.limits));
  EVOKE_ASSIGN_OR_RETURN(std::optional<Lease> lease, ResolveLease(caller, command.lease));
  std::optional<LeaseRegions> own_regions;
  RegionResolver* regions = command.regions;
  if (regions == nullptr && lease) regions = &own_regions.emplace(lease->id, leases_);
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<LoadResponseSink> sink,
                         LoadResponseSink::Create(command, inline_out,
                                                  options_.max_inline_load_bytes, regions,
                                                  copiers_));
  const absl::Time start = absl::Now();
  result->metas.clear();
  result->infos.clear();
  absl::Status s = tiers_->Load(command.ids, *command.fingerprint, *sink, &result->metas,
                                &result->infos, &caller);
  EVOKE_LOG_DEBUG("Load: ", command.ids.size(), " blocks in ",
                  absl::FormatDuration(absl::Now() - start));
  if (!s.ok()) {
    if (inline_out != nullptr) inline_out->clear();
    return WithFieldPath(s, ItemsField::kIds);
  }
  sink->ApplyNewPositions(&result->metas);
  for (v1::BlockMeta& meta : result->metas) meta.clear_summaries();
  return absl::OkStatus();
}

absl::Status BlockService::LoadInto(const Caller& caller, const LoadCommand& command,
                                    LoadSink& sink, LoadResult* result) {
  EVOKE_RETURN_IF_ERROR(ValidateLoadCommand(command, options_.limits));
  if (!command.destinations.empty() || !command.scatter.empty() || !command.reanchor.empty()) {
    return absl::InternalError("LoadInto: destinations, scatter and re-anchoring need Load");
  }
  // Resolved only for its errors (an unknown lease is NOT_FOUND, as for
  // every Load).
  EVOKE_RETURN_IF_ERROR(ResolveLease(caller, command.lease).status());
  const absl::Time start = absl::Now();
  result->metas.clear();
  result->infos.clear();
  absl::Status s = tiers_->Load(command.ids, *command.fingerprint, sink, &result->metas,
                                &result->infos, &caller);
  EVOKE_LOG_DEBUG("Load: ", command.ids.size(), " blocks in ",
                  absl::FormatDuration(absl::Now() - start));
  if (!s.ok()) return WithFieldPath(s, ItemsField::kIds);
  return absl::OkStatus();
}

}  // namespace evoke
