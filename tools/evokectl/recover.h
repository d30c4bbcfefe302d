// evokectl recover: which stored blocks of a session a recovery query
// would bring back, best first, for a query given as a file of floats or
// taken from a stored block's own key summary ("blocks like this one").
#ifndef EVOKE_TOOLS_EVOKECTL_RECOVER_H_
#define EVOKE_TOOLS_EVOKECTL_RECOVER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "evoke/client.h"

namespace evoke::ctl {

struct RecoverCommand {
  std::string ns, session;
  std::string like;        // A block id (hex): its summary is the query.
  std::string query_file;  // Or: whitespace-separated floats, heads x dim.
  uint32_t heads = 0;      // With query_file: the query heads.
  std::string kind = "mean";  // mean, repr or embedding.
  int64_t layer = -1;      // -1: --like's first summary of that kind; else 0.
  uint32_t k = 8;
  bool json = false;
};

// Recover runs the query and prints the blocks (JSON with `json`). Errors
// name the option or the daemon's field.
absl::Status Recover(Client& client, const RecoverCommand& c);

}  // namespace evoke::ctl

#endif  // EVOKE_TOOLS_EVOKECTL_RECOVER_H_
