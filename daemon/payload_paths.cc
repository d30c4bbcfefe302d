#include "daemon/payload_paths.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/log.h"
#include "common/metrics.h"
#include "gpu/rope_device.h"
#include "gpu/transfer_plan.h"
#include "common/byte_size.h"
#include "common/status_macros.h"

namespace evoke {

absl::StatusOr<DeviceOps*> DeviceCopiers::Get(int device) {
  absl::MutexLock lock(&mu_);
  auto it = copiers_.find(device);
  if (it != copiers_.end()) return it->second.get();
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<DeviceOps> copier, factory_->Open(device));
  DeviceOps* raw = copier.get();
  copiers_.emplace(device, std::move(copier));
  return raw;
}

namespace {

std::string Where(int device) {
  return device < 0 ? std::string("on the host") : absl::StrCat("on CUDA device ", device);
}

// ResolveSlices resolves the gather or scatter list `list` named `field`
// ("blocks[2].gather") through `regions` (which looks each region up once).
// Errors name the slice. The regions stay mapped while `regions` lives.
absl::StatusOr<SliceList> ResolveSlices(absl::Span<const SliceRef> list,
                                        RegionResolver& regions, absl::string_view field) {
  SliceList out;
  out.pieces.reserve(list.size());
  const Region* last = nullptr;
  uint64_t last_id = 0;
  for (size_t j = 0; j < list.size(); ++j) {
    const SliceRef& slice = list[j];
    if (last == nullptr || slice.region_id != last_id) {
      EVOKE_ASSIGN_OR_RETURN(
          std::shared_ptr<Region> region,
          regions.Get(slice.region_id, absl::StrCat(field, ".slices[", j, "]")));
      last = region.get();  // `regions` keeps it mapped.
      last_id = slice.region_id;
    }
    const Region& region = *last;
    // The field's name is built only for an error: lists run to 4096 slices.
    if (slice.length == 0 || slice.offset > region.size() ||
        slice.length > region.size() - slice.offset) {
      return region.CheckSlice(slice.offset, slice.length,
                               absl::StrCat(field, ".slices[", j, "]"));
    }
    const bool cuda = region.kind() == Region::Kind::kCuda;
    const int device = cuda ? region.device() : -1;
    if (j == 0) {
      out.device = device;
    } else if (device != out.device) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".slices[", j, "]: region ", slice.region_id, " is ", Where(device),
          ", slices[0] ", Where(out.device),
          "; the slices of one list must all be on the host or all on one CUDA device"));
    }
    uint8_t* base = cuda ? static_cast<uint8_t*>(region.device_ptr()) : region.host_data();
    if (base == nullptr) {
      return absl::InternalError(absl::StrCat(field, ".slices[", j, "]: region ",
                                              slice.region_id, " has no mapping"));
    }
    out.pieces.push_back(SliceList::Piece{base + slice.offset, slice.length});
    out.total += slice.length;  // Bounded: each length fits its region.
  }
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Region>> LeaseRegions::Get(uint64_t region_id,
                                                          absl::string_view field) {
  auto it = cache_.find(region_id);
  if (it != cache_.end()) return it->second;
  EVOKE_ASSIGN_OR_RETURN(std::shared_ptr<Region> region,
                         leases_->GetRegion(lease_, region_id, std::string(field)));
  return cache_.emplace(region_id, std::move(region)).first->second;
}

absl::StatusOr<std::unique_ptr<SaveRequestSource>> SaveRequestSource::Create(
    const SaveCommand& command, RegionResolver* regions, DeviceCopiers* copiers) {
  std::unique_ptr<SaveRequestSource> source(new SaveRequestSource(command, copiers));
  const size_t n = command.blocks.size();
  source->regions_.resize(n);
  source->gathers_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const PayloadRef& payload = command.blocks[i].payload;
    if (payload.kind != PayloadRef::Kind::kGather && payload.kind != PayloadRef::Kind::kRegion) {
      continue;
    }
    if (regions == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lease_id: is required when blocks[", i, "] names regions"));
    }
    if (payload.kind == PayloadRef::Kind::kGather) {
      EVOKE_ASSIGN_OR_RETURN(
          source->gathers_[i],
          ResolveSlices(payload.gather, *regions, absl::StrCat("blocks[", i, "].gather")));
      continue;
    }
    const std::string field = absl::StrCat("blocks[", i, "].region");
    EVOKE_ASSIGN_OR_RETURN(std::shared_ptr<Region> region,
                           regions->Get(payload.region.region_id, field));
    EVOKE_RETURN_IF_ERROR(
        region->CheckSlice(payload.region.offset, payload.region.length, field));
    source->regions_[i] = std::move(region);
  }
  return source;
}

absl::Span<const absl::string_view> SaveRequestSource::HostPieces(size_t i) {
  return command_.blocks[i].payload.inline_pieces;
}

absl::string_view SaveRequestSource::HostBytes(size_t i) {
  const PayloadRef& payload = command_.blocks[i].payload;
  if (!gathers_[i].empty() || !payload.inline_pieces.empty()) return {};
  if (regions_[i] == nullptr) return payload.inline_bytes;
  if (regions_[i]->host_data() == nullptr) return {};
  return absl::string_view(
      reinterpret_cast<const char*>(regions_[i]->host_data() + payload.region.offset),
      payload.region.length);
}

namespace {

// GatherHashingDestination copies the pieces of `list`, in order, to `dst`
// and returns PayloadChecksum of the copy, hashed as it is filled
// (CopyPiecesHashingDestination).
uint64_t GatherHashingDestination(uint8_t* dst, const SliceList& list) {
  std::vector<absl::string_view> pieces;
  pieces.reserve(list.pieces.size());
  for (const SliceList::Piece& piece : list.pieces) {
    pieces.emplace_back(reinterpret_cast<const char*>(piece.ptr), piece.length);
  }
  return CopyPiecesHashingDestination(dst, pieces);
}

}  // namespace

absl::Status SaveRequestSource::Fetch(absl::Span<const size_t> items,
                                      absl::Span<uint8_t* const> dsts,
                                      absl::Span<std::optional<uint64_t>> checksums) {
  // Per device, one FetchBlocks: every contiguous slice and every piece of
  // every gather list bound for the host, and the device checksums of the
  // session blocks, hashed beside the copies.
  struct DeviceFetch {
    std::vector<FetchBlock> blocks;
    std::vector<size_t> hashed;  // Per block: its index k in `items`, or kNotHashed.
  };
  constexpr size_t kNotHashed = SIZE_MAX;
  absl::flat_hash_map<int, DeviceFetch> by_device;
  uint64_t gathered_slices = 0, gathered_on_host = 0, hashed_on_device = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const SliceList& gather = gathers_[items[k]];
    if (!gather.empty()) {
      uint8_t* dst = dsts[k];
      if (gather.device < 0) {
        // Hashed here, from the daemon's copy (the destination), each chunk
        // while it is still in cache: what is stored is what was hashed,
        // whatever the client does to its pages meanwhile.
        checksums[k] = GatherHashingDestination(dst, gather);
        gathered_on_host += gather.pieces.size();
      } else {
        // Checksums left unset: the TierManager hashes what landed in tier 1.
        DeviceFetch& fetch = by_device[gather.device];
        for (const SliceList::Piece& piece : gather.pieces) {
          fetch.blocks.push_back(FetchBlock{piece.ptr, dst, piece.length, /*checksum=*/false});
          fetch.hashed.push_back(kNotHashed);
          dst += piece.length;
        }
      }
      gathered_slices += gather.pieces.size();
      continue;
    }
    const SaveCommandBlock& block = command_.blocks[items[k]];
    const Region& region = *regions_[items[k]];
    const SliceRef& slice = block.payload.region;
    const uint8_t* src = static_cast<const uint8_t*>(region.device_ptr()) + slice.offset;
    // Session blocks: hashed on the device. Prefix blocks: left unset, the
    // caller hashes tier 1's copy.
    const bool session = block.meta->kind() == v1::BLOCK_KIND_SESSION;
    DeviceFetch& fetch = by_device[region.device()];
    fetch.blocks.push_back(FetchBlock{src, dsts[k], slice.length, session});
    fetch.hashed.push_back(session ? k : kNotHashed);
    hashed_on_device += session;
  }
  const absl::Time t0 = absl::Now();
  std::vector<uint64_t> sums;
  for (auto& [device, fetch] : by_device) {
    EVOKE_ASSIGN_OR_RETURN(DeviceOps* ops, copiers_->Get(device));
    sums.assign(fetch.blocks.size(), 0);
    EVOKE_RETURN_IF_ERROR(ops->FetchBlocks(fetch.blocks, absl::MakeSpan(sums)));
    for (size_t j = 0; j < sums.size(); ++j) {
      if (fetch.hashed[j] != kNotHashed) checksums[fetch.hashed[j]] = sums[j];
    }
  }
  EVOKE_LOG_DEBUG("save fetch: ", items.size(), " blocks (", gathered_slices,
                  " gathered slices, ", gathered_on_host, " of them on the host), ",
                  by_device.size(), " devices, ", hashed_on_device,
                  " hashed on the device beside the copies, ",
                  absl::FormatDuration(absl::Now() - t0));
  return absl::OkStatus();
}

absl::Status CheckInlineBudget(absl::Span<const v1::BlockMeta> metas, uint64_t budget) {
  uint64_t total = 0;
  for (size_t i = 0; i < metas.size(); ++i) {
    total += metas[i].payload_bytes();
    if (total > budget) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ids: the payloads of ids[0..", i, "] add up to ", FormatByteSize(total),
          ", over the response limit of ", FormatByteSize(budget),
          " (--max-message-bytes); load fewer blocks per call or use a region"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LoadResponseSink>> LoadResponseSink::Create(
    const LoadCommand& command, std::vector<std::string>* inline_out, uint64_t inline_budget,
    RegionResolver* regions, DeviceCopiers* copiers) {
  std::unique_ptr<LoadResponseSink> sink(
      new LoadResponseSink(command, inline_out, inline_budget, copiers));
  if ((!command.scatter.empty() || !command.destinations.empty()) && regions == nullptr) {
    return absl::InvalidArgumentError(
        "lease_id: is required with destinations or scatter (regions belong to a lease)");
  }
  if (!command.scatter.empty()) {
    sink->mode_ = Mode::kScatter;
    sink->scatter_.reserve(command.scatter.size());
    for (size_t i = 0; i < command.scatter.size(); ++i) {
      EVOKE_ASSIGN_OR_RETURN(
          SliceList list,
          ResolveSlices(command.scatter[i], *regions, absl::StrCat("scatter[", i, "]")));
      sink->scatter_.push_back(std::move(list));
    }
    return sink;
  }
  if (!command.destinations.empty()) {
    sink->mode_ = Mode::kDestinations;
  } else if (inline_out == nullptr) {
    return absl::InvalidArgumentError(
        "destinations: are required here (this transport returns no payloads inline)");
  }
  sink->regions_.reserve(command.destinations.size());
  for (size_t i = 0; i < command.destinations.size(); ++i) {
    const SliceRef& slice = command.destinations[i];
    const std::string field = absl::StrCat("destinations[", i, "]");
    EVOKE_ASSIGN_OR_RETURN(std::shared_ptr<Region> region, regions->Get(slice.region_id, field));
    EVOKE_RETURN_IF_ERROR(region->CheckSlice(slice.offset, slice.length, field));
    sink->regions_.push_back(std::move(region));
  }
  return sink;
}

absl::Status LoadResponseSink::PrepareReanchor(size_t i, const v1::BlockMeta& meta) {
  const ReanchorRef& r = command_.reanchor[i];
  if (!r.set()) return absl::OkStatus();
  const std::string field = absl::StrCat("reanchor[", i, "]");
  if (meta.fingerprint().layout() != v1::LAYOUT_CANONICAL_V1) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": block ", BlockId::FromBytes(meta.id())->ToHex(),
        " has an opaque layout; only canonical blocks can be re-anchored"));
  }
  Reanchoring plan;
  absl::StatusOr<RopePlan> rope = MakeRopePlan(meta.fingerprint());
  if (!rope.ok()) {
    return absl::Status(rope.status().code(), absl::StrCat(field, ": ", rope.status().message()));
  }
  plan.plan = std::move(rope).value();
  const uint32_t n = meta.n_tokens();
  std::vector<int64_t> target(n);
  if (!r.positions.empty()) {
    if (r.first_position.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": give first_position or positions, not both"));
    }
    if (r.positions.size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".positions: has ", r.positions.size(), " entries, expected n_tokens = ", n));
    }
    for (uint32_t t = 0; t < n; ++t) {
      if (r.positions[t] < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".positions[", t, "]: ", r.positions[t], " is negative"));
      }
      target[t] = r.positions[t];
    }
    plan.contiguous = false;
    plan.positions.assign(r.positions.begin(), r.positions.end());
  } else {
    const int32_t first = *r.first_position;
    const int64_t last = static_cast<int64_t>(first) + n - 1;
    if (first < 0 || last > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".first_position: ", first, " + n_tokens ", n, " must stay within [0, 2^31)"));
    }
    for (uint32_t t = 0; t < n; ++t) target[t] = static_cast<int64_t>(first) + t;
    plan.first = first;
  }
  const std::vector<int64_t> original = OriginalPositions(meta);
  plan.delta.resize(n);
  for (uint32_t t = 0; t < n; ++t) plan.delta[t] = target[t] - original[t];
  plan.meta = meta;
  reanchor_[i] = std::move(plan);
  return absl::OkStatus();
}

absl::Status LoadResponseSink::AfterHostCopy(size_t i, uint8_t* dest, uint64_t n) {
  if (i >= reanchor_.size() || !reanchor_[i]) return absl::OkStatus();
  const Reanchoring& r = *reanchor_[i];
  PhaseTimer timer(Phase::kReanchor);
  return ReanchorCanonicalBlock(r.plan, r.meta, dest, n, r.delta);
}

void LoadResponseSink::ApplyNewPositions(std::vector<v1::BlockMeta>* metas) const {
  for (size_t i = 0; i < reanchor_.size() && i < metas->size(); ++i) {
    if (!reanchor_[i]) continue;
    v1::BlockMeta& m = (*metas)[i];
    if (reanchor_[i]->contiguous) {
      m.clear_positions();
      m.set_first_position(reanchor_[i]->first);
    } else {
      m.mutable_positions()->Assign(reanchor_[i]->positions.begin(),
                                    reanchor_[i]->positions.end());
      m.set_first_position(reanchor_[i]->positions.empty() ? 0 : reanchor_[i]->positions[0]);
    }
  }
}

absl::Status LoadResponseSink::Prepare(absl::Span<const v1::BlockMeta> metas) {
  reanchor_.assign(metas.size(), std::nullopt);
  for (size_t i = 0; i < command_.reanchor.size() && i < metas.size(); ++i) {
    EVOKE_RETURN_IF_ERROR(PrepareReanchor(i, metas[i]));
  }
  if (mode_ == Mode::kScatter) {
    for (size_t i = 0; i < metas.size(); ++i) {
      if (scatter_[i].total != metas[i].payload_bytes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "scatter[", i, "].slices: lengths add up to ", scatter_[i].total,
            " bytes, the block's payload is ", metas[i].payload_bytes(),
            " bytes (they must be equal)"));
      }
    }
    return absl::OkStatus();
  }
  if (mode_ == Mode::kDestinations) {
    for (size_t i = 0; i < metas.size(); ++i) {
      if (command_.destinations[i].length < metas[i].payload_bytes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "destinations[", i, "].length: ", command_.destinations[i].length,
            " is shorter than the block's payload (", metas[i].payload_bytes(), " bytes)"));
      }
    }
    return absl::OkStatus();
  }
  EVOKE_RETURN_IF_ERROR(CheckInlineBudget(metas, budget_));
  inline_out_->resize(metas.size());
  for (size_t i = 0; i < metas.size(); ++i) (*inline_out_)[i].resize(metas[i].payload_bytes());
  return absl::OkStatus();
}

uint8_t* LoadResponseSink::HostDestination(size_t i) {
  if (mode_ == Mode::kScatter) return nullptr;
  if (mode_ == Mode::kInline) return reinterpret_cast<uint8_t*>((*inline_out_)[i].data());
  if (regions_[i]->host_data() == nullptr) return nullptr;
  return regions_[i]->host_data() + command_.destinations[i].offset;
}

uint8_t* LoadResponseSink::DestinationOnDevice(size_t i) const {
  return static_cast<uint8_t*>(regions_[i]->device_ptr()) + command_.destinations[i].offset;
}

namespace {

// ScatterHashingSource copies `n` bytes from `src` into `pieces` (lengths
// adding up to n) and returns PayloadChecksum of the source: each 1 MiB
// chunk is hashed, then scattered while it is still in cache.
uint64_t ScatterHashingSource(const uint8_t* src, uint64_t n,
                              absl::Span<const SliceList::Piece> pieces) {
  absl::InlinedVector<uint64_t, 16> chunks;
  chunks.reserve((n + kChecksumChunkBytes - 1) / kChecksumChunkBytes);
  size_t piece = 0;
  uint64_t in_piece = 0;  // Bytes of pieces[piece] already written.
  for (uint64_t off = 0; off < n; off += kChecksumChunkBytes) {
    const uint64_t chunk = std::min<uint64_t>(kChecksumChunkBytes, n - off);
    chunks.push_back(ChunkChecksum(src + off, chunk));
    for (uint64_t done = 0; done < chunk;) {
      const SliceList::Piece& p = pieces[piece];
      const uint64_t take = std::min(chunk - done, p.length - in_piece);
      std::memcpy(p.ptr + in_piece, src + off + done, take);
      done += take;
      in_piece += take;
      if (in_piece == p.length) {
        ++piece;
        in_piece = 0;
      }
    }
  }
  return CombineChunkChecksums(chunks, n);
}

absl::Status ScatterChecksumError(size_t i, uint64_t stored, uint64_t got) {
  return absl::DataLossError(absl::StrCat("ids[", i, "]: the payload fails its checksum (stored ",
                                          absl::Hex(stored), ", read ", absl::Hex(got),
                                          "); nothing was served"));
}

}  // namespace

absl::Status LoadResponseSink::DeliverScattered(size_t i, const uint8_t* bytes, uint64_t n,
                                                uint64_t checksum) {
  const SliceList& list = scatter_[i];
  const uint8_t* src = bytes;
  if (reanchor_[i]) {
    // Verify into a staging copy, rotate K there, scatter the result.
    uint8_t* stage;
    if (list.device < 0) {
      if (staging_bytes_ < n) {
        staging_.reset(new uint8_t[n]);
        staging_bytes_ = n;
      }
      stage = staging_.get();
    } else {
      // Each waits for its device copy: bounded by draining earlier ones.
      if (!device_staging_.empty() && device_staging_bytes_ + n > kMaxDeviceStaging) {
        EVOKE_RETURN_IF_ERROR(Drain());
      }
      device_staging_.emplace_back(new uint8_t[n]);
      device_staging_bytes_ += n;
      stage = device_staging_.back().get();
    }
    const uint64_t got = CopyHashingSource(stage, bytes, n);
    if (got != checksum) return ScatterChecksumError(i, checksum, got);
    EVOKE_RETURN_IF_ERROR(AfterHostCopy(i, stage, n));
    src = stage;
    if (list.device < 0) {
      for (const SliceList::Piece& p : list.pieces) {
        std::memcpy(p.ptr, src, p.length);
        src += p.length;
      }
      return absl::OkStatus();
    }
  } else if (list.device < 0) {
    const uint64_t got = ScatterHashingSource(bytes, n, list.pieces);
    return got == checksum ? absl::OkStatus() : ScatterChecksumError(i, checksum, got);
  } else {
    // The device's chunk checksums need each chunk contiguous where it
    // lands, which a scattered payload is not: verify before the copy.
    const uint64_t got = [&] {
      PhaseTimer timer(Phase::kChecksum);
      return PayloadChecksum(bytes, n);
    }();
    if (got != checksum) return ScatterChecksumError(i, checksum, got);
  }
  // A CUDA list: its slices join the device's one batch, copied at Finish
  // (`src` stays valid until then: tier 1 under a read pin, or staging).
  std::vector<CopyOp>& ops = device_ops_[list.device];
  for (const SliceList::Piece& p : list.pieces) {
    ops.push_back({p.ptr, src, p.length});
    src += p.length;
  }
  ++scattered_to_devices_;
  return absl::OkStatus();
}

absl::Status LoadResponseSink::Deliver(size_t i, const uint8_t* bytes, uint64_t n,
                                       uint64_t checksum) {
  if (mode_ == Mode::kScatter) return DeliverScattered(i, bytes, n, checksum);
  delivered_.push_back(Delivered{i, bytes, n, checksum});
  return absl::OkStatus();
}

absl::Status LoadResponseSink::Drain() {
  const absl::Time t0 = absl::Now();
  // Scattered blocks, verified (and re-anchored) on the host at Deliver: one
  // batch of host-to-device copies per device.
  for (auto& [device, ops] : device_ops_) {
    EVOKE_ASSIGN_OR_RETURN(DeviceOps* copier, copiers_->Get(device));
    EVOKE_RETURN_IF_ERROR(copier->HostToDevice(ops));
  }
  const absl::Time t1 = absl::Now();
  // Contiguous destinations: one LandBlocks per device. Each block is copied
  // in pieces, verified where it landed as its pieces arrive, and (when
  // asked) re-anchored in place once verified, while later pieces are still
  // in flight.
  absl::flat_hash_map<int, std::vector<size_t>> by_device;  // Indices into delivered_.
  for (size_t k = 0; k < delivered_.size(); ++k) {
    by_device[regions_[delivered_[k].index]->device()].push_back(k);
  }
  std::vector<DeviceReanchorJob> jobs;
  std::vector<LandingBlock> blocks;
  std::vector<uint64_t> got;
  size_t reanchored = 0;
  for (auto& [device, list] : by_device) {
    EVOKE_ASSIGN_OR_RETURN(DeviceOps* ops, copiers_->Get(device));
    jobs.clear();
    jobs.reserve(list.size());  // Blocks point into it: it must not move.
    blocks.clear();
    for (size_t k : list) {
      const Delivered& d = delivered_[k];
      uint8_t* dst = DestinationOnDevice(d.index);
      const DeviceReanchorJob* job = nullptr;
      if (reanchor_[d.index]) {
        const Reanchoring& r = *reanchor_[d.index];
        jobs.push_back(DeviceReanchorJob{&r.plan, &r.meta, dst, r.meta.payload_bytes(), r.delta});
        job = &jobs.back();
      }
      blocks.push_back(LandingBlock{d.host, dst, d.bytes, /*verify=*/true, job});
    }
    reanchored += jobs.size();
    got.assign(blocks.size(), 0);
    EVOKE_RETURN_IF_ERROR(ops->LandBlocks(blocks, absl::MakeSpan(got)));
    // The checksums are of the bytes as they landed, before re-anchoring. A
    // block that differs may already be rotated in place (garbage at its
    // destination): the call fails, so nothing is served, and the
    // TierManager finds and quarantines a bad tier-1 copy.
    for (size_t j = 0; j < list.size(); ++j) {
      const Delivered& d = delivered_[list[j]];
      if (got[j] != d.checksum) {
        return absl::DataLossError(absl::StrCat(
            "ids[", d.index, "]: the copy on the GPU fails its checksum (stored ",
            absl::Hex(d.checksum), ", on device ", absl::Hex(got[j]), "); nothing was served"));
      }
    }
  }
  if (!delivered_.empty() || scattered_to_devices_ > 0) {
    EVOKE_LOG_DEBUG("load to GPU: ", scattered_to_devices_, " scattered blocks, host to device ",
                    absl::FormatDuration(t1 - t0), "; ", delivered_.size(),
                    " blocks landed, verified and ", reanchored, " re-anchored on ",
                    by_device.size(), " devices ", absl::FormatDuration(absl::Now() - t1));
  }
  // Done with every source: the caller may free them.
  device_ops_.clear();
  delivered_.clear();
  device_staging_.clear();
  device_staging_bytes_ = 0;
  scattered_to_devices_ = 0;
  return absl::OkStatus();
}

}  // namespace evoke
