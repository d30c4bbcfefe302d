#include "daemon/lease_manager.h"

#include <sys/random.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fd_passing.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace evoke {

namespace {

MappingLimits LimitsOf(const LeaseManagerOptions& o) {
  MappingLimits l;
  l.max_bytes = o.max_mapped_bytes;
  l.max_bytes_per_uid = std::min(o.max_mapped_bytes_per_uid, o.max_mapped_bytes);
  // Never past the kernel's vm.max_map_count: the daemon would abort.
  const uint64_t kernel_safe = DefaultMaxMappings();
  l.max_mappings = o.max_mappings == 0 ? kernel_safe : std::min(o.max_mappings, kernel_safe);
  l.max_mappings_per_uid = o.max_mappings_per_uid == 0
                               ? std::max<uint64_t>(1, l.max_mappings / 4)
                               : std::min(o.max_mappings_per_uid, l.max_mappings);
  return l;
}

constexpr absl::string_view kUnknownLease = "lease_id: unknown or ended lease";

}  // namespace

LeaseManager::LeaseManager(const LeaseManagerOptions& options, TierManager* tiers)
    : options_(options),
      max_leases_per_uid_(options.max_leases_per_uid == 0
                              ? std::max<uint32_t>(1, options.max_leases / 4)
                              : std::min(options.max_leases_per_uid, options.max_leases)),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      tiers_(tiers),
      budget_(LimitsOf(options)) {}

absl::StatusOr<Lease> LeaseManager::Grant(absl::string_view client_name, uid_t owner_uid,
                                          uint32_t max_for_uid, uint64_t max_mapped_bytes) {
  const uint32_t cap = max_for_uid != 0 ? max_for_uid : max_leases_per_uid_;
  char bytes[16];
  if (getrandom(bytes, sizeof(bytes), 0) != static_cast<ssize_t>(sizeof(bytes))) {
    return absl::UnavailableError("no randomness for a lease id");
  }
  const BlockId id = BlockId::FromBytes(absl::string_view(bytes, sizeof(bytes))).value();
  absl::MutexLock lock(&mu_);
  if (leases_.size() >= options_.max_leases) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many open leases (", options_.max_leases, ", --max-leases)"));
  }
  uint32_t& mine = leases_per_uid_[owner_uid];
  if (mine >= cap) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", owner_uid, " holds ", mine, " open leases, the limit per uid (", cap,
        max_for_uid != 0 ? ", max_leases in the policy" : ", --max-leases-per-uid",
        "); end one first"));
  }
  ++mine;
  LeaseState& state = leases_[id];
  state.owner = next_owner_++;
  state.max_mapped_bytes = max_mapped_bytes;
  state.owner_uid = owner_uid;
  state.client_name = std::string(client_name.substr(0, 128));
  state.granted = clock_->Now();
  state.last_used = state.granted;
  EVOKE_LOG_DEBUG("lease ", id.ToHex().substr(0, 8), " granted to '",
                  state.client_name, "' (uid ", owner_uid, ")");
  return Lease{id, state.owner, owner_uid};
}

void LeaseManager::End(const BlockId& id) {
  LeaseState state;
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(id);
    if (it == leases_.end()) return;
    state = std::move(it->second);
    Forget(it);
    ++expired_;
  }
  Release(std::move(state));
}

void LeaseManager::Forget(absl::flat_hash_map<BlockId, LeaseState>::iterator it) {
  auto u = leases_per_uid_.find(it->second.owner_uid);
  if (u != leases_per_uid_.end() && --u->second == 0) leases_per_uid_.erase(u);
  leases_.erase(it);
}

void LeaseManager::Release(LeaseState state) {
  // Outside the lock: the TierManager takes its own.
  uint64_t released = tiers_->ReleaseOwner(state.owner);
  for (const auto& [id, owner] : state.handles) released += tiers_->ReleaseOwner(owner);
  {
    absl::MutexLock lock(&mu_);
    pins_released_ += released;
  }
  if (!state.regions.empty() || released > 0) {
    EVOKE_LOG_FIELDS(LogLevel::kInfo, "lease ended", LogField("client", state.client_name),
                     LogField("uid", state.owner_uid),
                     LogField("regions_unmapped", state.regions.size()),
                     LogField("pins_released", released));
  }
  // state.regions drops here; each region unmaps when its last copy ends.
}

absl::StatusOr<Lease> LeaseManager::Find(absl::string_view lease_id) const {
  if (lease_id.empty()) {
    return absl::InvalidArgumentError(
        "lease_id: is required (open a lease with OpenLease)");
  }
  absl::StatusOr<BlockId> id = BlockId::FromBytes(lease_id);
  if (!id.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("lease_id: ", id.status().message()));
  }
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(*id);
  if (it == leases_.end()) {
    return absl::NotFoundError("lease_id: unknown or ended lease");
  }
  it->second.last_used = std::max(it->second.last_used, now);
  return Lease{*id, it->second.owner, it->second.owner_uid};
}

absl::StatusOr<uint64_t> LeaseManager::Touch(const BlockId& id) const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return absl::NotFoundError("lease_id: unknown or ended lease");
  it->second.last_used = std::max(it->second.last_used, now);
  return it->second.regions_removed;
}

absl::StatusOr<LeaseInfo> LeaseManager::Describe(const BlockId& id) const {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return absl::NotFoundError("lease_id: unknown or ended lease");
  const LeaseState& state = it->second;
  return LeaseInfo{state.client_name, state.owner_uid, state.granted, state.last_used,
                   state.regions.size()};
}

size_t LeaseManager::ExpireIdle() {
  if (options_.idle_timeout == absl::InfiniteDuration()) return 0;
  const absl::Time now = clock_->Now();
  std::vector<LeaseState> idle;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (now - it->second.last_used < options_.idle_timeout) {
        ++it;
        continue;
      }
      EVOKE_LOG_FIELDS(LogLevel::kInfo, "ending an idle lease (--lease-idle-ms)",
                       LogField("lease", it->first.ToHex().substr(0, 8)),
                       LogField("client", it->second.client_name),
                       LogField("idle", absl::FormatDuration(now - it->second.last_used)));
      idle.push_back(std::move(it->second));
      Forget(it++);
      ++expired_;
    }
  }
  for (LeaseState& state : idle) Release(std::move(state));
  return idle.size();
}

absl::StatusOr<uint64_t> LeaseManager::AddRegion(const BlockId& lease,
                                                 std::shared_ptr<Region> region) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease);
  if (it == leases_.end()) return absl::NotFoundError("lease_id: unknown or ended lease");
  it->second.last_used = std::max(it->second.last_used, now);
  if (it->second.regions.size() >= options_.max_regions_per_lease) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the lease already has ", options_.max_regions_per_lease,
        " regions; unregister some first"));
  }
  const uint64_t id = next_region_++;
  it->second.regions.emplace(id, std::move(region));
  return id;
}

absl::StatusOr<LeaseManager::Handle> LeaseManager::NewHandle(const BlockId& lease) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease);
  if (it == leases_.end()) return absl::NotFoundError(kUnknownLease);
  it->second.last_used = std::max(it->second.last_used, now);
  if (it->second.handles.size() >= options_.max_handles_per_lease) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the lease already holds ", options_.max_handles_per_lease,
        " handles; release some first"));
  }
  const Handle handle{next_handle_++, next_owner_++};
  it->second.handles.emplace(handle.id, handle.owner);
  return handle;
}

bool LeaseManager::HasHandle(const BlockId& lease, uint64_t handle) const {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease);
  return it != leases_.end() && it->second.handles.contains(handle);
}

absl::StatusOr<PinOwner> LeaseManager::TakeHandle(const BlockId& lease, uint64_t handle) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease);
  if (it == leases_.end()) return absl::NotFoundError(kUnknownLease);
  it->second.last_used = std::max(it->second.last_used, now);
  auto h = it->second.handles.find(handle);
  if (h == it->second.handles.end()) {
    return absl::NotFoundError(
        absl::StrCat("handle: ", handle, " is not an open handle of this lease"));
  }
  const PinOwner owner = h->second;
  it->second.handles.erase(h);
  return owner;
}

absl::StatusOr<uint64_t> LeaseManager::AddSharedMemoryRegion(absl::string_view lease_id,
                                                             uid_t peer_uid, int fd,
                                                             uint64_t size) {
  UniqueFd owned(fd);  // Until ShmRegion::Map takes it.
  absl::StatusOr<BlockId> id = BlockId::FromBytes(lease_id);
  if (!id.ok()) return absl::NotFoundError(kUnknownLease);
  uint64_t max_mapped_bytes = 0;
  {
    // The owner check comes first and does not mark the lease used: to
    // another uid, a lease looks exactly like one that does not exist.
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(*id);
    if (it == leases_.end()) return absl::NotFoundError(kUnknownLease);
    if (it->second.owner_uid != peer_uid) {
      EVOKE_LOG_DEBUG("fd channel: uid ", peer_uid, " tried to register memory under lease ",
                      id->ToHex().substr(0, 8), " of uid ", it->second.owner_uid,
                      "; refused as unknown");
      return absl::NotFoundError(kUnknownLease);
    }
    max_mapped_bytes = it->second.max_mapped_bytes;
  }
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<ShmRegion> region,
                         ShmRegion::Map(owned.Release(), size, options_.max_region_bytes,
                                        &budget_, peer_uid, max_mapped_bytes));
  // The lease may have ended meanwhile: AddRegion then answers NOT_FOUND and
  // the region unmaps here.
  return AddRegion(*id, std::move(region));
}

absl::StatusOr<std::shared_ptr<Region>> LeaseManager::GetRegion(
    const BlockId& lease, uint64_t region_id, const std::string& field) const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease);
  if (it == leases_.end()) return absl::NotFoundError("lease_id: unknown or ended lease");
  it->second.last_used = std::max(it->second.last_used, now);
  auto r = it->second.regions.find(region_id);
  if (r == it->second.regions.end()) {
    return absl::NotFoundError(absl::StrCat(
        field, ".region_id: region ", region_id, " is not registered by this lease"));
  }
  return r->second;
}

bool LeaseManager::HasRegion(const BlockId& lease, uint64_t region_id,
                             uint64_t* regions_removed) const {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease);
  if (it == leases_.end()) return false;
  if (regions_removed != nullptr) *regions_removed = it->second.regions_removed;
  return it->second.regions.contains(region_id);
}

absl::Status LeaseManager::RemoveRegion(const BlockId& lease, uint64_t region_id) {
  std::shared_ptr<Region> dropped;  // Unmapped outside the lock.
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease);
  if (it == leases_.end()) return absl::NotFoundError("lease_id: unknown or ended lease");
  it->second.last_used = std::max(it->second.last_used, now);
  auto r = it->second.regions.find(region_id);
  if (r == it->second.regions.end()) {
    return absl::NotFoundError(absl::StrCat(
        "region_id: region ", region_id, " is not registered by this lease"));
  }
  dropped = std::move(r->second);
  it->second.regions.erase(r);
  ++it->second.regions_removed;
  return absl::OkStatus();
}

v1::LeaseStat LeaseManager::Stats() const {
  v1::LeaseStat s;
  absl::MutexLock lock(&mu_);
  s.set_leases(leases_.size());
  for (const auto& [id, lease] : leases_) {
    for (const auto& [rid, region] : lease.regions) {
      if (region->kind() == Region::Kind::kSharedMemory) {
        s.set_shm_regions(s.shm_regions() + 1);
        s.set_shm_bytes(s.shm_bytes() + region->size());
      } else {
        s.set_cuda_regions(s.cuda_regions() + 1);
        s.set_cuda_bytes(s.cuda_bytes() + region->size());
      }
    }
  }
  s.set_leases_expired(expired_);
  s.set_pins_released_on_expiry(pins_released_);
  return s;
}

}  // namespace evoke
