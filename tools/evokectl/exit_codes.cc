#include "tools/evokectl/exit_codes.h"

namespace evoke::ctl {

ExitCode ExitCodeFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kNotFound:
      return kExitNotFound;
    // A deadline or a cancelled call: the daemon did not answer in time,
    // which a retry (or a longer --timeout) may cure, as for a daemon that
    // is restarting.
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
      return kExitUnavailable;
    case absl::StatusCode::kDataLoss:
      return kExitDataLoss;
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return kExitPermissionDenied;
    default:
      return kExitError;
  }
}

const char* ExitCodeTable() {
  return "Exit status:\n"
         "  0  success\n"
         "  1  error not listed below (input refused by evoked, internal error)\n"
         "  2  usage error: unknown command or flag, malformed value (nothing done)\n"
         "  3  not found: a named block, session or file does not exist\n"
         "  4  unavailable: evoked is not running, unreachable or did not answer in time\n"
         "  5  data loss: verify found corrupt or missing blocks, or a block file or\n"
         "     stream is damaged or truncated (from a file, nothing of it is stored)\n"
         "  6  permission denied: the socket, namespace or file is not this user's\n";
}

}  // namespace evoke::ctl
