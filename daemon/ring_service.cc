#include "daemon/ring_service.h"

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "daemon/kvtier_service.h"
#include "evoke/v1/kvtier.pb.h"

namespace evoke {
namespace {

// Most entries run as one Save or Load.
constexpr size_t kMaxCombined = 256;

class ServiceRingHandler final : public RingHandler {
 public:
  ServiceRingHandler(KvTierService* service, std::shared_ptr<const Caller> caller,
                     const Lease& lease, uint64_t region_id, const LeaseManager* leases)
      : service_(service),
        caller_(std::move(caller)),
        lease_(lease),
        lease_bytes_(lease.id.ToBytes()),
        region_id_(region_id),
        leases_(leases) {}

  void Execute(absl::Span<const RingRequest> requests, absl::Span<RingResult> results) override {
    size_t i = 0;
    while (i < requests.size()) {
      size_t j = i + 1;
      while (j < requests.size() && j - i < kMaxCombined &&
             Compatible(requests[i].sqe, requests[j].sqe, requests[i].meta, requests[j].meta)) {
        ++j;
      }
      const auto start = std::chrono::steady_clock::now();
      Run(requests.subspan(i, j - i), results.subspan(i, j - i), /*alone=*/j - i == 1);
      Record(requests[i].sqe.opcode, results.subspan(i, j - i),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      i = j;
    }
  }

  bool Alive() override { return leases_->HasRegion(lease_.id, region_id_); }

 private:
  static bool Compatible(const ring::RingSqe& a, const ring::RingSqe& b, absl::string_view ma,
                         absl::string_view mb) {
    if (a.opcode != b.opcode || (a.n_slices > 0) != (b.n_slices > 0)) return false;
    if (a.opcode == ring::kOpSave) {
      return (a.flags & ring::kSaveDurable) == (b.flags & ring::kSaveDurable);
    }
    // Loads: one fingerprint per request.
    return ma == mb;
  }

  // Run runs entries as one request; when that fails and they are several,
  // each runs again alone so that each gets its own status.
  void Run(absl::Span<const RingRequest> requests, absl::Span<RingResult> results, bool alone) {
    absl::Status s = requests[0].sqe.opcode == ring::kOpSave ? RunSaves(requests, results)
                                                             : RunLoads(requests, results);
    if (s.ok()) return;
    if (alone || s.code() == absl::StatusCode::kUnavailable ||
        s.code() == absl::StatusCode::kDeadlineExceeded) {
      for (RingResult& r : results) {
        if (r.status.ok()) r.status = s;
      }
      return;
    }
    for (size_t k = 0; k < requests.size(); ++k) {
      if (!results[k].status.ok()) continue;  // Its own arguments were bad.
      Run(requests.subspan(k, 1), results.subspan(k, 1), /*alone=*/true);
    }
  }

  // Record counts each entry of a batch as one call of "ring.Save" or
  // "ring.Load" with its own status and the batch's time.
  void Record(uint8_t opcode, absl::Span<const RingResult> results, double seconds) {
    RpcMetrics* const metrics = service_->rpc_metrics();
    if (metrics == nullptr) return;
    const int method = opcode == ring::kOpSave ? metrics->ring_save() : metrics->ring_load();
    for (const RingResult& r : results) {
      metrics->Record(method, static_cast<int>(r.status.code()), seconds);
    }
  }

  static void FillSlice(const ring::RingSlice& from, v1::RegionSlice* to) {
    to->set_region_id(from.region_id);
    to->set_offset(from.offset);
    to->set_length(from.length);
  }

  // RunSaves stores the entries as one SaveRequest. Entries whose arguments
  // do not parse get their own INVALID_ARGUMENT and are left out. Returns
  // the request's error (results untouched then, but for those entries).
  absl::Status RunSaves(absl::Span<const RingRequest> requests, absl::Span<RingResult> results) {
    save_.Clear();
    save_.set_lease_id(lease_bytes_);
    save_.set_durable((requests[0].sqe.flags & ring::kSaveDurable) != 0);
    index_.clear();
    for (size_t k = 0; k < requests.size(); ++k) {
      const RingRequest& r = requests[k];
      v1::SaveBlock* block = save_.add_blocks();
      if (!block->mutable_meta()->ParseFromArray(r.meta.data(), static_cast<int>(r.meta.size()))) {
        save_.mutable_blocks()->RemoveLast();
        results[k].status = absl::InvalidArgumentError(
            "sqe arguments: are not a serialized evoke.v1.BlockMeta (meta_len bytes)");
        continue;
      }
      if (r.slices.empty()) {
        FillSlice(r.sqe.slice, block->mutable_region());
      } else {
        v1::RegionSlices* gather = block->mutable_gather();
        for (const ring::RingSlice& slice : r.slices) FillSlice(slice, gather->add_slices());
      }
      block->set_pin((r.sqe.flags & ring::kSavePin) != 0);
      index_.push_back(k);
    }
    if (index_.empty()) return absl::OkStatus();
    save_response_.Clear();
    // The TierManager bounds the wait for room (--save-wait-ms).
    EVOKE_RETURN_IF_ERROR(
        service_->DoSave(*caller_, save_, absl::InfiniteFuture(), &save_response_));
    for (size_t n = 0; n < index_.size(); ++n) {
      const v1::SaveResult& saved = save_response_.results(static_cast<int>(n));
      RingResult& out = results[index_[n]];
      out.checksum = saved.checksum();
      out.tier = static_cast<uint32_t>(saved.tier());
      out.payload_bytes = PayloadLength(save_.blocks(static_cast<int>(n)));
      if (saved.deduplicated()) out.flags |= ring::kCqeDeduplicated;
    }
    return absl::OkStatus();
  }

  absl::Status RunLoads(absl::Span<const RingRequest> requests, absl::Span<RingResult> results) {
    const absl::string_view fp_bytes = requests[0].meta;
    if (!has_fingerprint_ || fp_bytes != fingerprint_bytes_) {
      has_fingerprint_ = fingerprint_.ParseFromArray(fp_bytes.data(),
                                                     static_cast<int>(fp_bytes.size()));
      if (!has_fingerprint_) {
        for (RingResult& r : results) {
          r.status = absl::InvalidArgumentError(
              "sqe arguments: are not a serialized evoke.v1.LayoutFingerprint (meta_len bytes)");
        }
        return absl::OkStatus();
      }
      fingerprint_bytes_.assign(fp_bytes.data(), fp_bytes.size());
    }
    load_.Clear();
    load_.set_lease_id(lease_bytes_);
    *load_.mutable_fingerprint() = fingerprint_;
    bool reanchor = false;
    for (const RingRequest& r : requests) reanchor |= (r.sqe.flags & ring::kLoadReanchor) != 0;
    for (const RingRequest& r : requests) {
      load_.add_ids(reinterpret_cast<const char*>(r.sqe.id), sizeof(r.sqe.id));
      if (r.slices.empty()) {
        FillSlice(r.sqe.slice, load_.add_destinations());
      } else {
        v1::RegionSlices* scatter = load_.add_scatter();
        for (const ring::RingSlice& slice : r.slices) FillSlice(slice, scatter->add_slices());
      }
      if (reanchor) {
        v1::Reanchor* re = load_.add_reanchor();
        if ((r.sqe.flags & ring::kLoadReanchor) != 0) re->set_first_position(r.sqe.first_position);
      }
    }
    load_response_.Clear();
    EVOKE_RETURN_IF_ERROR(service_->DoLoad(*caller_, load_, &load_response_));
    for (size_t k = 0; k < requests.size(); ++k) {
      const v1::LoadedBlock& block = load_response_.blocks(static_cast<int>(k));
      RingResult& out = results[k];
      out.checksum = block.meta().checksum();
      out.payload_bytes = block.meta().payload_bytes();
      out.tier = static_cast<uint32_t>(block.served_from());
      if ((requests[k].sqe.flags & ring::kLoadWantMeta) != 0) {
        block.meta().SerializeToString(&out.meta);
      }
    }
    return absl::OkStatus();
  }

  KvTierService* const service_;
  const std::shared_ptr<const Caller> caller_;
  const Lease lease_;
  const std::string lease_bytes_;
  const uint64_t region_id_;
  const LeaseManager* const leases_;
  // Reused from one batch to the next (their memory with them).
  v1::SaveRequest save_;
  v1::SaveResponse save_response_;
  v1::LoadRequest load_;
  v1::LoadResponse load_response_;
  std::vector<size_t> index_;
  bool has_fingerprint_ = false;
  std::string fingerprint_bytes_;
  v1::LayoutFingerprint fingerprint_;
};

}  // namespace

std::unique_ptr<RingHandler> MakeServiceRingHandler(KvTierService* service,
                                                    std::shared_ptr<const Caller> caller,
                                                    const Lease& lease, uint64_t region_id,
                                                    const LeaseManager* leases) {
  return std::make_unique<ServiceRingHandler>(service, std::move(caller), lease, region_id,
                                              leases);
}

}  // namespace evoke
