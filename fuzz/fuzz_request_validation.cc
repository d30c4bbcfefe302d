// fuzz_request_validation: what a client sends, checked as evoked checks it.
//
// Input: one selector byte, then a serialized request:
//   0 SaveRequest    -> ValidateSaveRequest; then, for each block it accepts,
//                       what the daemon does with it next without disk: the
//                       daemon's MEAN_KEYS summary of an inline canonical
//                       payload, RecoveryIndex::Add of every summary and a
//                       Search with each, and RoPE re-anchoring of the payload
//                       (a Load with new positions)
//   1 LoadRequest    -> ValidateLoadRequest
//   2 RecoverRequest -> the checks of KvTierService::Recover, then
//                       RecoveryIndex::Search over a small index built once
//   3 ListRequest    -> the checks of KvTierService::List
//   4 DeleteRequest  -> ParseIds as Lookup, Delete, Pin and Verify call it
// Recover's and List's checks live inside daemon/kvtier_service.cc (they
// need a CallbackServerContext there), so they are restated here; keep the
// two in step.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "common/block_validation.h"
#include "common/fingerprint.h"
#include "common/rope.h"
#include "common/summaries.h"
#include "daemon/request_validation.h"
#include "evoke/chain_hash.h"
#include "evoke/summaries.h"
#include "evoke/v1/kvtier.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "recovery/recovery_index.h"

namespace evoke {
namespace {

// Stops the run with a message: a property the code promises was broken.
#include "fuzz/fuzz_check.h"

const RequestLimits& Limits() {
  static const RequestLimits limits;  // The daemon's defaults.
  return limits;
}

// The shape of the blocks of the index that Recover requests search: the
// same one make_seeds.cc uses for its Recover seeds.
v1::LayoutFingerprint IndexFingerprint() {
  CacheShape shape;
  shape.n_layers = 2;
  shape.n_kv_heads = 2;
  shape.head_dim = 8;
  return MakeFingerprint("ns", "model", shape);
}

// An index of 40 session blocks ("ns", "s") of IndexFingerprint(), each with
// MEAN_KEYS summaries of layer 1 and an EMBEDDING of dim 4.
const RecoveryIndex& SeededIndex() {
  static RecoveryIndex* index = [] {
    auto* idx = new RecoveryIndex();
    const v1::LayoutFingerprint fp = IndexFingerprint();
    for (uint64_t seq = 0; seq < 40; ++seq) {
      v1::BlockMeta meta;
      const BlockId id = SessionBlockId("ns", "s", seq);
      meta.set_id(id.ToBytes());
      meta.set_kind(v1::BLOCK_KIND_SESSION);
      *meta.mutable_fingerprint() = fp;
      meta.set_session_id("s");
      meta.set_sequence(seq);
      meta.set_n_tokens(4);
      meta.set_layer_end(2);
      v1::Summary* s = meta.add_summaries();
      s->set_kind(v1::SUMMARY_MEAN_KEYS);
      s->set_layer(1);
      s->set_heads(2);
      s->set_dim(8);
      for (int i = 0; i < 16; ++i) s->add_values(std::sin(seq * 16.0 + i));
      v1::Summary* e = meta.add_summaries();
      e->set_kind(v1::SUMMARY_EMBEDDING);
      e->set_heads(1);
      e->set_dim(4);
      for (int i = 0; i < 4; ++i) e->add_values(std::cos(seq * 4.0 + i));
      idx->Add(id, meta);
    }
    return idx;
  }();
  return *index;
}

void CheckHits(const RecoveryQuery& query, const absl::StatusOr<std::vector<RecoveryHit>>& hits,
               uint64_t candidates) {
  if (!hits.ok()) return;
  FUZZ_CHECK(hits->size() <= query.k);
  FUZZ_CHECK(hits->size() <= candidates);
  for (size_t i = 0; i < hits->size(); ++i) {
    const RecoveryHit& h = (*hits)[i];
    if (query.exclude != nullptr) FUZZ_CHECK(!query.exclude->contains(h.id));
    if (query.has_min_score) FUZZ_CHECK(h.score >= query.min_score);
    // Best first; a NaN score would break the order (and rank first).
    FUZZ_CHECK(!std::isnan(h.score));
    if (i > 0) FUZZ_CHECK((*hits)[i - 1].score >= h.score);
  }
}

void FuzzSave(const v1::SaveRequest& request) {
  if (!ValidateSaveRequest(request, Limits()).ok()) return;
  // Every accepted block has an id and a payload of the size its shape says.
  RecoveryIndex index;
  for (const v1::SaveBlock& block : request.blocks()) {
    const v1::BlockMeta& meta = block.meta();
    absl::StatusOr<BlockId> id = BlockId::FromBytes(meta.id());
    FUZZ_CHECK(id.ok());
    const uint64_t size = PayloadLength(block);
    FUZZ_CHECK(size > 0 && size <= Limits().block.max_block_bytes);
    if (meta.fingerprint().layout() == v1::LAYOUT_CANONICAL_V1) {
      absl::StatusOr<uint64_t> expected = CanonicalPayloadBytes(
          meta.fingerprint(), meta.n_tokens(), meta.layer_end() - meta.layer_begin());
      FUZZ_CHECK(expected.ok() && *expected == size);
    }
    (void)DigestFingerprint(meta.fingerprint());
    (void)DescribeFingerprint(meta.fingerprint());

    v1::BlockMeta stored = meta;
    const bool inline_canonical = block.payload_case() == v1::SaveBlock::kInlineBytes &&
                                  meta.fingerprint().layout() == v1::LAYOUT_CANONICAL_V1;
    if (inline_canonical) {
      const auto* payload = reinterpret_cast<const uint8_t*>(block.inline_bytes().data());
      // The daemon's summarize hook (daemon/daemon.cc) on the stored bytes:
      // MEAN_KEYS when the client sent none and fewer than 8 summaries.
      bool has_mean = meta.summaries_size() >= 8;
      for (const v1::Summary& s : meta.summaries()) {
        has_mean = has_mean || s.kind() == v1::SUMMARY_MEAN_KEYS;
      }
      if (!has_mean) {
        absl::StatusOr<v1::Summary> mean =
            MeanKeysSummary(meta, payload, size, DefaultSummaryLayer(meta));
        if (mean.ok()) *stored.add_summaries() = *mean;
      }
      // A Load with new positions re-anchors the keys in place.
      absl::StatusOr<RopePlan> plan = MakeRopePlan(meta.fingerprint());
      if (plan.ok()) {
        const std::vector<int64_t> original = OriginalPositions(meta);
        std::vector<int64_t> delta(original.size());
        const auto base = static_cast<int32_t>(meta.sequence());
        for (size_t t = 0; t < delta.size(); ++t) {
          delta[t] = static_cast<int64_t>(base) + static_cast<int64_t>(t) - original[t];
        }
        std::string copy(block.inline_bytes());
        (void)ReanchorCanonicalBlock(*plan, meta, reinterpret_cast<uint8_t*>(copy.data()),
                                     copy.size(), delta);
      }
    }
    index.Add(*id, stored);
    // Search each summary's table with the summary itself as the query.
    for (const v1::Summary& s : stored.summaries()) {
      RecoveryQuery query;
      query.scope = meta.kind() == v1::BLOCK_KIND_SESSION
                        ? SessionScopeKey(meta.fingerprint().namespace_(), meta.session_id())
                        : ModelScopeKey(DigestFingerprint(meta.fingerprint()));
      query.kind = s.kind();
      query.layer = s.layer();
      query.queries = absl::MakeConstSpan(s.values().data(), s.values_size());
      query.n_query_heads = s.heads() == 0 ? 1 : s.heads();
      query.k = 4;
      uint64_t candidates = 0;
      CheckHits(query, index.Search(query, &candidates), candidates);
      (void)index.SearchExact(query);
    }
  }
}

void FuzzLoad(const v1::LoadRequest& request) {
  absl::StatusOr<std::vector<BlockId>> ids = ValidateLoadRequest(request, Limits());
  if (!ids.ok()) return;
  FUZZ_CHECK(!ids->empty() && ids->size() <= Limits().max_batch_blocks);
  absl::flat_hash_set<BlockId> unique(ids->begin(), ids->end());
  FUZZ_CHECK(unique.size() == ids->size());
  (void)MakeRopePlan(request.fingerprint());
}

// KvTierService::Recover's checks, then the search.
void FuzzRecover(const v1::RecoverRequest& request) {
  const RequestLimits& limits = Limits();
  RecoveryQuery query;
  switch (request.scope_case()) {
    case v1::RecoverRequest::kSession:
      if (request.session().namespace_().empty() || request.session().session_id().empty()) {
        return;
      }
      query.scope = SessionScopeKey(request.session().namespace_(), request.session().session_id());
      break;
    case v1::RecoverRequest::kModel:
      if (!ValidateFingerprint(request.model().fingerprint(), limits.block, "model.fingerprint")
               .ok()) {
        return;
      }
      query.scope = ModelScopeKey(DigestFingerprint(request.model().fingerprint()));
      break;
    default:
      return;
  }
  if (!v1::SummaryKind_IsValid(request.kind()) ||
      request.kind() == v1::SUMMARY_KIND_UNSPECIFIED) {
    return;
  }
  if (request.k() == 0 || request.k() > 1024) return;
  if (request.queries().empty()) return;
  if (request.aggregation() != v1::AGGREGATION_MEAN &&
      request.aggregation() != v1::AGGREGATION_MAX) {
    return;
  }
  absl::StatusOr<std::vector<BlockId>> excluded =
      ParseIds(request.exclude_ids(), "exclude_ids", 0, limits.max_ids, false);
  if (!excluded.ok()) return;
  const absl::flat_hash_set<BlockId> exclude(excluded->begin(), excluded->end());
  if (request.has_min_score() && !std::isfinite(request.min_score())) return;
  query.kind = request.kind();
  query.layer = request.layer();
  query.queries = absl::MakeConstSpan(request.queries().data(), request.queries_size());
  query.n_query_heads = request.n_query_heads();
  query.aggregate_max = request.aggregation() == v1::AGGREGATION_MAX;
  query.exclude = &exclude;
  query.has_min_score = request.has_min_score();
  query.min_score = request.min_score();
  query.k = request.k();
  uint64_t candidates = 0;
  absl::StatusOr<std::vector<RecoveryHit>> hits = SeededIndex().Search(query, &candidates);
  CheckHits(query, hits, candidates);
  absl::StatusOr<std::vector<RecoveryHit>> exact = SeededIndex().SearchExact(query);
  // The approximate search and the exact one agree on what is an error.
  FUZZ_CHECK(hits.ok() == exact.ok());
}

// KvTierService::List's checks.
void FuzzList(const v1::ListRequest& request) {
  const uint32_t page_size = request.page_size() == 0 ? 100 : request.page_size();
  if (page_size > 1000) return;
  if (!request.session_id().empty() && request.namespace_().empty()) return;
  if (!v1::Tier_IsValid(request.tier())) return;
  if (!request.page_token().empty()) {
    absl::StatusOr<BlockId> after = BlockId::FromHex(request.page_token());
    if (!after.ok()) return;
    // A token is what ToHex wrote.
    absl::StatusOr<BlockId> again = BlockId::FromHex(after->ToHex());
    FUZZ_CHECK(again.ok() && *again == *after);
  }
}

void FuzzIds(const v1::DeleteRequest& request) {
  for (bool unique : {false, true}) {
    absl::StatusOr<std::vector<BlockId>> ids =
        ParseIds(request.ids(), "ids", 1, Limits().max_ids, unique);
    if (!ids.ok()) continue;
    FUZZ_CHECK(static_cast<int>(ids->size()) == request.ids_size());
    for (int i = 0; i < request.ids_size(); ++i) {
      FUZZ_CHECK((*ids)[i].ToBytes() == request.ids(i));
    }
  }
}

template <typename Message>
bool Parse(const uint8_t* data, size_t size, Message* m) {
  return m->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace
}  // namespace evoke

// protobuf logs every string field with invalid UTF-8 it parses; thousands
// of lines a second would drown the fuzzer's own output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace evoke;
  if (size < 1 || size > (1u << 20)) return 0;
  const uint8_t which = data[0] % 5;
  ++data;
  --size;
  switch (which) {
    case 0: {
      v1::SaveRequest r;
      if (Parse(data, size, &r)) FuzzSave(r);
      break;
    }
    case 1: {
      v1::LoadRequest r;
      if (Parse(data, size, &r)) FuzzLoad(r);
      break;
    }
    case 2: {
      v1::RecoverRequest r;
      if (Parse(data, size, &r)) FuzzRecover(r);
      break;
    }
    case 3: {
      v1::ListRequest r;
      if (Parse(data, size, &r)) FuzzList(r);
      break;
    }
    case 4: {
      v1::DeleteRequest r;
      if (Parse(data, size, &r)) FuzzIds(r);
      break;
    }
  }
  return 0;
}
