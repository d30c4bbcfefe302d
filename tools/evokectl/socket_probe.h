// Before evokectl dials a Unix socket through gRPC, it looks at the path
// itself: gRPC reports a missing file, a directory, a regular file, a stale
// socket (nothing listening) and a listener that never answers all alike, as
// UNAVAILABLE after its connect wait. An operator's tool should say which,
// naming the path, and say it at once.
#ifndef EVOKE_CLIENT_EVOKECTL_SOCKET_PROBE_H_
#define EVOKE_CLIENT_EVOKECTL_SOCKET_PROBE_H_

#include <string>

#include "absl/status/status.h"

namespace evoke::ctl {

// How long evokectl waits for a listener on a Unix socket to answer before
// it gives up (a process that accepted the connection but never speaks
// gRPC, or an evoked that is stuck).
inline constexpr double kUnixConnectSeconds = 2.0;

// Checks the socket at PATH ("unix:" already stripped): OK when something
// accepts a connection there. Otherwise UNAVAILABLE (no such file, a
// directory, not a socket, nothing listening) or PERMISSION_DENIED (the
// directory or the socket), in one line that starts "cannot reach evoked at
// unix:PATH: " and says why.
absl::Status ProbeUnixSocket(const std::string& path);

}  // namespace evoke::ctl

#endif  // EVOKE_CLIENT_EVOKECTL_SOCKET_PROBE_H_
