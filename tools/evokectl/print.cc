// evokectl's printing (print.h).
#include "tools/evokectl/print.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/byte_size.h"
#include "common/fingerprint.h"

namespace evoke::ctl {
namespace {

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

}  // namespace

void PrintQuota(const v1::NamespaceStat& n) {
  auto line = [](const char* what, uint64_t used, uint64_t q) {
    std::cout << absl::StrFormat("  %-9s %12s of %s\n", what, FormatByteSize(used),
                                 q == 0 ? std::string("no quota") : FormatByteSize(q));
  };
  std::cout << "namespace " << n.name() << (n.shared() ? " (shared)" : "") << ": " << n.blocks()
            << " blocks\n";
  line("tier 1", n.tier1_bytes(), n.tier1_quota_bytes());
  line("tier 2", n.tier2_bytes(), n.tier2_quota_bytes());
  line("metadata", n.metadata_bytes(), n.metadata_quota_bytes());
  static const char* const kClasses[] = {"no cap", "low", "normal", "high"};
  std::cout << "  retention classes up to: " << kClasses[std::min<uint32_t>(n.max_retention(), 3)]
            << "\n";
}

std::string Layers(const v1::BlockMeta& m) {
  return absl::StrCat(m.layer_begin(), "-", m.layer_end());
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


std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) {
    // Only a bug of ours (every message here renders): say so, in JSON.
    return "{\"error\":\"evokectl cannot render this reply as JSON\"}";
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


void PrintStat(const v1::StatResponse& s) {
  if (!s.has_counters()) {  // A tenant's Stat: its own namespaces only.
    std::cout << "evoked " << s.version() << "\n";
    PrintNamespaces(s);
    return;
  }
  std::cout << "evoked " << s.version() << "  data_dir " << s.data_dir() << "  up "
            << s.uptime_seconds() << "s\n";
  std::cout << "metrics " << (s.metrics_address().empty()
                                  ? std::string("off")
                                  : absl::StrCat("http://", s.metrics_address(), "/metrics"))
            << "\n";
  std::cout << absl::StrFormat("%-16s %10s %14s %14s %14s\n", "tier", "blocks",
                               "payload", "used", "capacity");
  std::cout << absl::StrFormat("%-16s %10d %14s %14s %14s  %s\n", "1 pinned host",
                               s.pinned().blocks(),
                               FormatByteSize(s.pinned().payload_bytes()),
                               FormatByteSize(s.pinned().used_bytes()),
                               FormatByteSize(s.pinned().capacity_bytes()),
                               s.pinned_memory_locked() ? "locked"
                               : s.pinned_prefaulted_bytes() >= s.pinned().capacity_bytes()
                                   ? "not locked, prefaulted"
                                   : "not locked");
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
  if (d.quarantined() || d.quarantined_segments() > 0 || d.salvage().ran()) {
    const v1::DiskSalvage& v = d.salvage();
    std::cout << "recovery: " << (d.quarantined() ? "metadata started anew, " : "")
              << "quarantined_segments=" << d.quarantined_segments()
              << " salvage: restored=" << v.restored() << " removed=" << v.removed()
              << " lost_damaged=" << v.damaged() << " lost_unidentified=" << v.unidentified()
              << " unreadable_segments=" << v.unreadable_segments() << "\n";
  }
  std::cout << "segments: " << d.segments() << " files, "
            << FormatByteSize(d.segment_file_bytes()) << " allocated, "
            << FormatByteSize(d.segment_live_bytes()) << " live"
            << (d.direct_io() ? " (O_DIRECT)" : " (buffered)") << "  syncs=" << d.segment_syncs()
            << " compacted_records=" << d.compacted_records()
            << " removed_segments=" << d.removed_segments();
  if (d.segment_payload_bytes() > 0) {
    std::cout << absl::StrFormat(
        "  written=%s for %s of payload (%.3fx)", FormatByteSize(d.segment_bytes_written()),
        FormatByteSize(d.segment_payload_bytes()),
        static_cast<double>(d.segment_bytes_written()) /
            static_cast<double>(d.segment_payload_bytes()));
  }
  std::cout << "\n";
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
              << " removals_dropped=" << r.removals_dropped() << " paced=" << r.paced() << "\n"
              << "  errors=" << r.errors() << " timeouts=" << r.timeouts()
              << " checksum_failures=" << r.checksum_failures()
              << " breaker_opens=" << r.breaker_opens() << " unavailable=" << r.unavailable()
              << "\n";
  }
  PrintNamespaces(s);
}

std::string StartupLosses(const v1::DiskHealth& d) {
  std::vector<std::string> parts;
  if (d.quarantined()) {
    parts.push_back(absl::StrCat("the metadata was quarantined and rebuilt (",
                                 d.salvage().restored(), " records salvaged)"));
  }
  if (d.quarantined_segments() > 0) {
    parts.push_back(absl::StrCat(d.quarantined_segments(), " segment files quarantined"));
  }
  if (d.salvage().damaged() > 0) {
    parts.push_back(absl::StrCat(d.salvage().damaged(), " blocks with damaged payloads"));
  }
  if (d.salvage().unidentified() > 0) {
    parts.push_back(absl::StrCat(d.salvage().unidentified(),
                                 " blocks without identity records"));
  }
  if (d.salvage().unreadable_segments() > 0) {
    parts.push_back(absl::StrCat(d.salvage().unreadable_segments(),
                                 " segments readable only up to damage"));
  }
  if (d.unreadable_records() > 0) {
    parts.push_back(absl::StrCat(d.unreadable_records(), " unreadable records"));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace evoke::ctl
