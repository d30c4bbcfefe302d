#include "common/peer_cred.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace evoke {

absl::StatusOr<PeerCred> GetPeerCred(int fd) {
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    const int err = errno;
    if (err == ENOTSOCK || err == ENOPROTOOPT || err == EINVAL) {
      return absl::FailedPreconditionError(
          absl::StrCat("SO_PEERCRED: fd ", fd, " is not a Unix socket: ", std::strerror(err)));
    }
    return absl::InternalError(absl::StrCat("SO_PEERCRED: ", std::strerror(err)));
  }
  if (len != sizeof(cred)) {
    return absl::InternalError("SO_PEERCRED: short answer");
  }
  PeerCred peer;
  peer.pid = cred.pid;
  peer.uid = cred.uid;
  peer.gid = cred.gid;
  return peer;
}

std::string DescribePeer(const PeerCred& peer) {
  return absl::StrCat("uid ", peer.uid, " gid ", peer.gid, " pid ", peer.pid);
}

}  // namespace evoke
