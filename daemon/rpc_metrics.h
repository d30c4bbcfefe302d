// RpcMetrics: calls, status codes and latency of every evoke.v1.KvTier method
// and of the command rings' opcodes. One instance per daemon; Stat (RpcStat)
// and /metrics both read it, so the two never disagree.
#ifndef EVOKE_DAEMON_RPC_METRICS_H_
#define EVOKE_DAEMON_RPC_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "common/metrics.h"
#include "evoke/v1/kvtier.pb.h"

namespace evoke {

// Thread-safe; Record is lock-free (relaxed atomics).
class RpcMetrics {
 public:
  // gRPC status codes 0 (OK) .. 16 (UNAUTHENTICATED).
  static constexpr int kCodes = 17;

  // Methods: every method of evoke.v1.KvTier (kvtier.proto's order, named
  // as there: "Save", "Load", ...), then "ring.Save", "ring.Load",
  // "ring.Acquire" and "ring.Release".
  RpcMetrics();
  RpcMetrics(const RpcMetrics&) = delete;
  RpcMetrics& operator=(const RpcMetrics&) = delete;

  // The index of a gRPC method path ("/evoke.v1.KvTier/Save"), or -1 for
  // other services (health, reflection).
  int IndexOfPath(absl::string_view path) const;
  // The index of a method name ("Save", "ring.Load"), or -1.
  int IndexOf(absl::string_view name) const;
  int ring_save() const { return ring_save_; }
  int ring_load() const { return ring_load_; }
  // The method of a ring opcode ("ring.Save", "ring.Acquire", ...), or -1.
  int ring_method(uint8_t opcode) const {
    return opcode < ring_methods_.size() ? ring_methods_[opcode] : -1;
  }
  size_t size() const { return methods_.size(); }
  const std::string& name(int method) const { return methods_[method]->name; }

  // Record counts one completed call of `method` with gRPC status `code`
  // that took `seconds`. Codes out of range count as UNKNOWN (2).
  void Record(int method, int code, double seconds);
  // Recover: the blocks its scope held (RecoverResponse.candidates).
  void RecordRecoverCandidates(uint64_t candidates);

  struct MethodSnapshot {
    std::string name;
    std::array<uint64_t, kCodes> codes{};  // Completed calls per status code.
    Histogram::Snapshot latency;           // Seconds.
  };
  // Every method (called or not), in index order.
  std::vector<MethodSnapshot> Read() const;
  Histogram::Snapshot RecoverCandidates() const { return recover_candidates_.Read(); }

  // FillStat appends one RpcStat per method that has completed calls.
  void FillStat(google::protobuf::RepeatedPtrField<v1::RpcStat>* out) const;

  // A server interceptor factory that records every KvTier call (method,
  // final status, time from the call's start to its status being sent).
  // Calls that end without a status (the client went away) count as
  // CANCELLED. The factory must not outlive this object.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  NewInterceptorFactory();

 private:
  struct Method {
    explicit Method(std::string n) : name(std::move(n)), latency(LatencyBucketsSeconds()) {
      for (auto& c : codes) c.store(0, std::memory_order_relaxed);
    }
    const std::string name;
    std::array<std::atomic<uint64_t>, kCodes> codes;
    Histogram latency;
  };
  std::vector<std::unique_ptr<Method>> methods_;
  absl::flat_hash_map<std::string, int> by_path_;
  absl::flat_hash_map<std::string, int> by_name_;
  int ring_save_ = -1;
  int ring_load_ = -1;
  std::array<int, 5> ring_methods_{-1, -1, -1, -1, -1};  // By ring::Opcode.
  Histogram recover_candidates_;
};

// The gRPC code name of `code` ("OK", "INVALID_ARGUMENT", ...), as
// Prometheus label values and logs show it.
const char* GrpcCodeName(int code);

}  // namespace evoke

#endif  // EVOKE_DAEMON_RPC_METRICS_H_
