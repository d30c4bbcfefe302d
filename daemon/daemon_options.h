// DaemonOptions: everything evoked can be told, grouped by the part of the
// daemon that uses it (server, tcp, metrics, tier1, tier2, tiers, remote,
// leases, fd, rings), so that Daemon::Start builds each part from its own
// group (daemon/daemon_parts.h). Command-line flags and the optional config
// file map 1:1 onto these fields; their names predate the groups and stay
// as they were (flag --pinned-bytes, config key pinned-bytes, field
// tier1.pinned_bytes; --remote-conf is remote.conf). daemon_flags.cc maps
// each flag to its field.
#ifndef EVOKE_DAEMON_DAEMON_OPTIONS_H_
#define EVOKE_DAEMON_DAEMON_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace evoke {

struct DaemonOptions {
  // The API's server (gRPC on the Unix socket, KvTierService, its worker
  // threads) and who may call it.
  struct Server {
    // Unix socket the API is served on, created mode 0660. A relative path
    // is resolved against the working directory at start. At most 107
    // bytes once resolved (the sun_path limit).
    // Default: "evoked.sock" (in the current directory).
    std::string socket = "evoked.sock";

    // Access policy file (docs/ACCESS.md): which uids/gids (and, over TCP,
    // which bearer tokens) may use which namespaces, which are admins, which
    // namespaces are shared and their quotas. Empty means no policy: only
    // evoked's own uid and root may call.
    // Default: "" (none).
    std::string policy;

    // Largest gRPC message, received or sent. Must exceed
    // tiers.max_block_bytes by at least 1 MiB (room for metadata).
    // Default: 80 MiB.
    uint64_t max_message_bytes = 80ull << 20;

    // Threads that run RPCs which copy bytes or touch disk. 0 means
    // max(4, hardware threads). At most 256.
    // Default: 0.
    uint32_t worker_threads = 0;

    // RPCs of one uid queued or running on the worker threads at once; past
    // it a call is RESOURCE_EXHAUSTED at once. Workers serve uids in turn
    // (round robin), so a uid with many calls queued delays another uid's
    // call by at most one call of its own. 0: 4 x the worker threads.
    // Default: 0.
    uint32_t max_calls_per_uid = 0;

    // WatchBlocks: events kept for watchers to catch up from (a resume
    // token older than these reports the loss), and streams open at once.
    // Defaults: 65536, 256.
    uint32_t watch_backlog_events = 65536;
    uint32_t max_watchers = 256;

    // How long SIGTERM waits for in-flight RPCs before cancelling them.
    // Default: 5000 ms.
    uint32_t shutdown_grace_ms = 5000;

    // ResolvedWorkerThreads returns worker_threads, or the automatic count.
    uint32_t ResolvedWorkerThreads() const;
    // ResolvedMaxCallsPerUid returns max_calls_per_uid, or 4 x the workers.
    uint32_t ResolvedMaxCallsPerUid() const;
  };

  // The API on TCP as well (tcp_auth.h): a listening port of the same
  // server, with TLS and the policy's bearer tokens.
  struct Tcp {
    // TCP address to serve the API on as well, "HOST:PORT" ("[::1]:7070" for
    // an IPv6 literal, "0.0.0.0:7070" for every interface). Empty means Unix
    // socket only. TCP is served only with TLS (--tls-cert, --tls-key) and
    // bearer tokens from --policy, so all three are required with it.
    // Flag: --tcp-listen. Default: "" (off).
    std::string listen;

    // PEM certificate chain and private key of the TCP listener. Required
    // with --tcp-listen, refused without it.
    // Default: "".
    std::string tls_cert;
    std::string tls_key;
  };

  // Prometheus /metrics (MetricsServer).
  struct Metrics {
    static constexpr absl::string_view kDefaultAddress = "127.0.0.1:9464";
    // Where to serve Prometheus /metrics over plain HTTP, "HOST:PORT" (port
    // 0: the kernel picks one; Stat and the log say which). Empty: off. With
    // --metrics-namespaces the figures name every namespace (tenant);
    // without it they are aggregates (docs/METRICS.md). When the default
    // address is busy (another evoked on the host), evoked warns and serves
    // without /metrics; an address given with --metrics-address (or in the
    // config file) that cannot be bound stops the start instead.
    // Flag: --metrics-address. Default: "127.0.0.1:9464".
    std::string address = std::string(kDefaultAddress);
    // Whether address was given (flag or config file) rather than left at
    // its default. Set by ParseDaemonFlags; not a flag of its own.
    bool address_given = false;
    // Per-namespace series on /metrics (evoke_namespace_*, labelled with
    // each tenant's namespace name, blocks and bytes). Off, /metrics shows
    // aggregates only: anyone who can reach it (any local user on loopback)
    // would otherwise learn every tenant's name and usage.
    // Flag: --metrics-namespaces. Default: false.
    bool namespaces = false;
  };

  // Tier 1: the pinned host-memory arena (PinnedArena), when it spills
  // (the TierManager's watermarks) and its registration with CUDA.
  struct Tier1 {
    // Size of tier 1, the pinned host-memory arena, allocated at start.
    // Default: 1 GiB.
    uint64_t pinned_bytes = 1ull << 30;

    // Tier 1 spills once used bytes pass high_watermark * pinned_bytes,
    // down to low_watermark * pinned_bytes. 0 < low < high <= 1.
    // Defaults: 0.95 and 0.80.
    double high_watermark = 0.95;
    double low_watermark = 0.80;

    // mlock tier 1 (best effort; Stat reports whether it worked).
    // Default: true.
    bool lock_memory = true;

    // When tier 1 is not locked, fault its pages in on a background thread
    // at start, so that Saves into fresh space do not pay for the kernel
    // zeroing pages (PinnedArenaOptions::prefault). Commits pinned_bytes of
    // memory.
    // Default: true.
    bool prefault_memory = true;

    // When a GPU exists, tier 1 is registered with CUDA (cudaHostRegister)
    // in chunks of this size on a background thread. 0 disables
    // registration.
    // Default: 1 GiB.
    uint64_t cuda_register_chunk_bytes = 1ull << 30;
  };

  // Tier 2: the spill store on disk (SpillStore) and what the spiller
  // writes to it.
  struct Tier2 {
    // Directory of the spill store (RocksDB). Created when missing; one
    // evoked per directory (a second one is refused).
    // Default: "evoke-data" (in the current directory).
    std::string data_dir = "evoke-data";

    // Budget of payload bytes in tier 2 (disk). Past it, the least recently
    // used payloads are dropped and their metadata kept (breadcrumbs).
    // Default: 16 GiB.
    uint64_t spill_bytes = 16ull << 30;

    // fsync the spill store's WAL on every spill batch. Without it a
    // process crash loses nothing that was spilled; a machine crash may
    // lose the last batches. Durable saves always fsync.
    // Default: false.
    bool spill_sync = false;

    // Payload bytes written to disk per spill batch.
    // Default: 64 MiB.
    uint64_t spill_batch_bytes = 64ull << 20;
  };

  // The TierManager over all tiers: what a block may be, the memory its
  // Saves and Loads may hold, its copy threads and its summaries.
  struct Tiers {
    // Largest payload of one block (a protocol limit: larger payloads are
    // INVALID_ARGUMENT). A block that is within it but larger than tier 1
    // is RESOURCE_EXHAUSTED.
    // Default: 64 MiB.
    uint64_t max_block_bytes = 64ull << 20;

    // Heap bytes that Loads may hold at once, over every call, for blocks
    // read from disk (or tier 3) that land neither in tier 1 nor in the
    // caller's memory (scatter lists, CUDA, inline). At least
    // max_block_bytes.
    // Default: 256 MiB.
    uint64_t staging_bytes = 256ull << 20;

    // Budget of block metadata held in memory (ids, tokens, positions,
    // summaries, breadcrumbs) over all namespaces. A Save past it is
    // RESOURCE_EXHAUSTED. At least 1 MiB.
    // Default: 1 GiB.
    uint64_t metadata_bytes = 1ull << 30;

    // How long a Save may wait for tier 1 to spill before
    // RESOURCE_EXHAUSTED.
    // Default: 10000 ms.
    uint32_t save_wait_ms = 10000;

    // Extra threads that copy and checksum payloads of 512 KiB or more in parallel,
    // and as many again that scan recovery tables of 32k rows or more.
    // 0 does both on the RPC's own thread. At most 64.
    // Default: 2.
    uint32_t copy_threads = 2;

    // Tier-2 reads one Load keeps in flight at once, for the blocks it
    // reads from disk into a destination known in advance (a region, or
    // room in tier 1). 1 reads them one after another. At most 64.
    // Default: 4.
    uint32_t disk_reads_in_flight = 4;

    // The layer whose keys the daemon summarizes (SUMMARY_MEAN_KEYS) for
    // canonical blocks saved without such a summary; -1 means the middle of
    // each block's layers. Recover asks for a layer: use the same one.
    // Default: -1.
    int32_t summary_layer = -1;
  };

  // Tier 3, a Ceph RADOS pool that several evoked hosts share
  // (docs/REMOTE.md): the RadosObjectStore, the RemoteTier over it, and the
  // TierManager's write-behind. Empty conf means none. Each field is the
  // flag --remote-<name>, e.g. conf is --remote-conf.
  struct Remote {
    // ceph.conf of the cluster (monitors, auth). Default: "" (no tier 3).
    std::string conf;
    // Pool of the blocks; each evoke namespace is a RADOS namespace in it.
    // Default: "evoke".
    std::string pool = "evoke";
    // Ceph user and keyring (empty: what conf says).
    // Defaults: "client.admin", "".
    std::string user = "client.admin";
    std::string keyring;
    // Deadline of every remote operation (connect included). Default:
    // 5000 ms.
    uint32_t op_timeout_ms = 5000;
    // true: a remote tier that cannot be reached at start (bad conf path,
    // unreachable monitors, unknown pool) stops evoked with the reason.
    // false: evoked starts without it, serves from its local tiers, reports
    // the reason in Stat and keeps retrying. Default: false.
    bool required = false;
    // Write session blocks to tier 3 too (to move a session to another
    // host); prefix blocks always go. Default: false.
    bool sessions = false;
    // Bound of the write-behind queue; past it the newest are dropped
    // (counted), so the heads of chains already queued still go. Default:
    // 256 MiB.
    uint64_t queue_bytes = 256ull << 20;
    // Write-behind budget: payload bytes per second it may copy and write
    // (a token bucket; 0: no limit), and the bucket's burst. Defaults: 0,
    // 64 MiB.
    uint64_t write_bytes_per_s = 0;
    uint64_t write_burst_bytes = 64ull << 20;
    // Remote operations in flight (and blocks per write-behind batch).
    // Default: 16.
    uint32_t inflight = 16;
    // The circuit breaker: after a failure tier 3 is left alone for
    // retry_ms, doubling on each failed retry up to retry_max_ms.
    // Defaults: 1000 and 30000.
    uint32_t retry_ms = 1000;
    uint32_t retry_max_ms = 30000;
    // Write-behind pauses while the pool holds more than this (0: no limit
    // but the pool's own quota). Default: 0.
    uint64_t bytes = 0;
    // Blocks written to tier 3 more than this many seconds ago are removed
    // by a sweep every min(expiry / 4, 1 h), whichever host wrote them (0:
    // never). Age is since written, not since last read. Default: 0.
    uint64_t expiry_s = 0;
  };

  // Leases (LeaseManager) and the client shared memory registered with
  // them.
  struct Leases {
    // Open leases at once. Default: 4096.
    uint32_t max_leases = 4096;
    // Open leases of one uid, so that no uid can take them all (TCP
    // principals share one count). 0: a quarter of max_leases.
    // Default: 0.
    uint32_t max_leases_per_uid = 0;

    // Regions (shared memory or CUDA) one lease may register. Default: 256.
    uint32_t max_regions_per_lease = 256;

    // Largest registered region. Default: 64 GiB.
    uint64_t max_region_bytes = 64ull << 30;

    // Client shared memory mapped at once, over all leases, and the number
    // of mappings. A registration past either is RESOURCE_EXHAUSTED. Keep
    // max_mappings well under vm.max_map_count (65530 by default), which
    // the daemon's own allocations share: past it mmap fails and allocators
    // abort.
    // Defaults: 64 GiB and 16384.
    uint64_t max_mapped_bytes = 64ull << 30;
    uint32_t max_mappings = 16384;

    // Client shared memory mapped at once by the processes of one uid. 0
    // means a quarter of max_mapped_bytes (no uid can map it all).
    // Default: 0.
    uint64_t max_mapped_bytes_per_uid = 0;

    // A lease with no RPC for this long is closed and its regions unmapped.
    // 0 means never (leases end when their client closes them or its
    // process exits).
    // Flag: --lease-idle-ms. Default: 0.
    uint32_t idle_ms = 0;

    // ResolvedMaxMappedBytesPerUid returns max_mapped_bytes_per_uid, or a
    // quarter of max_mapped_bytes when it is 0.
    uint64_t ResolvedMaxMappedBytesPerUid() const;
  };

  // The fd socket (FdChannel), where clients hand shared memory over.
  struct Fd {
    // Unix socket for shared-memory registration (FdChannel, SCM_RIGHTS),
    // mode 0660. Empty means the API socket's path + ".fd".
    // Flag: --fd-socket. Default: "".
    std::string socket;

    // Total time one fd-socket connection has, from accept to its last
    // reply, however slowly it sends (a per-read timeout lets a trickling
    // client hold the connection for ever).
    // Flag: --fd-connection-deadline-ms. Default: 2000 ms.
    uint32_t connection_deadline_ms = 2000;
  };

  // The command rings (RingOptions).
  struct Rings {
    // The longest a command ring's thread polls for its client's next
    // submission before sleeping (RingOptions::spin_max): it polls for
    // twice the recent gap between submissions while that is under half of
    // this, 50 us otherwise. A ring of a client that submits every few
    // hundred microseconds then keeps a core busy; 50 or less: always 50 us.
    // Flag: --ring-poll-max-us. Default: 1000.
    uint32_t poll_max_us = 1000;
  };

  Server server;
  Tcp tcp;
  Metrics metrics;
  Tier1 tier1;
  Tier2 tier2;
  Tiers tiers;
  Remote remote;
  Leases leases;
  Fd fd;
  Rings rings;

  // debug, info, warning or error. The process's (main sets the logger
  // before anything starts), not one part's.
  // Default: "info".
  std::string log_level = "info";

  // Validate checks every field and returns INVALID_ARGUMENT naming the
  // flag, e.g. "--low-watermark: 0.99 must be below --high-watermark 0.95".
  // One check for all groups, since some relate fields of two groups
  // (--max-message-bytes and --max-block-bytes, --tcp-listen and --policy).
  absl::Status Validate() const;

  // ResolvedFdSocket returns fd.socket, or the default next to
  // server.socket.
  std::string ResolvedFdSocket() const;
};

// SplitHostPort splits "HOST:PORT" ("[v6]:PORT" for an IPv6 literal, host
// returned without brackets); false unless the port is 1..65535 and the host
// is non-empty. Used for --tcp-listen.
bool SplitHostPort(absl::string_view address, std::string* host, uint16_t* port);

}  // namespace evoke

#endif  // EVOKE_DAEMON_DAEMON_OPTIONS_H_
