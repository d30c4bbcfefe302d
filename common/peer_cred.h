// PeerCred: who is on the other end of a Unix socket, as the kernel says
// (SO_PEERCRED), not as the client claims.
#ifndef EVOKE_COMMON_PEER_CRED_H_
#define EVOKE_COMMON_PEER_CRED_H_

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace evoke {

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
};

// GetPeerCred reads SO_PEERCRED of a connected AF_UNIX socket: the
// credentials of the process that connected (at connect time).
// Errors: FAILED_PRECONDITION (not a Unix socket), INTERNAL (getsockopt).
absl::StatusOr<PeerCred> GetPeerCred(int fd);

// "uid 1000 gid 1000 pid 42", for logs.
std::string DescribePeer(const PeerCred& peer);

}  // namespace evoke

#endif  // EVOKE_COMMON_PEER_CRED_H_
