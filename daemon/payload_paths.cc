#include "daemon/payload_paths.h"

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/status_macros.h"

namespace evoke {

absl::StatusOr<DeviceCopier*> DeviceCopiers::Get(int device) {
  absl::MutexLock lock(&mu_);
  auto it = copiers_.find(device);
  if (it != copiers_.end()) return it->second.get();
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<DeviceCopier> copier, DeviceCopier::Create(device));
  DeviceCopier* raw = copier.get();
  copiers_.emplace(device, std::move(copier));
  return raw;
}

absl::StatusOr<std::unique_ptr<SaveRequestSource>> SaveRequestSource::Create(
    const v1::SaveRequest& request, const std::optional<Lease>& lease,
    const LeaseManager& leases, DeviceCopiers* copiers) {
  std::unique_ptr<SaveRequestSource> source(new SaveRequestSource(request, copiers));
  source->regions_.resize(request.blocks_size());
  for (int i = 0; i < request.blocks_size(); ++i) {
    const v1::SaveBlock& block = request.blocks(i);
    if (block.payload_case() != v1::SaveBlock::kRegion) continue;
    const std::string field = absl::StrCat("blocks[", i, "].region");
    EVOKE_ASSIGN_OR_RETURN(
        std::shared_ptr<Region> region,
        leases.GetRegion(lease->id, block.region().region_id(), field));
    EVOKE_RETURN_IF_ERROR(
        region->CheckSlice(block.region().offset(), block.region().length(), field));
    source->regions_[i] = std::move(region);
  }
  return source;
}

absl::string_view SaveRequestSource::HostBytes(size_t i) {
  const v1::SaveBlock& block = request_.blocks(static_cast<int>(i));
  if (regions_[i] == nullptr) return block.inline_bytes();
  if (regions_[i]->host_data() == nullptr) return {};
  return absl::string_view(
      reinterpret_cast<const char*>(regions_[i]->host_data() + block.region().offset()),
      block.region().length());
}

absl::Status SaveRequestSource::Fetch(absl::Span<const size_t> items,
                                      absl::Span<uint8_t* const> dsts) {
  absl::flat_hash_map<int, std::vector<CopyOp>> by_device;
  for (size_t k = 0; k < items.size(); ++k) {
    const Region& region = *regions_[items[k]];
    const v1::RegionSlice& slice = request_.blocks(static_cast<int>(items[k])).region();
    by_device[region.device()].push_back(
        {dsts[k], static_cast<const uint8_t*>(region.device_ptr()) + slice.offset(),
         slice.length()});
  }
  for (auto& [device, ops] : by_device) {
    EVOKE_ASSIGN_OR_RETURN(DeviceCopier* copier, copiers_->Get(device));
    EVOKE_RETURN_IF_ERROR(copier->DeviceToHost(ops));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LoadResponseSink>> LoadResponseSink::Create(
    const v1::LoadRequest& request, v1::LoadResponse* response, uint64_t inline_budget,
    const std::optional<Lease>& lease, const LeaseManager& leases,
    DeviceCopiers* copiers) {
  std::unique_ptr<LoadResponseSink> sink(
      new LoadResponseSink(request, response, inline_budget, copiers));
  for (int i = 0; i < request.destinations_size(); ++i) {
    const v1::RegionSlice& slice = request.destinations(i);
    const std::string field = absl::StrCat("destinations[", i, "]");
    EVOKE_ASSIGN_OR_RETURN(std::shared_ptr<Region> region,
                           leases.GetRegion(lease->id, slice.region_id(), field));
    EVOKE_RETURN_IF_ERROR(region->CheckSlice(slice.offset(), slice.length(), field));
    sink->regions_.push_back(std::move(region));
  }
  return sink;
}

absl::Status LoadResponseSink::Prepare(absl::Span<const v1::BlockMeta> metas) {
  response_->clear_blocks();
  for (size_t i = 0; i < metas.size(); ++i) response_->add_blocks();
  if (!regions_.empty()) {
    for (size_t i = 0; i < metas.size(); ++i) {
      if (request_.destinations(static_cast<int>(i)).length() < metas[i].payload_bytes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "destinations[", i, "].length: ", request_.destinations(static_cast<int>(i)).length(),
            " is shorter than the block's payload (", metas[i].payload_bytes(), " bytes)"));
      }
    }
    return absl::OkStatus();
  }
  uint64_t total = 0;
  for (size_t i = 0; i < metas.size(); ++i) {
    total += metas[i].payload_bytes();
    if (total > budget_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ids: the payloads of ids[0..", i, "] add up to ", FormatByteSize(total),
          ", over the response limit of ", FormatByteSize(budget_),
          " (--max-message-bytes); load fewer blocks per call or use a region"));
    }
  }
  for (size_t i = 0; i < metas.size(); ++i) {
    response_->mutable_blocks(static_cast<int>(i))
        ->mutable_inline_bytes()
        ->resize(metas[i].payload_bytes());
  }
  return absl::OkStatus();
}

uint8_t* LoadResponseSink::HostDestination(size_t i) {
  if (regions_.empty()) {
    return reinterpret_cast<uint8_t*>(
        response_->mutable_blocks(static_cast<int>(i))->mutable_inline_bytes()->data());
  }
  if (regions_[i]->host_data() == nullptr) return nullptr;
  return regions_[i]->host_data() + request_.destinations(static_cast<int>(i)).offset();
}

absl::Status LoadResponseSink::Deliver(size_t i, const uint8_t* bytes, uint64_t n) {
  const Region& region = *regions_[i];
  device_ops_[region.device()].push_back(
      {static_cast<uint8_t*>(region.device_ptr()) +
           request_.destinations(static_cast<int>(i)).offset(),
       bytes, n});
  return absl::OkStatus();
}

absl::Status LoadResponseSink::Finish() {
  for (auto& [device, ops] : device_ops_) {
    EVOKE_ASSIGN_OR_RETURN(DeviceCopier* copier, copiers_->Get(device));
    EVOKE_RETURN_IF_ERROR(copier->HostToDevice(ops));
  }
  return absl::OkStatus();
}

}  // namespace evoke
