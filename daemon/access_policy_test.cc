// Trust groups of the access policy (issue #25): the rules checked at start,
// and what a caller matched by the policy may write and see.
#include "daemon/access_policy.h"

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kPrincipals[] = R"pb(
  principals { name: "alice" uids: 1001 namespaces: "shared" namespaces: "alice" }
  principals { name: "bob" uids: 1002 namespaces: "shared" }
  principals { name: "carol" uids: 1003 namespaces: "shared" }
  principals { name: "ops" uids: 1004 namespaces: "*" admin: true }
  principals { name: "any" uids: 1005 namespaces: "*" }
)pb";

absl::StatusOr<AccessPolicy> ParseWith(const std::string& namespaces) {
  return AccessPolicy::Parse(std::string(kPrincipals) + namespaces, "test");
}

std::shared_ptr<const Caller> Peer(const AccessPolicy& policy, uid_t uid) {
  PeerCred peer;
  peer.uid = uid;
  peer.gid = uid;
  peer.pid = 1;
  absl::StatusOr<std::shared_ptr<const Caller>> c = policy.ForPeer(peer);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

v1::LayoutFingerprint Fp(const std::string& ns, const std::string& group) {
  v1::LayoutFingerprint fp;
  fp.set_namespace_(ns);
  fp.set_trust_group(group);
  return fp;
}

TEST(TrustGroupTest, RefusesGroupsThatCannotMeanWhatTheySay) {
  EXPECT_THAT(ParseWith(R"pb(namespaces { name: "shared" shared: true }
                             namespaces {
                               name: "alice"
                               trust_groups { name: "g" principals: "alice" }
                             })pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not shared")));
  EXPECT_THAT(ParseWith(R"pb(namespaces {
                               name: "shared"
                               shared: true
                               trust_groups { name: "g" principals: "mallory" }
                             })pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("trust_groups[0].principals: \"mallory\" is not a principal")));
  EXPECT_THAT(ParseWith(R"pb(namespaces {
                               name: "shared"
                               shared: true
                               trust_groups { name: "bob" principals: "alice" }
                             })pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is a principal's name")));
  EXPECT_THAT(ParseWith(R"pb(namespaces {
                               name: "shared"
                               shared: true
                               trust_groups { name: "g" principals: "alice" }
                               trust_groups { name: "g" principals: "bob" }
                             })pb")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("listed twice")));
  // A member must be allowed the namespace ("*" counts).
  EXPECT_THAT(AccessPolicy::Parse(R"pb(
                principals { name: "alice" uids: 1 namespaces: "shared" }
                principals { name: "eve" uids: 2 namespaces: "eve" }
                namespaces {
                  name: "shared"
                  shared: true
                  trust_groups { name: "g" principals: "alice" principals: "eve" }
                })pb",
                                  "test")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("\"eve\" may not use namespace \"shared\"")));
  EXPECT_TRUE(ParseWith(R"pb(namespaces {
                               name: "shared"
                               shared: true
                               trust_groups { name: "team" principals: "alice" principals: "any" }
                             })pb")
                  .ok());
}

TEST(TrustGroupTest, MembersSeeTheirGroupsBlocksOnly) {
  absl::StatusOr<AccessPolicy> policy = ParseWith(R"pb(namespaces {
                                                         name: "shared"
                                                         shared: true
                                                         trust_groups {
                                                           name: "team"
                                                           principals: "alice"
                                                           principals: "bob"
                                                         }
                                                       })pb");
  ASSERT_TRUE(policy.ok()) << policy.status();
  const auto alice = Peer(*policy, 1001), bob = Peer(*policy, 1002), carol = Peer(*policy, 1003),
             ops = Peer(*policy, 1004), any = Peer(*policy, 1005);
  ASSERT_TRUE(alice && bob && carol && ops && any);
  // The declared group: its members, and admins.
  for (const auto& c : {alice, bob, ops}) EXPECT_TRUE(c->SeesBlock(Fp("shared", "team")));
  EXPECT_FALSE(carol->SeesBlock(Fp("shared", "team")));
  // "*" opens the namespace, not the group.
  EXPECT_TRUE(any->Sees("shared"));
  EXPECT_FALSE(any->SeesBlock(Fp("shared", "team")));
  // Each principal is a group of one.
  EXPECT_TRUE(carol->SeesBlock(Fp("shared", "carol")));
  EXPECT_FALSE(alice->SeesBlock(Fp("shared", "carol")));
  EXPECT_TRUE(ops->SeesBlock(Fp("shared", "carol")));
  // A block without a group: only admins in a shared namespace (it has no
  // writer anyone else trusts); anyone who may use a private one.
  EXPECT_FALSE(alice->SeesBlock(Fp("shared", "")));
  EXPECT_TRUE(ops->SeesBlock(Fp("shared", "")));
  EXPECT_TRUE(alice->SeesBlock(Fp("alice", "")));
  EXPECT_FALSE(bob->SeesBlock(Fp("alice", "")));
  // What error messages list.
  EXPECT_EQ(alice->TrustGroupsIn("shared"), "[alice, team]");
  EXPECT_EQ(carol->TrustGroupsIn("shared"), "[carol]");
}

// A token file is read up to 4 KiB: a path that names a device or a huge
// file cannot make the start read without end.
TEST(AccessPolicyTest, ReadsAtMost4KiBOfATokenFile) {
  evoke::testing::TempDir dir;
  const std::string big = dir.Join("big.token");
  std::ofstream(big) << std::string(5000, 'x');
  const std::string policy = "principals { name: \"t\" namespaces: \"n\" token_file: \"";
  EXPECT_THAT(AccessPolicy::Parse(policy + big + "\" }", "test").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is over 4 KiB")));
  EXPECT_THAT(AccessPolicy::Parse(policy + "/dev/zero\" }", "test").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is over 4 KiB")));
  const std::string good = dir.Join("good.token");
  std::ofstream(good) << "0123456789abcdef0123\nsecond line ignored\n";
  EXPECT_TRUE(AccessPolicy::Parse(policy + good + "\" }", "test").ok());
}

// A token that "Bearer <token>" cannot carry (white space or a control byte
// inside) is refused at start, not left as a principal no call can reach.
// Found by fuzz_bearer_token.
TEST(AccessPolicyTest, RefusesATokenNoCallCouldPresent) {
  evoke::testing::TempDir dir;
  const std::string policy = "principals { name: \"t\" namespaces: \"n\" token_file: \"";
  for (const std::string& token : {std::string("0123456789 abcdef0123"),
                                   std::string("0123456789\tabcdef0123"),
                                   std::string("0123456789\0abcdef0123", 21)}) {
    const std::string path = dir.Join("t.token");
    std::ofstream(path, std::ios::binary | std::ios::trunc) << token << "\n";
    EXPECT_THAT(AccessPolicy::Parse(policy + path + "\" }", "test").status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("white space or a control character")));
  }
}

// Caps from the policy: a uid matched by several principals gets the
// largest of each; unset stays 0 (the daemon's per-uid default).
TEST(AccessPolicyTest, CapsAreTheLargestOfTheMatchedPrincipals) {
  absl::StatusOr<AccessPolicy> policy = AccessPolicy::Parse(R"pb(
    principals { name: "a" uids: 7 namespaces: "n" max_leases: 3 max_calls: 40 }
    principals { name: "b" gids: 9 namespaces: "m" max_leases: 5 max_rings: 2 }
  )pb", "test");
  ASSERT_TRUE(policy.ok()) << policy.status();
  PeerCred both;
  both.uid = 7;
  both.gid = 9;
  absl::StatusOr<std::shared_ptr<const Caller>> c = policy->ForPeer(both);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->caps().leases, 5u);
  EXPECT_EQ((*c)->caps().calls, 40u);
  EXPECT_EQ((*c)->caps().rings, 2u);
  const auto only_a = Peer(*policy, 7);
  ASSERT_TRUE(only_a);
  EXPECT_EQ(only_a->caps().rings, 0u);
}

// The policy shipped in deploy/ parses, and its engines share prefixes
// through their trust group.
TEST(TrustGroupTest, TheShippedPolicyParses) {
  std::ifstream in(std::string(EVOKE_SOURCE_DIR) + "/deploy/kubernetes/evoked-policy.yaml");
  ASSERT_TRUE(in) << "deploy/kubernetes/evoked-policy.yaml";
  // The ConfigMap's `policy.txtpb: |` block: its lines indented by 4.
  std::string line, text;
  bool in_block = false;
  while (std::getline(in, line)) {
    if (line.find("policy.txtpb: |") != std::string::npos) {
      in_block = true;
    } else if (in_block) {
      if (!line.empty() && line.rfind("    ", 0) != 0) break;
      text += (line.size() > 4 ? line.substr(4) : "") + "\n";
    }
  }
  ASSERT_FALSE(text.empty());
  absl::StatusOr<AccessPolicy> policy = AccessPolicy::Parse(text, "evoked-policy.yaml");
  ASSERT_TRUE(policy.ok()) << policy.status();
  const auto a = Peer(*policy, 20001), b = Peer(*policy, 20002);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(a->SeesBlock(Fp("prefixes", "serving")));
  EXPECT_TRUE(b->SeesBlock(Fp("prefixes", "serving")));
  EXPECT_FALSE(b->SeesBlock(Fp("prefixes", "engine-a")));
}

}  // namespace
}  // namespace evoke
