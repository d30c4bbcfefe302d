// fuzz_access_policy: the access policy (--policy, daemon/access_policy.h)
// from arbitrary bytes, and what the callers it accepts may see.
//
// Input (FuzzedDataProvider): the policy text, then up to 8 probes, each a
// peer (uid, gid) and a block's namespace and trust group. Parse must never
// crash; a policy it accepts must hold its own rules for every probe:
//   - a block is visible only in a namespace the caller may use;
//   - a caller that sees every block (an admin of "*") sees each one;
//   - in a shared namespace, a block without a trust group is seen by
//     admins (of that namespace) only, and one of a group by its members
//     and admins only;
//   - each principal is a group of one: the principal whose uid matched
//     sees its own group's blocks in every namespace it may use.
// Inputs that name a token_file are skipped: those are paths the operator
// chose (the parser reads at most 4 KiB of each), not bytes from a client.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "daemon/access_policy.h"
#include "fuzz/fuzz_check.h"

namespace evoke {
namespace {

bool Lists(const v1::Principal& pr, const std::string& ns) {
  return std::find(pr.namespaces().begin(), pr.namespaces().end(), ns) != pr.namespaces().end() ||
         std::find(pr.namespaces().begin(), pr.namespaces().end(), "*") != pr.namespaces().end();
}

void Run(FuzzedDataProvider& in) {
  const std::string text = in.ConsumeRandomLengthString(8192);
  if (text.find("token_file") != std::string::npos) return;
  absl::StatusOr<AccessPolicy> policy = AccessPolicy::Parse(text, "fuzz");
  if (!policy.ok()) {
    FUZZ_CHECK(policy.status().code() == absl::StatusCode::kInvalidArgument);
    return;
  }
  (void)policy->Summary();
  const v1::AccessPolicy& proto = policy->proto();
  for (int probe = 0; probe < 8 && in.remaining_bytes() > 0; ++probe) {
    PeerCred peer;
    peer.uid = in.ConsumeIntegralInRange<uid_t>(0, 8);
    peer.gid = in.ConsumeIntegralInRange<gid_t>(0, 8);
    peer.pid = 1;
    // Namespaces and groups from the policy's own names, or made up.
    auto pick_name = [&](bool group) -> std::string {
      const int choice = in.ConsumeIntegralInRange<int>(0, 3);
      if (choice == 0 || proto.namespaces_size() == 0) return in.ConsumeRandomLengthString(16);
      const v1::NamespacePolicy& ns =
          proto.namespaces(in.ConsumeIntegralInRange<int>(0, proto.namespaces_size() - 1));
      if (!group) return ns.name();
      if (choice == 1 && ns.trust_groups_size() > 0) {
        return ns.trust_groups(in.ConsumeIntegralInRange<int>(0, ns.trust_groups_size() - 1))
            .name();
      }
      if (choice == 2 && proto.principals_size() > 0) {
        return proto.principals(in.ConsumeIntegralInRange<int>(0, proto.principals_size() - 1))
            .name();
      }
      return "";
    };
    v1::LayoutFingerprint fp;
    fp.set_namespace_(pick_name(false));
    fp.set_trust_group(pick_name(true));
    absl::StatusOr<std::shared_ptr<const Caller>> caller = policy->ForPeer(peer);
    if (!caller.ok()) {
      FUZZ_CHECK(caller.status().code() == absl::StatusCode::kPermissionDenied);
      continue;
    }
    const Caller& c = **caller;
    const bool sees = c.SeesBlock(fp);
    if (sees) FUZZ_CHECK(c.Sees(fp.namespace_()));
    if (c.SeesEveryBlock()) FUZZ_CHECK(sees);
    if (policy->IsShared(fp.namespace_()) && fp.trust_group().empty()) {
      FUZZ_CHECK(sees == (c.admin() && c.Sees(fp.namespace_())));
    }
    // A group is seen by a non-admin only if one of its matched principals
    // is the group, or is listed in it for this namespace.
    if (sees && !c.admin() && !fp.trust_group().empty()) {
      bool member = false;
      for (const v1::Principal& pr : proto.principals()) {
        bool match = false;
        for (uint32_t u : pr.uids()) match = match || u == peer.uid;
        for (uint32_t g : pr.gids()) match = match || g == peer.gid;
        if (!match) continue;
        member = member || pr.name() == fp.trust_group();
        const v1::NamespacePolicy* ns = policy->Namespace(fp.namespace_());
        if (ns == nullptr) continue;
        for (const v1::TrustGroup& group : ns->trust_groups()) {
          if (group.name() != fp.trust_group()) continue;
          for (const std::string& name : group.principals()) member = member || name == pr.name();
        }
      }
      FUZZ_CHECK(member);
    }
    // Its own group: every principal it matched, where it may write.
    for (const v1::Principal& pr : proto.principals()) {
      bool match = false;
      for (uint32_t u : pr.uids()) match = match || u == peer.uid;
      for (uint32_t g : pr.gids()) match = match || g == peer.gid;
      if (!match || pr.namespaces().empty()) continue;
      v1::LayoutFingerprint own = fp;
      own.set_namespace_(pr.namespaces(0) == "*" ? fp.namespace_() : pr.namespaces(0));
      own.set_trust_group(pr.name());
      if (Lists(pr, own.namespace_())) FUZZ_CHECK(c.SeesBlock(own));
    }
  }
}

}  // namespace
}  // namespace evoke

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  evoke::Run(in);
  return 0;
}
