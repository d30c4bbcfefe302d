// fuzz_remote_record: what a host reads back from tier 3 (the shared object
// store, storage/remote/remote_tier.h). Any host of the fleet, a different version,
// or anyone with write access to the pool may have written an object; a Load
// that reaches it must never crash, serve bytes that do not match the record
// it checked, serve a record whose identity does not hold, or delete an
// object only because this host's limits are stricter.
//
// One input: host A saves a prefix chain of 3 blocks and a session block
// through the real engine (write-behind to an in-memory ObjectStore), so the
// objects start as a real host writes them. Then, per object, the input
// (FuzzedDataProvider) keeps it, or replaces its data, or its record: raw
// bytes, or the real record parsed and changed (tokens dropped or changed,
// id, parent, namespace, trust group, layers, sizes, summaries, then
// optionally the checksum made to match the data again, as an attacker
// would). Host B, with the input's limits (--max-block-bytes, staging), then
// loads the blocks, alone and together, describes and verifies them.
//
// Checked:
//   - Load fails only with NOT_FOUND, DATA_LOSS, FAILED_PRECONDITION,
//     RESOURCE_EXHAUSTED or INVALID_ARGUMENT; what it serves is, for each
//     id, a record whose id is that id, whose identity holds
//     (CheckRecordIdentity), whose namespace is the fingerprint's, and bytes
//     whose checksum is the record's;
//   - an object larger than B's --max-block-bytes is never read and never
//     removed;
//   - an untouched object is served byte for byte when its chain is.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/block_validation.h"
#include "common/checksum.h"
#include "fuzz/fuzz_blocks.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_engine.h"
#include "google/protobuf/stubs/logging.h"
#include "storage/remote/remote_tier.h"
#include "storage/spill_record.pb.h"
#include "storage/tier_manager.h"
#include "testing/memory_object_store.h"
#include "testing/memory_tier.h"

namespace evoke {
namespace {

using ::evoke::testing::MemoryObjectStore;
using ::evoke::testing::SharedStore;

struct Host {
  std::unique_ptr<RemoteTier> remote;
  std::unique_ptr<TierManager> tiers;
};

Host Open(MemoryObjectStore* store, uint64_t max_block_bytes, uint64_t staging_bytes) {
  Host h;
  RemoteTierOptions ro;
  ro.retry = absl::Milliseconds(1);
  ro.retry_max = absl::Milliseconds(2);
  h.remote = std::make_unique<RemoteTier>(std::make_unique<SharedStore>(store), ro);
  FUZZ_CHECK(h.remote->Start().ok());
  TierManagerOptions options;
  options.remote = h.remote.get();
  options.remote_sessions = true;
  options.copy_threads = 0;
  options.max_wait_for_room = absl::Milliseconds(10);
  if (max_block_bytes != 0) options.limits.max_block_bytes = max_block_bytes;
  if (staging_bytes != 0) options.staging_bytes = staging_bytes;
  h.tiers = fuzz::OpenMemoryEngine(options, std::make_unique<evoke::testing::MemoryTier>());
  return h;
}

// The blocks host A saves: a prefix chain of three and one session block.
struct Written {
  std::vector<v1::BlockMeta> metas;
  std::vector<std::string> payloads;
  std::vector<BlockId> ids;
};

Written Blocks() {
  Written w;
  const v1::LayoutFingerprint fp = fuzz::Fp(true);
  const std::vector<int32_t> tokens = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22};
  BlockId parent;
  for (int i = 0; i < 3; ++i) {
    const std::string payload = fuzz::Payload(4, 20 + i);
    w.metas.push_back(fuzz::WithChecksum(
        fuzz::PrefixBlockMeta(fp, parent, absl::MakeConstSpan(tokens).subspan(4 * i, 4), 0, 2,
                              4 * i),
        payload));
    parent = *BlockId::FromBytes(w.metas.back().id());
    w.payloads.push_back(payload);
  }
  const std::string payload = fuzz::Payload(4, 30);
  w.metas.push_back(fuzz::WithChecksum(fuzz::SessionBlockMeta(fp, "s", 0, 4, 0, 2, 0), payload));
  w.payloads.push_back(payload);
  for (const v1::BlockMeta& m : w.metas) w.ids.push_back(*BlockId::FromBytes(m.id()));
  return w;
}

// Changes the record as a writer with pool access could.
void Mutate(FuzzedDataProvider& in, const Written& w, const std::string& data,
            storage::SpillRecord* r) {
  v1::BlockMeta* m = r->mutable_meta();
  const int changes = in.ConsumeIntegralInRange<int>(1, 3);
  for (int c = 0; c < changes; ++c) {
    switch (in.ConsumeIntegralInRange<int>(0, 11)) {
      case 0: m->clear_tokens(); break;
      case 1:
        if (m->tokens_size() > 0) m->set_tokens(0, in.ConsumeIntegral<int32_t>());
        break;
      case 2: m->set_id(w.metas[in.ConsumeIntegralInRange<size_t>(0, 3)].id()); break;
      case 3: m->set_id(in.ConsumeBytesAsString(in.ConsumeIntegralInRange<size_t>(0, 17))); break;
      case 4: m->set_parent_id(in.ConsumeBytesAsString(16)); break;
      case 5: m->mutable_fingerprint()->set_namespace_(in.ConsumeRandomLengthString(8)); break;
      case 6: m->mutable_fingerprint()->set_trust_group(in.ConsumeRandomLengthString(8)); break;
      case 7:
        m->set_layer_begin(in.ConsumeIntegral<uint32_t>() % 4);
        m->set_layer_end(in.ConsumeIntegral<uint32_t>() % 4);
        break;
      case 8: m->set_n_tokens(in.ConsumeIntegral<uint32_t>() % 64); break;
      case 9: m->set_payload_bytes(in.ConsumeIntegral<uint64_t>()); break;
      case 10: {
        v1::Summary* s = m->add_summaries();
        s->set_kind(v1::SUMMARY_MEAN_KEYS);
        s->set_heads(in.ConsumeIntegral<uint32_t>() % 4);
        s->set_dim(in.ConsumeIntegral<uint32_t>() % 16);
        for (int i = in.ConsumeIntegralInRange<int>(0, 40); i > 0; --i) {
          s->add_values(in.ConsumeFloatingPoint<float>());
        }
        break;
      }
      default: m->set_first_position(in.ConsumeIntegral<int32_t>()); break;
    }
  }
  if (in.ConsumeBool()) {  // Make the checksum match the (new) data again.
    m->set_checksum(PayloadChecksum(data.data(), data.size()));
    m->set_payload_bytes(data.size());
  }
}

bool Allowed(absl::StatusCode c) {
  switch (c) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kInvalidArgument:
      return true;
    default:
      return false;
  }
}

void CheckLoad(Host& b, const Written& w, absl::Span<const BlockId> ids,
               const std::vector<bool>& touched) {
  StringLoadSink sink;
  std::vector<v1::BlockMeta> metas;
  std::vector<LoadedInfo> infos;
  const absl::Status s = b.tiers->Load(ids, w.metas[0].fingerprint(), sink, &metas, &infos);
  if (!s.ok()) {
    if (!Allowed(s.code())) {
      fprintf(stderr, "unexpected status: %s\n", s.ToString().c_str());
      FUZZ_CHECK(Allowed(s.code()));
    }
    return;
  }
  FUZZ_CHECK(metas.size() == ids.size() && sink.payloads().size() == ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string& p = sink.payloads()[i];
    FUZZ_CHECK(metas[i].id() == ids[i].ToBytes());
    FUZZ_CHECK(CheckRecordIdentity(ids[i], metas[i]).ok());
    FUZZ_CHECK(metas[i].fingerprint().namespace_() == w.metas[0].fingerprint().namespace_());
    FUZZ_CHECK(PayloadChecksum(p.data(), p.size()) == metas[i].checksum());
    for (size_t j = 0; j < w.ids.size(); ++j) {
      if (w.ids[j] == ids[i] && !touched[j]) FUZZ_CHECK(p == w.payloads[j]);
    }
  }
}

void Run(FuzzedDataProvider& in) {
  static const Written w = Blocks();
  MemoryObjectStore store;
  {
    Host a = Open(&store, 0, 0);
    std::vector<SaveItem> items;
    std::vector<absl::string_view> views;
    for (size_t i = 0; i < w.metas.size(); ++i) {
      items.push_back(SaveItem{&w.metas[i], w.payloads[i].size()});
      views.push_back(w.payloads[i]);
    }
    HostSaveSource source(views);
    FUZZ_CHECK(a.tiers->Save(items, source, false, absl::InfiniteFuture()).ok());
    FUZZ_CHECK(a.tiers->WaitForRemoteIdle(absl::Seconds(10)));
    (void)a.tiers->Shutdown();
  }
  const std::string ns = RemoteTier::RemoteNamespace(w.metas[0].fingerprint());
  const std::string magic = RemoteTier::EncodeRecord(storage::SpillRecord());
  std::vector<bool> touched(w.ids.size(), false);
  std::vector<uint64_t> sizes(w.ids.size());
  for (size_t i = 0; i < w.ids.size(); ++i) {
    FUZZ_CHECK(store.Has(ns, w.ids[i]));
    std::string data = w.payloads[i];
    const int how = in.ConsumeIntegralInRange<int>(0, 4);
    if (how == 1 || how == 4) {
      data = in.ConsumeRandomLengthString(4096);
      store.SetData(ns, w.ids[i], data);
      touched[i] = true;
    }
    if (how == 2 || how == 4) {
      const std::string encoded = store.RecordOf(ns, w.ids[i]);
      storage::SpillRecord r;
      FUZZ_CHECK(r.ParseFromString(encoded.substr(magic.size())));
      Mutate(in, w, data, &r);
      store.SetRecord(ns, w.ids[i], RemoteTier::EncodeRecord(r));
      touched[i] = true;
    } else if (how == 3) {
      store.SetRecord(ns, w.ids[i], in.ConsumeRandomLengthString(512));
      touched[i] = true;
    }
    sizes[i] = data.size();
  }
  const uint64_t max_block_bytes = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(1, 4096)
                                                    : 0;
  const uint64_t staging =
      max_block_bytes == 0 ? 0 : max_block_bytes + in.ConsumeIntegral<uint16_t>();
  Host b = Open(&store, max_block_bytes, staging);
  const uint64_t reads_before = store.read_bytes;
  for (size_t i = 0; i < w.ids.size(); ++i) CheckLoad(b, w, {&w.ids[i], 1}, touched);
  CheckLoad(b, w, w.ids, touched);
  (void)reads_before;
  for (size_t i = 0; i < w.ids.size(); ++i) {
    if (max_block_bytes != 0 && sizes[i] > max_block_bytes) {
      FUZZ_CHECK(store.Has(ns, w.ids[i]));  // Over this host's limit: left in place.
    }
    (void)b.tiers->Describe(w.ids[i]);
  }
  (void)b.tiers->Verify({});
  (void)b.tiers->Shutdown();
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
