// Command-line flags and config file of evoked, mapped 1:1 onto
// DaemonOptions. Sizes accept units ("64MiB", "1.5GiB", "4096").
#ifndef EVOKE_DAEMON_DAEMON_FLAGS_H_
#define EVOKE_DAEMON_DAEMON_FLAGS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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
// reads back to exactly the same options, whatever the values (sizes of any
// magnitude, paths with quotes, `#`, backslashes, spaces or control bytes):
// used by --print-config.
std::string OptionsToConfig(const DaemonOptions& options);

// The config file format, a subset of TOML: one `key = value` per line;
// blank lines and lines starting with `#` are ignored; `value` is either a
// basic string in double quotes (escapes \\ \" \n \t \r \b \f \uXXXX
// \UXXXXXXXX; any other byte, `#` included, stands for itself), a literal
// string in single quotes (no escapes), or a bare word ending at the first
// `#` or the end of the line, trimmed. A `#` comment may follow a quoted
// value. Anything else (a section, a key without `=`, text after a closing
// quote, an unterminated string, a bad escape) is INVALID_ARGUMENT naming
// the line. ParseConfigText returns the (key, value) pairs in file order.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseConfigText(
    absl::string_view text);

// QuoteConfigString renders `value` as a basic string that ParseConfigText
// reads back byte for byte.
std::string QuoteConfigString(absl::string_view value);

}  // namespace evoke

#endif  // EVOKE_DAEMON_DAEMON_FLAGS_H_
