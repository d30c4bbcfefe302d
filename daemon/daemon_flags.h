// Command-line flags and config file of evoked, mapped 1:1 onto
// DaemonOptions. Sizes accept units ("64MiB", "1.5GiB", "4096").
#ifndef EVOKE_DAEMON_DAEMON_FLAGS_H_
#define EVOKE_DAEMON_DAEMON_FLAGS_H_

#include <string>

#include "absl/status/status.h"
#include "daemon/daemon_options.h"

namespace evoke {

// ParseDaemonFlags fills `options` from argv, starting from its current
// values. `--config FILE` reads a config file first (lines `key = value`,
// keys spelled like the flags without "--", `#` comments); flags given on the
// command line override it. On --help, --version or --print-config it sets
// `*exit_now` and puts the text to print in `*output`. Returns
// INVALID_ARGUMENT for an unknown flag, a malformed value, or options that
// fail DaemonOptions::Validate(), with a message naming the flag.
absl::Status ParseDaemonFlags(int argc, const char* const* argv,
                              DaemonOptions* options, std::string* output,
                              bool* exit_now);

// OptionsToConfig renders `options` as a config file that ParseDaemonFlags
// reads back to the same options (used by --print-config).
std::string OptionsToConfig(const DaemonOptions& options);

}  // namespace evoke

#endif  // EVOKE_DAEMON_DAEMON_FLAGS_H_
