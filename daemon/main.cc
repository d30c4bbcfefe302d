// evoked: the evoke KV-cache tier daemon. See daemon_options.h for flags.
//
// Exit status: 0 after a clean shutdown (SIGTERM or SIGINT: tier 1 is
// flushed to disk first), 1 when starting or flushing failed, 2 for bad
// flags.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/log.h"
#include "daemon/daemon.h"
#include "daemon/daemon_flags.h"

namespace {

// RetainFreedHeap keeps the heap memory that gRPC's receive buffers return
// instead of giving it back to the kernel at once. gRPC reads a message into
// freshly malloc'd slices of up to a few MiB and frees them once the call
// is done; with glibc's defaults (memory over 128 KiB at the top of a heap
// is trimmed, large blocks are mmapped and unmapped) every inline Save
// faulted most of its receive buffers in anew: about 1,500 page faults per
// 16 MiB Save, measured with evoke-bench (about 400 with this; heaps that
// empty completely are still unmapped). Blocks under 32 MiB now come from
// the heaps, and up to one largest message per heap stays mapped for the
// next call. Process-wide, so set here and not in the library.
void RetainFreedHeap(uint64_t max_message_bytes) {
  constexpr int kMmapThreshold = 32 << 20;  // glibc's upper bound for it.
  const int trim = static_cast<int>(
      std::min<uint64_t>(std::max<uint64_t>(max_message_bytes, kMmapThreshold), 1u << 30));
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
  mallopt(M_TRIM_THRESHOLD, trim);
}

}  // namespace

int main(int argc, char** argv) {
  evoke::SetLogProgram("evoked");
  evoke::DaemonOptions options;
  std::string output;
  bool exit_now = false;
  absl::Status parsed =
      evoke::ParseDaemonFlags(argc, argv, &options, &output, &exit_now);
  if (!parsed.ok()) {
    std::fprintf(stderr, "evoked: %s\n", std::string(parsed.message()).c_str());
    return 2;
  }
  if (exit_now) {
    std::fputs(output.c_str(), stdout);
    return 0;
  }
  evoke::LogLevel level = evoke::LogLevel::kInfo;
  evoke::ParseLogLevel(options.log_level, &level);
  evoke::SetLogLevel(level);
  RetainFreedHeap(options.server.max_message_bytes);

  // Files evoked creates (RocksDB's WAL, SST and blob files, logs) hold other
  // processes' KV bytes: owner-only whatever umask evoked was started with.
  // The sockets set their own modes (0660).
  umask(077);

  // Block the shutdown signals in every thread (all are created after this)
  // and take them synchronously below.
  signal(SIGPIPE, SIG_IGN);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<evoke::Daemon>> daemon =
      evoke::Daemon::Start(options);
  if (!daemon.ok()) {
    EVOKE_LOG_ERROR("cannot start: ", daemon.status().ToString());
    return 1;
  }
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  EVOKE_LOG_INFO("received ", signal_number == SIGTERM ? "SIGTERM" : "SIGINT",
                 ": flushing tier 1 to disk and exiting");
  const absl::Status s = (*daemon)->Shutdown();
  // Everything that must outlive the process is on disk and closed; what
  // is left is memory (the block index, tier 1), which the kernel frees
  // faster than destructors would.
  std::fflush(nullptr);
  std::_Exit(s.ok() ? 0 : 1);
}
