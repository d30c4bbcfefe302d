// evokectl watch: block events from WatchBlocks, one line each.
#ifndef EVOKE_TOOLS_EVOKECTL_WATCH_H_
#define EVOKE_TOOLS_EVOKECTL_WATCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "evoke/client.h"

namespace evoke::ctl {

// WatchEvents prints block events of `ns` (empty: all the caller may see)
// of `kinds` ("stored", ...; empty: all), after `resume_token` (bytes;
// empty: from now), one line each (JSON lines with `json`), until `count`
// of them (0: no end) or the stream ends, which is the error returned. At
// exit, the token to resume after the last event printed goes to stderr
// ("resume: HEX"); losses are reported there too.
absl::Status WatchEvents(Client& client, const std::string& ns,
                         const std::vector<std::string>& kinds, const std::string& resume_token,
                         uint64_t count, bool json);

}  // namespace evoke::ctl

#endif  // EVOKE_TOOLS_EVOKECTL_WATCH_H_
