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
  if (socket.empty()) return Invalid("socket", "is required");
  std::error_code ec;
  const std::string resolved = std::filesystem::absolute(socket, ec).string();
  if (ec || resolved.size() > 107) {
    return Invalid("socket", absl::StrCat("path '", resolved, "' is ",
                                          resolved.size(),
                                          " bytes; Unix sockets allow 107"));
  }
  if (data_dir.empty()) return Invalid("data-dir", "is required");
  if (pinned_bytes < (1u << 20)) {
    return Invalid("pinned-bytes", absl::StrCat(FormatByteSize(pinned_bytes),
                                                " is below the minimum of 1 MiB"));
  }
  if (!(std::isfinite(high_watermark) && high_watermark > 0 &&
        high_watermark <= 1)) {
    return Invalid("high-watermark",
                   absl::StrCat(high_watermark, " must be in (0, 1]"));
  }
  if (!(std::isfinite(low_watermark) && low_watermark > 0 &&
        low_watermark < high_watermark)) {
    return Invalid("low-watermark",
                   absl::StrCat(low_watermark, " must be in (0, --high-watermark ",
                                high_watermark, ")"));
  }
  if (max_block_bytes == 0) {
    return Invalid("max-block-bytes", "must be > 0");
  }
  if (staging_bytes < max_block_bytes) {
    return Invalid("staging-bytes", absl::StrCat(FormatByteSize(staging_bytes),
                                                 " is below --max-block-bytes (",
                                                 FormatByteSize(max_block_bytes), ")"));
  }
  if (max_message_bytes < max_block_bytes + (1u << 20) ||
      max_message_bytes > (2047ull << 20)) {
    return Invalid("max-message-bytes",
                   absl::StrCat(FormatByteSize(max_message_bytes),
                                " must be at least --max-block-bytes + 1 MiB (",
                                FormatByteSize(max_block_bytes + (1u << 20)),
                                ") and below 2 GiB"));
  }
  if (copy_threads > 64) {
    return Invalid("copy-threads", absl::StrCat(copy_threads, " exceeds 64"));
  }
  if (worker_threads > 256) {
    return Invalid("worker-threads", absl::StrCat(worker_threads, " exceeds 256"));
  }
  if (spill_batch_bytes < (1u << 20)) {
    return Invalid("spill-batch-bytes",
                   absl::StrCat(FormatByteSize(spill_batch_bytes),
                                " is below the minimum of 1 MiB"));
  }
  {
    const std::string fd = std::filesystem::absolute(ResolvedFdSocket(), ec).string();
    if (ec || fd.size() > 107) {
      return Invalid("fd-socket", absl::StrCat("path '", fd, "' is ", fd.size(),
                                               " bytes; Unix sockets allow 107"));
    }
  }
  if (summary_layer < -1 || summary_layer >= 1024) {
    return Invalid("summary-layer", absl::StrCat(summary_layer, " must be -1 or a layer index"));
  }
  if (max_leases == 0) return Invalid("max-leases", "must be > 0");
  if (max_leases_per_uid > max_leases) {
    return Invalid("max-leases-per-uid",
                   absl::StrCat(max_leases_per_uid, " exceeds --max-leases ", max_leases));
  }
  if (max_regions_per_lease == 0) return Invalid("max-regions-per-lease", "must be > 0");
  if (max_region_bytes == 0) return Invalid("max-region-bytes", "must be > 0");
  if (!tcp_listen.empty()) {
    uint16_t port = 0;
    std::string host;
    if (!SplitHostPort(tcp_listen, &host, &port)) {
      return Invalid("tcp-listen",
                     absl::StrCat("'", tcp_listen,
                                  "' is not HOST:PORT (e.g. 0.0.0.0:7070, [::1]:7070)"));
    }
    if (tls_cert.empty() || tls_key.empty()) {
      return Invalid("tcp-listen",
                     "requires --tls-cert and --tls-key (TCP is served only with TLS)");
    }
    if (policy.empty()) {
      return Invalid("tcp-listen",
                     "requires --policy (TCP clients are identified by its bearer tokens)");
    }
  } else if (!tls_cert.empty() || !tls_key.empty()) {
    return Invalid(tls_cert.empty() ? "tls-key" : "tls-cert",
                   "is used only with --tcp-listen");
  }
  if (!metrics_address.empty()) {
    const size_t colon = metrics_address.rfind(':');
    uint32_t port = 0;
    const absl::string_view host =
        colon == std::string::npos ? absl::string_view()
                                   : absl::string_view(metrics_address).substr(0, colon);
    if (colon == std::string::npos || host.empty() ||
        !absl::SimpleAtoi(absl::string_view(metrics_address).substr(colon + 1), &port) ||
        port > 65535 || metrics_address.find_first_of(" \t,") != std::string::npos) {
      return Invalid("metrics-address",
                     absl::StrCat("'", metrics_address,
                                  "' is not HOST:PORT (e.g. 127.0.0.1:9464; port 0: any "
                                  "free port; empty: off)"));
    }
  }
  if (max_mapped_bytes == 0) return Invalid("max-mapped-bytes", "must be > 0");
  if (max_mappings == 0 || max_mappings > kMaxMappingsLimit) {
    return Invalid("max-mappings", absl::StrCat(max_mappings, " must be in [1, ",
                                                kMaxMappingsLimit, "]"));
  }
  if (max_mapped_bytes_per_uid > max_mapped_bytes) {
    return Invalid("max-mapped-bytes-per-uid",
                   absl::StrCat(FormatByteSize(max_mapped_bytes_per_uid),
                                " exceeds --max-mapped-bytes ",
                                FormatByteSize(max_mapped_bytes)));
  }
  if (fd_connection_deadline_ms == 0) {
    return Invalid("fd-connection-deadline-ms", "must be > 0");
  }
  if (metadata_bytes < (1u << 20)) {
    return Invalid("metadata-bytes", absl::StrCat(FormatByteSize(metadata_bytes),
                                                  " is below the minimum of 1 MiB"));
  }
  if (remote_op_timeout_ms == 0) return Invalid("remote-op-timeout-ms", "must be > 0");
  if (remote_inflight == 0 || remote_inflight > 1024) {
    return Invalid("remote-inflight", absl::StrCat(remote_inflight, " is not in 1..1024"));
  }
  if (remote_retry_ms == 0) return Invalid("remote-retry-ms", "must be > 0");
  if (remote_retry_max_ms < remote_retry_ms) {
    return Invalid("remote-retry-max-ms", absl::StrCat(remote_retry_max_ms,
                                                       " is below --remote-retry-ms ",
                                                       remote_retry_ms));
  }
  if (!remote_conf.empty() && remote_pool.empty()) {
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
  return fd_socket.empty() ? socket + ".fd" : fd_socket;
}

uint64_t DaemonOptions::ResolvedMaxMappedBytesPerUid() const {
  return max_mapped_bytes_per_uid == 0 ? std::max<uint64_t>(1, max_mapped_bytes / 4)
                                       : max_mapped_bytes_per_uid;
}

uint32_t DaemonOptions::ResolvedMaxCallsPerUid() const {
  return max_calls_per_uid == 0 ? 4 * ResolvedWorkerThreads() : max_calls_per_uid;
}

uint32_t DaemonOptions::ResolvedWorkerThreads() const {
  if (worker_threads != 0) return worker_threads;
  return std::max(4u, std::thread::hardware_concurrency());
}

}  // namespace evoke
