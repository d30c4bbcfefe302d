#include "engines/llama/kv_adapter.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/block_validation.h"
#include "common/status_macros.h"
#include "ggml-backend.h"
#include "ggml.h"

namespace evoke::llama {
namespace {

// A model metadata value ("" when absent).
std::string MetaValue(const llama_model* model, const std::string& key) {
  char buf[256];
  const int32_t n = llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf));
  if (n < 0) return "";
  return std::string(buf, std::min<size_t>(static_cast<size_t>(n), sizeof(buf) - 1));
}

uint32_t MetaU32(const llama_model* model, const std::string& key, uint32_t fallback) {
  uint32_t v = 0;
  const std::string s = MetaValue(model, key);
  return !s.empty() && absl::SimpleAtoi(s, &v) ? v : fallback;
}

double MetaDouble(const llama_model* model, const std::string& key, double fallback) {
  double v = 0;
  const std::string s = MetaValue(model, key);
  return !s.empty() && absl::SimpleAtod(s, &v) ? v : fallback;
}

absl::Status Refuse(absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat("evoke llama adapter: ", why));
}

// The sequence state of `seq`, read into `*buf` (grown when needed, never
// shrunk, so that a reused buffer costs no new pages).
absl::StatusOr<absl::string_view> SeqBlob(llama_context* ctx, llama_seq_id seq,
                                          std::string* buf) {
  const size_t size = llama_state_seq_get_size(ctx, seq);
  if (size == 0) return absl::InternalError("llama_state_seq_get_size failed (see llama.cpp log)");
  if (buf->size() < size) buf->resize(size);
  const size_t got =
      llama_state_seq_get_data(ctx, reinterpret_cast<uint8_t*>(buf->data()), size, seq);
  if (got != size) {
    return absl::InternalError(absl::StrCat("llama_state_seq_get_data wrote ", got,
                                            " bytes, llama_state_seq_get_size said ", size));
  }
  return absl::string_view(buf->data(), size);
}

// Whether a failed transfer through the shared region may be the region's
// fault (gone with a restarted daemon, or its lease), so that an inline
// retry can succeed. Errors about the request itself are not retried.
bool MayBeTheRegion(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvAdapter>> KvAdapter::Open(llama_context* ctx,
                                                           const llama_context_params& cparams,
                                                           Client* client,
                                                           AdapterOptions options) {
  if (ctx == nullptr) return absl::InvalidArgumentError("ctx: null llama_context");
  if (client == nullptr) return absl::InvalidArgumentError("client: null evoke::Client");
  if (options.model_id.empty()) return absl::InvalidArgumentError("options.model_id: empty");
  if (options.session_id.empty()) return absl::InvalidArgumentError("options.session_id: empty");
  const llama_model* model = llama_get_model(ctx);
  llama_memory_t mem = llama_get_memory(ctx);
  if (model == nullptr || mem == nullptr) {
    return Refuse("the context has no model or no memory module");
  }
  if (llama_model_is_recurrent(model) || llama_model_is_hybrid(model)) {
    return Refuse(
        "recurrent and hybrid models keep a state, not a KV cache of tokens; ranges of it "
        "cannot be evicted");
  }
  if (llama_model_n_swa(model) > 0) {
    return Refuse(absl::StrCat("the model uses sliding-window attention (n_swa ",
                               llama_model_n_swa(model),
                               "); its cache holds two sub-caches, which the adapter does not "
                               "handle"));
  }
  const llama_rope_type rope_type = llama_model_rope_type(model);
  if (rope_type != LLAMA_ROPE_TYPE_NONE && rope_type != LLAMA_ROPE_TYPE_NORM &&
      rope_type != LLAMA_ROPE_TYPE_NEOX) {
    return Refuse(absl::StrCat("RoPE type ", static_cast<int>(rope_type),
                               " (multimodal / M-RoPE) is not supported; NORM, NEOX or none"));
  }
  if (!cparams.kv_unified) {
    return Refuse("llama_context_params.kv_unified is false; the adapter needs one unified "
                  "KV stream to move ranges through its scratch sequence");
  }
  absl::StatusOr<v1::DType> k_dtype = DTypeOfGgmlType(cparams.type_k, "llama_context_params.type_k");
  if (!k_dtype.ok()) return k_dtype.status();
  absl::StatusOr<v1::DType> v_dtype = DTypeOfGgmlType(cparams.type_v, "llama_context_params.type_v");
  if (!v_dtype.ok()) return v_dtype.status();

  const int32_t n_seq_max = static_cast<int32_t>(llama_n_seq_max(ctx));
  const llama_seq_id scratch = options.scratch_seq >= 0 ? options.scratch_seq : n_seq_max - 1;
  if (options.seq < 0 || options.seq >= n_seq_max) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.seq: ", options.seq, " is not in [0, n_seq_max ", n_seq_max, ")"));
  }
  if (scratch < 0 || scratch >= n_seq_max || scratch == options.seq) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.scratch_seq: ", scratch, " must be in [0, n_seq_max ", n_seq_max,
        ") and differ from options.seq ", options.seq,
        " (create the context with n_seq_max >= 2)"));
  }
  if (llama_memory_seq_pos_max(mem, scratch) >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "options.scratch_seq: sequence ", scratch, " holds tokens; it must be left to the adapter"));
  }
  // The authoritative check of the cache's stream count: the state of the
  // empty scratch sequence says how many streams the cache has.
  std::string probe;
  EVOKE_ASSIGN_OR_RETURN(absl::string_view probe_blob, SeqBlob(ctx, scratch, &probe));
  EVOKE_RETURN_IF_ERROR(ParseSeqState(probe_blob).status());

  // Shape and RoPE from the model, with the context's overrides.
  const std::string arch = MetaValue(model, "general.architecture");
  const uint32_t n_layer = static_cast<uint32_t>(llama_model_n_layer(model));
  const uint32_t n_head = static_cast<uint32_t>(llama_model_n_head(model));
  const uint32_t n_head_kv = static_cast<uint32_t>(llama_model_n_head_kv(model));
  const uint32_t n_embd = static_cast<uint32_t>(llama_model_n_embd(model));
  if (n_head == 0 || n_head_kv == 0 || n_layer == 0) {
    return Refuse("the model reports no attention heads or layers");
  }
  const uint32_t head_dim = MetaU32(model, arch + ".attention.key_length", n_embd / n_head);
  const uint32_t v_head_dim = MetaU32(model, arch + ".attention.value_length", head_dim);
  if (v_head_dim != head_dim) {
    return Refuse(absl::StrCat("K heads are ", head_dim, " wide and V heads ", v_head_dim,
                               "; the canonical layout needs equal widths"));
  }
  const std::string scaling = absl::AsciiStrToLower(MetaValue(model, arch + ".rope.scaling.type"));
  if (scaling == "yarn" || scaling == "longrope" ||
      cparams.rope_scaling_type == LLAMA_ROPE_SCALING_TYPE_YARN ||
      cparams.rope_scaling_type == LLAMA_ROPE_SCALING_TYPE_LONGROPE) {
    return Refuse("YaRN and LongRoPE scaling are not supported by the adapter");
  }

  auto adapter = std::unique_ptr<KvAdapter>(new KvAdapter(ctx, client, std::move(options)));
  adapter->scratch_ = scratch;
  CacheShape shape;
  shape.k_dtype = *k_dtype;
  shape.v_dtype = *v_dtype;
  shape.n_layers = n_layer;
  shape.n_kv_heads = n_head_kv;
  shape.head_dim = head_dim;
  v1::LayoutFingerprint fp =
      MakeFingerprint(adapter->options_.ns, adapter->options_.model_id, shape);
  fp.set_model_revision(adapter->options_.model_revision);
  v1::RopeParams* rope = fp.mutable_rope();
  if (rope_type == LLAMA_ROPE_TYPE_NONE) {
    rope->set_type(v1::ROPE_NONE);
  } else {
    rope->set_type(rope_type == LLAMA_ROPE_TYPE_NEOX ? v1::ROPE_NEOX : v1::ROPE_NORM);
    rope->set_rotary_dim(MetaU32(model, arch + ".rope.dimension_count", head_dim));
    rope->set_freq_base(cparams.rope_freq_base != 0
                            ? cparams.rope_freq_base
                            : MetaDouble(model, arch + ".rope.freq_base", 10000.0));
    const double freq_scale = cparams.rope_freq_scale != 0
                                  ? cparams.rope_freq_scale
                                  : llama_model_rope_freq_scale_train(model);
    rope->set_freq_scale(freq_scale);
    if (!adapter->options_.rope_freq_factors.empty()) {
      rope->set_scaling(v1::ROPE_SCALING_LLAMA3);
      for (float f : adapter->options_.rope_freq_factors) rope->add_freq_factors(f);
    } else if (freq_scale != 1.0) {
      rope->set_scaling(v1::ROPE_SCALING_LINEAR);
    }
  }
  // What the daemon would refuse at the first Save, refused now (e.g. a
  // freq-factor count that does not match rotary_dim / 2).
  if (absl::Status valid = ValidateFingerprint(fp, BlockLimits(), "fingerprint"); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layout derived from the model and options is invalid: ",
                     valid.message()));
  }
  adapter->fingerprint_ = std::move(fp);
  adapter->format_ = CacheFormat{n_layer, n_head_kv, head_dim, *k_dtype, *v_dtype, false};

  // Continue the session's numbering after its stored blocks.
  v1::ListRequest list;
  list.set_namespace_(adapter->options_.ns);
  list.set_session_id(adapter->options_.session_id);
  list.set_page_size(1000);
  for (;;) {
    EVOKE_ASSIGN_OR_RETURN(v1::ListResponse page, client->List(list));
    for (const v1::BlockInfo& b : page.blocks()) {
      adapter->next_sequence_ = std::max(adapter->next_sequence_, b.meta().sequence() + 1);
    }
    if (page.next_page_token().empty()) break;
    list.set_page_token(page.next_page_token());
  }
  return adapter;
}

absl::Status KvAdapter::ReadState(llama_pos p0, llama_pos p1, SeqState* state) {
  if (p0 < 0 || p1 <= p0) {
    return absl::InvalidArgumentError(
        absl::StrCat("range: [", p0, ", ", p1, ") is empty or negative"));
  }
  llama_memory_t mem = llama_get_memory(ctx_);
  llama_memory_seq_rm(mem, scratch_, -1, -1);
  llama_memory_seq_cp(mem, options_.seq, scratch_, p0, p1);
  absl::Cleanup clear_scratch = [&] { llama_memory_seq_rm(mem, scratch_, -1, -1); };
  EVOKE_ASSIGN_OR_RETURN(absl::string_view blob, SeqBlob(ctx_, scratch_, &state_buf_));
  EVOKE_ASSIGN_OR_RETURN(*state, ParseSeqState(blob));
  if (state->positions.empty()) {
    return absl::NotFoundError(absl::StrCat("sequence ", options_.seq,
                                            " holds no tokens in [", p0, ", ", p1, ")"));
  }
  if (state->n_layer != format_.n_layer) {
    return absl::InternalError(absl::StrCat("llama.cpp wrote ", state->n_layer,
                                            " layers, the model has ", format_.n_layer));
  }
  EVOKE_ASSIGN_OR_RETURN(v1::DType k, DTypeOfGgmlType(state->k_type, "cache type_k"));
  EVOKE_ASSIGN_OR_RETURN(v1::DType v, DTypeOfGgmlType(state->v_type, "cache type_v"));
  if (k != format_.k_dtype || v != format_.v_dtype) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the cache holds ", DTypeName(k), "/", DTypeName(v), " K/V, but the context parameters "
        "given to Open said ", DTypeName(format_.k_dtype), "/", DTypeName(format_.v_dtype)));
  }
  format_.v_trans = state->v_trans;  // Learnt from the cache itself.
  v_trans_known_ = true;
  return absl::OkStatus();
}

absl::StatusOr<CanonicalRange> KvAdapter::Read(llama_pos p0, llama_pos p1) {
  SeqState state;
  EVOKE_RETURN_IF_ERROR(ReadState(p0, p1, &state));
  return ToCanonical(state, format_.n_kv_heads, format_.head_dim);
}

SharedRegion* KvAdapter::RegionFor(uint64_t bytes) {
  if (!options_.shared_memory) return nullptr;
  if (region_ != nullptr && region_->size() >= bytes && client_->has_lease()) {
    return region_.get();
  }
  DropRegion();
  if (!client_->OpenLease("evoke-llama").ok()) return nullptr;
  constexpr uint64_t kMin = 8ull << 20, kGranule = 2ull << 20;
  const uint64_t size = (std::max(bytes, kMin) + kGranule - 1) / kGranule * kGranule;
  absl::StatusOr<std::unique_ptr<SharedRegion>> region = client_->CreateSharedRegion(size);
  if (!region.ok()) return nullptr;
  region_ = std::move(region).value();
  return region_.get();
}

KvAdapter::~KvAdapter() { DropRegion(); }

void KvAdapter::DropRegion() {
  if (region_ == nullptr) return;
  if (client_->has_lease()) (void)client_->UnregisterRegion(region_->id());
  region_.reset();
}

absl::StatusOr<EvictedBlock> KvAdapter::Evict(llama_pos p0, llama_pos p1,
                                              absl::Span<const v1::Summary> summaries) {
  SeqState state;
  EVOKE_RETURN_IF_ERROR(ReadState(p0, p1, &state));
  const uint64_t bytes = CanonicalBytes(state);
  // The canonical bytes go straight into the shared region, or into a kept
  // buffer for an inline save.
  SharedRegion* region = RegionFor(bytes);
  if (region == nullptr && inline_buf_.size() < bytes) inline_buf_.resize(bytes);
  char* dst = region != nullptr ? reinterpret_cast<char*>(region->data()) : inline_buf_.data();
  EVOKE_ASSIGN_OR_RETURN(
      std::vector<int32_t> positions,
      ToCanonicalInto(state, format_.n_kv_heads, format_.head_dim, absl::MakeSpan(dst, bytes)));
  const uint32_t n = static_cast<uint32_t>(positions.size());
  v1::BlockMeta meta = SessionBlockMeta(fingerprint_, options_.session_id, next_sequence_, n, 0,
                                        format_.n_layer, positions.front());
  meta.set_token_offset(static_cast<uint64_t>(positions.front()));
  if (positions.back() - positions.front() + 1 != static_cast<int32_t>(n)) {
    for (int32_t p : positions) meta.add_positions(p);
  }
  for (const v1::Summary& s : summaries) *meta.add_summaries() = s;
  absl::Status saved;
  if (region != nullptr) {
    saved = client_->Save({BlockToSave(meta, region->Slice(0, bytes))}, options_.durable).status();
    ++stats_.shm_transfers;
    if (MayBeTheRegion(saved)) {
      // The region may have died with a restarted daemon: once more, inline.
      inline_buf_.assign(reinterpret_cast<const char*>(region->data()), bytes);
      DropRegion();
      ++stats_.shm_fallbacks;
      region = nullptr;
    }
  }
  if (region == nullptr) {
    saved = client_->Save({BlockToSave(meta, absl::string_view(inline_buf_.data(), bytes))},
                          options_.durable)
                .status();
    ++stats_.inline_transfers;
  }
  EVOKE_RETURN_IF_ERROR(saved);
  // Acknowledged: now the cells can go.
  if (!llama_memory_seq_rm(llama_get_memory(ctx_), options_.seq, p0, p1)) {
    return absl::InternalError(absl::StrCat("llama_memory_seq_rm refused to remove [", p0, ", ",
                                            p1, ") after the block was saved"));
  }
  EvictedBlock out;
  out.id = BlockIdOf(meta);
  out.sequence = next_sequence_++;
  out.positions = std::move(positions);
  out.payload_bytes = bytes;
  known_bytes_[out.id] = bytes;
  return out;
}

absl::StatusOr<std::vector<v1::RecoveredBlock>> KvAdapter::Recover(
    absl::Span<const float> queries, uint32_t n_query_heads, uint32_t layer, uint32_t k,
    absl::Span<const BlockId> exclude) {
  v1::RecoverRequest request;
  request.mutable_session()->set_namespace_(options_.ns);
  request.mutable_session()->set_session_id(options_.session_id);
  request.set_kind(v1::SUMMARY_MEAN_KEYS);
  request.set_layer(layer);
  request.mutable_queries()->Add(queries.begin(), queries.end());
  request.set_n_query_heads(n_query_heads);
  request.set_k(k);
  request.set_require_bytes(true);
  for (const BlockId& id : exclude) request.add_exclude_ids(id.ToBytes());
  EVOKE_ASSIGN_OR_RETURN(v1::RecoverResponse response, client_->Recover(request));
  for (const v1::RecoveredBlock& b : response.blocks()) {
    absl::StatusOr<BlockId> id = BlockId::FromBytes(b.id());
    if (id.ok() && b.meta().payload_bytes() > 0) known_bytes_[*id] = b.meta().payload_bytes();
  }
  return std::vector<v1::RecoveredBlock>(response.blocks().begin(), response.blocks().end());
}

absl::StatusOr<SplicedBlock> KvAdapter::Splice(const BlockId& id, llama_pos new_first_position,
                                               SpliceMode mode) {
  if (new_first_position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("new_first_position: ", new_first_position, " is negative"));
  }
  if (mode == SpliceMode::kShiftInEngine && !llama_memory_can_shift(llama_get_memory(ctx_))) {
    return absl::FailedPreconditionError(
        "mode: kShiftInEngine, but this llama.cpp memory cannot shift positions");
  }
  return Bring(id, new_first_position, mode == SpliceMode::kReanchorInDaemon);
}

absl::StatusOr<SplicedBlock> KvAdapter::Restore(const BlockId& id) {
  return Bring(id, std::nullopt, false);
}

absl::StatusOr<SplicedBlock> KvAdapter::Bring(const BlockId& id,
                                              std::optional<llama_pos> new_first_position,
                                              bool reanchor_in_daemon) {
  std::vector<v1::Reanchor> reanchor;
  if (new_first_position.has_value() && reanchor_in_daemon) {
    reanchor.emplace_back().set_first_position(static_cast<int32_t>(*new_first_position));
  }
  const BlockId ids[] = {id};
  const auto known = known_bytes_.find(id);
  SharedRegion* region = known != known_bytes_.end() ? RegionFor(known->second) : nullptr;
  absl::StatusOr<std::vector<LoadedBlock>> loaded;
  if (region != nullptr) {
    loaded = client_->LoadWith(ids, fingerprint_, reanchor, {region->Slice(0, region->size())});
    ++stats_.shm_transfers;
    // NOT_FOUND here is about the block (a dead region is FAILED_PRECONDITION
    // or UNAVAILABLE): no inline retry for it.
    if (!loaded.ok() && loaded.status().code() != absl::StatusCode::kNotFound &&
        MayBeTheRegion(loaded.status())) {
      DropRegion();
      ++stats_.shm_fallbacks;
      region = nullptr;
    }
  }
  if (region == nullptr) {
    loaded = client_->LoadWith(ids, fingerprint_, reanchor, {});
    ++stats_.inline_transfers;
  }
  if (!loaded.ok()) return loaded.status();
  const LoadedBlock& block = loaded->front();
  absl::string_view payload =
      region != nullptr ? absl::string_view(reinterpret_cast<const char*>(region->data()),
                                            block.meta.payload_bytes())
                        : absl::string_view(block.payload);
  known_bytes_[id] = payload.size();
  int32_t shift = 0;
  if (new_first_position.has_value() && !reanchor_in_daemon) {
    const int32_t first = block.meta.positions_size() > 0 ? block.meta.positions(0)
                                                          : block.meta.first_position();
    shift = static_cast<int32_t>(*new_first_position) - first;
  }
  return Write(block.meta, payload, block.served_from, shift);
}

absl::StatusOr<SplicedBlock> KvAdapter::Write(const v1::BlockMeta& meta, absl::string_view payload,
                                              v1::Tier served_from, int32_t shift) {
  if (meta.layer_begin() != 0 || meta.layer_end() != format_.n_layer) {
    return absl::FailedPreconditionError(absl::StrCat(
        "block holds layers [", meta.layer_begin(), ", ", meta.layer_end(),
        "); the adapter splices whole blocks of all ", format_.n_layer, " layers"));
  }
  std::vector<int32_t> positions(meta.n_tokens());
  for (uint32_t i = 0; i < meta.n_tokens(); ++i) {
    positions[i] = meta.positions_size() > 0 ? meta.positions(static_cast<int>(i))
                                             : meta.first_position() + static_cast<int32_t>(i);
  }
  // The blob's V layout (transposed or not, which llama.cpp decides from
  // flash attention) must be the cache's: learnt from the first Read, probed
  // with a one-token Read, or, for an empty sequence, tried both ways.
  llama_memory_t mem = llama_get_memory(ctx_);
  if (!v_trans_known_ && llama_memory_seq_pos_max(mem, options_.seq) >= 0) {
    const llama_pos any = llama_memory_seq_pos_max(mem, options_.seq);
    SeqState probe;
    EVOKE_RETURN_IF_ERROR(ReadState(any, any + 1, &probe));
  }
  llama_memory_seq_rm(mem, scratch_, -1, -1);
  absl::Cleanup clear_scratch = [&] { llama_memory_seq_rm(mem, scratch_, -1, -1); };
  bool placed = false;
  for (int attempt = 0; attempt < (v_trans_known_ ? 1 : 2) && !placed; ++attempt) {
    if (attempt == 1) format_.v_trans = !format_.v_trans;
    EVOKE_RETURN_IF_ERROR(
        WriteSeqStateBlob(payload, positions, format_, scratch_, &state_buf_));
    placed = llama_state_seq_set_data(ctx_, reinterpret_cast<const uint8_t*>(state_buf_.data()),
                                      state_buf_.size(), scratch_) == state_buf_.size();
  }
  if (!placed) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "llama_state_seq_set_data could not place ", positions.size(),
        " cells (is the KV cache full? see llama.cpp's log)"));
  }
  v_trans_known_ = true;
  if (shift != 0) {
    llama_memory_seq_add(mem, scratch_, -1, -1, shift);
    for (int32_t& p : positions) p += shift;
  }
  // Clear the block's own positions in seq(), run by run (a gapped block
  // leaves whatever sits in its gaps alone), then move the cells in.
  for (size_t i = 0; i < positions.size();) {
    size_t j = i + 1;
    while (j < positions.size() && positions[j] == positions[j - 1] + 1) ++j;
    llama_memory_seq_rm(mem, options_.seq, positions[i], positions[j - 1] + 1);
    i = j;
  }
  llama_memory_seq_cp(mem, scratch_, options_.seq, -1, -1);
  SplicedBlock out;
  out.id = BlockIdOf(meta);
  out.positions = std::move(positions);
  out.served_from = served_from;
  return out;
}

std::vector<v1::BlockMeta> KvAdapter::PrefixChain(absl::Span<const llama_token> tokens,
                                                   uint32_t block_tokens) const {
  std::vector<v1::BlockMeta> chain;
  BlockId parent;
  for (size_t b = 0; (b + 1) * block_tokens <= tokens.size(); ++b) {
    chain.push_back(PrefixBlockMeta(fingerprint_, parent,
                                    tokens.subspan(b * block_tokens, block_tokens), 0,
                                    format_.n_layer,
                                    static_cast<int32_t>(b * block_tokens)));
    parent = BlockIdOf(chain.back());
  }
  return chain;
}

absl::StatusOr<KvAdapter::StoredPrefix> KvAdapter::LookupPrefix(
    absl::Span<const llama_token> tokens, uint32_t block_tokens) {
  if (block_tokens == 0) return absl::InvalidArgumentError("block_tokens: 0");
  StoredPrefix out;
  out.chain = PrefixChain(tokens, block_tokens);
  if (out.chain.empty()) return out;
  for (const v1::BlockMeta& m : out.chain) out.ids.push_back(BlockIdOf(m));
  EVOKE_ASSIGN_OR_RETURN(std::vector<v1::Tier> present, client_->Lookup(out.ids));
  // A breadcrumb (bytes dropped) ends the stored prefix.
  while (out.present < present.size() && present[out.present] != v1::TIER_BREADCRUMB) {
    ++out.present;
  }
  return out;
}

absl::StatusOr<PrefixResult> KvAdapter::SavePrefix(absl::Span<const llama_token> tokens,
                                                   uint32_t block_tokens) {
  EVOKE_ASSIGN_OR_RETURN(StoredPrefix stored, LookupPrefix(tokens, block_tokens));
  const std::vector<v1::BlockMeta>& chain = stored.chain;
  PrefixResult out;
  if (chain.empty()) return out;
  // Breadcrumbs (bytes dropped) are saved again.
  out.present = static_cast<uint32_t>(stored.present);
  std::vector<std::string> payloads;
  std::vector<BlockToSave> batch;
  payloads.reserve(chain.size() - out.present);
  for (size_t b = out.present; b < chain.size(); ++b) {
    const llama_pos p0 = static_cast<llama_pos>(b * block_tokens);
    EVOKE_ASSIGN_OR_RETURN(CanonicalRange range,
                           Read(p0, p0 + static_cast<llama_pos>(block_tokens)));
    if (range.positions.size() != block_tokens) {
      return absl::NotFoundError(absl::StrCat("sequence ", options_.seq, " holds ",
                                              range.positions.size(), " of the ", block_tokens,
                                              " positions of [", p0, ", ",
                                              p0 + static_cast<llama_pos>(block_tokens), ")"));
    }
    out.payload_bytes += range.payload.size();
    payloads.push_back(std::move(range.payload));
  }
  for (size_t b = out.present; b < chain.size(); ++b) {
    batch.push_back(BlockToSave(chain[b], payloads[b - out.present]));
  }
  EVOKE_RETURN_IF_ERROR(client_->Save(batch, options_.durable).status());
  stats_.inline_transfers += batch.size();
  out.blocks = static_cast<uint32_t>(batch.size());
  out.tokens = static_cast<uint32_t>(chain.size() * block_tokens);
  return out;
}

absl::StatusOr<PrefixResult> KvAdapter::LoadLongestPrefix(absl::Span<const llama_token> tokens,
                                                          uint32_t block_tokens,
                                                          uint32_t max_tokens) {
  EVOKE_ASSIGN_OR_RETURN(StoredPrefix stored, LookupPrefix(tokens, block_tokens));
  PrefixResult out;
  // At least the prompt's last token is left to decode: its logits are the
  // next token's.
  const size_t whole = tokens.empty() ? 0 : (tokens.size() - 1) / block_tokens;
  const size_t n = std::min<size_t>({stored.present, whole, max_tokens / block_tokens});
  if (n == 0) return out;
  std::vector<BlockId>& ids = stored.ids;
  ids.resize(n);
  // Through the shared region when it can hold the chain (the daemon copies
  // each payload once, no message carries it), else inline.
  EVOKE_ASSIGN_OR_RETURN(const uint64_t block_bytes,
                         CanonicalPayloadBytes(fingerprint_, block_tokens, format_.n_layer));
  SharedRegion* region = RegionFor(n * block_bytes);
  absl::StatusOr<std::vector<LoadedBlock>> loaded;
  if (region != nullptr) {
    std::vector<v1::RegionSlice> slices;
    for (size_t i = 0; i < n; ++i) slices.push_back(region->Slice(i * block_bytes, block_bytes));
    loaded = client_->LoadWith(ids, fingerprint_, {}, slices);
    stats_.shm_transfers += n;
    if (!loaded.ok() && loaded.status().code() != absl::StatusCode::kNotFound) {
      if (MayBeTheRegion(loaded.status())) DropRegion();
      stats_.shm_fallbacks += n;
      region = nullptr;
    }
  }
  if (region == nullptr) {
    loaded = client_->Load(ids, fingerprint_);
    stats_.inline_transfers += n;
  }
  if (!loaded.ok()) return loaded.status();
  for (size_t i = 0; i < loaded->size(); ++i) {
    const LoadedBlock& block = (*loaded)[i];
    const absl::string_view payload =
        region != nullptr
            ? absl::string_view(reinterpret_cast<const char*>(region->data()) + i * block_bytes,
                                block.meta.payload_bytes())
            : absl::string_view(block.payload);
    EVOKE_RETURN_IF_ERROR(Write(block.meta, payload, block.served_from, 0).status());
    out.payload_bytes += payload.size();
    ++out.blocks;
  }
  out.tokens = out.blocks * block_tokens;  // What the cache holds now.
  return out;
}

bool QueryCapture::Callback(struct ggml_tensor* t, bool ask, void* user_data) {
  auto* self = static_cast<QueryCapture*>(user_data);
  // Pre-RoPE: the projection (or its reshape), not the ROPE node of the same name.
  const bool wanted = t->op != GGML_OP_ROPE && self->name_ == ggml_get_name(t);
  if (ask) return wanted;
  if (!wanted || t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
  // The projection (and its bias) is [n_embd_q, n_tokens]; its reshape or
  // view is [head_dim, n_head, n_tokens].
  const bool flat = t->op == GGML_OP_MUL_MAT || t->op == GGML_OP_ADD;
  const int64_t n_tokens = flat ? t->ne[1] : t->ne[2];
  const int64_t row = ggml_nelements(t) / std::max<int64_t>(1, n_tokens);
  self->query_.resize(static_cast<size_t>(row));
  ggml_backend_tensor_get(t, self->query_.data(), (n_tokens - 1) * row * sizeof(float),
                          row * sizeof(float));
  return true;
}

}  // namespace evoke::llama
