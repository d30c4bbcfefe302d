#include "daemon/daemon_flags.h"

#include <CLI/CLI.hpp>

#include <istream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/byte_size.h"

#ifndef EVOKE_VERSION
#define EVOKE_VERSION "dev"
#endif

namespace evoke {
namespace {

void AddSize(CLI::App& app, const std::string& flag, uint64_t* field,
             const std::string& help) {
  app.add_option_function<std::string>(
         "--" + flag,
         [field, flag](const std::string& value) {
           absl::StatusOr<uint64_t> parsed = ParseByteSize(value);
           if (!parsed.ok()) {
             throw CLI::ValidationError("--" + flag,
                                        std::string(parsed.status().message()));
           }
           *field = *parsed;
         },
         help)
      ->default_str(FormatByteSize(*field))
      ->type_name("SIZE");
}

bool IsBlank(char c) { return c == ' ' || c == '\t'; }

bool IsKeyChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
         c == '.';
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// ParseValue reads the value part of a line (after `=`, leading blanks
// skipped). Returns an error message, empty on success.
std::string ParseValue(absl::string_view v, std::string* out) {
  out->clear();
  size_t i = 0;
  if (v.empty() || v[0] == '#') return "has no value";
  if (v[0] == '"' || v[0] == '\'') {
    const char quote = v[0];
    bool closed = false;
    for (i = 1; i < v.size(); ++i) {
      const char c = v[i];
      if (c == quote) {
        closed = true;
        ++i;
        break;
      }
      if (c != '\\' || quote == '\'') {
        out->push_back(c);
        continue;
      }
      if (++i == v.size()) break;
      switch (v[i]) {
        case '\\': out->push_back('\\'); break;
        case '"': out->push_back('"'); break;
        case 'n': out->push_back('\n'); break;
        case 't': out->push_back('\t'); break;
        case 'r': out->push_back('\r'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'u':
        case 'U': {
          const size_t digits = v[i] == 'u' ? 4 : 8;
          if (v.size() - i - 1 < digits) return "has a truncated \\u escape";
          uint32_t cp = 0;
          for (size_t k = 1; k <= digits; ++k) {
            const char h = v[i + k];
            if (!absl::ascii_isxdigit(static_cast<unsigned char>(h))) {
              return "has a malformed \\u escape";
            }
            cp = cp * 16 + static_cast<uint32_t>(
                               absl::ascii_isdigit(static_cast<unsigned char>(h))
                                   ? h - '0'
                                   : absl::ascii_tolower(static_cast<unsigned char>(h)) -
                                         'a' + 10);
            if (cp > 0x10FFFF) return "has a \\U escape beyond U+10FFFF";
          }
          if (cp >= 0xD800 && cp <= 0xDFFF) return "has a surrogate \\u escape";
          AppendUtf8(cp, out);
          i += digits;
          break;
        }
        default:
          return absl::StrCat("has an unknown escape \\", absl::string_view(&v[i], 1),
                              " (write \\\\ for a backslash)");
      }
    }
    if (!closed) return "has an unterminated string";
    while (i < v.size() && IsBlank(v[i])) ++i;
    if (i < v.size() && v[i] != '#') return "has text after the closing quote";
    return "";
  }
  const size_t hash = v.find('#');
  *out = std::string(absl::StripAsciiWhitespace(v.substr(0, hash)));
  return "";
}

// EvokeConfig reads config files with ParseConfigText, so that what
// OptionsToConfig prints reads back exactly (CLI11's own reader cuts values
// at any `#`, splits them at spaces and commas, and has no escapes).
class EvokeConfig : public CLI::Config {
 public:
  std::string to_config(const CLI::App*, bool, bool, std::string) const override {
    return "";  // Unused: OptionsToConfig prints the config.
  }
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    const std::string text((std::istreambuf_iterator<char>(input)),
                           std::istreambuf_iterator<char>());
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> pairs =
        ParseConfigText(text);
    if (!pairs.ok()) throw CLI::FileError(std::string(pairs.status().message()));
    std::vector<CLI::ConfigItem> items;
    items.reserve(pairs->size());
    for (auto& [key, value] : *pairs) {
      CLI::ConfigItem item;
      item.name = std::move(key);
      item.inputs = {std::move(value)};
      items.push_back(std::move(item));
    }
    return items;
  }
};

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseConfigText(
    absl::string_view text) {
  std::vector<std::pair<std::string, std::string>> pairs;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    // Windows line ends and surrounding blanks carry no meaning.
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto bad = [&](absl::string_view problem) {
      return absl::InvalidArgumentError(
          absl::StrCat("config line ", line_number, ": ", problem));
    };
    size_t k = 0;
    while (k < line.size() && IsKeyChar(line[k])) ++k;
    if (k == 0) return bad("expected `key = value`");
    std::string key(line.substr(0, k));
    while (k < line.size() && IsBlank(line[k])) ++k;
    if (k == line.size() || line[k] != '=') {
      return bad(absl::StrCat("expected `=` after key '", key, "'"));
    }
    ++k;
    while (k < line.size() && IsBlank(line[k])) ++k;
    std::string value;
    const std::string problem = ParseValue(line.substr(k), &value);
    if (!problem.empty()) return bad(absl::StrCat("'", key, "' ", problem));
    pairs.emplace_back(std::move(key), std::move(value));
  }
  return pairs;
}

std::string QuoteConfigString(absl::string_view value) {
  std::string out = "\"";
  for (const char c : value) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
          absl::StrAppendFormat(&out, "\\u%04X", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);  // Bytes >= 0x80 too: the reader takes them as they are.
        }
    }
  }
  out += "\"";
  return out;
}

absl::Status ParseDaemonFlags(int argc, const char* const* argv,
                              DaemonOptions* o, std::string* output,
                              bool* exit_now) {
  *exit_now = false;
  CLI::App app{
      "evoked: the evoke KV-cache tier daemon. Inference engines hand it "
      "evicted KV blocks over gRPC; it keeps them in pinned host memory, "
      "spills cold ones to RocksDB, and hands them back without recompute."};
  // A flag given twice keeps its last value (the command line can override
  // a wrapper script's defaults).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.config_formatter(std::make_shared<EvokeConfig>());
  // A misspelt key is an error, not a silently ignored line.
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.set_config("--config", "",
                 "Read options from FILE (lines `key = value`, keys as the "
                 "flags without --); command-line flags override it");
  bool print_config = false;
  bool version = false;
  app.add_flag("--print-config", print_config,
               "Print the effective options as a config file and exit");
  app.add_flag("--version", version, "Print the version and exit");

  // The flags, each onto its field. Flags keep the flat names they had before
  // DaemonOptions was grouped by part (--pinned-bytes, not --tier1-...), so
  // command lines and config files written for any release still read.
  app.add_option("--socket", o->server.socket,
                 "Unix socket to serve on (mode 0660); relative paths resolve "
                 "against the working directory")
      ->capture_default_str();
  app.add_option("--data-dir", o->tier2.data_dir,
                 "Directory of tier 2 (RocksDB records, segment files); one evoked per directory")
      ->capture_default_str();
  AddSize(app, "pinned-bytes", &o->tier1.pinned_bytes,
          "Size of tier 1, the pinned host-memory arena");
  AddSize(app, "spill-bytes", &o->tier2.spill_bytes,
          "Budget of payload bytes on disk; past it payloads become breadcrumbs");
  app.add_option("--high-watermark", o->tier1.high_watermark,
                 "Tier 1 starts spilling above this fraction of pinned-bytes")
      ->capture_default_str();
  app.add_option("--low-watermark", o->tier1.low_watermark,
                 "Tier 1 spills down to this fraction of pinned-bytes")
      ->capture_default_str();
  AddSize(app, "max-block-bytes", &o->tiers.max_block_bytes, "Largest payload of one block");
  AddSize(app, "staging-bytes", &o->tiers.staging_bytes,
          "Heap bytes all Loads may hold for disk reads that miss tier 1");
  AddSize(app, "max-message-bytes", &o->server.max_message_bytes,
          "Largest gRPC message received or sent");
  app.add_option("--worker-threads", o->server.worker_threads,
                 "Threads for RPCs that copy bytes or touch disk (0 = auto)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--copy-threads", o->tiers.copy_threads,
                 "Extra threads that copy and checksum payloads of 512 KiB or more (and as "
                 "many that scan large recovery tables)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--disk-reads-in-flight", o->tiers.disk_reads_in_flight,
                 "Tier-2 reads one Load keeps in flight at once (1: one after another)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--lock-memory", o->tier1.lock_memory,
                 "mlock tier 1 (best effort; Stat reports the outcome)")
      ->capture_default_str();
  app.add_option("--prefault-memory", o->tier1.prefault_memory,
                 "When tier 1 is not locked, fault its pages in on a background thread at "
                 "start, so that Saves do not pay for page zeroing (commits --pinned-bytes "
                 "of memory; Stat reports the progress)")
      ->capture_default_str();
  app.add_option("--ring-poll-max-us", o->rings.poll_max_us,
                 "Longest a command ring's thread polls for its client's next submission before "
                 "sleeping: twice the recent gap while that is under half of this, 50 us "
                 "otherwise (50 or less: always 50 us; a polling ring keeps a core busy)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app.add_option("--spill-sync", o->tier2.spill_sync,
                 "fsync the spill store's WAL on every spill batch")
      ->capture_default_str();
  AddSize(app, "spill-batch-bytes", &o->tier2.spill_batch_bytes,
          "Payload bytes written to disk per spill batch");
  app.add_option("--save-wait-ms", o->tiers.save_wait_ms,
                 "How long a Save may wait for tier 1 to make room")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--shutdown-grace-ms", o->server.shutdown_grace_ms,
                 "How long SIGTERM waits for in-flight RPCs")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--fd-socket", o->fd.socket,
                 "Unix socket for shared-memory registration (default: SOCKET.fd)");
  app.add_option("--max-leases", o->leases.max_leases, "Open leases at once")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-leases-per-uid", o->leases.max_leases_per_uid,
                 "Open leases of one uid (0 = a quarter of --max-leases)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-calls-per-uid", o->server.max_calls_per_uid,
                 "RPCs of one uid queued or running at once; workers serve uids in turn "
                 "(0 = 4 x --worker-threads)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--watch-backlog-events", o->server.watch_backlog_events,
                 "WatchBlocks events kept for watchers to catch up from")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 24));
  app.add_option("--max-watchers", o->server.max_watchers, "WatchBlocks streams open at once")
      ->capture_default_str()
      ->check(CLI::Range(0u, 65536u));
  app.add_option("--max-regions-per-lease", o->leases.max_regions_per_lease,
                 "Regions one lease may register")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  AddSize(app, "max-region-bytes", &o->leases.max_region_bytes, "Largest registered region");
  AddSize(app, "cuda-register-chunk-bytes", &o->tier1.cuda_register_chunk_bytes,
          "Chunk size of tier 1's background CUDA registration (0 = off)");
  app.add_option("--summary-layer", o->tiers.summary_layer,
                 "Layer summarized for Recover (-1: the middle of each block's layers)")
      ->capture_default_str();
  app.add_option("--log-level", o->log_level, "debug, info, warning or error")
      ->capture_default_str();
  app.add_option("--policy", o->server.policy,
                 "Access policy file: namespaces per uid/gid, admins, TCP bearer "
                 "tokens (default: none: only evoked's own uid and root may call)");
  app.add_option("--tcp-listen", o->tcp.listen,
                 "Also serve the API on TCP HOST:PORT, with TLS and bearer tokens "
                 "(requires --tls-cert, --tls-key and --policy; default: off)");
  // A function option with an optional value, so that "--metrics-address="
  // and "--metrics-address ''" both mean off (a plain string option takes
  // neither).
  CLI::Option* metrics_address =
      app.add_option_function<std::string>(
             "--metrics-address", [o](const std::string& v) { o->metrics.address = v; },
             absl::StrCat("Serve Prometheus /metrics on HOST:PORT over plain HTTP (port 0: "
                          "any free port; empty: off; default ",
                          DaemonOptions::Metrics::kDefaultAddress,
                          "); aggregates only unless --metrics-namespaces"))
          ->expected(0, 1)
          ->type_name("HOST:PORT");
  app.add_flag("--metrics-namespaces", o->metrics.namespaces,
               "Per-namespace series on /metrics (each tenant's namespace name, blocks and "
               "bytes, readable by anyone who can reach /metrics; default: off, aggregates "
               "only)");
  app.add_option("--tls-cert", o->tcp.tls_cert,
                 "PEM certificate chain of the TCP listener");
  app.add_option("--tls-key", o->tcp.tls_key, "PEM private key of the TCP listener");
  AddSize(app, "max-mapped-bytes", &o->leases.max_mapped_bytes,
          "Client shared memory mapped at once, over all leases");
  app.add_option("--max-mappings", o->leases.max_mappings,
                 "Client shared-memory mappings at once (keep well under "
                 "vm.max_map_count)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  AddSize(app, "max-mapped-bytes-per-uid", &o->leases.max_mapped_bytes_per_uid,
          "Client shared memory mapped at once by one uid (0 = a quarter of "
          "--max-mapped-bytes)");
  app.add_option("--fd-connection-deadline-ms", o->fd.connection_deadline_ms,
                 "Total time one fd-socket connection has, however slowly it sends")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lease-idle-ms", o->leases.idle_ms,
                 "Close a lease with no RPC for this long (0 = never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  AddSize(app, "metadata-bytes", &o->tiers.metadata_bytes,
          "Budget of block metadata in memory (tokens, positions, summaries), "
          "all namespaces together");
  app.add_option("--remote-conf", o->remote.conf,
                 "ceph.conf of a Ceph cluster whose RADOS pool is tier 3, shared by "
                 "several hosts (default: none)");
  app.add_option("--remote-pool", o->remote.pool,
                 "RADOS pool of tier 3 (each evoke namespace is a RADOS namespace in it)")
      ->capture_default_str();
  app.add_option("--remote-user", o->remote.user, "Ceph user of tier 3")
      ->capture_default_str();
  app.add_option("--remote-keyring", o->remote.keyring,
                 "Keyring of --remote-user (default: what --remote-conf says)");
  app.add_option("--remote-op-timeout-ms", o->remote.op_timeout_ms,
                 "Deadline of every tier-3 operation, connect included")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  // Bare switches (--remote-required, or --remote-required=false), unlike the
  // older boolean options that take a value.
  app.add_flag("--remote-required", o->remote.required,
               "Exit at start when tier 3 cannot be reached (else: start without it "
               "and keep retrying)");
  app.add_flag("--remote-sessions", o->remote.sessions,
               "Write session blocks to tier 3 too (prefix blocks always go)");
  AddSize(app, "remote-queue-bytes", &o->remote.queue_bytes,
          "Bound of the tier-3 write-behind queue (the newest are dropped past it)");
  AddSize(app, "remote-write-bytes-per-s", &o->remote.write_bytes_per_s,
          "Write-behind budget: payload bytes per second copied and written to tier 3 "
          "(0: no limit)");
  AddSize(app, "remote-write-burst-bytes", &o->remote.write_burst_bytes,
          "Burst of the write-behind budget");
  app.add_option("--remote-inflight", o->remote.inflight,
                 "Tier-3 operations in flight (and blocks per write-behind batch)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--remote-retry-ms", o->remote.retry_ms,
                 "First wait of tier 3's circuit breaker after a failure (doubles)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--remote-retry-max-ms", o->remote.retry_max_ms,
                 "Longest wait of tier 3's circuit breaker")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  AddSize(app, "remote-bytes", &o->remote.bytes,
          "Write-behind pauses while the pool holds more than this (0 = no limit)");
  app.add_option("--remote-expiry-s", o->remote.expiry_s,
                 "Remove tier-3 blocks written more than this many seconds ago (0 = never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    *output = app.help();
    *exit_now = true;
    return absl::OkStatus();
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  o->metrics.address_given = metrics_address->count() > 0;
  if (version) {
    *output = absl::StrCat("evoked ", EVOKE_VERSION, "\n");
    *exit_now = true;
    return absl::OkStatus();
  }
  absl::Status valid = o->Validate();
  if (!valid.ok()) return valid;
  if (print_config) {
    *output = OptionsToConfig(*o);
    *exit_now = true;
  }
  return absl::OkStatus();
}

// ShortestDouble renders `v` with the fewest digits that parse back to it.
std::string ShortestDouble(double v) {
  for (int precision = 1; precision <= 17; ++precision) {
    const std::string s = absl::StrFormat("%.*g", precision, v);
    double back = 0;
    if (absl::SimpleAtod(s, &back) && back == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

std::string OptionsToConfig(const DaemonOptions& o) {
  // A size prints with its unit when that reads back exactly ("64 MiB"),
  // else as the plain byte count ("1.50 GiB" is rounded; "1 PiB" has a unit
  // ParseByteSize does not take).
  auto size = [](uint64_t v) {
    const std::string pretty = FormatByteSize(v);
    absl::StatusOr<uint64_t> back = ParseByteSize(pretty);
    return QuoteConfigString(back.ok() && *back == v ? pretty : absl::StrCat(v));
  };
  auto str = [](const std::string& v) { return QuoteConfigString(v); };
  return absl::StrCat(
      "# evoked configuration (evoked --config FILE). Keys are the flags.\n",
      "socket = ", str(o.server.socket), "\n",
      "data-dir = ", str(o.tier2.data_dir), "\n",
      "pinned-bytes = ", size(o.tier1.pinned_bytes), "\n",
      "spill-bytes = ", size(o.tier2.spill_bytes), "\n",
      "high-watermark = ", ShortestDouble(o.tier1.high_watermark), "\n",
      "low-watermark = ", ShortestDouble(o.tier1.low_watermark), "\n",
      "max-block-bytes = ", size(o.tiers.max_block_bytes), "\n",
      "staging-bytes = ", size(o.tiers.staging_bytes), "\n",
      "max-message-bytes = ", size(o.server.max_message_bytes), "\n",
      "worker-threads = ", o.server.worker_threads, "\n",
      "copy-threads = ", o.tiers.copy_threads, "\n",
      "disk-reads-in-flight = ", o.tiers.disk_reads_in_flight, "\n",
      "lock-memory = ", o.tier1.lock_memory ? "true" : "false", "\n",
      "prefault-memory = ", o.tier1.prefault_memory ? "true" : "false", "\n",
      "ring-poll-max-us = ", o.rings.poll_max_us, "\n",
      "spill-sync = ", o.tier2.spill_sync ? "true" : "false", "\n",
      "spill-batch-bytes = ", size(o.tier2.spill_batch_bytes), "\n",
      "save-wait-ms = ", o.tiers.save_wait_ms, "\n",
      "shutdown-grace-ms = ", o.server.shutdown_grace_ms, "\n",
      "fd-socket = ", str(o.fd.socket), "\n",
      "max-leases = ", o.leases.max_leases, "\n",
      "max-leases-per-uid = ", o.leases.max_leases_per_uid, "\n",
      "max-calls-per-uid = ", o.server.max_calls_per_uid, "\n",
      "watch-backlog-events = ", o.server.watch_backlog_events, "\n",
      "max-watchers = ", o.server.max_watchers, "\n",
      "max-regions-per-lease = ", o.leases.max_regions_per_lease, "\n",
      "max-region-bytes = ", size(o.leases.max_region_bytes), "\n",
      "cuda-register-chunk-bytes = ", size(o.tier1.cuda_register_chunk_bytes), "\n",
      "summary-layer = ", o.tiers.summary_layer, "\n",
      "log-level = ", str(o.log_level), "\n",
      "policy = ", str(o.server.policy), "\n",
      "tcp-listen = ", str(o.tcp.listen), "\n",
      "metrics-address = ", str(o.metrics.address), "\n",
      "metrics-namespaces = ", o.metrics.namespaces ? "true" : "false", "\n",
      "tls-cert = ", str(o.tcp.tls_cert), "\n",
      "tls-key = ", str(o.tcp.tls_key), "\n",
      "max-mapped-bytes = ", size(o.leases.max_mapped_bytes), "\n",
      "max-mappings = ", o.leases.max_mappings, "\n",
      "max-mapped-bytes-per-uid = ", size(o.leases.max_mapped_bytes_per_uid), "\n",
      "fd-connection-deadline-ms = ", o.fd.connection_deadline_ms, "\n",
      "lease-idle-ms = ", o.leases.idle_ms, "\n",
      "metadata-bytes = ", size(o.tiers.metadata_bytes), "\n",
      "remote-conf = ", str(o.remote.conf), "\n",
      "remote-pool = ", str(o.remote.pool), "\n",
      "remote-user = ", str(o.remote.user), "\n",
      "remote-keyring = ", str(o.remote.keyring), "\n",
      "remote-op-timeout-ms = ", o.remote.op_timeout_ms, "\n",
      "remote-required = ", o.remote.required ? "true" : "false", "\n",
      "remote-sessions = ", o.remote.sessions ? "true" : "false", "\n",
      "remote-queue-bytes = ", size(o.remote.queue_bytes), "\n",
      "remote-write-bytes-per-s = ", size(o.remote.write_bytes_per_s), "\n",
      "remote-write-burst-bytes = ", size(o.remote.write_burst_bytes), "\n",
      "remote-inflight = ", o.remote.inflight, "\n",
      "remote-retry-ms = ", o.remote.retry_ms, "\n",
      "remote-retry-max-ms = ", o.remote.retry_max_ms, "\n",
      "remote-bytes = ", size(o.remote.bytes), "\n",
      "remote-expiry-s = ", o.remote.expiry_s, "\n");
}

}  // namespace evoke
