#include "common/peer_cred.h"

#include <sys/socket.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

TEST(PeerCredTest, SocketPairReportsThisProcess) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  absl::StatusOr<PeerCred> peer = GetPeerCred(sv[0]);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->pid, getpid());
  EXPECT_EQ(peer->uid, getuid());
  EXPECT_EQ(peer->gid, getgid());
  EXPECT_THAT(DescribePeer(*peer), ::testing::HasSubstr("pid"));
  close(sv[0]);
  close(sv[1]);
}

TEST(PeerCredTest, PipeIsNotASocket) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  EXPECT_THAT(GetPeerCred(p[0]), StatusIs(absl::StatusCode::kFailedPrecondition));
  close(p[0]);
  close(p[1]);
}

}  // namespace
}  // namespace evoke
