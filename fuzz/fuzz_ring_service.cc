// fuzz_ring_service: the daemon's real RingHandler (daemon/ring_service.cc,
// MakeServiceRingHandler), which decodes each ring submission a client wrote
// into a command and runs it on the BlockService, as evoked does. fuzz_ring covers the
// ring itself (indices, headers, wake words) with a fake handler; this target
// covers what the entries ask for, against the real service, TierManager,
// leases and a shared-memory region, in process.
//
// One input is one batch of 1..16 submissions (FuzzedDataProvider), as the
// ring thread hands them over once it has checked the entry itself (opcode
// known, arguments inside the slot; fuzz_ring covers that): each a Save or a
// Load, with any flags, positions
// and user data; its meta either raw bytes or a real BlockMeta (Save) /
// LayoutFingerprint (Load) with fields changed; its payload the entry's own
// slice or a gather/scatter list, each slice in the region, at its edge,
// past it, or in another region id. The region's bytes come from the input
// too. Saves use blocks whose ids Loads later in the batch name.
//
// Checked:
//   - every result's status is a code the service answers with (never
//     INTERNAL or UNKNOWN);
//   - a Save that succeeds (and was not deduplicated) returns the checksum
//     of the bytes it read;
//   - a Load that succeeds (without re-anchoring) wrote, into the region,
//     bytes whose checksum is the one it returned;
//   - the handler stays alive; nothing the batch does crashes the daemon or
//     reads or writes outside the region (ASan).
#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/ring_format.h"
#include "daemon/access_policy.h"
#include "daemon/block_service.h"
#include "daemon/lease_manager.h"
#include "daemon/payload_paths.h"
#include "daemon/ring_server.h"
#include "daemon/ring_service.h"
#include "fuzz/fuzz_blocks.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_engine.h"
#include "google/protobuf/stubs/logging.h"
#include "testing/host_device_copier.h"
#include "testing/memory_tier.h"

namespace evoke {
namespace {

constexpr uint64_t kRegionBytes = 64 << 10;

// One daemon for the whole run (as a long-lived evoked), with one lease and
// one shared-memory region.
struct Daemon {
  testing::HostDevices gpus{1};
  std::unique_ptr<TierManager> tiers;
  std::unique_ptr<LeaseManager> leases;
  std::unique_ptr<DeviceCopiers> copiers;
  std::unique_ptr<BlockService> service;
  Lease lease;
  uint64_t region_id = 0;
  uint8_t* region = nullptr;  // The client's mapping of the same memfd.
  std::unique_ptr<RingHandler> handler;

  Daemon() {
    TierManagerOptions tier_options;
    tier_options.copy_threads = 0;
    tier_options.max_wait_for_room = absl::Milliseconds(5);
    tiers = fuzz::OpenMemoryEngine(tier_options, std::make_unique<testing::MemoryTier>());
    leases = std::make_unique<LeaseManager>(LeaseManagerOptions(), tiers.get());
    copiers = std::make_unique<DeviceCopiers>(&gpus);
    service = std::make_unique<BlockService>(tiers.get(), leases.get(), copiers.get(),
                                             BlockServiceOptions());
    absl::StatusOr<Lease> l = leases->Grant("fuzz");
    FUZZ_CHECK(l.ok());
    lease = *l;
    const int fd = ::memfd_create("region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    FUZZ_CHECK(fd >= 0 && ::ftruncate(fd, kRegionBytes) == 0);
    FUZZ_CHECK(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0);
    void* p = ::mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    FUZZ_CHECK(p != MAP_FAILED);
    region = static_cast<uint8_t*>(p);
    absl::StatusOr<uint64_t> r =
        leases->AddSharedMemoryRegion(lease.id.ToBytes(), geteuid(), ::dup(fd), kRegionBytes);
    if (!r.ok()) fprintf(stderr, "region: %s\n", r.status().ToString().c_str());
    FUZZ_CHECK(r.ok());
    ::close(fd);
    region_id = *r;
    const AccessPolicy policy = AccessPolicy::OwnerOnly(geteuid());
    PeerCred me;
    me.uid = geteuid();
    me.gid = getegid();
    absl::StatusOr<std::shared_ptr<const Caller>> caller = policy.ForPeer(me);
    FUZZ_CHECK(caller.ok());
    handler = MakeServiceRingHandler(service.get(), /*metrics=*/nullptr, *caller, lease,
                                     region_id);
  }
};

// The blocks Saves draw on (and Loads name): a prefix chain and two session
// blocks of the fuzz shape (2 layers, 2 KV heads of 8 dims, f16).
struct Blocks {
  std::vector<v1::BlockMeta> metas;
  std::vector<std::string> payloads;
  Blocks() {
    const v1::LayoutFingerprint fp = fuzz::Fp(true);
    const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10, 11, 12};
    BlockId parent;
    for (int i = 0; i < 2; ++i) {
      payloads.push_back(fuzz::Payload(4, 40 + i));
      metas.push_back(fuzz::WithChecksum(
          fuzz::PrefixBlockMeta(fp, parent, absl::MakeConstSpan(tokens).subspan(4 * i, 4), 0, 2,
                                4 * i),
          payloads.back()));
      parent = *BlockId::FromBytes(metas.back().id());
    }
    for (int i = 0; i < 2; ++i) {
      payloads.push_back(fuzz::Payload(4, 50 + i));
      metas.push_back(
          fuzz::WithChecksum(fuzz::SessionBlockMeta(fp, "s", i, 4, 0, 2, 4 * i), payloads.back()));
    }
  }
};

ring::RingSlice Slice(FuzzedDataProvider& in, uint64_t region_id, uint64_t want) {
  ring::RingSlice s;
  s.region_id = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.ConsumeIntegral<uint64_t>()
                                                            : region_id;
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:  // In the region, the size the block needs.
      s.length = want;
      s.offset =
          in.ConsumeIntegralInRange<uint64_t>(0, kRegionBytes - std::min(want, kRegionBytes));
      break;
    case 1:  // At its end.
      s.length = want;
      s.offset = kRegionBytes - std::min(want, kRegionBytes);
      break;
    case 2:  // Anything near it.
      s.offset = in.ConsumeIntegralInRange<uint64_t>(0, kRegionBytes + 64);
      s.length = in.ConsumeIntegralInRange<uint64_t>(0, want + 64);
      break;
    default:  // Anything.
      s.offset = in.ConsumeIntegral<uint64_t>();
      s.length = in.ConsumeIntegral<uint64_t>();
  }
  return s;
}

bool Answered(absl::StatusCode c) {
  switch (c) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return false;
    default:
      return true;
  }
}

void Run(FuzzedDataProvider& in) {
  static Daemon* d = new Daemon();
  static const Blocks* blocks = new Blocks();
  // The region's bytes: the payloads, then what the input gives.
  for (size_t i = 0; i < blocks->payloads.size(); ++i) {
    std::memcpy(d->region + 4096 * i, blocks->payloads[i].data(), blocks->payloads[i].size());
  }
  const std::string fill = in.ConsumeBytesAsString(in.ConsumeIntegralInRange<size_t>(0, 4096));
  std::memcpy(d->region + 16384, fill.data(), fill.size());

  const size_t n = in.ConsumeIntegralInRange<size_t>(1, 16);
  std::vector<std::string> metas(n);
  std::vector<std::vector<ring::RingSlice>> lists(n);
  std::vector<RingRequest> requests(n);
  for (size_t i = 0; i < n; ++i) {
    ring::RingSqe& sqe = requests[i].sqe;
    std::memset(&sqe, 0, sizeof(sqe));
    sqe.user_data = i;
    sqe.opcode = in.ConsumeBool() ? ring::kOpSave : ring::kOpLoad;
    sqe.flags = in.ConsumeIntegral<uint8_t>() & (in.ConsumeBool() ? 0xff : 0x3);
    sqe.first_position = in.ConsumeIntegralInRange<int32_t>(-8, 4096);
    const size_t b = in.ConsumeIntegralInRange<size_t>(0, blocks->metas.size() - 1);
    const v1::BlockMeta& meta = blocks->metas[b];
    const uint64_t want = blocks->payloads[b].size();
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {
      metas[i] = in.ConsumeRandomLengthString(256);
    } else if (sqe.opcode == ring::kOpSave) {
      v1::BlockMeta m = meta;
      switch (in.ConsumeIntegralInRange<int>(0, 6)) {
        case 0: m.set_payload_bytes(in.ConsumeIntegral<uint32_t>() % (2 * want + 1)); break;
        case 1: m.set_checksum(in.ConsumeIntegral<uint64_t>()); break;
        case 2: m.set_layer_end(in.ConsumeIntegral<uint32_t>() % 4); break;
        case 3: m.clear_tokens(); break;
        case 4: m.set_n_tokens(in.ConsumeIntegral<uint32_t>() % 16); break;
        default: break;  // As the client builds it.
      }
      metas[i] = m.SerializeAsString();
    } else {
      v1::LayoutFingerprint fp = meta.fingerprint();
      if (in.ConsumeIntegralInRange<int>(0, 5) == 0) fp.set_namespace_("other");
      metas[i] = fp.SerializeAsString();
    }
    if (in.ConsumeIntegralInRange<int>(0, 5) == 0) {
      const std::string id = in.ConsumeBytesAsString(16);
      std::memcpy(sqe.id, id.data(), id.size());
    } else {
      std::memcpy(sqe.id, meta.id().data(), 16);
    }
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
      const size_t k = in.ConsumeIntegralInRange<size_t>(1, 4);
      for (size_t j = 0; j < k; ++j) lists[i].push_back(Slice(in, d->region_id, want / k));
      sqe.n_slices = static_cast<uint16_t>(k);
    } else if (sqe.opcode == ring::kOpSave && in.ConsumeBool()) {
      sqe.slice = {d->region_id, 4096 * b, want};  // Where the payload is.
    } else {
      sqe.slice = Slice(in, d->region_id, want);
    }
    sqe.meta_len = static_cast<uint32_t>(metas[i].size());
    sqe.arg_len = static_cast<uint32_t>(metas[i].size() + 24 * lists[i].size());
    requests[i].meta = metas[i];
    requests[i].slices = lists[i];
  }
  std::vector<RingResult> results(n);
  d->handler->Execute(requests, absl::MakeSpan(results));
  for (size_t i = 0; i < n; ++i) {
    const RingRequest& r = requests[i];
    const RingResult& out = results[i];
    if (!Answered(out.status.code())) {
      fprintf(stderr, "entry %zu (opcode %u): %s\n", i, r.sqe.opcode,
              out.status.ToString().c_str());
      FUZZ_CHECK(Answered(out.status.code()));
    }
    // A deduplicated Save read nothing: its figures are the stored block's.
    if (!out.status.ok() || r.sqe.n_slices != 0 || (out.flags & ring::kCqeDeduplicated)) continue;
    const bool reanchored = r.sqe.opcode == ring::kOpLoad && (r.sqe.flags & ring::kLoadReanchor);
    if ((r.sqe.opcode == ring::kOpSave || r.sqe.opcode == ring::kOpLoad) && !reanchored) {
      // One slice: the bytes there are the ones the checksum names (read by
      // a Save, written by a Load), unless a later entry of the batch wrote
      // over them.
      bool overwritten = false;
      for (size_t j = i + 1; j < n; ++j) {
        overwritten = overwritten || (requests[j].sqe.opcode == ring::kOpLoad);
      }
      // A Save reads its slice; a Load fills the start of one at least as
      // large as the block.
      if (r.sqe.opcode == ring::kOpSave) {
        FUZZ_CHECK(r.sqe.slice.length == out.payload_bytes);
      } else {
        FUZZ_CHECK(r.sqe.slice.length >= out.payload_bytes);
      }
      if (!overwritten && r.sqe.slice.offset + out.payload_bytes <= kRegionBytes) {
        FUZZ_CHECK(PayloadChecksum(d->region + r.sqe.slice.offset, out.payload_bytes) ==
                   out.checksum);
      }
    }
  }
  FUZZ_CHECK(d->handler->Alive());
  // Each input starts from an empty store, so that a crash replays alone.
  (void)d->tiers->ReleaseOwner(d->lease.owner);
  bool more = false;
  std::vector<BlockId> stored;
  for (const BlockInfo& info : d->tiers->List(ListFilter(), nullptr, 1000, &more)) {
    stored.push_back(*BlockId::FromBytes(info.meta.id()));
  }
  if (!stored.empty()) FUZZ_CHECK(d->tiers->Delete(stored).ok());
}

}  // namespace
}  // namespace evoke

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  evoke::Run(in);
  return 0;
}
