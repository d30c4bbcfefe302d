#include "daemon/ring_service.h"

#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "daemon/storage_mapping.h"
#include "evoke/v1/kvtier.pb.h"

namespace evoke {
namespace {

// Most entries run as one Save or Load.
constexpr size_t kMaxCombined = 256;

class ServiceRingHandler final : public RingHandler {
 public:
  ServiceRingHandler(BlockService* service, RpcMetrics* metrics,
                     std::shared_ptr<const Caller> caller, const Lease& lease,
                     uint64_t region_id)
      : service_(service),
        metrics_(metrics),
        caller_(std::move(caller)),
        lease_(lease),
        region_id_(region_id),
        regions_(lease.id, service->leases()) {}

  void Execute(absl::Span<const RingRequest> requests, absl::Span<RingResult> results) override {
    // Once per submission: the lease is still open (and used), and the
    // regions kept resolved are still the lease's.
    absl::StatusOr<uint64_t> removed = service_->leases()->Touch(lease_.id);
    if (!removed.ok()) {
      for (RingResult& r : results) r.status = removed.status();
      return;
    }
    if (*removed != regions_removed_) {
      regions_.Drop();
      regions_removed_ = *removed;
    }
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

  // Also called every 100 ms while the ring sleeps: a region the client
  // removed meanwhile is let go of (unmapped, its bytes no longer charged to
  // the uid's mapping cap) within that, not at the next submission.
  bool Alive() override {
    uint64_t removed = 0;
    if (!service_->leases()->HasRegion(lease_.id, region_id_, &removed)) {
      regions_.Drop();  // The ring stops: the regions unmap now, not when it is reaped.
      return false;
    }
    if (removed != regions_removed_) {
      regions_.Drop();
      regions_removed_ = removed;
    }
    return true;
  }

 private:
  static bool Compatible(const ring::RingSqe& a, const ring::RingSqe& b, absl::string_view ma,
                         absl::string_view mb) {
    if (a.opcode != b.opcode || (a.n_slices > 0) != (b.n_slices > 0)) return false;
    // Each Acquire and Release is its own command.
    if (a.opcode != ring::kOpSave && a.opcode != ring::kOpLoad) return false;
    if (a.opcode == ring::kOpSave) {
      return (a.flags & ring::kSaveDurable) == (b.flags & ring::kSaveDurable);
    }
    // Loads: one fingerprint per request.
    return ma == mb;
  }

  // Run runs entries as one command; when that fails and they are several,
  // each runs again alone so that each gets its own status.
  void Run(absl::Span<const RingRequest> requests, absl::Span<RingResult> results, bool alone) {
    switch (requests[0].sqe.opcode) {
      case ring::kOpAcquire:
        results[0].status = RunAcquire(requests[0], results[0]);
        return;
      case ring::kOpRelease:
        results[0].status = RunRelease(requests[0], results[0]);
        return;
      default:
        break;
    }
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
    if (metrics_ == nullptr) return;
    const int method = metrics_->ring_method(opcode);
    for (const RingResult& r : results) {
      metrics_->Record(method, static_cast<int>(r.status.code()), seconds);
    }
  }

  static SliceRef ToSlice(const ring::RingSlice& from) {
    return SliceRef{from.region_id, from.offset, from.length};
  }

  static void ToSlices(absl::Span<const ring::RingSlice> from, std::vector<SliceRef>* to) {
    to->clear();
    for (const ring::RingSlice& slice : from) to->push_back(ToSlice(slice));
  }

  // RunSaves stores the entries as one SaveCommand. Entries whose arguments
  // do not parse get their own INVALID_ARGUMENT and are left out. Returns
  // the command's error (results untouched then, but for those entries).
  absl::Status RunSaves(absl::Span<const RingRequest> requests, absl::Span<RingResult> results) {
    save_.lease = LeaseRef{{}, &lease_};
    save_.regions = &regions_;
    save_.durable = (requests[0].sqe.flags & ring::kSaveDurable) != 0;
    if (metas_.size() < requests.size()) metas_.resize(requests.size());
    save_.blocks.resize(requests.size());  // Keeps the gather lists' memory.
    index_.clear();
    size_t n = 0;
    for (size_t k = 0; k < requests.size(); ++k) {
      const RingRequest& r = requests[k];
      v1::BlockMeta& meta = metas_[n];
      if (!meta.ParseFromArray(r.meta.data(), static_cast<int>(r.meta.size()))) {
        results[k].status = absl::InvalidArgumentError(
            "sqe arguments: are not a serialized evoke.v1.BlockMeta (meta_len bytes)");
        continue;
      }
      SaveCommandBlock& block = save_.blocks[n];
      block.meta = &meta;
      block.pin = (r.sqe.flags & ring::kSavePin) != 0;
      if (r.slices.empty()) {
        block.payload.kind = PayloadRef::Kind::kRegion;
        block.payload.region = ToSlice(r.sqe.slice);
      } else {
        block.payload.kind = PayloadRef::Kind::kGather;
        ToSlices(r.slices, &block.payload.gather);
      }
      index_.push_back(k);
      ++n;
    }
    if (n == 0) return absl::OkStatus();
    save_.blocks.resize(n);
    // The TierManager bounds the wait for room (--save-wait-ms).
    EVOKE_ASSIGN_OR_RETURN(std::vector<SavedBlock> saved, service_->Save(*caller_, save_));
    for (size_t b = 0; b < n; ++b) {
      RingResult& out = results[index_[b]];
      out.checksum = saved[b].checksum;
      out.tier = static_cast<uint32_t>(ToProto(saved[b].location));
      out.payload_bytes = save_.blocks[b].payload.Length();
      if (saved[b].deduplicated) out.flags |= ring::kCqeDeduplicated;
    }
    return absl::OkStatus();
  }

  // RunAcquire: the ids in the arguments (16 bytes each, checked by the
  // ring), the handle and count in the completion, the tiers in its message.
  absl::Status RunAcquire(const RingRequest& request, RingResult& out) {
    const size_t n = request.meta.size() / 16;
    if (n > service_->limits().max_ids) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sqe.meta_len: ", n, " ids is past the limit of ", service_->limits().max_ids));
    }
    ids_.clear();
    for (size_t k = 0; k < n; ++k) ids_.push_back(*BlockId::FromBytes(request.meta.substr(16 * k, 16)));
    EVOKE_ASSIGN_OR_RETURN(
        BlockService::Acquired held,
        service_->Acquire(*caller_, lease_, ids_, (request.sqe.flags & ring::kAcquireAll) != 0));
    out.checksum = held.handle;
    out.payload_bytes = held.held.size();
    out.meta.clear();
    for (BlockLocation where : held.held) out.meta.push_back(static_cast<char>(ToProto(where)));
    return absl::OkStatus();
  }

  absl::Status RunRelease(const RingRequest& request, RingResult& out) {
    uint64_t handle = 0;
    std::memcpy(&handle, request.sqe.id, sizeof(handle));  // Little endian.
    if (handle == 0) return absl::InvalidArgumentError("sqe.id: handle 0 is no handle");
    EVOKE_ASSIGN_OR_RETURN(uint64_t released, service_->Release(lease_, handle));
    out.payload_bytes = released;
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
    load_.lease = LeaseRef{{}, &lease_};
    load_.regions = &regions_;
    load_.fingerprint = &fingerprint_;
    load_.ids.clear();
    load_.destinations.clear();
    load_.reanchor.clear();
    const bool scatter = !requests[0].slices.empty();  // The same for the batch.
    load_.scatter.resize(scatter ? requests.size() : 0);
    bool reanchor = false;
    for (const RingRequest& r : requests) reanchor |= (r.sqe.flags & ring::kLoadReanchor) != 0;
    for (size_t k = 0; k < requests.size(); ++k) {
      const RingRequest& r = requests[k];
      // Sixteen bytes always parse.
      load_.ids.push_back(*BlockId::FromBytes(
          absl::string_view(reinterpret_cast<const char*>(r.sqe.id), sizeof(r.sqe.id))));
      if (scatter) {
        ToSlices(r.slices, &load_.scatter[k]);
      } else {
        load_.destinations.push_back(ToSlice(r.sqe.slice));
      }
      if (reanchor) {
        ReanchorRef re;
        if ((r.sqe.flags & ring::kLoadReanchor) != 0) re.first_position = r.sqe.first_position;
        load_.reanchor.push_back(re);
      }
    }
    EVOKE_RETURN_IF_ERROR(service_->Load(*caller_, load_, /*inline_out=*/nullptr, &loaded_));
    for (size_t k = 0; k < requests.size(); ++k) {
      const v1::BlockMeta& meta = loaded_.metas[k];
      RingResult& out = results[k];
      out.checksum = meta.checksum();
      out.payload_bytes = meta.payload_bytes();
      out.tier = static_cast<uint32_t>(ToProto(loaded_.infos[k].served_from));
      if ((requests[k].sqe.flags & ring::kLoadWantMeta) != 0) meta.SerializeToString(&out.meta);
    }
    return absl::OkStatus();
  }

  BlockService* const service_;
  RpcMetrics* const metrics_;
  const std::shared_ptr<const Caller> caller_;
  const Lease lease_;
  const uint64_t region_id_;
  // The regions entries name, kept mapped from one submission to the next
  // until the lease has a region removed (regions_removed_ changes).
  LeaseRegions regions_;
  uint64_t regions_removed_ = 0;
  // Reused from one batch to the next (their memory with them).
  SaveCommand save_;
  std::vector<v1::BlockMeta> metas_;
  std::vector<size_t> index_;
  std::vector<BlockId> ids_;  // Of an Acquire.
  LoadCommand load_;
  LoadResult loaded_;
  bool has_fingerprint_ = false;
  std::string fingerprint_bytes_;
  v1::LayoutFingerprint fingerprint_;
};

}  // namespace

std::unique_ptr<RingHandler> MakeServiceRingHandler(BlockService* service, RpcMetrics* metrics,
                                                    std::shared_ptr<const Caller> caller,
                                                    const Lease& lease, uint64_t region_id) {
  return std::make_unique<ServiceRingHandler>(service, metrics, std::move(caller), lease,
                                              region_id);
}

}  // namespace evoke
