#include "daemon/access_policy.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace evoke {
namespace {

// Collects the first parse error with its line (1-based) and column.
class FirstError final : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (error_.empty()) error_ = absl::StrCat("line ", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

// Namespaces follow BlockMeta's rules loosely; "*" means all.
bool PlausibleNamespace(absl::string_view ns) {
  return !ns.empty() && ns.size() <= 256 &&
         ns.find_first_of(absl::string_view("\0\n", 2)) == absl::string_view::npos;
}

// Constant-time equality for equal-length strings; lengths leak, contents do not.
bool SameToken(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

}  // namespace

namespace {
std::string GroupKey(absl::string_view ns, absl::string_view group) {
  return absl::StrCat(ns, "\x1f", group);
}
}  // namespace

bool Caller::InTrustGroup(absl::string_view ns, absl::string_view group) const {
  if (admin_) return true;
  if (group.empty()) return !shared_.contains(ns);
  return principals_.contains(group) || groups_.contains(GroupKey(ns, group));
}

std::string Caller::TrustGroupsIn(absl::string_view ns) const {
  std::vector<std::string> names(principals_.begin(), principals_.end());
  const std::string prefix = GroupKey(ns, "");
  for (const std::string& key : groups_) {
    if (absl::StartsWith(key, prefix)) names.push_back(key.substr(prefix.size()));
  }
  std::sort(names.begin(), names.end());
  return absl::StrCat("[", absl::StrJoin(names, ", "), "]");
}

std::shared_ptr<const Caller> Caller::Unrestricted() {
  static const std::shared_ptr<const Caller> all = [] {
    auto c = std::make_shared<Caller>();
    c->name_ = "in-process";
    c->admin_ = true;
    c->cuda_regions_ = true;
    c->all_namespaces_ = true;
    return c;
  }();
  return all;
}

AccessPolicy AccessPolicy::OwnerOnly(uid_t owner) {
  AccessPolicy p;
  p.owner_ = owner;
  return p;
}

absl::StatusOr<AccessPolicy> AccessPolicy::Parse(absl::string_view text,
                                                 absl::string_view origin) {
  AccessPolicy p;
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &p.proto_)) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", errors.error()));
  }
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": ", what));
  };
  for (int i = 0; i < p.proto_.namespaces_size(); ++i) {
    const v1::NamespacePolicy& ns = p.proto_.namespaces(i);
    const std::string field = absl::StrCat("namespaces[", i, "]");
    if (!PlausibleNamespace(ns.name()) || ns.name() == "*") {
      return bad(absl::StrCat(field, ".name: \"", absl::CEscape(ns.name()),
                              "\" is not a namespace name"));
    }
    if (!p.namespaces_.emplace(ns.name(), static_cast<size_t>(i)).second) {
      return bad(absl::StrCat(field, ".name: \"", ns.name(), "\" is listed twice"));
    }
  }
  absl::flat_hash_map<std::string, size_t> users;  // namespace -> principals using it.
  for (int i = 0; i < p.proto_.principals_size(); ++i) {
    const v1::Principal& pr = p.proto_.principals(i);
    const std::string field = absl::StrCat("principals[", i, "]");
    if (pr.name().empty()) return bad(absl::StrCat(field, ".name: is required"));
    if (pr.uids().empty() && pr.gids().empty() && pr.token_file().empty()) {
      return bad(absl::StrCat(field, " (", pr.name(),
                              "): matches nobody (give uids, gids or token_file)"));
    }
    if (pr.namespaces().empty() && !pr.admin()) {
      return bad(absl::StrCat(field, " (", pr.name(),
                              "): has no namespaces and is not an admin"));
    }
    for (const std::string& ns : pr.namespaces()) {
      if (ns == "*") continue;
      if (!PlausibleNamespace(ns)) {
        return bad(absl::StrCat(field, ".namespaces: \"", absl::CEscape(ns),
                                "\" is not a namespace name"));
      }
      ++users[ns];
    }
    if (!pr.token_file().empty()) {
      // At most 4 KiB: a token is one short line, and the path could name
      // anything (a device, a huge file).
      std::ifstream in(pr.token_file(), std::ios::binary);
      if (!in) return bad(absl::StrCat(field, ".token_file: cannot read ", pr.token_file()));
      std::string token(4097, '\0');
      in.read(token.data(), static_cast<std::streamsize>(token.size()));
      token.resize(static_cast<size_t>(in.gcount()));
      if (token.size() > 4096) {
        return bad(absl::StrCat(field, ".token_file: ", pr.token_file(), " is over 4 KiB"));
      }
      token = token.substr(0, token.find('\n'));
      token = std::string(absl::StripAsciiWhitespace(token));
      if (token.size() < 16) {
        return bad(absl::StrCat(field, ".token_file: ", pr.token_file(),
                                " holds a token shorter than 16 characters"));
      }
      // A call presents "Bearer <token>", which allows no white space or
      // control byte in the token: such a principal could never be reached.
      if (std::any_of(token.begin(), token.end(), [](char ch) {
            const auto u = static_cast<unsigned char>(ch);
            return absl::ascii_isspace(u) || absl::ascii_iscntrl(u);
          })) {
        return bad(absl::StrCat(field, ".token_file: ", pr.token_file(),
                                " holds a token with white space or a control character inside"
                                " (a call sends \"Bearer <token>\", which allows neither)"));
      }
      for (const auto& [other, t] : p.tokens_) {
        if (SameToken(t, token)) {
          return bad(absl::StrCat(field, ".token_file: the same token as principals[",
                                  other, "]"));
        }
      }
      p.tokens_.emplace_back(static_cast<size_t>(i), std::move(token));
    }
  }
  // Two principals on one namespace is sharing, and must be said so: a
  // shared namespace accepts only verified prefix blocks.
  for (const auto& [ns, n] : users) {
    if (n > 1 && !p.IsShared(ns)) {
      return bad(absl::StrCat("namespace \"", ns, "\" is listed by ", n,
                              " principals but is not declared shared "
                              "(namespaces { name: \"", ns, "\" shared: true })"));
    }
  }
  EVOKE_RETURN_IF_ERROR(p.CheckTrustGroups(origin));
  return p;
}

absl::Status AccessPolicy::CheckTrustGroups(absl::string_view origin) const {
  absl::flat_hash_map<std::string, const v1::Principal*> principals;
  for (const v1::Principal& pr : proto_.principals()) principals.emplace(pr.name(), &pr);
  for (int i = 0; i < proto_.namespaces_size(); ++i) {
    const v1::NamespacePolicy& ns = proto_.namespaces(i);
    if (ns.trust_groups().empty()) continue;
    if (!ns.shared()) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, ": namespaces[", i, "].trust_groups: namespace \"", ns.name(),
          "\" is not shared (trust groups are for shared namespaces)"));
    }
    absl::flat_hash_set<std::string> seen;
    for (int g = 0; g < ns.trust_groups_size(); ++g) {
      const v1::TrustGroup& group = ns.trust_groups(g);
      const std::string field = absl::StrCat(origin, ": namespaces[", i, "].trust_groups[", g, "]");
      if (group.name().empty() || group.name().size() > 128) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".name: must be 1..128 bytes"));
      }
      if (principals.contains(group.name())) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".name: \"", group.name(),
                         "\" is a principal's name (each principal is already its own group)"));
      }
      if (!seen.insert(group.name()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".name: \"", group.name(), "\" is listed twice"));
      }
      for (const std::string& name : group.principals()) {
        auto it = principals.find(name);
        if (it == principals.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ".principals: \"", name, "\" is not a principal"));
        }
        const auto& uses = it->second->namespaces();
        if (std::find(uses.begin(), uses.end(), ns.name()) == uses.end() &&
            std::find(uses.begin(), uses.end(), "*") == uses.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ".principals: \"", name, "\" may not use namespace \"", ns.name(), "\""));
        }
      }
    }
  }
  return absl::OkStatus();
}

void AccessPolicy::Grant(const v1::Principal& pr, Caller* c) const {
  c->admin_ = c->admin_ || pr.admin();
  c->cuda_regions_ = c->cuda_regions_ || pr.cuda_regions();
  c->caps_.leases = std::max(c->caps_.leases, pr.max_leases());
  c->caps_.calls = std::max(c->caps_.calls, pr.max_calls());
  c->caps_.rings = std::max(c->caps_.rings, pr.max_rings());
  c->caps_.mapped_bytes = std::max<uint64_t>(c->caps_.mapped_bytes, pr.max_mapped_bytes());
  c->principals_.insert(pr.name());
  for (const std::string& ns : pr.namespaces()) {
    if (ns == "*") {
      c->all_namespaces_ = true;
    } else {
      c->namespaces_.insert(ns);
    }
  }
  for (const v1::NamespacePolicy& ns : proto_.namespaces()) {
    if (ns.shared()) c->shared_.insert(ns.name());
    for (const v1::TrustGroup& group : ns.trust_groups()) {
      for (const std::string& name : group.principals()) {
        if (name == pr.name()) c->groups_.insert(GroupKey(ns.name(), group.name()));
      }
    }
  }
}

absl::StatusOr<AccessPolicy> AccessPolicy::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--policy: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().size() > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("--policy: ", path, " is over 1 MiB"));
  }
  return Parse(text.str(), absl::StrCat("--policy ", path));
}

absl::StatusOr<std::shared_ptr<const Caller>> AccessPolicy::ForPeer(
    const PeerCred& peer) const {
  auto c = std::make_shared<Caller>();
  c->uid_ = peer.uid;
  c->writer_ = absl::StrCat("uid:", peer.uid);
  if (owner_.has_value()) {
    if (peer.uid != *owner_ && peer.uid != 0) {
      return absl::PermissionDeniedError(absl::StrCat(
          DescribePeer(peer), " may not use this evoked (no --policy: only uid ", *owner_,
          " and root may)"));
    }
    c->name_ = absl::StrCat("owner (", DescribePeer(peer), ")");
    c->admin_ = true;
    c->all_namespaces_ = true;
    return std::shared_ptr<const Caller>(std::move(c));
  }
  std::vector<std::string> names;
  for (const v1::Principal& pr : proto_.principals()) {
    bool match = false;
    for (uint32_t u : pr.uids()) match = match || u == peer.uid;
    for (uint32_t g : pr.gids()) match = match || g == peer.gid;
    if (!match) continue;
    names.push_back(pr.name());
    Grant(pr, c.get());
  }
  if (names.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(DescribePeer(peer), " is not a principal of the access policy"));
  }
  c->name_ = absl::StrCat(absl::StrJoin(names, "+"), " (", DescribePeer(peer), ")");
  return std::shared_ptr<const Caller>(std::move(c));
}

absl::StatusOr<std::shared_ptr<const Caller>> AccessPolicy::ForToken(
    absl::string_view token) const {
  // Every principal's token is compared, so the time does not say which
  // one (or whether any) matched.
  std::optional<size_t> found;
  for (const auto& [index, t] : tokens_) {
    if (SameToken(t, token) && !found) found = index;
  }
  if (!found) return absl::UnauthenticatedError("bearer token not recognized");
  const v1::Principal& pr = proto_.principals(static_cast<int>(*found));
  auto c = std::make_shared<Caller>();
  c->name_ = absl::StrCat(pr.name(), " (token)");
  c->writer_ = absl::StrCat("principal:", pr.name());
  Grant(pr, c.get());
  return std::shared_ptr<const Caller>(std::move(c));
}

const v1::NamespacePolicy* AccessPolicy::Namespace(absl::string_view ns) const {
  auto it = namespaces_.find(ns);
  return it == namespaces_.end() ? nullptr
                                 : &proto_.namespaces(static_cast<int>(it->second));
}

NamespaceQuota AccessPolicy::QuotaOf(absl::string_view ns) const {
  NamespaceQuota q;
  if (const v1::NamespacePolicy* p = Namespace(ns); p != nullptr) {
    q.tier1_bytes = p->tier1_bytes();
    q.tier2_bytes = p->tier2_bytes();
    q.metadata_bytes = p->metadata_bytes();
  }
  return q;
}

std::string AccessPolicy::Summary() const {
  if (owner_.has_value()) {
    return absl::StrCat("access: no --policy; uid ", *owner_, " and root only");
  }
  std::vector<std::string> lines;
  for (const v1::Principal& pr : proto_.principals()) {
    lines.push_back(absl::StrCat(
        pr.name(), ": uids [", absl::StrJoin(pr.uids(), ","), "] gids [",
        absl::StrJoin(pr.gids(), ","), "]", pr.token_file().empty() ? "" : " token",
        " namespaces [", absl::StrJoin(pr.namespaces(), ","), "]", pr.admin() ? " admin" : ""));
  }
  return absl::StrCat("access policy: ", absl::StrJoin(lines, "; "));
}

}  // namespace evoke
