// BlockService: the one body of the data plane. Every transport (the gRPC
// methods, the inline wire, the command rings) decodes its Save and Load
// requests into plain commands (daemon/block_commands.h) and runs them here;
// this is where they are validated, access-checked, their lease and regions
// resolved, and run against the TierManager. Errors are absl::Status with
// messages that name the command's fields; each transport translates them
// into its own vocabulary (a gRPC status, a ring completion).
#ifndef EVOKE_DAEMON_BLOCK_SERVICE_H_
#define EVOKE_DAEMON_BLOCK_SERVICE_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/access_policy.h"
#include "daemon/block_commands.h"
#include "daemon/lease_manager.h"
#include "daemon/payload_paths.h"
#include "daemon/request_validation.h"
#include "storage/tier_manager.h"

namespace evoke {

// The uid a caller's leases belong to; TCP callers (no uid) share one that
// no Unix peer has, so their leases take no shared-memory regions.
uid_t OwnerUid(const Caller& caller);
// PERMISSION_DENIED unless the caller is an admin; `what` names the action.
absl::Status NeedsAdmin(const Caller& caller, absl::string_view what);
// PERMISSION_DENIED unless the caller may use namespace `ns`.
absl::Status NeedsNamespace(const Caller& caller, absl::string_view field,
                            absl::string_view ns);
// A fingerprint's trust group must be one the caller is in (see
// Caller::InTrustGroup); `field` names the fingerprint.
absl::Status NeedsTrustGroup(const Caller& caller, absl::string_view field,
                             const v1::LayoutFingerprint& fp);

struct BlockServiceOptions {
  RequestLimits limits;
  // Payloads returned inline by one Load: at most this (RESOURCE_EXHAUSTED).
  uint64_t max_inline_load_bytes = 79ull << 20;
  // Shared namespaces; null: none.
  const AccessPolicy* policy = nullptr;
};

// What a Load returns besides the payloads: per id, its metadata (with the
// new positions of a re-anchored block, without summaries) and where it was
// served from.
struct LoadResult {
  std::vector<v1::BlockMeta> metas;
  std::vector<LoadedInfo> infos;
};

// Thread-safe. `tiers`, `leases` and `copiers` must outlive the service.
class BlockService {
 public:
  BlockService(TierManager* tiers, LeaseManager* leases, DeviceCopiers* copiers,
               BlockServiceOptions options);

  // Save validates the command (INVALID_ARGUMENT naming the field), checks
  // the caller may write each block (its namespace and trust group; prefix
  // blocks need their tokens; shared namespaces hold prefix blocks only),
  // resolves the lease (the caller's own: another's is NOT_FOUND, as an
  // unknown one) and the payloads' regions, and stores the blocks with the
  // caller as their writer. Errors from storage name "blocks[i]".
  absl::StatusOr<std::vector<SavedBlock>> Save(const Caller& caller, const SaveCommand& command);

  // Load validates and resolves the command as Save does and loads the ids
  // into the command's destinations or scatter lists (re-anchored where
  // asked), or, with neither, into `inline_out` (one string per id, under
  // max_inline_load_bytes; null: refused). Errors from storage name "ids[i]".
  absl::Status Load(const Caller& caller, const LoadCommand& command,
                    std::vector<std::string>* inline_out, LoadResult* result);

  // LoadInto is Load into a transport's own sink (it encodes inline payloads
  // itself). The command must name no destinations, scatter or re-anchoring:
  // those need Load.
  absl::Status LoadInto(const Caller& caller, const LoadCommand& command, LoadSink& sink,
                        LoadResult* result);

  // Acquire holds the blocks of `ids` loadable under a new handle of
  // `lease` (TierManager::Acquire: the longest held run, or with `all`
  // every id). No handle is made when nothing is held (handle 0).
  // NOT_FOUND (mode all: "ids[i]"), RESOURCE_EXHAUSTED (handles per lease).
  struct Acquired {
    uint64_t handle = 0;
    std::vector<BlockLocation> held;
  };
  absl::StatusOr<Acquired> Acquire(const Caller& caller, const Lease& lease,
                                   absl::Span<const BlockId> ids, bool all);
  // Release ends a handle of `lease` and returns how many holds went.
  // NOT_FOUND naming "handle" for one the lease does not have.
  absl::StatusOr<uint64_t> Release(const Lease& lease, uint64_t handle);

  // FindLease resolves a lease_id of the caller's own uid (NOT_FOUND for
  // another's, as for an unknown one).
  absl::StatusOr<Lease> FindLease(const Caller& caller, absl::string_view lease_id) const;

  const RequestLimits& limits() const { return options_.limits; }
  LeaseManager* leases() const { return leases_; }

 private:
  // CheckSaveAccess refuses blocks in namespaces the caller may not use,
  // prefix blocks without their tokens, and session blocks in a shared
  // namespace.
  absl::Status CheckSaveAccess(const SaveCommand& command, const Caller& caller) const;
  // ResolveLease: the command's lease, resolved (nullopt: none).
  absl::StatusOr<std::optional<Lease>> ResolveLease(const Caller& caller,
                                                    const LeaseRef& ref) const;

  TierManager* const tiers_;
  LeaseManager* const leases_;
  DeviceCopiers* const copiers_;
  const BlockServiceOptions options_;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_BLOCK_SERVICE_H_
