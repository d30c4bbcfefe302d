#include "tools/evokectl/watch.h"

#include <iostream>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "tools/evokectl/print.h"

namespace evoke::ctl {

absl::Status WatchEvents(Client& client, const std::string& ns,
                         const std::vector<std::string>& kinds, const std::string& resume_token,
                         uint64_t count, bool json) {
  v1::WatchBlocksRequest request;
  request.set_namespace_(ns);
  for (const std::string& k : kinds) {
    v1::BlockEventKind kind = v1::BLOCK_EVENT_KIND_UNSPECIFIED;
    v1::BlockEventKind_Parse(absl::StrCat("BLOCK_EVENT_", absl::AsciiStrToUpper(k)), &kind);
    request.add_kinds(kind);
  }
  request.set_resume_token(resume_token);
  absl::StatusOr<std::unique_ptr<BlockWatch>> w = client.WatchBlocks(request);
  if (!w.ok()) return w.status();
  v1::BlockEvents batch;
  std::string token;
  uint64_t seen = 0;
  absl::Status ended;
  while (count == 0 || seen < count) {
    if (!(*w)->Next(&batch)) {
      ended = (*w)->Finish();
      if (ended.ok()) ended = absl::UnavailableError("the watch stream ended");
      break;
    }
    token = batch.resume_token();
    if (batch.lost_unknown()) std::cerr << "lost: an unknown number of events (a new run)\n";
    if (batch.lost_events() > 0) std::cerr << "lost: " << batch.lost_events() << " events\n";
    for (const v1::BlockEvent& e : batch.events()) {
      if (json) {
        PrintJson(e);
      } else {
        const std::string kind = v1::BlockEventKind_Name(e.kind()).substr(12);  // BLOCK_EVENT_
        std::cout << e.seq() << " " << absl::AsciiStrToLower(kind) << " "
                  << absl::BytesToHexString(e.id()) << " " << e.namespace_() << " "
                  << TierName(e.tier()) << " -> " << TierName(e.location()) << "\n";
      }
      std::cout.flush();
      // Resume right after the last event printed (the batch may go on).
      const uint64_t next = e.seq() + 1;
      token.replace(8, 8, reinterpret_cast<const char*>(&next), 8);
      if (++seen == count) break;
    }
  }
  std::cerr << "resume: " << absl::BytesToHexString(token) << "\n";
  return ended;
}

}  // namespace evoke::ctl
