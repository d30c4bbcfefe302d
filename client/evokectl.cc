// evokectl: inspect, verify and manage the blocks stored by evoked.
//
//   evokectl [--socket PATH] [--json] COMMAND ...
//
// The socket comes from --socket, else $EVOKE_SOCKET, else ./evoked.sock.
// Exit status: 0 on success, 1 with a one-line reason on stderr on any error
// (including corrupt blocks found by `verify`), 2 for usage errors.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/byte_size.h"
#include "common/fingerprint.h"
#include "evoke/block_file.h"
#include "evoke/client.h"

namespace evoke {
namespace {

// Fails the command: printed as one line, exit status 1.
struct CommandError {
  absl::Status status;
};

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) throw CommandError{v.status()};
  return std::move(v).value();
}
void Check(const absl::Status& s) {
  if (!s.ok()) throw CommandError{s};
}

std::string TierName(int tier) {
  switch (tier) {
    case v1::TIER_PINNED_HOST:
      return "pinned";
    case v1::TIER_SPILL:
      return "spill";
    case v1::TIER_BREADCRUMB:
      return "breadcrumb";
    default:
      return "-";
  }
}

BlockId ParseId(const std::string& hex) {
  absl::StatusOr<BlockId> id = BlockId::FromHex(hex);
  if (!id.ok()) {
    throw CommandError{absl::InvalidArgumentError(
        absl::StrCat("block id '", hex, "': ", id.status().message()))};
  }
  return *id;
}

// Rewrites proto-JSON bytes fields that hold ids (base64) as hex, so that
// ids in --json output can be pasted into other commands.
void HexIds(google::protobuf::Value* v) {
  if (v->has_struct_value()) {
    for (auto& [key, field] : *v->mutable_struct_value()->mutable_fields()) {
      if ((key == "id" || key == "parentId") && field.has_string_value()) {
        std::string raw;
        if (absl::Base64Unescape(field.string_value(), &raw) && raw.size() == 16) {
          field.set_string_value(absl::BytesToHexString(raw));
        }
      } else {
        HexIds(&field);
      }
    }
  } else if (v->has_list_value()) {
    for (auto& item : *v->mutable_list_value()->mutable_values()) HexIds(&item);
  }
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) {
    throw CommandError{absl::InternalError("cannot render JSON")};
  }
  google::protobuf::Value value;
  if (google::protobuf::util::JsonStringToMessage(json, &value).ok()) {
    HexIds(&value);
    std::string hexed;
    if (google::protobuf::util::MessageToJsonString(value, &hexed).ok()) return hexed;
  }
  return json;
}

void PrintJson(const google::protobuf::Message& message) {
  std::cout << ToJson(message) << "\n";
}

std::string Layers(const v1::BlockMeta& m) {
  return absl::StrCat(m.layer_begin(), "-", m.layer_end());
}

void PrintBlock(const v1::BlockInfo& info) {
  const v1::BlockMeta& m = info.meta();
  std::cout << "id:            " << BlockIdOf(m).ToHex() << "\n"
            << "kind:          "
            << (m.kind() == v1::BLOCK_KIND_PREFIX ? "prefix" : "session") << "\n";
  if (m.kind() == v1::BLOCK_KIND_SESSION) {
    std::cout << "session:       " << m.session_id() << " #" << m.sequence() << "\n";
  } else {
    std::cout << "parent:        "
              << (m.parent_id().empty() ? std::string("(root)")
                                        : BlockId::FromBytes(m.parent_id())->ToHex())
              << "\n";
  }
  std::cout << "layout:        " << DescribeFingerprint(m.fingerprint()) << "\n"
            << "fingerprint:   " << DigestFingerprint(m.fingerprint()).ToHex() << "\n"
            << "tokens:        " << m.n_tokens() << " (offset " << m.token_offset()
            << ")\n"
            << "layers:        [" << m.layer_begin() << ", " << m.layer_end() << ")\n"
            << "positions:     "
            << (m.positions().empty()
                    ? absl::StrCat(m.first_position(), "..",
                                   static_cast<int64_t>(m.first_position()) +
                                       m.n_tokens() - 1)
                    : absl::StrCat("explicit (", m.positions_size(), ")"))
            << "\n"
            << "payload:       " << m.payload_bytes() << " bytes ("
            << FormatByteSize(m.payload_bytes()) << ")\n"
            << "checksum:      " << absl::StrFormat("%016x", m.checksum()) << " (xxh3-64)\n"
            << "tier:          " << TierName(info.tier())
            << (info.on_disk() && info.tier() == v1::TIER_PINNED_HOST ? " (+disk copy)" : "")
            << "\n"
            << "bytes:         " << (info.bytes_available() ? "available" : "dropped (breadcrumb)")
            << "\n"
            << "pins:          " << info.pin_count() << "\n"
            << "created:       "
            << absl::FormatTime(absl::FromUnixMillis(m.created_unix_ms()), absl::UTCTimeZone())
            << "\n"
            << "last access:   "
            << absl::FormatTime(absl::FromUnixMillis(info.last_access_unix_ms()),
                                absl::UTCTimeZone())
            << "\n";
}

void PrintNamespaces(const v1::StatResponse& s) {
  if (s.namespaces().empty()) return;
  auto quota = [](uint64_t used, uint64_t q) {
    return q == 0 ? FormatByteSize(used)
                  : absl::StrCat(FormatByteSize(used), "/", FormatByteSize(q));
  };
  std::cout << absl::StrFormat("%-24s %10s %22s %22s %22s\n", "namespace", "blocks",
                               "tier 1", "tier 2", "metadata");
  for (const v1::NamespaceStat& n : s.namespaces()) {
    std::cout << absl::StrFormat("%-24s %10d %22s %22s %22s%s\n", n.name(), n.blocks(),
                                 quota(n.tier1_bytes(), n.tier1_quota_bytes()),
                                 quota(n.tier2_bytes(), n.tier2_quota_bytes()),
                                 quota(n.metadata_bytes(), n.metadata_quota_bytes()),
                                 n.shared() ? "  shared" : "");
  }
}

void PrintStat(const v1::StatResponse& s) {
  if (!s.has_counters()) {  // A tenant's Stat: its own namespaces only.
    std::cout << "evoked " << s.version() << "\n";
    PrintNamespaces(s);
    return;
  }
  std::cout << "evoked " << s.version() << "  data_dir " << s.data_dir() << "  up "
            << s.uptime_seconds() << "s\n";
  std::cout << absl::StrFormat("%-16s %10s %14s %14s %14s\n", "tier", "blocks",
                               "payload", "used", "capacity");
  std::cout << absl::StrFormat("%-16s %10d %14s %14s %14s  %s\n", "1 pinned host",
                               s.pinned().blocks(),
                               FormatByteSize(s.pinned().payload_bytes()),
                               FormatByteSize(s.pinned().used_bytes()),
                               FormatByteSize(s.pinned().capacity_bytes()),
                               s.pinned_memory_locked() ? "locked" : "not locked");
  std::cout << absl::StrFormat("%-16s %10d %14s %14s %14s\n", "2 spill (disk)",
                               s.spill().blocks(), FormatByteSize(s.spill().payload_bytes()),
                               FormatByteSize(s.spill().used_bytes()),
                               FormatByteSize(s.spill().capacity_bytes()));
  std::cout << absl::StrFormat("%-16s %10d\n", "breadcrumbs", s.breadcrumb_blocks());
  std::cout << absl::StrFormat("%-16s %10d\n", "pinned blocks", s.pinned_blocks());
  const v1::Counters& c = s.counters();
  std::cout << "counters: saves=" << c.saves() << " dedups=" << c.dedups()
            << " loads=" << c.loads() << " hits_tier1=" << c.hits_tier1()
            << " hits_tier2=" << c.hits_tier2() << " misses=" << c.misses()
            << " spills=" << c.spills() << " evictions=" << c.evictions()
            << " promotions=" << c.promotions() << " breadcrumbs=" << c.breadcrumbs()
            << " checksum_failures=" << c.checksum_failures()
            << " deletes=" << c.deletes() << " spill_errors=" << c.spill_errors()
            << " invalid_records=" << c.invalid_records()
            << "\n";
  std::cout << "metadata: " << FormatByteSize(s.metadata_bytes());
  if (s.metadata_budget_bytes() > 0) {
    std::cout << " of " << FormatByteSize(s.metadata_budget_bytes()) << " (--metadata-bytes)";
  }
  std::cout << "\n";
  const v1::DiskHealth& d = s.disk_health();
  std::cout << "disk: " << (d.writable() ? "writable" : "NOT WRITABLE: " + d.reason())
            << (d.opened_read_only() ? " (opened read-only)" : "")
            << "  write_failures=" << d.write_failures()
            << " refused_writes=" << d.refused_writes() << " resumes=" << d.resumes()
            << " corrupt_files=" << d.corrupt_files()
            << " unreadable_records=" << d.unreadable_records() << "\n";
  std::cout << "segments: " << d.segments() << " files, "
            << FormatByteSize(d.segment_file_bytes()) << " allocated, "
            << FormatByteSize(d.segment_live_bytes()) << " live"
            << (d.direct_io() ? " (O_DIRECT)" : " (buffered)") << "  syncs=" << d.segment_syncs()
            << " compacted_records=" << d.compacted_records()
            << " removed_segments=" << d.removed_segments() << "\n";
  for (const std::string& step : d.recovery()) std::cout << "  recovered at start: " << step << "\n";
  if (s.has_remote() && s.remote().enabled()) {
    const v1::RemoteStat& r = s.remote();
    std::cout << "remote: " << r.store() << " " << r.state()
              << (r.last_error().empty() ? "" : " (last error: " + r.last_error() + ")") << "\n"
              << "  pool: " << r.pool_objects() << " objects, "
              << FormatByteSize(r.pool_used_bytes()) << ", expired="
              << r.expired_objects() << "\n"
              << "  written=" << r.objects_written() << " (" << FormatByteSize(r.bytes_written())
              << ") dedups=" << r.dedups() << " fetches=" << r.fetches() << " ("
              << FormatByteSize(r.fetched_bytes()) << ") misses=" << r.misses()
              << " probes=" << r.probes() << "\n"
              << "  write-behind: queue=" << r.queue_blocks() << " ("
              << FormatByteSize(r.queue_bytes()) << ") inflight=" << r.inflight()
              << " dropped=" << r.dropped_blocks() << " removals=" << r.removals_queued()
              << " removals_dropped=" << r.removals_dropped() << "\n"
              << "  errors=" << r.errors() << " timeouts=" << r.timeouts()
              << " checksum_failures=" << r.checksum_failures()
              << " breaker_opens=" << r.breaker_opens() << " unavailable=" << r.unavailable()
              << "\n";
  }
  PrintNamespaces(s);
}

int Run(int argc, char** argv) {
  CLI::App app{"evokectl: inspect, verify and manage the blocks stored by evoked"};
  app.require_subcommand(1);
  app.fallthrough();  // --socket/--json/--timeout may follow the command.
  std::string socket;
  bool json = false;
  double timeout_s = 60;
  app.add_option("--socket", socket,
                 "evoked's socket (default: $EVOKE_SOCKET, else ./evoked.sock)");
  app.add_flag("--json", json, "Print JSON instead of text");
  app.add_option("--timeout", timeout_s, "Seconds per call")->capture_default_str();

  CLI::App* stat = app.add_subcommand("stat", "Occupancy of each tier and counters");
  CLI::App* ls = app.add_subcommand("ls", "List blocks");
  std::string ls_ns, ls_session, ls_tier;
  int64_t ls_limit = 0;
  ls->add_option("--namespace", ls_ns, "Only this namespace");
  ls->add_option("--session", ls_session, "Only this session (needs --namespace)");
  ls->add_option("--tier", ls_tier, "pinned, spill or breadcrumb");
  ls->add_option("--limit", ls_limit, "At most this many blocks (0 = all)")
      ->check(CLI::NonNegativeNumber);
  CLI::App* show = app.add_subcommand("show", "One block's metadata and state");
  std::string show_id;
  show->add_option("ID", show_id, "Block id (32 hex digits)")->required();
  CLI::App* rm = app.add_subcommand("rm", "Delete blocks from every tier");
  std::vector<std::string> rm_ids;
  rm->add_option("ID", rm_ids, "Block ids")->required();
  CLI::App* drop = app.add_subcommand("drop-session", "Delete every block of a session");
  std::string drop_ns, drop_session;
  drop->add_option("NAMESPACE", drop_ns)->required();
  drop->add_option("SESSION", drop_session)->required();
  CLI::App* verify = app.add_subcommand(
      "verify", "Re-read blocks from every tier and check their checksums");
  std::vector<std::string> verify_ids;
  verify->add_option("ID", verify_ids, "Block ids (default: all)");
  CLI::App* flush = app.add_subcommand("flush", "Write tier 1 to disk");
  bool flush_evict = false;
  flush->add_flag("--evict", flush_evict, "Then release tier 1 of unpinned blocks");
  CLI::App* exp = app.add_subcommand("export", "Write one block to a block file");
  std::string exp_id, exp_file;
  exp->add_option("ID", exp_id)->required();
  exp->add_option("FILE", exp_file)->required();
  CLI::App* imp = app.add_subcommand("import", "Store the block of a block file");
  std::string imp_file;
  bool imp_durable = false;
  imp->add_option("FILE", imp_file)->required();
  imp->add_flag("--durable", imp_durable, "Return once the block is on disk");
  CLI::App* health = app.add_subcommand("health", "Ask whether evoked is serving");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    // An operator's tool fails at once when there is no socket to dial,
    // rather than waiting out the connect timeout.
    const std::string target = ResolveTarget(socket);
    if (std::error_code ec;
        absl::StartsWith(target, "unix:") && !std::filesystem::exists(target.substr(5), ec)) {
      Check(absl::UnavailableError(absl::StrCat(
          "cannot reach evoked at ", target,
          ec == std::errc::permission_denied
              ? ": permission denied on its directory (is this user in the socket's group?)"
              : ": no such socket (is it running? set --socket or EVOKE_SOCKET)")));
    }
    ClientOptions options;
    options.target = socket;
    options.call_timeout = absl::Seconds(timeout_s);
    options.connect_timeout = absl::Seconds(std::min(timeout_s, 10.0));
    std::unique_ptr<Client> client = Check(Client::Connect(options));

    if (*stat) {
      const v1::StatResponse s = Check(client->Stat());
      json ? PrintJson(s) : PrintStat(s);
    } else if (*ls) {
      v1::ListRequest request;
      request.set_namespace_(ls_ns);
      request.set_session_id(ls_session);
      if (!ls_tier.empty()) {
        if (ls_tier == "pinned") {
          request.set_tier(v1::TIER_PINNED_HOST);
        } else if (ls_tier == "spill") {
          request.set_tier(v1::TIER_SPILL);
        } else if (ls_tier == "breadcrumb") {
          request.set_tier(v1::TIER_BREADCRUMB);
        } else {
          throw CommandError{absl::InvalidArgumentError(absl::StrCat(
              "--tier: '", ls_tier, "' is not pinned, spill or breadcrumb"))};
        }
      }
      v1::ListResponse all;
      for (;;) {
        request.set_page_size(1000);
        v1::ListResponse page = Check(client->List(request));
        for (auto& b : *page.mutable_blocks()) {
          if (ls_limit != 0 && all.blocks_size() >= ls_limit) break;
          *all.add_blocks() = std::move(b);
        }
        if (page.next_page_token().empty() ||
            (ls_limit != 0 && all.blocks_size() >= ls_limit)) {
          break;
        }
        request.set_page_token(page.next_page_token());
      }
      if (json) {
        PrintJson(all);
      } else {
        std::cout << absl::StrFormat("%-32s %-7s %-10s %12s %7s %7s %s\n", "ID", "KIND",
                                     "TIER", "BYTES", "TOKENS", "LAYERS",
                                     "SESSION#SEQ / NAMESPACE");
        for (const v1::BlockInfo& b : all.blocks()) {
          const v1::BlockMeta& m = b.meta();
          std::cout << absl::StrFormat(
              "%-32s %-7s %-10s %12d %7d %7s %s\n", BlockIdOf(m).ToHex(),
              m.kind() == v1::BLOCK_KIND_PREFIX ? "prefix" : "session",
              TierName(b.tier()) + (b.pin_count() > 0 ? "*" : ""), m.payload_bytes(),
              m.n_tokens(), Layers(m),
              m.kind() == v1::BLOCK_KIND_SESSION
                  ? absl::StrCat(m.session_id(), "#", m.sequence())
                  : m.fingerprint().namespace_());
        }
        std::cout << all.blocks_size() << " blocks\n";
      }
    } else if (*show) {
      const v1::BlockInfo info = Check(client->Describe(ParseId(show_id)));
      json ? PrintJson(info) : PrintBlock(info);
    } else if (*rm) {
      std::vector<BlockId> ids;
      for (const std::string& h : rm_ids) ids.push_back(ParseId(h));
      Check(client->Delete(ids));
      if (json) {
        std::cout << "{\"deleted\":" << ids.size() << "}\n";
      } else {
        std::cout << "deleted " << ids.size() << " block(s)\n";
      }
    } else if (*drop) {
      const uint32_t n = Check(client->DropSession(drop_ns, drop_session));
      if (json) {
        std::cout << "{\"deleted\":" << n << "}\n";
      } else {
        std::cout << "deleted " << n << " block(s) of session " << drop_session << "\n";
      }
    } else if (*verify) {
      std::vector<BlockId> ids;
      for (const std::string& h : verify_ids) ids.push_back(ParseId(h));
      const v1::VerifyResponse r = Check(client->Verify(ids));
      if (json) {
        PrintJson(r);
      } else {
        std::cout << "checked " << r.blocks_checked() << " blocks, "
                  << r.copies_checked() << " copies: " << r.copies_ok() << " ok, "
                  << r.corrupt_size() << " corrupt, " << r.missing() << " missing\n";
        for (const v1::CorruptCopy& c : r.corrupt()) {
          std::cout << "  corrupt " << BlockId::FromBytes(c.id())->ToHex() << " in "
                    << TierName(c.tier()) << ": " << c.detail() << "\n";
        }
      }
      if (r.corrupt_size() > 0 || r.missing() > 0) {
        throw CommandError{absl::DataLossError(absl::StrCat(
            r.corrupt_size(), " corrupt copies and ", r.missing(),
            " missing blocks (corrupt copies were dropped, never served)"))};
      }
    } else if (*flush) {
      const v1::FlushResponse r = Check(client->Flush(flush_evict));
      if (json) {
        PrintJson(r);
      } else {
        std::cout << "wrote " << r.blocks_written() << " blocks ("
                  << FormatByteSize(r.bytes_written()) << ") to disk";
        if (flush_evict) std::cout << ", released " << r.blocks_evicted() << " from tier 1";
        std::cout << "\n";
      }
    } else if (*exp) {
      const BlockId id = ParseId(exp_id);
      const v1::BlockInfo info = Check(client->Describe(id));
      std::vector<LoadedBlock> loaded =
          Check(client->Load({&id, 1}, info.meta().fingerprint()));
      Check(WriteBlockFile(exp_file, loaded[0].meta, loaded[0].payload));
      if (json) {
        std::cout << "{\"id\":\"" << id.ToHex() << "\",\"bytes\":"
                  << loaded[0].payload.size() << ",\"file\":\"" << exp_file << "\"}\n";
      } else {
        std::cout << "exported " << id.ToHex() << " ("
                  << FormatByteSize(loaded[0].payload.size()) << ") to " << exp_file << "\n";
      }
    } else if (*imp) {
      BlockFile file = Check(ReadBlockFile(imp_file));
      BlockToSave block{file.meta, file.payload, false};
      const std::vector<v1::SaveResult> r = Check(client->Save({&block, 1}, imp_durable));
      const std::string id = BlockIdOf(file.meta).ToHex();
      if (json) {
        std::cout << "{\"id\":\"" << id << "\",\"deduplicated\":"
                  << (r[0].deduplicated() ? "true" : "false") << "}\n";
      } else {
        std::cout << "imported " << id << " (" << FormatByteSize(file.payload.size())
                  << ")" << (r[0].deduplicated() ? ", already stored" : "") << "\n";
      }
    } else if (*health) {
      Check(client->HealthCheck());
      std::cout << (json ? "{\"status\":\"SERVING\"}" : "SERVING") << "\n";
    }
  } catch (const CommandError& e) {
    std::cerr << "evokectl: " << absl::StatusCodeToString(e.status.code()) << ": "
              << e.status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace evoke

int main(int argc, char** argv) { return evoke::Run(argc, argv); }
