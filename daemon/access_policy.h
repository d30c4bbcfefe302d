// AccessPolicy: who may use which namespaces of this evoked, and who is an
// admin. Callers are identified by the kernel (SO_PEERCRED on the Unix
// sockets) or by a bearer token (TCP), never by what a request says.
#ifndef EVOKE_DAEMON_ACCESS_POLICY_H_
#define EVOKE_DAEMON_ACCESS_POLICY_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/peer_cred.h"
#include "evoke/v1/access.pb.h"
#include "storage/tier_types.h"

namespace evoke {

// Caller: the rights of one identified caller. It is the NamespaceScope the
// service hands to storage, so another tenant's blocks read as absent.
class Caller final : public NamespaceScope {
 public:
  // Everything: in-process embedders and tests that run no policy.
  static std::shared_ptr<const Caller> Unrestricted();

  bool SeesAll() const override { return all_namespaces_; }
  bool Sees(absl::string_view ns) const override {
    return all_namespaces_ || namespaces_.contains(ns);
  }
  // A block is visible when its namespace is and the caller trusts its
  // writers: an admin, a member of the block's trust group, or (for a block
  // without one) anyone outside shared namespaces.
  bool SeesBlock(const v1::LayoutFingerprint& fp) const override {
    return Sees(fp.namespace_()) && InTrustGroup(fp.namespace_(), fp.trust_group());
  }
  bool SeesEveryBlock() const override { return all_namespaces_ && admin_; }
  // Whether the caller may write and read blocks of trust group `group` in
  // `ns` (see SeesBlock). Admins may, for every group.
  bool InTrustGroup(absl::string_view ns, absl::string_view group) const;
  // The trust groups the caller belongs to in `ns`, for error messages.
  std::string TrustGroupsIn(absl::string_view ns) const;
  bool admin() const { return admin_; }
  // "engine-a (uid 1000 gid 1000 pid 42)", for logs and errors.
  const std::string& name() const { return name_; }
  // The Unix uid, or nullopt for a TCP caller.
  std::optional<uid_t> uid() const { return uid_; }
  // The namespaces named for it (without "*").
  const absl::flat_hash_set<std::string>& namespaces() const { return namespaces_; }
  // What a block it saves records as its writer (BlockMeta.writer):
  // "uid:N" for a Unix peer, "principal:NAME" for a TCP one, "" in-process.
  const std::string& writer() const { return writer_; }
  // May register CUDA regions: Unix peers, in-process callers, and TCP
  // principals whose policy entry says cuda_regions.
  bool may_register_cuda() const { return uid_.has_value() || cuda_regions_; }
  // Its fair-share caps from the policy (0: the daemon's per-uid default).
  struct Caps {
    uint32_t leases = 0;
    uint32_t calls = 0;
    uint32_t rings = 0;
    uint64_t mapped_bytes = 0;
  };
  const Caps& caps() const { return caps_; }
  // Tokens (prompts) are shown to admins and to the block's writer only.
  bool SeesTokensOf(const v1::BlockMeta& meta) const override {
    return admin_ || (!meta.writer().empty() && meta.writer() == writer_);
  }

 private:
  friend class AccessPolicy;
  std::string name_;
  bool admin_ = false;
  bool all_namespaces_ = false;
  absl::flat_hash_set<std::string> namespaces_;
  std::optional<uid_t> uid_;
  std::string writer_;
  bool cuda_regions_ = false;
  Caps caps_;
  // Trust: the names of the principals it matched (each a group of one in
  // every namespace), the declared groups it is in ("ns\x1fgroup"), and the
  // shared namespaces (where a block must name its group).
  absl::flat_hash_set<std::string> principals_;
  absl::flat_hash_set<std::string> groups_;
  absl::flat_hash_set<std::string> shared_;
};

class AccessPolicy {
 public:
  // OwnerOnly is the policy without --policy: the daemon's own uid and root
  // are admins of every namespace; every other uid is refused. (The socket
  // is 0660, so only the daemon's group can even connect.)
  static AccessPolicy OwnerOnly(uid_t owner);
  // Parse reads the protobuf text format of evoke.v1.AccessPolicy and checks
  // it (INVALID_ARGUMENT "<origin>: <problem>"); token files are read
  // relative to the working directory.
  static absl::StatusOr<AccessPolicy> Parse(absl::string_view text, absl::string_view origin);
  static absl::StatusOr<AccessPolicy> Load(const std::string& path);

  // ForPeer returns the rights of a Unix-socket peer: the union of every
  // principal whose uids or gids it matches. PERMISSION_DENIED when none.
  absl::StatusOr<std::shared_ptr<const Caller>> ForPeer(const PeerCred& peer) const;
  // ForToken returns the principal whose bearer token this is (compared in
  // constant time per principal). UNAUTHENTICATED otherwise.
  absl::StatusOr<std::shared_ptr<const Caller>> ForToken(absl::string_view token) const;

  // The namespace's settings (shared, quotas), or null.
  const v1::NamespacePolicy* Namespace(absl::string_view ns) const;
  bool IsShared(absl::string_view ns) const {
    const v1::NamespacePolicy* p = Namespace(ns);
    return p != nullptr && p->shared();
  }
  const v1::AccessPolicy& proto() const { return proto_; }
  bool has_tokens() const { return !tokens_.empty(); }
  // The quotas of `ns` (zeros: none).
  NamespaceQuota QuotaOf(absl::string_view ns) const;
  // One line per principal, for the start log (no tokens).
  std::string Summary() const;

 private:
  v1::AccessPolicy proto_;
  // Principal index -> its bearer token (read from token_file).
  std::vector<std::pair<size_t, std::string>> tokens_;
  absl::flat_hash_map<std::string, size_t> namespaces_;  // name -> index in proto_.
  std::optional<uid_t> owner_;  // OwnerOnly.

  // Adds what principal `pr` grants to `c`.
  void Grant(const v1::Principal& pr, Caller* c) const;
  // Checks the namespaces' trust_groups against the principals.
  absl::Status CheckTrustGroups(absl::string_view origin) const;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_ACCESS_POLICY_H_
