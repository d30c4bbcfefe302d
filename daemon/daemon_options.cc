#include "daemon/daemon_options.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"

namespace evoke {
namespace {

absl::Status Invalid(absl::string_view flag, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

// A sanity bound, not the kernel's: the daemon still has to stay under
// vm.max_map_count, which an administrator may have raised.
constexpr uint32_t kMaxMappingsLimit = 1u << 22;

}  // namespace

bool SplitHostPort(absl::string_view address, std::string* host, uint16_t* port) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  absl::string_view h = address.substr(0, colon);
  const absl::string_view p = address.substr(colon + 1);
  if (h.front() == '[') {
    // An IPv6 literal in brackets: "[::1]".
    if (h.size() < 3 || h.back() != ']') return false;
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != absl::string_view::npos) {
    return false;  // An IPv6 literal must be bracketed.
  }
  for (char c : h) {
    if (c <= ' ' || c == '/' || c == '[' || c == ']') return false;
  }
  uint32_t value = 0;
  if (p.empty() || p.size() > 5 || !absl::SimpleAtoi(p, &value) || value == 0 ||
      value > 65535) {
    return false;
  }
  for (char c : p) {
    if (c < '0' || c > '9') return false;
  }
  *host = std::string(h);
  *port = static_cast<uint16_t>(value);
  return true;
}

absl::Status DaemonOptions::Validate() const {
  if (server.socket.empty()) return Invalid("socket", "is required");
  std::error_code ec;
  const std::string resolved = std::filesystem::absolute(server.socket, ec).string();
  if (ec || resolved.size() > 107) {
    return Invalid("socket", absl::StrCat("path '", resolved, "' is ",
                                          resolved.size(),
                                          " bytes; Unix sockets allow 107"));
  }
  if (tier2.data_dir.empty()) return Invalid("data-dir", "is required");
  if (tier1.pinned_bytes < (1u << 20)) {
    return Invalid("pinned-bytes", absl::StrCat(FormatByteSize(tier1.pinned_bytes),
                                                " is below the minimum of 1 MiB"));
  }
  if (!(std::isfinite(tier1.high_watermark) && tier1.high_watermark > 0 &&
        tier1.high_watermark <= 1)) {
    return Invalid("high-watermark",
                   absl::StrCat(tier1.high_watermark, " must be in (0, 1]"));
  }
  if (!(std::isfinite(tier1.low_watermark) && tier1.low_watermark > 0 &&
        tier1.low_watermark < tier1.high_watermark)) {
    return Invalid("low-watermark",
                   absl::StrCat(tier1.low_watermark, " must be in (0, --high-watermark ",
                                tier1.high_watermark, ")"));
  }
  if (tiers.max_block_bytes == 0) {
    return Invalid("max-block-bytes", "must be > 0");
  }
  if (tiers.staging_bytes < tiers.max_block_bytes) {
    return Invalid("staging-bytes",
                   absl::StrCat(FormatByteSize(tiers.staging_bytes),
                                " is below --max-block-bytes (",
                                FormatByteSize(tiers.max_block_bytes), ")"));
  }
  if (server.max_message_bytes < tiers.max_block_bytes + (1u << 20) ||
      server.max_message_bytes > (2047ull << 20)) {
    return Invalid("max-message-bytes",
                   absl::StrCat(FormatByteSize(server.max_message_bytes),
                                " must be at least --max-block-bytes + 1 MiB (",
                                FormatByteSize(tiers.max_block_bytes + (1u << 20)),
                                ") and below 2 GiB"));
  }
  if (tiers.copy_threads > 64) {
    return Invalid("copy-threads", absl::StrCat(tiers.copy_threads, " exceeds 64"));
  }
  if (tiers.disk_reads_in_flight < 1 || tiers.disk_reads_in_flight > 64) {
    return Invalid("disk-reads-in-flight",
                   absl::StrCat(tiers.disk_reads_in_flight, " is outside 1..64"));
  }
  if (server.worker_threads > 256) {
    return Invalid("worker-threads", absl::StrCat(server.worker_threads, " exceeds 256"));
  }
  if (tier2.spill_batch_bytes < (1u << 20)) {
    return Invalid("spill-batch-bytes",
                   absl::StrCat(FormatByteSize(tier2.spill_batch_bytes),
                                " is below the minimum of 1 MiB"));
  }
  {
    const std::string fd_path = std::filesystem::absolute(ResolvedFdSocket(), ec).string();
    if (ec || fd_path.size() > 107) {
      return Invalid("fd-socket", absl::StrCat("path '", fd_path, "' is ", fd_path.size(),
                                               " bytes; Unix sockets allow 107"));
    }
  }
  if (tiers.summary_layer < -1 || tiers.summary_layer >= 1024) {
    return Invalid("summary-layer",
                   absl::StrCat(tiers.summary_layer, " must be -1 or a layer index"));
  }
  if (leases.max_leases == 0) return Invalid("max-leases", "must be > 0");
  if (leases.max_leases_per_uid > leases.max_leases) {
    return Invalid("max-leases-per-uid",
                   absl::StrCat(leases.max_leases_per_uid, " exceeds --max-leases ",
                                leases.max_leases));
  }
  if (leases.max_regions_per_lease == 0) {
    return Invalid("max-regions-per-lease", "must be > 0");
  }
  if (leases.max_region_bytes == 0) return Invalid("max-region-bytes", "must be > 0");
  if (!tcp.listen.empty()) {
    uint16_t port = 0;
    std::string host;
    if (!SplitHostPort(tcp.listen, &host, &port)) {
      return Invalid("tcp-listen",
                     absl::StrCat("'", tcp.listen,
                                  "' is not HOST:PORT (e.g. 0.0.0.0:7070, [::1]:7070)"));
    }
    if (tcp.tls_cert.empty() || tcp.tls_key.empty()) {
      return Invalid("tcp-listen",
                     "requires --tls-cert and --tls-key (TCP is served only with TLS)");
    }
    if (server.policy.empty()) {
      return Invalid("tcp-listen",
                     "requires --policy (TCP clients are identified by its bearer tokens)");
    }
  } else if (!tcp.tls_cert.empty() || !tcp.tls_key.empty()) {
    return Invalid(tcp.tls_cert.empty() ? "tls-key" : "tls-cert",
                   "is used only with --tcp-listen");
  }
  if (!metrics.address.empty()) {
    const size_t colon = metrics.address.rfind(':');
    uint32_t port = 0;
    const absl::string_view host =
        colon == std::string::npos ? absl::string_view()
                                   : absl::string_view(metrics.address).substr(0, colon);
    if (colon == std::string::npos || host.empty() ||
        !absl::SimpleAtoi(absl::string_view(metrics.address).substr(colon + 1), &port) ||
        port > 65535 || metrics.address.find_first_of(" \t,") != std::string::npos) {
      return Invalid("metrics-address",
                     absl::StrCat("'", metrics.address,
                                  "' is not HOST:PORT (e.g. 127.0.0.1:9464; port 0: any "
                                  "free port; empty: off)"));
    }
  }
  if (leases.max_mapped_bytes == 0) return Invalid("max-mapped-bytes", "must be > 0");
  if (leases.max_mappings == 0 || leases.max_mappings > kMaxMappingsLimit) {
    return Invalid("max-mappings", absl::StrCat(leases.max_mappings, " must be in [1, ",
                                                kMaxMappingsLimit, "]"));
  }
  if (leases.max_mapped_bytes_per_uid > leases.max_mapped_bytes) {
    return Invalid("max-mapped-bytes-per-uid",
                   absl::StrCat(FormatByteSize(leases.max_mapped_bytes_per_uid),
                                " exceeds --max-mapped-bytes ",
                                FormatByteSize(leases.max_mapped_bytes)));
  }
  if (fd.connection_deadline_ms == 0) {
    return Invalid("fd-connection-deadline-ms", "must be > 0");
  }
  if (tiers.metadata_bytes < (1u << 20)) {
    return Invalid("metadata-bytes", absl::StrCat(FormatByteSize(tiers.metadata_bytes),
                                                  " is below the minimum of 1 MiB"));
  }
  if (remote.op_timeout_ms == 0) return Invalid("remote-op-timeout-ms", "must be > 0");
  if (remote.inflight == 0 || remote.inflight > 1024) {
    return Invalid("remote-inflight", absl::StrCat(remote.inflight, " is not in 1..1024"));
  }
  if (remote.retry_ms == 0) return Invalid("remote-retry-ms", "must be > 0");
  if (remote.retry_max_ms < remote.retry_ms) {
    return Invalid("remote-retry-max-ms", absl::StrCat(remote.retry_max_ms,
                                                       " is below --remote-retry-ms ",
                                                       remote.retry_ms));
  }
  if (!remote.conf.empty() && remote.pool.empty()) {
    return Invalid("remote-pool", "must not be empty with --remote-conf");
  }
  LogLevel level;
  if (!ParseLogLevel(log_level, &level)) {
    return Invalid("log-level", absl::StrCat("'", log_level,
                                             "' is not debug, info, warning or error"));
  }
  return absl::OkStatus();
}

std::string DaemonOptions::ResolvedFdSocket() const {
  return fd.socket.empty() ? server.socket + ".fd" : fd.socket;
}

uint64_t DaemonOptions::Leases::ResolvedMaxMappedBytesPerUid() const {
  return max_mapped_bytes_per_uid == 0 ? std::max<uint64_t>(1, max_mapped_bytes / 4)
                                       : max_mapped_bytes_per_uid;
}

uint32_t DaemonOptions::Server::ResolvedMaxCallsPerUid() const {
  return max_calls_per_uid == 0 ? 4 * ResolvedWorkerThreads() : max_calls_per_uid;
}

uint32_t DaemonOptions::Server::ResolvedWorkerThreads() const {
  if (worker_threads != 0) return worker_threads;
  return std::max(4u, std::thread::hardware_concurrency());
}

}  // namespace evoke
