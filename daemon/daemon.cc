#include "daemon/daemon.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <filesystem>
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
#include "common/summaries.h"
#include "daemon/access_policy.h"
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
#ifdef EVOKE_HAVE_RADOS
#include "storage/remote/rados_store.h"
#endif

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

// OpenRemoteTier connects tier 3. With --remote-required a failure stops
// the start; otherwise evoked runs without it and keeps retrying.
absl::StatusOr<std::unique_ptr<RemoteTier>> OpenRemoteTier(const DaemonOptions& options) {
#ifdef EVOKE_HAVE_RADOS
  RadosOptions rados;
  rados.conf_path = options.remote_conf;
  rados.pool = options.remote_pool;
  rados.user = options.remote_user;
  rados.keyring = options.remote_keyring;
  rados.op_timeout = absl::Milliseconds(options.remote_op_timeout_ms);
  rados.inflight = static_cast<int>(options.remote_inflight);
  RemoteTierOptions tier;
  tier.retry = absl::Milliseconds(options.remote_retry_ms);
  tier.retry_max = absl::Milliseconds(options.remote_retry_max_ms);
  tier.budget_bytes = options.remote_bytes;
  if (options.remote_expiry_s > 0) {
    tier.expire_after = absl::Seconds(static_cast<int64_t>(
        std::min<uint64_t>(options.remote_expiry_s, uint64_t{1} << 40)));
    tier.sweep_every = std::clamp(tier.expire_after / 4, absl::Seconds(1), absl::Hours(1));
  }
  auto remote = std::make_unique<RemoteTier>(NewRadosObjectStore(rados), tier);
  const absl::Status s = remote->Start();
  if (!s.ok()) {
    if (options.remote_required) {
      return absl::Status(s.code(), absl::StrCat("remote tier (--remote-required): ",
                                                 s.message()));
    }
    EVOKE_LOG_WARNING("remote tier not available, serving from the local tiers and "
                      "retrying in the background: ", s.message());
  } else {
    EVOKE_LOG_INFO("remote tier: rados pool ", options.remote_pool, " (", options.remote_conf,
                   ")");
  }
  return remote;
#else
  return absl::FailedPreconditionError(absl::StrCat(
      "--remote-conf ", options.remote_conf,
      ": this evoked was built without Ceph RADOS support (EVOKE_WITH_RADOS=OFF; "
      "install librados-dev and libradospp-dev and rebuild)"));
#endif
}

// NeedsMeanKeys: the daemon adds a MEAN_KEYS summary to canonical blocks
// saved without one (and with room for one more summary).
bool NeedsMeanKeys(const v1::BlockMeta& meta) {
  if (meta.fingerprint().layout() != v1::LAYOUT_CANONICAL_V1 || meta.summaries_size() >= 8) {
    return false;
  }
  for (const v1::Summary& s : meta.summaries()) {
    if (s.kind() == v1::SUMMARY_MEAN_KEYS) return false;
  }
  return true;
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
  std::string socket_path;
  std::unique_ptr<CopyPool> scan_pool;      // Outlives the RecoveryIndex.
  std::unique_ptr<RecoveryIndex> recovery;  // Outlives the TierManager.
  std::unique_ptr<RecoveryFeed> recovery_feed;
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
  DaemonOptions options;
  absl::Mutex mu;
  bool shut_down ABSL_GUARDED_BY(mu) = false;
  absl::Status shutdown_status ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  EVOKE_RETURN_IF_ERROR(options.Validate());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->socket_path = std::filesystem::absolute(options.socket).string();
  const std::string data_dir = std::filesystem::absolute(options.data_dir).string();
  const absl::Time start = absl::Now();

  if (options.policy.empty()) {
    impl->policy = std::make_unique<AccessPolicy>(AccessPolicy::OwnerOnly(geteuid()));
  } else {
    EVOKE_ASSIGN_OR_RETURN(AccessPolicy policy, AccessPolicy::Load(options.policy));
    impl->policy = std::make_unique<AccessPolicy>(std::move(policy));
  }
  EVOKE_LOG_INFO(impl->policy->Summary());
  // TLS files and tokens are checked before any storage is opened.
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials;
  if (!options.tcp_listen.empty()) {
    EVOKE_ASSIGN_OR_RETURN(
        tcp_credentials,
        TcpServerCredentials(options.tls_cert, options.tls_key, impl->policy.get()));
  }

  // /metrics is bound before any storage opens, so that an address given
  // explicitly that cannot be had stops the start at once. The default one
  // may be taken by another evoked on this host: that one keeps it.
  if (!options.metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> metrics =
        MetricsServer::Bind(options.metrics_address);
    if (metrics.ok()) {
      impl->metrics = std::move(metrics).value();
    } else if (options.metrics_address_given) {
      return metrics.status();
    } else {
      EVOKE_LOG_WARNING("serving without /metrics: default ", metrics.status().message(),
                        " (another evoked on this host?); set --metrics-address to "
                        "choose another address, or \"\" to turn it off");
    }
  }

  if (!options.remote_conf.empty()) {
    EVOKE_ASSIGN_OR_RETURN(impl->remote, OpenRemoteTier(options));
  }

  SpillStoreOptions spill_options;
  spill_options.path = data_dir;
  spill_options.sync = options.spill_sync;
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<SpillStore> spill,
                         SpillStore::Open(spill_options));

  PinnedArenaOptions arena_options;
  arena_options.capacity_bytes = options.pinned_bytes;
  arena_options.lock_memory = options.lock_memory;
  arena_options.prefault = options.prefault_memory;
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<PinnedArena> arena,
                         PinnedArena::Create(arena_options));
  const PinnedArena::Stats arena_stats = arena->GetStats();
  uint8_t* const arena_base = arena->base();
  const uint64_t arena_bytes = arena->capacity_bytes();
  if (!arena_stats.locked) {
    EVOKE_LOG_WARNING("tier 1 is not locked in RAM: ", arena_stats.lock_error);
  }

  // Large recovery scans run on copy_threads threads of their own.
  if (options.copy_threads > 0) {
    impl->scan_pool = std::make_unique<CopyPool>(static_cast<int>(options.copy_threads));
  }
  // Recover rescores with the summaries' exact values read from the
  // engine's in-RAM metadata (no f32 copy in the index). The source runs
  // without the index's lock (the engine calls the feed under its own), and
  // only for searches, which start after the TierManager is open.
  Impl* const self = impl.get();
  ExactSource exact = [self](const ExactRows& rows) {
    TierManager* const tiers = self->tiers.get();
    if (tiers == nullptr) return;  // Not open yet: every row reads as gone.
    const size_t width = static_cast<size_t>(rows.heads) * rows.dim;
    tiers->VisitMetas(rows.ids, [&](size_t i, const v1::BlockMeta& meta) {
      rows.found[i] = RecoveryIndex::CopySummary(meta, rows.kind, rows.layer, rows.heads,
                                                 rows.dim, rows.values + i * width);
    });
  };
  impl->recovery = std::make_unique<RecoveryIndex>(impl->scan_pool.get(), std::move(exact));
  impl->recovery_feed = std::make_unique<RecoveryFeed>(impl->recovery.get());
  TierManagerOptions tier_options;
  tier_options.observer = impl->recovery_feed.get();
  // MEAN_KEYS for canonical blocks saved without one, so Recover can find
  // every block an engine evicts.
  tier_options.summarize = [layer_option = options.summary_layer](
                               const v1::BlockMeta& meta, const uint8_t* payload,
                               uint64_t size) -> std::optional<v1::Summary> {
    if (!NeedsMeanKeys(meta)) return std::nullopt;
    uint32_t layer = DefaultSummaryLayer(meta);
    if (layer_option >= 0 && static_cast<uint32_t>(layer_option) >= meta.layer_begin() &&
        static_cast<uint32_t>(layer_option) < meta.layer_end()) {
      layer = static_cast<uint32_t>(layer_option);
    }
    absl::StatusOr<v1::Summary> s = MeanKeysSummary(meta, payload, size, layer);
    if (!s.ok()) {
      EVOKE_LOG_DEBUG("no mean_keys summary: ", s.status().ToString());
      return std::nullopt;
    }
    return std::move(s).value();
  };
  // Charged at the quota check: a float per KV head and dimension, and the
  // summary's own fields and framing.
  tier_options.summary_bound = [](const v1::BlockMeta& meta) -> uint64_t {
    if (!NeedsMeanKeys(meta)) return 0;
    return 4ull * meta.fingerprint().n_kv_heads() * meta.fingerprint().head_dim() + 64;
  };
  tier_options.limits.max_block_bytes = options.max_block_bytes;
  tier_options.staging_bytes = options.staging_bytes;
  tier_options.metadata_bytes = options.metadata_bytes;
  if (!impl->policy->proto().namespaces().empty()) {
    const AccessPolicy* policy = impl->policy.get();
    tier_options.quota = [policy](absl::string_view ns) { return policy->QuotaOf(ns); };
  }
  tier_options.high_watermark = options.high_watermark;
  tier_options.low_watermark = options.low_watermark;
  tier_options.spill_bytes = options.spill_bytes;
  tier_options.spill_batch_bytes = options.spill_batch_bytes;
  tier_options.max_wait_for_room = absl::Milliseconds(options.save_wait_ms);
  tier_options.copy_threads = static_cast<int>(options.copy_threads);
  tier_options.remote = impl->remote.get();
  tier_options.remote_sessions = options.remote_sessions;
  tier_options.remote_queue_bytes = options.remote_queue_bytes;
  tier_options.remote_batch_blocks = static_cast<int>(options.remote_inflight);
  EVOKE_ASSIGN_OR_RETURN(
      impl->tiers, TierManager::Open(tier_options, std::move(arena), std::move(spill)));

  absl::StatusOr<std::vector<GpuDevice>> gpus = ListGpus();
  impl->cuda_available = gpus.ok();
  if (gpus.ok()) {
    for (const GpuDevice& g : *gpus) {
      EVOKE_LOG_INFO("GPU ", g.ordinal, ": ", g.name, " (",
                     FormatByteSize(g.total_memory_bytes), ", sm_", g.compute_major,
                     g.compute_minor, ")");
    }
    if (options.cuda_register_chunk_bytes > 0) {
      absl::StatusOr<std::unique_ptr<HostRegistration>> reg = HostRegistration::Start(
          arena_base, arena_bytes, options.cuda_register_chunk_bytes);
      if (reg.ok()) {
        impl->registration = std::move(reg).value();
      } else {
        EVOKE_LOG_WARNING("tier 1 not registered with CUDA: ", reg.status().ToString());
      }
    }
  } else {
    EVOKE_LOG_INFO("no GPU: ", gpus.status().message(), "; host paths only");
  }

  LeaseManagerOptions lease_options;
  lease_options.max_leases = options.max_leases;
  lease_options.max_leases_per_uid = options.max_leases_per_uid;
  lease_options.max_regions_per_lease = options.max_regions_per_lease;
  lease_options.max_region_bytes = options.max_region_bytes;
  lease_options.max_mapped_bytes = options.max_mapped_bytes;
  lease_options.max_mapped_bytes_per_uid = options.ResolvedMaxMappedBytesPerUid();
  lease_options.max_mappings = options.max_mappings;
  if (options.lease_idle_ms > 0) {
    lease_options.idle_timeout = absl::Milliseconds(options.lease_idle_ms);
  }
  impl->leases = std::make_unique<LeaseManager>(lease_options, impl->tiers.get());
  impl->copiers = std::make_unique<DeviceCopiers>();

  if (options.lease_idle_ms > 0) {
    const absl::Duration every =
        std::clamp(absl::Milliseconds(options.lease_idle_ms) / 4, absl::Milliseconds(50),
                   absl::Seconds(5));
    LeaseManager* leases = impl->leases.get();
    absl::Notification* stop = &impl->stop_reaper;
    impl->lease_reaper = std::thread([leases, stop, every] {
      while (!stop->WaitForNotificationWithTimeout(every)) {
        if (const size_t n = leases->ExpireIdle(); n > 0) {
          EVOKE_LOG_INFO("ended ", n, " idle lease(s) (--lease-idle-ms)");
        }
      }
    });
  }
  impl->executor = std::make_unique<Executor>(options.ResolvedWorkerThreads());
  const std::string fd_socket =
      std::filesystem::absolute(options.ResolvedFdSocket()).string();
  KvTierServiceOptions service_options;
  service_options.limits.block.max_block_bytes = options.max_block_bytes;
  service_options.max_message_bytes = options.max_message_bytes;
  service_options.rings.spin_max = absl::Microseconds(options.ring_poll_max_us);
  service_options.max_calls_per_uid = options.ResolvedMaxCallsPerUid();
  service_options.data_dir = data_dir;
  service_options.version = EVOKE_VERSION;
  service_options.fd_socket = fd_socket;
  Impl* raw = impl.get();
  service_options.policy = impl->policy.get();
  // TCP calls by their own bearer token, Unix-socket calls by their
  // connection's SO_PEERCRED; neither path can resolve the other's calls.
  service_options.identify = [raw](const grpc::CallbackServerContext& context) {
    return IdentifyCaller(context, *raw->policy, raw->connections);
  };
  service_options.gpu_stats = [raw](v1::StatResponse* s) {
    s->set_cuda_available(raw->cuda_available);
    if (raw->registration != nullptr) {
      s->set_pinned_cuda_registered_bytes(raw->registration->registered_bytes());
      if (raw->registration->done()) {
        s->set_pinned_cuda_registration_ms(
            absl::ToInt64Milliseconds(raw->registration->elapsed()));
      }
    }
  };
  service_options.rpc_metrics = &impl->rpc_metrics;
  if (impl->metrics != nullptr) service_options.metrics_address = impl->metrics->address();
  impl->service = std::make_unique<KvTierService>(
      impl->tiers.get(), impl->executor.get(), impl->leases.get(),
      impl->copiers.get(), impl->recovery.get(), std::move(service_options));

  EVOKE_RETURN_IF_ERROR(PrepareSocketPath(impl->socket_path));
  FdChannelOptions fd_options;
  fd_options.connection_timeout = absl::Milliseconds(options.fd_connection_deadline_ms);
  // The same policy as the gRPC socket: a peer it refuses is refused here
  // before anything it sends is read.
  fd_options.admit = [raw](const PeerCred& peer) { return raw->policy->ForPeer(peer).status(); };
  EVOKE_ASSIGN_OR_RETURN(impl->fd_channel,
                         FdChannel::Start(fd_socket, impl->leases.get(), fd_options));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // No listening port for the Unix socket: PeerListener accepts on it and
  // hands each connection over once it knows who connected. TCP, when
  // configured, is a listening port with TLS and bearer tokens only.
  if (tcp_credentials != nullptr) {
    builder.AddListeningPort(options.tcp_listen, tcp_credentials, &impl->tcp_port);
  }
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(impl->rpc_metrics.NewInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  builder.RegisterService(impl->service.get());
  impl->server = builder.BuildAndStart();
  if (!options.tcp_listen.empty() && (impl->server == nullptr || impl->tcp_port == 0)) {
    return absl::UnavailableError(absl::StrCat(
        "--tcp-listen: cannot serve TLS on ", options.tcp_listen,
        " (address in use or not local, or --tls-cert and --tls-key not a matching "
        "certificate and key)"));
  }
  if (impl->server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("--socket: cannot serve on ", impl->socket_path));
  }
  if (impl->tcp_port != 0) {
    EVOKE_LOG_INFO("serving TCP on ", options.tcp_listen, " (port ", impl->tcp_port,
                   "): TLS with ", options.tls_cert,
                   ", every call needs a principal's bearer token");
  }
  EVOKE_ASSIGN_OR_RETURN(
      impl->listener,
      PeerListener::Start(impl->socket_path, [raw](int fd, const PeerCred& peer) {
        absl::StatusOr<std::shared_ptr<const Caller>> caller = raw->policy->ForPeer(peer);
        if (!caller.ok()) {
          // Served anyway, so that every call it makes is answered with the
          // reason (PERMISSION_DENIED) instead of a dropped connection.
          EVOKE_LOG_WARNING_EVERY_N_SEC(1, "connection from ", DescribePeer(peer), ": ",
                                        caller.status().message());
        }
        raw->connections.Set(fd, std::move(caller));
        grpc::AddInsecureChannelFromFd(raw->server.get(), fd);
      }));
  if (impl->metrics != nullptr) {
    KvTierService* service = impl->service.get();
    impl->metrics->Serve([service](v1::StatResponse* s) { service->AdminStat(s); },
                         &impl->rpc_metrics, options.metrics_namespaces);
    EVOKE_LOG_FIELDS(LogLevel::kInfo,
                     absl::StrCat("serving /metrics on http://", impl->metrics->address(),
                                  "/metrics"),
                     LogField("metrics_address", impl->metrics->address()));
  }
  impl->server->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  impl->server->GetHealthCheckService()->SetServingStatus("", true);

  const TierStats stat = impl->tiers->Stats();
  EVOKE_LOG_INFO(
      "evoked ", EVOKE_VERSION, " serving on unix:", impl->socket_path,
      "; tier 1: ", FormatByteSize(stat.host.capacity_bytes),
      stat.host_locked ? " (locked)" : " (not locked)",
      "; tier 2: ", data_dir, " (budget ", FormatByteSize(options.spill_bytes),
      "); recovered ", stat.disk.blocks, " blocks (",
      FormatByteSize(stat.disk.payload_bytes), ") and ",
      stat.breadcrumb_blocks, " breadcrumbs in ",
      absl::FormatDuration(absl::Now() - start));
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
                          std::chrono::milliseconds(impl_->options.shutdown_grace_ms));
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
