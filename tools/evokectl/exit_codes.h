// evokectl's exit statuses: the one table that maps a failure (a gRPC /
// absl status code) to what the process returns, so that scripts can tell
// "not there" from "daemon down" from "data damaged" without parsing text.
#ifndef EVOKE_CLIENT_EVOKECTL_EXIT_CODES_H_
#define EVOKE_CLIENT_EVOKECTL_EXIT_CODES_H_

#include "absl/status/status.h"

namespace evoke::ctl {

enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,             // Anything not below (refused input, internal).
  kExitUsage = 2,             // Bad command line; nothing was done.
  kExitNotFound = 3,          // A named block, session or file does not exist.
  kExitUnavailable = 4,       // evoked not running, unreachable or too slow.
  kExitDataLoss = 5,          // Corruption found (verify) or a damaged file.
  kExitPermissionDenied = 6,  // Refused: no rights (socket, namespace, file).
};

// ExitCodeFor maps a failed status to its exit code (kExitOk for OK).
ExitCode ExitCodeFor(const absl::Status& status);

// The table as printed after `evokectl --help` and in docs/EVOKECTL.md.
const char* ExitCodeTable();

}  // namespace evoke::ctl

#endif  // EVOKE_CLIENT_EVOKECTL_EXIT_CODES_H_
