// The C API (include/evoke/evoke.h) over evoke::Client.
#include "evoke/evoke.h"

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/block_validation.h"
#include "common/chain_hash.h"
#include "common/fingerprint.h"

#include "evoke/client.h"

struct evoke_client {
  std::unique_ptr<evoke::Client> client;
  mutable absl::Mutex mu;
  std::string last_error ABSL_GUARDED_BY(mu);
  // Shared buffers (evoke_buffer_alloc), by address.
  std::map<const uint8_t*, std::unique_ptr<evoke::SharedRegion>> buffers ABSL_GUARDED_BY(mu);

  // SliceOf names [data, data + size) when it lies inside one buffer.
  std::optional<evoke::v1::RegionSlice> SliceOf(const void* data, size_t size) const {
    const auto* p = static_cast<const uint8_t*>(data);
    absl::MutexLock lock(&mu);
    auto it = buffers.upper_bound(p);
    if (it == buffers.begin()) return std::nullopt;
    --it;
    const evoke::SharedRegion& r = *it->second;
    const uint64_t offset = static_cast<uint64_t>(p - r.data());
    if (offset > r.size() || size > r.size() - offset || size == 0) return std::nullopt;
    return r.Slice(offset, size);
  }
};

namespace {

using evoke::BlockId;
namespace v1 = evoke::v1;

evoke_status Fail(const evoke_client* c, const absl::Status& s) {
  if (c != nullptr) {
    absl::MutexLock lock(&c->mu);
    const_cast<evoke_client*>(c)->last_error = s.ok() ? "" : s.ToString();
  }
  return static_cast<evoke_status>(s.code());
}

evoke_status Invalid(const evoke_client* c, absl::string_view message) {
  return Fail(c, absl::InvalidArgumentError(message));
}

v1::LayoutFingerprint ToFingerprint(const evoke_layout& l) {
  v1::LayoutFingerprint fp;
  fp.set_namespace_(l.ns != nullptr ? l.ns : "");
  fp.set_model_id(l.model_id != nullptr ? l.model_id : "");
  fp.set_model_revision(l.model_revision != nullptr ? l.model_revision : "");
  fp.set_k_dtype(static_cast<v1::DType>(l.k_dtype));
  fp.set_v_dtype(static_cast<v1::DType>(l.v_dtype));
  fp.set_n_layers(l.n_layers);
  fp.set_n_kv_heads(l.n_kv_heads);
  fp.set_head_dim(l.head_dim);
  fp.set_layout(v1::LAYOUT_CANONICAL_V1);
  v1::RopeParams* r = fp.mutable_rope();
  r->set_type(l.rope_type == 0 ? v1::ROPE_NONE : static_cast<v1::RopeType>(l.rope_type));
  r->set_rotary_dim(l.rotary_dim);
  r->set_freq_base(l.freq_base);
  r->set_freq_scale(l.freq_scale);
  r->set_scaling(static_cast<v1::RopeScaling>(l.rope_scaling));
  if (l.freq_factors != nullptr) {
    r->mutable_freq_factors()->Add(l.freq_factors, l.freq_factors + l.n_freq_factors);
  }
  r->set_yarn_ext_factor(l.yarn_ext_factor);
  r->set_yarn_attn_factor(l.yarn_attn_factor);
  r->set_yarn_beta_fast(l.yarn_beta_fast);
  r->set_yarn_beta_slow(l.yarn_beta_slow);
  r->set_n_ctx_orig(l.n_ctx_orig);
  fp.set_tp_rank(l.tp_rank);
  fp.set_tp_size(l.tp_size);
  return fp;
}

// Loads one block by id into dst, optionally re-anchored.
evoke_status LoadInto(evoke_client* c, const v1::LayoutFingerprint& fp, const BlockId& id,
                      int32_t new_first_pos, void* dst, size_t cap, size_t* written) {
  if (dst == nullptr && cap > 0) return Invalid(c, "dst: is NULL");
  std::vector<v1::Reanchor> reanchor;
  if (new_first_pos != EVOKE_KEEP_POSITIONS) reanchor.emplace_back().set_first_position(new_first_pos);
  if (std::optional<v1::RegionSlice> slice = c->SliceOf(dst, cap)) {
    // Into a shared buffer: the daemon writes the payload there itself.
    absl::StatusOr<std::vector<evoke::LoadedBlock>> got =
        c->client->LoadWith({&id, 1}, fp, reanchor, {*slice});
    if (!got.ok()) {
      // Too small a slice is refused before anything is written; say how
      // much is needed, as the inline path does.
      if (got.status().code() == absl::StatusCode::kInvalidArgument && written != nullptr) {
        if (absl::StatusOr<v1::BlockInfo> info = c->client->Describe(id); info.ok()) {
          *written = info->meta().payload_bytes();
          if (*written > cap) {
            return Fail(c, absl::ResourceExhaustedError(absl::StrCat(
                               "cap: ", cap, " bytes is smaller than the block (", *written,
                               " bytes)")));
          }
        }
      }
      return Fail(c, got.status());
    }
    if (written != nullptr) *written = (*got)[0].meta.payload_bytes();
    return Fail(c, absl::OkStatus());
  }
  absl::StatusOr<std::vector<evoke::LoadedBlock>> got =
      c->client->LoadWith({&id, 1}, fp, reanchor, {});
  if (!got.ok()) return Fail(c, got.status());
  const std::string& payload = (*got)[0].payload;
  if (written != nullptr) *written = payload.size();
  if (payload.size() > cap) {
    return Fail(c, absl::ResourceExhaustedError(absl::StrCat(
                       "cap: ", cap, " bytes is smaller than the block (", payload.size(),
                       " bytes)")));
  }
  std::memcpy(dst, payload.data(), payload.size());
  return Fail(c, absl::OkStatus());
}

evoke_status CheckCommon(const evoke_client* c, const evoke_layout* layout) {
  if (c == nullptr) return EVOKE_INVALID_ARGUMENT;
  if (layout == nullptr) return Invalid(c, "layout: is NULL");
  return EVOKE_OK;
}

}  // namespace

extern "C" {

evoke_status evoke_connect(const char* socket, evoke_client** out) {
  if (out == nullptr) return EVOKE_INVALID_ARGUMENT;
  *out = nullptr;
  evoke::ClientOptions options;
  options.target = socket != nullptr ? socket : "";
  absl::StatusOr<std::unique_ptr<evoke::Client>> client = evoke::Client::Connect(options);
  if (!client.ok()) return static_cast<evoke_status>(client.status().code());
  auto* c = new evoke_client;
  c->client = std::move(client).value();
  *out = c;
  return EVOKE_OK;
}

void evoke_close(evoke_client* client) { delete client; }

evoke_status evoke_buffer_alloc(evoke_client* c, size_t size, void** out) {
  if (c == nullptr) return EVOKE_INVALID_ARGUMENT;
  if (out == nullptr) return Invalid(c, "out: is NULL");
  *out = nullptr;
  if (size == 0) return Invalid(c, "size: is 0");
  if (!c->client->has_lease()) {
    if (absl::Status s = c->client->OpenLease("c-api"); !s.ok()) return Fail(c, s);
  }
  absl::StatusOr<std::unique_ptr<evoke::SharedRegion>> region =
      c->client->CreateSharedRegion(size);
  if (!region.ok()) return Fail(c, region.status());
  *out = (*region)->data();
  {
    absl::MutexLock lock(&c->mu);
    c->buffers.emplace((*region)->data(), std::move(*region));
  }
  return Fail(c, absl::OkStatus());
}

void evoke_buffer_free(evoke_client* c, void* buffer) {
  if (c == nullptr || buffer == nullptr) return;
  std::unique_ptr<evoke::SharedRegion> region;
  {
    absl::MutexLock lock(&c->mu);
    auto it = c->buffers.find(static_cast<const uint8_t*>(buffer));
    if (it == c->buffers.end()) return;
    region = std::move(it->second);
    c->buffers.erase(it);
  }
  // The daemon unmaps its side; ours goes with the SharedRegion.
  (void)c->client->UnregisterRegion(region->id());
}

const char* evoke_last_error(const evoke_client* client) {
  if (client == nullptr) return "client is NULL";
  absl::MutexLock lock(&client->mu);
  return client->last_error.c_str();
}

size_t evoke_block_bytes(const evoke_layout* layout, uint32_t n_tokens, uint32_t layer_begin,
                         uint32_t layer_end) {
  if (layout == nullptr || layer_end <= layer_begin) return 0;
  absl::StatusOr<uint64_t> n =
      evoke::CanonicalPayloadBytes(ToFingerprint(*layout), n_tokens, layer_end - layer_begin);
  return n.ok() ? *n : 0;
}

evoke_status evoke_block_save(evoke_client* c, const evoke_layout* layout, const char* session,
                              uint64_t seq, uint32_t n_tokens, uint32_t layer_begin,
                              uint32_t layer_end, int32_t first_pos, const void* data,
                              size_t size) {
  if (evoke_status s = CheckCommon(c, layout); s != EVOKE_OK) return s;
  if (session == nullptr) return Invalid(c, "session: is NULL");
  if (data == nullptr) return Invalid(c, "data: is NULL");
  const v1::LayoutFingerprint fp = ToFingerprint(*layout);
  evoke::BlockToSave block(
      evoke::SessionBlockMeta(fp, session, seq, n_tokens, layer_begin, layer_end, first_pos),
      absl::string_view(static_cast<const char*>(data), size));
  if (std::optional<v1::RegionSlice> slice = c->SliceOf(data, size)) {
    block.payload = {};
    block.region = *slice;  // Through the ring: the daemon copies it once.
  }
  return Fail(c, c->client->Save({&block, 1}).status());
}

evoke_status evoke_block_load(evoke_client* c, const evoke_layout* layout, const char* session,
                              uint64_t seq, int32_t new_first_pos, void* dst, size_t cap,
                              size_t* written) {
  if (evoke_status s = CheckCommon(c, layout); s != EVOKE_OK) return s;
  if (session == nullptr) return Invalid(c, "session: is NULL");
  const v1::LayoutFingerprint fp = ToFingerprint(*layout);
  return LoadInto(c, fp, evoke::SessionBlockId(fp.namespace_(), session, seq), new_first_pos,
                  dst, cap, written);
}

evoke_status evoke_block_delete(evoke_client* c, const evoke_layout* layout,
                                const char* session, uint64_t seq) {
  if (evoke_status s = CheckCommon(c, layout); s != EVOKE_OK) return s;
  if (session == nullptr) return Invalid(c, "session: is NULL");
  const BlockId id = evoke::SessionBlockId(layout->ns != nullptr ? layout->ns : "", session, seq);
  return Fail(c, c->client->Delete({&id, 1}));
}

evoke_status evoke_session_drop(evoke_client* c, const char* ns, const char* session,
                                uint32_t* n_deleted) {
  if (c == nullptr) return EVOKE_INVALID_ARGUMENT;
  if (ns == nullptr || session == nullptr) return Invalid(c, "ns, session: must not be NULL");
  absl::StatusOr<uint32_t> n = c->client->DropSession(ns, session);
  if (n.ok() && n_deleted != nullptr) *n_deleted = *n;
  return Fail(c, n.status());
}

namespace {

// The chain id of prefix block `index`; INVALID_ARGUMENT when tokens are short.
absl::StatusOr<BlockId> PrefixId(const v1::LayoutFingerprint& fp, const int32_t* tokens,
                                 size_t n_tokens, uint32_t block_tokens, uint32_t index) {
  if (tokens == nullptr || block_tokens == 0) {
    return absl::InvalidArgumentError("tokens, block_tokens: must be non-NULL and > 0");
  }
  if (static_cast<uint64_t>(index + 1) * block_tokens > n_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n_tokens: ", n_tokens, " tokens do not cover block ", index, " of ", block_tokens));
  }
  const std::vector<BlockId> chain =
      evoke::PrefixChain(absl::MakeConstSpan(tokens, (index + 1) * block_tokens), block_tokens,
                         evoke::DigestFingerprint(fp));
  return chain.back();
}

}  // namespace

evoke_status evoke_prefix_save(evoke_client* c, const evoke_layout* layout,
                               const int32_t* tokens, size_t n_tokens, uint32_t block_tokens,
                               uint32_t block_index, uint32_t layer_begin, uint32_t layer_end,
                               const void* data, size_t size) {
  if (evoke_status s = CheckCommon(c, layout); s != EVOKE_OK) return s;
  if (data == nullptr) return Invalid(c, "data: is NULL");
  const v1::LayoutFingerprint fp = ToFingerprint(*layout);
  absl::StatusOr<BlockId> parent =
      block_index == 0 ? absl::StatusOr<BlockId>(BlockId())
                       : PrefixId(fp, tokens, n_tokens, block_tokens, block_index - 1);
  if (!parent.ok()) return Fail(c, parent.status());
  if (static_cast<uint64_t>(block_index + 1) * block_tokens > n_tokens || tokens == nullptr) {
    return Invalid(c, "n_tokens: too few tokens for this block");
  }
  evoke::BlockToSave block(
      evoke::PrefixBlockMeta(fp, *parent,
                             absl::MakeConstSpan(tokens + block_index * block_tokens, block_tokens),
                             layer_begin, layer_end,
                             static_cast<int32_t>(block_index * block_tokens)),
      absl::string_view(static_cast<const char*>(data), size));
  if (std::optional<v1::RegionSlice> slice = c->SliceOf(data, size)) {
    block.payload = {};
    block.region = *slice;  // Through the ring: the daemon copies it once.
  }
  return Fail(c, c->client->Save({&block, 1}).status());
}

evoke_status evoke_prefix_lookup(evoke_client* c, const evoke_layout* layout,
                                 const int32_t* tokens, size_t n_tokens, uint32_t block_tokens,
                                 size_t* n_blocks) {
  if (evoke_status s = CheckCommon(c, layout); s != EVOKE_OK) return s;
  if (tokens == nullptr || block_tokens == 0 || n_blocks == nullptr) {
    return Invalid(c, "tokens, block_tokens, n_blocks: must be non-NULL and > 0");
  }
  const std::vector<BlockId> chain =
      evoke::PrefixChain(absl::MakeConstSpan(tokens, n_tokens), block_tokens,
                         evoke::DigestFingerprint(ToFingerprint(*layout)));
  *n_blocks = 0;
  if (chain.empty()) return Fail(c, absl::OkStatus());
  absl::StatusOr<std::vector<v1::Tier>> tiers = c->client->Lookup(chain);
  if (tiers.ok()) *n_blocks = tiers->size();
  return Fail(c, tiers.status());
}

evoke_status evoke_prefix_acquire(evoke_client* c, const evoke_layout* layout,
                                  const int32_t* tokens, size_t n_tokens, uint32_t block_tokens,
                                  uint64_t* handle, size_t* n_blocks) {
  if (evoke_status s = CheckCommon(c, layout); s != EVOKE_OK) return s;
  if (tokens == nullptr || block_tokens == 0 || handle == nullptr || n_blocks == nullptr) {
    return Invalid(c, "tokens, block_tokens, handle, n_blocks: must be non-NULL and > 0");
  }
  *handle = 0;
  *n_blocks = 0;
  const std::vector<BlockId> chain =
      evoke::PrefixChain(absl::MakeConstSpan(tokens, n_tokens), block_tokens,
                         evoke::DigestFingerprint(ToFingerprint(*layout)));
  if (chain.empty()) return Fail(c, absl::OkStatus());
  if (!c->client->has_lease()) {
    if (absl::Status s = c->client->OpenLease("c-api"); !s.ok()) return Fail(c, s);
  }
  absl::StatusOr<evoke::Client::Acquired> held = c->client->Acquire(chain);
  if (held.ok()) {
    *handle = held->handle;
    *n_blocks = held->tiers.size();
  }
  return Fail(c, held.status());
}

evoke_status evoke_release(evoke_client* c, uint64_t handle, uint32_t* n_released) {
  if (c == nullptr) return EVOKE_INVALID_ARGUMENT;
  absl::StatusOr<uint32_t> released = c->client->Release(handle);
  if (released.ok() && n_released != nullptr) *n_released = *released;
  return Fail(c, released.status());
}

evoke_status evoke_prefix_load(evoke_client* c, const evoke_layout* layout,
                               const int32_t* tokens, size_t n_tokens, uint32_t block_tokens,
                               uint32_t block_index, int32_t new_first_pos, void* dst,
                               size_t cap, size_t* written) {
  if (evoke_status s = CheckCommon(c, layout); s != EVOKE_OK) return s;
  const v1::LayoutFingerprint fp = ToFingerprint(*layout);
  absl::StatusOr<BlockId> id = PrefixId(fp, tokens, n_tokens, block_tokens, block_index);
  if (!id.ok()) return Fail(c, id.status());
  return LoadInto(c, fp, *id, new_first_pos, dst, cap, written);
}

evoke_status evoke_recover(evoke_client* c, const evoke_layout* layout, const char* session,
                           uint32_t layer, const float* queries, uint32_t n_query_heads,
                           uint32_t k, const float* min_score, evoke_recovered* out,
                           size_t* n_out) {
  if (evoke_status s = CheckCommon(c, layout); s != EVOKE_OK) return s;
  if (session == nullptr || queries == nullptr || out == nullptr || n_out == nullptr) {
    return Invalid(c, "session, queries, out, n_out: must not be NULL");
  }
  *n_out = 0;
  v1::RecoverRequest request;
  request.mutable_session()->set_namespace_(layout->ns != nullptr ? layout->ns : "");
  request.mutable_session()->set_session_id(session);
  request.set_kind(v1::SUMMARY_MEAN_KEYS);
  request.set_layer(layer);
  request.mutable_queries()->Add(queries,
                                 queries + static_cast<size_t>(n_query_heads) * layout->head_dim);
  request.set_n_query_heads(n_query_heads);
  request.set_k(k);
  if (min_score != nullptr) request.set_min_score(*min_score);
  absl::StatusOr<v1::RecoverResponse> r = c->client->Recover(request);
  if (!r.ok()) return Fail(c, r.status());
  for (const v1::RecoveredBlock& b : r->blocks()) {
    evoke_recovered& o = out[(*n_out)++];
    o.seq = b.meta().sequence();
    o.score = b.score();
    o.first_pos = b.meta().positions().empty() ? b.meta().first_position() : b.meta().positions(0);
    o.n_tokens = b.meta().n_tokens();
    o.bytes_available = b.bytes_available() ? 1 : 0;
    o.tier = static_cast<int>(b.tier());
  }
  return Fail(c, absl::OkStatus());
}

}  // extern "C"
