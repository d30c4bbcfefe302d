// KvTierService: the gRPC face of the TierManager (evoke.v1.KvTier).
#ifndef EVOKE_DAEMON_KVTIER_SERVICE_H_
#define EVOKE_DAEMON_KVTIER_SERVICE_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/access_policy.h"
#include "daemon/block_service.h"
#include "daemon/block_watch.h"
#include "daemon/executor.h"
#include "daemon/inline_wire.h"
#include "daemon/lease_manager.h"
#include "daemon/payload_paths.h"
#include "daemon/request_validation.h"
#include "daemon/ring_server.h"
#include "daemon/rpc_metrics.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "recovery/recovery_index.h"
#include "storage/tier_manager.h"

namespace evoke {


struct KvTierServiceOptions {
  RequestLimits limits;
  // Loads whose payloads would exceed this are refused (RESOURCE_EXHAUSTED).
  uint64_t max_message_bytes = 80ull << 20;
  std::string data_dir;
  std::string version;
  // Absolute path of the FdChannel socket (told to clients in LeaseGrant).
  std::string fd_socket;
  // Adds GPU state (CUDA availability, tier-1 registration) to Stat.
  std::function<void(v1::StatResponse*)> gpu_stats;
  // Who is calling: the rights of the connection (or token) a call came on,
  // or an error to answer it with. Unset: every caller is unrestricted (an
  // in-process embedding; evoked always sets it).
  std::function<absl::StatusOr<std::shared_ptr<const Caller>>(
      const grpc::CallbackServerContext&)>
      identify;
  // Shared namespaces and quotas; null: none.
  const AccessPolicy* policy = nullptr;
  // The command rings' limits and polling.
  RingOptions rings;
  // Inline payload buffers kept for reuse between calls (bytes, buffers).
  uint64_t inline_pool_bytes = 160ull << 20;
  size_t inline_pool_buffers = 16;
  // Calls per method and status, with latency (Stat's `rpcs`); the ring
  // opcodes are recorded here, the RPCs by the server's interceptor
  // (RpcMetrics::NewInterceptorFactory). Null: not recorded. Must outlive
  // the service.
  RpcMetrics* rpc_metrics = nullptr;
  // The WatchBlocks streams (null: WatchBlocks is UNAVAILABLE). Must
  // outlive the service.
  WatchHub* watch = nullptr;
  // Where /metrics is served (Stat's `metrics_address`); empty: off.
  std::string metrics_address;
  // Calls of one uid queued or running on the executor at once (TCP
  // principals share one count); past it RESOURCE_EXHAUSTED. 0: no cap.
  uint32_t max_calls_per_uid = 0;
};

// KvTierService is the gRPC transport: it decodes each request, runs Save
// and Load as commands on the BlockService (daemon/block_service.h) that the
// command rings share, answers the metadata RPCs against the TierManager,
// and translates absl::Status into grpc::Status, once, here. It uses gRPC's
// callback API: cheap, memory-only RPCs (Lookup, Describe, List, Stat,
// Unpin) finish on the reactor thread;
// everything that copies payloads, touches disk or may wait for room runs on
// the Executor, and the reactor is finished from there. The daemon keeps
// serving whatever a request contains.
//
// Save and Load are raw (ByteBuffer) methods: inline payloads are read from
// the received slices into pooled buffers and answered from pooled buffers
// that gRPC sends without another copy (daemon/inline_wire.h); every other
// field is parsed and validated exactly as protobuf would.
//
// Thread-safe. `tiers` and `executor` must outlive the service.
class KvTierService final : public v1::KvTier::CallbackService {
 public:
  // Whose turn a call takes on the executor (the caller's uid; TCP
  // principals share one) and the cap on that uid's calls (0: none).
  struct CallLane {
    uid_t uid;
    uint32_t limit;
  };

  // `leases`, `copiers` and `recovery` must outlive the service.
  KvTierService(TierManager* tiers, Executor* executor, LeaseManager* leases,
                DeviceCopiers* copiers, const RecoveryIndex* recovery,
                KvTierServiceOptions options);
  ~KvTierService() override;

  // CloseLeases ends every open lease stream (UNAVAILABLE "shutting down"),
  // so that server shutdown does not wait for them, and stops every ring.
  void CloseLeases();

  // Save and Load, registered as raw callback methods by the constructor
  // (as the generated WithRawCallbackMethod_* would, without their
  // overloads that hide the typed ones).
  grpc::ServerUnaryReactor* SaveBytes(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response);
  grpc::ServerUnaryReactor* LoadBytes(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response);
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const v1::LookupRequest* request,
                                   v1::LookupResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const v1::DeleteRequest* request,
                                   v1::DeleteResponse* response) override;
  grpc::ServerUnaryReactor* DropSession(grpc::CallbackServerContext* context,
                                        const v1::DropSessionRequest* request,
                                        v1::DropSessionResponse* response) override;
  grpc::ServerUnaryReactor* Pin(grpc::CallbackServerContext* context,
                                const v1::PinRequest* request,
                                v1::PinResponse* response) override;
  grpc::ServerUnaryReactor* Unpin(grpc::CallbackServerContext* context,
                                  const v1::PinRequest* request,
                                  v1::PinResponse* response) override;
  grpc::ServerUnaryReactor* Acquire(grpc::CallbackServerContext* context,
                                    const v1::AcquireRequest* request,
                                    v1::AcquireResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* context,
                                     const v1::PrefetchRequest* request,
                                     v1::PrefetchResponse* response) override;
  grpc::ServerUnaryReactor* SetRetention(grpc::CallbackServerContext* context,
                                         const v1::SetRetentionRequest* request,
                                         v1::SetRetentionResponse* response) override;
  grpc::ServerUnaryReactor* KeepSession(grpc::CallbackServerContext* context,
                                        const v1::KeepSessionRequest* request,
                                        v1::KeepSessionResponse* response) override;
  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* context,
                                 const v1::ListRequest* request,
                                 v1::ListResponse* response) override;
  grpc::ServerUnaryReactor* Describe(grpc::CallbackServerContext* context,
                                     const v1::DescribeRequest* request,
                                     v1::BlockInfo* response) override;
  grpc::ServerUnaryReactor* Stat(grpc::CallbackServerContext* context,
                                 const v1::StatRequest* request,
                                 v1::StatResponse* response) override;
  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* Flush(grpc::CallbackServerContext* context,
                                  const v1::FlushRequest* request,
                                  v1::FlushResponse* response) override;
  grpc::ServerUnaryReactor* Recover(grpc::CallbackServerContext* context,
                                    const v1::RecoverRequest* request,
                                    v1::RecoverResponse* response) override;
  grpc::ServerWriteReactor<v1::BlockEvents>* WatchBlocks(
      grpc::CallbackServerContext* context, const v1::WatchBlocksRequest* request) override;
  grpc::ServerWriteReactor<v1::LeaseEvent>* OpenLease(
      grpc::CallbackServerContext* context,
      const v1::OpenLeaseRequest* request) override;
  grpc::ServerUnaryReactor* RegisterCudaRegion(
      grpc::CallbackServerContext* context,
      const v1::RegisterCudaRegionRequest* request,
      v1::RegisterRegionResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(
      grpc::CallbackServerContext* context,
      const v1::UnregisterRegionRequest* request,
      v1::UnregisterRegionResponse* response) override;

  grpc::ServerUnaryReactor* AttachRing(grpc::CallbackServerContext* context,
                                       const v1::AttachRingRequest* request,
                                       v1::AttachRingResponse* response) override;

  // AdminStat fills the whole of Stat's answer, as an admin sees it (also
  // what /metrics exports on each scrape).
  void AdminStat(v1::StatResponse* response) const;

  // The call figures of this service (null: none kept).
  RpcMetrics* rpc_metrics() const { return options_.rpc_metrics; }

  class LeaseReactor;

 private:
  // The caller's turn on the executor (its uid) and its cap on calls.
  CallLane LaneOf(const Caller& caller) const;
  void Forget(LeaseReactor* reactor);
  absl::Status CheckRetentionCap(absl::string_view field, absl::string_view ns, int wanted) const;
  absl::StatusOr<std::shared_ptr<const Caller>> Identify(
      const grpc::CallbackServerContext& context) const;
  // Payload bytes a Load may return inline: room is left for metadata in
  // the response message.
  uint64_t InlineLoadBudget() const { return options_.max_message_bytes - (1u << 20); }
  // The raw Save and Load: parse, decode into a command, run it on the
  // BlockService, encode.
  grpc::Status SaveRaw(const Caller& caller, const grpc::ByteBuffer& request,
                       absl::Time deadline, grpc::ByteBuffer* response);
  grpc::Status LoadRaw(const Caller& caller, const grpc::ByteBuffer& request,
                       grpc::ByteBuffer* response);

  TierManager* const tiers_;
  Executor* const executor_;
  LeaseManager* const leases_;
  const RecoveryIndex* const recovery_;
  const KvTierServiceOptions options_;
  // The data plane, shared with the command rings.
  BlockService blocks_;
  CudaMappings cuda_mappings_;
  // Inline payload buffers reused across Save and Load calls.
  inline_wire::StringPool payload_pool_;
  absl::Mutex reactors_mu_;
  absl::flat_hash_map<LeaseReactor*, std::weak_ptr<LeaseReactor>> reactors_
      ABSL_GUARDED_BY(reactors_mu_);
  bool closing_ ABSL_GUARDED_BY(reactors_mu_) = false;
  // The command rings (daemon/ring_server.h); declared last so that they
  // stop before anything they use goes.
  std::unique_ptr<RingSet> rings_;
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_KVTIER_SERVICE_H_
