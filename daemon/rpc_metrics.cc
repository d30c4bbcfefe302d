#include "daemon/rpc_metrics.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/ring_format.h"
#include "google/protobuf/descriptor.h"

namespace evoke {
namespace {

// Buckets of RecoverResponse.candidates: how many blocks one Recover scored.
constexpr double kCandidateBuckets[] = {1,     4,     16,     64,     256,    1024,
                                        4096,  16384, 65536,  262144, 1048576};

class RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(RpcMetrics* metrics, int method)
      : metrics_(metrics), method_(method), start_(std::chrono::steady_clock::now()) {}
  ~RpcInterceptor() override {
    if (!recorded_) Record(static_cast<int>(grpc::StatusCode::CANCELLED));
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(static_cast<int>(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  void Record(int code) {
    recorded_ = true;
    metrics_->Record(method_, code,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
                         .count());
  }
  RpcMetrics* const metrics_;
  const int method_;
  const std::chrono::steady_clock::time_point start_;
  bool recorded_ = false;
};

class RpcInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcInterceptorFactory(RpcMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const int method = metrics_->IndexOfPath(info->method());
    if (method < 0) return nullptr;  // Health checks, reflection.
    return new RpcInterceptor(metrics_, method);
  }

 private:
  RpcMetrics* const metrics_;
};

}  // namespace

RpcMetrics::RpcMetrics() : recover_candidates_(kCandidateBuckets) {
  const google::protobuf::ServiceDescriptor* service =
      v1::StatResponse::descriptor()->file()->FindServiceByName("KvTier");
  if (service != nullptr) {
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string& name = service->method(i)->name();
      by_path_.emplace(absl::StrCat("/", service->full_name(), "/", name), i);
      by_name_.emplace(name, i);
      methods_.push_back(std::make_unique<Method>(name));
    }
  }
  for (const char* ring : {"ring.Save", "ring.Load", "ring.Acquire", "ring.Release"}) {
    by_name_.emplace(ring, static_cast<int>(methods_.size()));
    methods_.push_back(std::make_unique<Method>(ring));
  }
  ring_save_ = IndexOf("ring.Save");
  ring_load_ = IndexOf("ring.Load");
  ring_methods_[ring::kOpSave] = ring_save_;
  ring_methods_[ring::kOpLoad] = ring_load_;
  ring_methods_[ring::kOpAcquire] = IndexOf("ring.Acquire");
  ring_methods_[ring::kOpRelease] = IndexOf("ring.Release");
}

int RpcMetrics::IndexOfPath(absl::string_view path) const {
  auto it = by_path_.find(path);
  return it == by_path_.end() ? -1 : it->second;
}

int RpcMetrics::IndexOf(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

void RpcMetrics::Record(int method, int code, double seconds) {
  if (method < 0 || static_cast<size_t>(method) >= methods_.size()) return;
  if (code < 0 || code >= kCodes) code = static_cast<int>(grpc::StatusCode::UNKNOWN);
  Method& m = *methods_[method];
  m.codes[code].fetch_add(1, std::memory_order_relaxed);
  m.latency.Observe(seconds);
}

void RpcMetrics::RecordRecoverCandidates(uint64_t candidates) {
  recover_candidates_.Observe(static_cast<double>(candidates));
}

std::vector<RpcMetrics::MethodSnapshot> RpcMetrics::Read() const {
  std::vector<MethodSnapshot> out(methods_.size());
  for (size_t i = 0; i < methods_.size(); ++i) {
    out[i].name = methods_[i]->name;
    for (int c = 0; c < kCodes; ++c) {
      out[i].codes[c] = methods_[i]->codes[c].load(std::memory_order_relaxed);
    }
    out[i].latency = methods_[i]->latency.Read();
  }
  return out;
}

void RpcMetrics::FillStat(google::protobuf::RepeatedPtrField<v1::RpcStat>* out) const {
  for (const MethodSnapshot& m : Read()) {
    uint64_t calls = 0;
    for (uint64_t n : m.codes) calls += n;
    if (calls == 0) continue;
    v1::RpcStat* s = out->Add();
    s->set_method(m.name);
    s->set_calls(calls);
    s->set_errors(calls - m.codes[0]);
    s->set_seconds_sum(m.latency.sum);
    s->mutable_bucket_upper_seconds()->Assign(m.latency.bounds.begin(),
                                              m.latency.bounds.end());
    s->mutable_bucket_counts()->Assign(m.latency.counts.begin(), m.latency.counts.end());
  }
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RpcMetrics::NewInterceptorFactory() {
  return std::make_unique<RpcInterceptorFactory>(this);
}

const char* GrpcCodeName(int code) {
  static constexpr const char* kNames[RpcMetrics::kCodes] = {
      "OK",        "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",  "ALREADY_EXISTS",    "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",       "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code < 0 || code >= RpcMetrics::kCodes) return "UNKNOWN";
  return kNames[code];
}

}  // namespace evoke
