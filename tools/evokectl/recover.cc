#include "tools/evokectl/recover.h"

#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/evokectl/print.h"

namespace evoke::ctl {
namespace {

absl::StatusOr<v1::SummaryKind> KindOf(const std::string& name) {
  if (name == "mean") return v1::SUMMARY_MEAN_KEYS;
  if (name == "repr") return v1::SUMMARY_REPR_KEYS;
  if (name == "embedding") return v1::SUMMARY_EMBEDDING;
  return absl::InvalidArgumentError(
      absl::StrCat("--kind: ", name, " is not mean, repr or embedding"));
}

absl::Status QueryFromFile(const RecoverCommand& c, v1::RecoverRequest& req) {
  if (c.heads == 0) return absl::InvalidArgumentError("--heads: needed with --query-file");
  std::ifstream in(c.query_file);
  if (!in) return absl::NotFoundError(absl::StrCat("--query-file: cannot open ", c.query_file));
  std::string word;
  while (in >> word) {
    float v = 0;
    std::istringstream one(word);
    if (!(one >> v) || !one.eof()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--query-file: ", word, " is not a number"));
    }
    req.add_queries(v);
  }
  req.set_n_query_heads(c.heads);
  if (c.layer >= 0) req.set_layer(static_cast<uint32_t>(c.layer));
  return absl::OkStatus();
}

absl::Status QueryFromBlock(Client& client, const RecoverCommand& c, v1::RecoverRequest& req) {
  absl::StatusOr<BlockId> id = BlockId::FromHex(c.like);
  if (!id.ok()) return absl::InvalidArgumentError(absl::StrCat("--like: ", id.status().message()));
  absl::StatusOr<v1::BlockInfo> info = client.Describe(*id);
  if (!info.ok()) return info.status();
  for (const v1::Summary& s : info->meta().summaries()) {
    if (s.kind() != req.kind() || (c.layer >= 0 && s.layer() != c.layer)) continue;
    req.mutable_queries()->Assign(s.values().begin(), s.values().end());
    req.set_n_query_heads(s.heads());
    req.set_layer(s.layer());
    req.add_exclude_ids(id->ToBytes());
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("--like: block ", c.like, " has no ", c.kind,
                                          " summary", c.layer >= 0 ? " of that layer" : ""));
}

}  // namespace

absl::Status Recover(Client& client, const RecoverCommand& c) {
  if (c.like.empty() == c.query_file.empty()) {
    return absl::InvalidArgumentError("--like or --query-file: give exactly one");
  }
  v1::RecoverRequest req;
  req.mutable_session()->set_namespace_(c.ns);
  req.mutable_session()->set_session_id(c.session);
  absl::StatusOr<v1::SummaryKind> kind = KindOf(c.kind);
  if (!kind.ok()) return kind.status();
  req.set_kind(*kind);
  req.set_k(c.k);
  absl::Status built = c.like.empty() ? QueryFromFile(c, req) : QueryFromBlock(client, c, req);
  if (!built.ok()) return built;
  absl::StatusOr<v1::RecoverResponse> r = client.Recover(req);
  if (!r.ok()) return r.status();
  if (c.json) {
    PrintJson(*r);
    return absl::OkStatus();
  }
  int rank = 0;
  for (const v1::RecoveredBlock& b : r->blocks()) {
    const v1::BlockMeta& m = b.meta();
    std::cout << absl::StrFormat("%3d  %s  score %-10.4g %-10s seq %-6u positions [%d, %d)\n",
                                 ++rank, absl::BytesToHexString(b.id()), b.score(),
                                 TierName(b.tier()), m.sequence(), m.first_position(),
                                 m.first_position() + static_cast<int32_t>(m.n_tokens()));
  }
  if (rank == 0) std::cout << "no blocks\n";
  return absl::OkStatus();
}

}  // namespace evoke::ctl
