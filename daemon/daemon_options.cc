#include "daemon/daemon_options.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/log.h"

namespace evoke {
namespace {

absl::Status Invalid(absl::string_view flag, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", problem));
}

}  // namespace

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
  if (max_regions_per_lease == 0) return Invalid("max-regions-per-lease", "must be > 0");
  if (max_region_bytes == 0) return Invalid("max-region-bytes", "must be > 0");
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

uint32_t DaemonOptions::ResolvedWorkerThreads() const {
  if (worker_threads != 0) return worker_threads;
  return std::max(4u, std::thread::hardware_concurrency());
}

}  // namespace evoke
