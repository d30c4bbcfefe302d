#include "daemon/daemon.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <utility>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_posix.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/byte_size.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/access_policy.h"
#include "daemon/block_watch.h"
#include "daemon/daemon_parts.h"
#include "daemon/executor.h"
#include "daemon/fd_channel.h"
#include "daemon/kvtier_service.h"
#include "daemon/lease_manager.h"
#include "daemon/metrics_server.h"
#include "daemon/payload_paths.h"
#include "daemon/peer_listener.h"
#include "daemon/rpc_metrics.h"
#include "daemon/tcp_auth.h"
#include "gpu/cuda_ipc.h"
#include "gpu/device.h"
#include "common/copy_pool.h"
#include "storage/pinned_arena.h"
#include "storage/tier2/spill_store.h"
#include "recovery/recovery_index.h"
#include "storage/remote/remote_tier.h"
#include "storage/tier_manager.h"

#ifndef EVOKE_VERSION
#define EVOKE_VERSION "dev"
#endif

namespace evoke {
namespace {

// RecoveryFeed indexes the summaries of every block the TierManager holds
// (breadcrumbs included) for Recover.
class RecoveryFeed final : public BlockObserver {
 public:
  explicit RecoveryFeed(RecoveryIndex* index) : index_(index) {}
  void Added(const BlockId& id, const v1::BlockMeta& meta) override {
    index_->Add(id, meta);
  }
  void Removed(const BlockId& id, const v1::BlockMeta& meta) override {
    index_->Remove(id, meta);
  }

 private:
  RecoveryIndex* const index_;
};

constexpr char kServiceName[] = "evoke.v1.KvTier";

// PrepareSocketPath refuses a socket that another process is serving and
// removes a stale one (left by a crash).
absl::Status PrepareSocketPath(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("--socket: cannot stat ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(absl::StrCat(
        "--socket: ", path, " exists and is not a socket; refusing to replace it"));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("socket(): ", std::strerror(errno)));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool live =
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  if (live) {
    return absl::UnavailableError(absl::StrCat(
        "--socket: ", path, " is served by another process (another evoked?)"));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(absl::StrCat(
        "--socket: cannot remove stale ", path, ": ", std::strerror(errno)));
  }
  EVOKE_LOG_INFO("removed stale socket ", path);
  return absl::OkStatus();
}

// LoadPolicy reads --policy; without one only evoked's own uid (and root)
// may call.
absl::StatusOr<std::unique_ptr<AccessPolicy>> LoadPolicy(const DaemonOptions::Server& server) {
  if (server.policy.empty()) {
    return std::make_unique<AccessPolicy>(AccessPolicy::OwnerOnly(geteuid()));
  }
  EVOKE_ASSIGN_OR_RETURN(AccessPolicy policy, AccessPolicy::Load(server.policy));
  return std::make_unique<AccessPolicy>(std::move(policy));
}

// BindMetrics binds /metrics (null when off). An address given explicitly
// that cannot be had stops the start; the default one may be taken by
// another evoked on this host, which keeps it, and this one serves without.
absl::StatusOr<std::unique_ptr<MetricsServer>> BindMetrics(
    const DaemonOptions::Metrics& options) {
  if (options.address.empty()) return std::unique_ptr<MetricsServer>();
  absl::StatusOr<std::unique_ptr<MetricsServer>> metrics = MetricsServer::Bind(options.address);
  if (metrics.ok() || options.address_given) return metrics;
  EVOKE_LOG_WARNING("serving without /metrics: default ", metrics.status().message(),
                    " (another evoked on this host?); set --metrics-address to "
                    "choose another address, or \"\" to turn it off");
  return std::unique_ptr<MetricsServer>();
}

// OpenRemoteTier connects tier 3. With --remote-required a failure stops
// the start; otherwise evoked runs without it and keeps retrying.
absl::StatusOr<std::unique_ptr<RemoteTier>> OpenRemoteTier(
    const DaemonOptions::Remote& options) {
#ifdef EVOKE_HAVE_RADOS
  auto remote = std::make_unique<RemoteTier>(NewRadosObjectStore(ToRadosOptions(options)),
                                             ToRemoteTierOptions(options));
  const absl::Status s = remote->Start();
  if (!s.ok()) {
    if (options.required) {
      return absl::Status(s.code(), absl::StrCat("remote tier (--remote-required): ",
                                                 s.message()));
    }
    EVOKE_LOG_WARNING("remote tier not available, serving from the local tiers and "
                      "retrying in the background: ", s.message());
  } else {
    EVOKE_LOG_INFO("remote tier: rados pool ", options.pool, " (", options.conf, ")");
  }
  return remote;
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "--remote-conf ", options.conf,
      ": this evoked was built without Ceph RADOS support (EVOKE_WITH_RADOS=OFF; "
      "install librados-dev and libradospp-dev and rebuild)"));
#endif
}

// CreateTier1 allocates the pinned arena. Not being able to lock it is no
// reason to refuse to start (Stat reports it), but worth a warning.
absl::StatusOr<std::unique_ptr<PinnedArena>> CreateTier1(const DaemonOptions::Tier1& tier1) {
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<PinnedArena> arena,
                         PinnedArena::Create(ToArenaOptions(tier1)));
  const PinnedArena::Stats stats = arena->GetStats();
  if (!stats.locked) {
    EVOKE_LOG_WARNING("tier 1 is not locked in RAM: ", stats.lock_error);
  }
  return arena;
}

}  // namespace

class Daemon::Impl {
 public:
  ~Impl() {
    if (lease_reaper.joinable()) {  // A Start that failed after starting it.
      stop_reaper.Notify();
      lease_reaper.join();
    }
  }

  // The steps of Daemon::Start that wire parts to one another, in the order
  // Start calls them.
  void OpenRecovery(const DaemonOptions::Tiers& tiers_options);
  TierManagerOptions TierOptions(const DaemonOptions& options);
  void StartGpus(const DaemonOptions::Tier1& tier1, uint8_t* arena_base,
                 uint64_t arena_bytes);
  void StartLeaseReaper(const DaemonOptions::Leases& leases_options);
  KvTierServiceOptions ServiceOptions(const DaemonOptions& options);
  absl::Status StartFdChannel(const DaemonOptions& options);
  absl::Status Serve(const DaemonOptions& options,
                     std::shared_ptr<grpc::ServerCredentials> tcp_credentials);
  void ServeMetrics(const DaemonOptions::Metrics& metrics_options);

  std::string socket_path;
  std::unique_ptr<CopyPool> scan_pool;      // Outlives the RecoveryIndex.
  std::unique_ptr<RecoveryIndex> recovery;  // Outlives the TierManager.
  std::unique_ptr<RecoveryFeed> recovery_feed;
  // WatchBlocks: what happens to blocks (fed by the TierManager, which it
  // outlives) and the streams that read it.
  std::unique_ptr<BlockEventLog> events;
  std::unique_ptr<WatchHub> watch;
  std::unique_ptr<RemoteTier> remote;  // Tier 3; outlives the TierManager.
  std::unique_ptr<TierManager> tiers;
  std::unique_ptr<HostRegistration> registration;  // Of tier 1, with CUDA.
  std::unique_ptr<LeaseManager> leases;
  std::unique_ptr<DeviceCopiers> copiers;
  std::unique_ptr<FdChannel> fd_channel;
  std::unique_ptr<Executor> executor;
  RpcMetrics rpc_metrics;  // Outlives the service and the server.
  std::unique_ptr<KvTierService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<AccessPolicy> policy;
  ConnectionTable connections;
  int tcp_port = 0;  // The bound --tcp-listen port; 0 when not serving TCP.
  std::unique_ptr<PeerListener> listener;  // Stopped before the server.
  // /metrics; stopped before the service its scrapes read.
  std::unique_ptr<MetricsServer> metrics;
  // Ends leases idle past --lease-idle-ms; stopped before the leases go.
  std::thread lease_reaper;
  absl::Notification stop_reaper;
  bool cuda_available = false;
  uint32_t shutdown_grace_ms = 0;  // --shutdown-grace-ms, for Shutdown.
  absl::Mutex mu;
  bool shut_down ABSL_GUARDED_BY(mu) = false;
  absl::Status shutdown_status ABSL_GUARDED_BY(mu);
};

// The recovery index, fed by the TierManager (opened next). Large scans run
// on copy_threads threads of their own.
void Daemon::Impl::OpenRecovery(const DaemonOptions::Tiers& tiers_options) {
  if (tiers_options.copy_threads > 0) {
    scan_pool = std::make_unique<CopyPool>(static_cast<int>(tiers_options.copy_threads));
  }
  // Recover rescores with the summaries' exact values read from the
  // engine's in-RAM metadata (no f32 copy in the index). The source runs
  // without the index's lock (the engine calls the feed under its own), and
  // only for searches, which start after the TierManager is open.
  ExactSource exact = [this](const ExactRows& rows) {
    TierManager* const open_tiers = tiers.get();
    if (open_tiers == nullptr) return;  // Not open yet: every row reads as gone.
    const size_t width = static_cast<size_t>(rows.heads) * rows.dim;
    open_tiers->VisitMetas(rows.ids, [&](size_t i, const v1::BlockMeta& meta) {
      rows.found[i] = RecoveryIndex::CopySummary(meta, rows.kind, rows.layer, rows.heads,
                                                 rows.dim, rows.values + i * width);
    });
  };
  recovery = std::make_unique<RecoveryIndex>(scan_pool.get(), std::move(exact));
  recovery_feed = std::make_unique<RecoveryFeed>(recovery.get());
}

// What the options say, and the parts opened before the TierManager: the
// recovery feed, the policy's quotas and tier 3.
TierManagerOptions Daemon::Impl::TierOptions(const DaemonOptions& options) {
  TierManagerOptions tier_options = ToTierManagerOptions(options);
  // Each run's events are numbered afresh: a random epoch tells runs apart
  // in resume tokens.
  events = std::make_unique<BlockEventLog>(options.server.watch_backlog_events,
                                           std::random_device()() * (1ull << 32) +
                                               std::random_device()());
  watch = std::make_unique<WatchHub>(
      events.get(), WatchHubOptions{options.server.max_watchers,
                                    options.server.watch_backlog_events, 256});
  tier_options.observer = recovery_feed.get();
  tier_options.events = events.get();
  if (!policy->proto().namespaces().empty()) {
    const AccessPolicy* quotas = policy.get();
    tier_options.quota = [quotas](absl::string_view ns) { return quotas->QuotaOf(ns); };
  }
  tier_options.remote = remote.get();
  return tier_options;
}

// With a GPU, tier 1 is registered with CUDA in the background (unless
// --cuda-register-chunk-bytes is 0); without one, host paths only.
void Daemon::Impl::StartGpus(const DaemonOptions::Tier1& tier1, uint8_t* arena_base,
                             uint64_t arena_bytes) {
  absl::StatusOr<std::vector<GpuDevice>> gpus = ListGpus();
  cuda_available = gpus.ok();
  if (!gpus.ok()) {
    EVOKE_LOG_INFO("no GPU: ", gpus.status().message(), "; host paths only");
    return;
  }
  for (const GpuDevice& g : *gpus) {
    EVOKE_LOG_INFO("GPU ", g.ordinal, ": ", g.name, " (", FormatByteSize(g.total_memory_bytes),
                   ", sm_", g.compute_major, g.compute_minor, ")");
  }
  if (tier1.cuda_register_chunk_bytes == 0) return;
  absl::StatusOr<std::unique_ptr<HostRegistration>> reg =
      HostRegistration::Start(arena_base, arena_bytes, tier1.cuda_register_chunk_bytes);
  if (reg.ok()) {
    registration = std::move(reg).value();
  } else {
    EVOKE_LOG_WARNING("tier 1 not registered with CUDA: ", reg.status().ToString());
  }
}

// Ends leases idle past --lease-idle-ms (none when it is 0).
void Daemon::Impl::StartLeaseReaper(const DaemonOptions::Leases& leases_options) {
  if (leases_options.idle_ms == 0) return;
  const absl::Duration every = LeaseReaperInterval(leases_options);
  LeaseManager* const reaped = leases.get();
  absl::Notification* const stop = &stop_reaper;
  lease_reaper = std::thread([reaped, stop, every] {
    while (!stop->WaitForNotificationWithTimeout(every)) {
      if (const size_t n = reaped->ExpireIdle(); n > 0) {
        EVOKE_LOG_INFO("ended ", n, " idle lease(s) (--lease-idle-ms)");
      }
    }
  });
}

// What the options say, and the service's hooks into the daemon: who is
// calling, GPU state and metrics for Stat.
KvTierServiceOptions Daemon::Impl::ServiceOptions(const DaemonOptions& options) {
  KvTierServiceOptions service_options = ToServiceOptions(options);
  service_options.policy = policy.get();
  // TCP calls by their own bearer token, Unix-socket calls by their
  // connection's SO_PEERCRED; neither path can resolve the other's calls.
  service_options.identify = [this](const grpc::CallbackServerContext& context) {
    return IdentifyCaller(context, *policy, connections);
  };
  service_options.gpu_stats = [this](v1::StatResponse* s) {
    s->set_cuda_available(cuda_available);
    if (registration != nullptr) {
      s->set_pinned_cuda_registered_bytes(registration->registered_bytes());
      if (registration->done()) {
        s->set_pinned_cuda_registration_ms(absl::ToInt64Milliseconds(registration->elapsed()));
      }
    }
  };
  service_options.rpc_metrics = &rpc_metrics;
  service_options.watch = watch.get();
  if (metrics != nullptr) service_options.metrics_address = metrics->address();
  return service_options;
}

// The fd socket, where clients hand over shared memory for their leases.
absl::Status Daemon::Impl::StartFdChannel(const DaemonOptions& options) {
  FdChannelOptions fd_options = ToFdChannelOptions(options.fd);
  // The same policy as the gRPC socket: a peer it refuses is refused here
  // before anything it sends is read.
  fd_options.admit = [this](const PeerCred& peer) { return policy->ForPeer(peer).status(); };
  const std::string fd_socket = std::filesystem::absolute(options.ResolvedFdSocket()).string();
  EVOKE_ASSIGN_OR_RETURN(fd_channel, FdChannel::Start(fd_socket, leases.get(), fd_options));
  return absl::OkStatus();
}

// Serve builds the gRPC server and starts accepting on the Unix socket
// (and on TCP when configured).
absl::Status Daemon::Impl::Serve(const DaemonOptions& options,
                                 std::shared_ptr<grpc::ServerCredentials> tcp_credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // No listening port for the Unix socket: PeerListener accepts on it and
  // hands each connection over once it knows who connected. TCP, when
  // configured, is a listening port with TLS and bearer tokens only.
  if (tcp_credentials != nullptr) {
    builder.AddListeningPort(options.tcp.listen, tcp_credentials, &tcp_port);
  }
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(rpc_metrics.NewInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.server.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.server.max_message_bytes));
  builder.RegisterService(service.get());
  server = builder.BuildAndStart();
  if (!options.tcp.listen.empty() && (server == nullptr || tcp_port == 0)) {
    return absl::UnavailableError(absl::StrCat(
        "--tcp-listen: cannot serve TLS on ", options.tcp.listen,
        " (address in use or not local, or --tls-cert and --tls-key not a matching "
        "certificate and key)"));
  }
  if (server == nullptr) {
    return absl::UnavailableError(absl::StrCat("--socket: cannot serve on ", socket_path));
  }
  if (tcp_port != 0) {
    EVOKE_LOG_INFO("serving TCP on ", options.tcp.listen, " (port ", tcp_port,
                   "): TLS with ", options.tcp.tls_cert,
                   ", every call needs a principal's bearer token");
  }
  EVOKE_ASSIGN_OR_RETURN(
      listener, PeerListener::Start(socket_path, [this](int fd, const PeerCred& peer) {
        absl::StatusOr<std::shared_ptr<const Caller>> caller = policy->ForPeer(peer);
        if (!caller.ok()) {
          // Served anyway, so that every call it makes is answered with the
          // reason (PERMISSION_DENIED) instead of a dropped connection.
          EVOKE_LOG_WARNING_EVERY_N_SEC(1, "connection from ", DescribePeer(peer), ": ",
                                        caller.status().message());
        }
        connections.Set(fd, std::move(caller));
        grpc::AddInsecureChannelFromFd(server.get(), fd);
      }));
  return absl::OkStatus();
}

// /metrics, bound at the start of Start, serves once the service exists.
void Daemon::Impl::ServeMetrics(const DaemonOptions::Metrics& metrics_options) {
  if (metrics == nullptr) return;
  KvTierService* const stat_source = service.get();
  metrics->Serve([stat_source](v1::StatResponse* s) { stat_source->AdminStat(s); },
                 &rpc_metrics, metrics_options.namespaces);
  EVOKE_LOG_FIELDS(LogLevel::kInfo,
                   absl::StrCat("serving /metrics on http://", metrics->address(), "/metrics"),
                   LogField("metrics_address", metrics->address()));
}

// Start builds the parts in an order that fails early and cheaply: access
// and the addresses to bind are checked before any storage opens, and the
// sockets are served only once everything behind them exists.
absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  EVOKE_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>();
  impl->shutdown_grace_ms = options.server.shutdown_grace_ms;
  impl->socket_path = std::filesystem::absolute(options.server.socket).string();
  const absl::Time start = absl::Now();

  // Access: the policy, and the TLS files and tokens of TCP.
  EVOKE_ASSIGN_OR_RETURN(impl->policy, LoadPolicy(options.server));
  EVOKE_LOG_INFO(impl->policy->Summary());
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials;
  if (!options.tcp.listen.empty()) {
    EVOKE_ASSIGN_OR_RETURN(tcp_credentials, TcpServerCredentials(options.tcp.tls_cert,
                                                                 options.tcp.tls_key,
                                                                 impl->policy.get()));
  }
  EVOKE_ASSIGN_OR_RETURN(impl->metrics, BindMetrics(options.metrics));

  // Storage: tier 3, tier 2, tier 1, and the TierManager over them (which
  // rebuilds the block index from disk into the recovery index).
  if (!options.remote.conf.empty()) {
    EVOKE_ASSIGN_OR_RETURN(impl->remote, OpenRemoteTier(options.remote));
  }
  const SpillStoreOptions spill_options = ToSpillStoreOptions(options.tier2);
  const absl::Time tier2_start = absl::Now();
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<SpillStore> spill, SpillStore::Open(spill_options));
  const absl::Duration tier2_open = absl::Now() - tier2_start;
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<PinnedArena> arena, CreateTier1(options.tier1));
  uint8_t* const arena_base = arena->base();
  const uint64_t arena_bytes = arena->capacity_bytes();
  impl->OpenRecovery(options.tiers);
  const absl::Time index_start = absl::Now();
  EVOKE_ASSIGN_OR_RETURN(impl->tiers, TierManager::Open(impl->TierOptions(options),
                                                        std::move(arena), std::move(spill)));
  const absl::Duration index_build = absl::Now() - index_start;
  impl->StartGpus(options.tier1, arena_base, arena_bytes);

  // Clients' shared memory: leases, their reaper, device copies.
  impl->leases =
      std::make_unique<LeaseManager>(ToLeaseManagerOptions(options.leases), impl->tiers.get());
  impl->copiers = std::make_unique<DeviceCopiers>();
  impl->StartLeaseReaper(options.leases);

  // The service, then the sockets in front of it.
  impl->executor = std::make_unique<Executor>(options.server.ResolvedWorkerThreads());
  impl->service = std::make_unique<KvTierService>(
      impl->tiers.get(), impl->executor.get(), impl->leases.get(), impl->copiers.get(),
      impl->recovery.get(), impl->ServiceOptions(options));
  EVOKE_RETURN_IF_ERROR(PrepareSocketPath(impl->socket_path));
  EVOKE_RETURN_IF_ERROR(impl->StartFdChannel(options));
  EVOKE_RETURN_IF_ERROR(impl->Serve(options, std::move(tcp_credentials)));
  impl->ServeMetrics(options.metrics);
  impl->server->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  impl->server->GetHealthCheckService()->SetServingStatus("", true);

  const TierStats stat = impl->tiers->Stats();
  EVOKE_LOG_INFO(
      "evoked ", EVOKE_VERSION, " serving on unix:", impl->socket_path,
      "; tier 1: ", FormatByteSize(stat.host.capacity_bytes),
      stat.host_locked ? " (locked)" : " (not locked)",
      "; tier 2: ", spill_options.path, " (budget ", FormatByteSize(options.tier2.spill_bytes),
      "); recovered ", stat.disk.blocks, " blocks (",
      FormatByteSize(stat.disk.payload_bytes), ") and ",
      stat.breadcrumb_blocks, " breadcrumbs in ", absl::FormatDuration(absl::Now() - start),
      " (tier 2 open ", absl::FormatDuration(tier2_open), ", index ",
      absl::FormatDuration(index_build), ")");
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() {
  absl::Status s = Shutdown();
  if (!s.ok()) EVOKE_LOG_ERROR("shutdown: ", s.ToString());
}

const std::string& Daemon::socket_path() const { return impl_->socket_path; }

absl::Status Daemon::Shutdown() {
  absl::MutexLock lock(&impl_->mu);
  if (impl_->shut_down) return impl_->shutdown_status;
  impl_->shut_down = true;
  const absl::Time start = absl::Now();
  impl_->server->GetHealthCheckService()->SetServingStatus(kServiceName, false);
  impl_->server->GetHealthCheckService()->SetServingStatus("", false);
  impl_->listener.reset();  // No new connections.
  impl_->metrics.reset();   // No scrapes of what goes next.
  // Lease streams would otherwise hold the shutdown for its whole grace.
  impl_->service->CloseLeases();
  // Stops accepting, lets calls in flight finish (the executor keeps
  // running them), then cancels what is left.
  impl_->server->Shutdown(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(impl_->shutdown_grace_ms));
  impl_->executor.reset();  // Drains queued work.
  const uint64_t spills_before = impl_->tiers->Stats().counters.spills;
  absl::Status s = impl_->tiers->Shutdown();
  const uint64_t spills_after = impl_->tiers->Stats().counters.spills;
  impl_->server.reset();
  impl_->fd_channel.reset();
  impl_->service.reset();
  if (impl_->lease_reaper.joinable()) {
    impl_->stop_reaper.Notify();
    impl_->lease_reaper.join();
  }
  impl_->leases.reset();        // Unmaps regions.
  impl_->copiers.reset();
  impl_->registration.reset();  // cudaHostUnregister before tier 1 goes.
  // Tier 2 is closed (TierManager::Shutdown). The index and tier 1 go with
  // the Daemon: evoked's main exits without destroying it, since tearing
  // down a million-entry index and unmapping tier 1 took longer than the
  // whole flush (5.2 s of 19.7 s for 1M small blocks).
  unlink(impl_->socket_path.c_str());
  if (s.ok()) {
    EVOKE_LOG_INFO("shut down: flushed ",
                   spills_after - spills_before,
                   " tier-1 blocks to disk in ",
                   absl::FormatDuration(absl::Now() - start));
  } else {
    EVOKE_LOG_ERROR("shut down: flushing tier 1 failed: ", s.ToString());
  }
  impl_->shutdown_status = s;
  return s;
}

}  // namespace evoke
