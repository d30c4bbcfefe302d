#include "engines/llama/attention_capture.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engines/llama/seq_state.h"
#include "common/status_macros.h"
#include "ggml-backend.h"
#include "ggml.h"

namespace evoke::llama {
namespace {

constexpr absl::string_view kSoftMax = "kq_soft_max-";
constexpr absl::string_view kQcur = "Qcur-";
constexpr absl::string_view kCacheK = "cache_k_l";

// The layer number after `prefix` in `name`, or -1.
int32_t LayerAfter(absl::string_view name, absl::string_view prefix) {
  if (!absl::StartsWith(name, prefix)) return -1;
  int32_t layer = -1;
  return absl::SimpleAtoi(name.substr(prefix.size()), &layer) ? layer : -1;
}

// The layer of a flash-attention node: its K input is (a cast of) a view of
// the cache tensor "cache_k_l<layer>".
int32_t FlashAttnLayer(const ggml_tensor* fa) {
  const ggml_tensor* t = fa->src[1];
  for (int hops = 0; t != nullptr && hops < 8; ++hops) {
    const int32_t layer = LayerAfter(ggml_get_name(t), kCacheK);
    if (layer >= 0) return layer;
    t = t->view_src != nullptr ? t->view_src : t->src[0];
  }
  return -1;
}

// Copies the bytes a (possibly strided) tensor spans, so that elements can be
// read at their byte offsets.
const char* Fetch(const ggml_tensor* t, std::vector<char>* buf) {
  const size_t n = ggml_nbytes(t);
  if (buf->size() < n) buf->resize(n);
  ggml_backend_tensor_get(const_cast<ggml_tensor*>(t), buf->data(), 0, n);
  return buf->data();
}

float Element(const char* base, ggml_type type, size_t offset) {
  switch (type) {
    case GGML_TYPE_F32: {
      float f;
      std::memcpy(&f, base + offset, sizeof(f));
      return f;
    }
    case GGML_TYPE_F16: {
      ggml_fp16_t h;
      std::memcpy(&h, base + offset, sizeof(h));
      return ggml_fp16_to_fp32(h);
    }
    case GGML_TYPE_BF16: {
      ggml_bf16_t h;
      std::memcpy(&h, base + offset, sizeof(h));
      return ggml_bf16_to_fp32(h);
    }
    default:
      return std::numeric_limits<float>::quiet_NaN();
  }
}

bool Readable(ggml_type type) {
  return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
}

}  // namespace

AttentionCapture::AttentionCapture(AttentionCaptureOptions options)
    : options_(std::move(options)) {
  if (options_.query_layer >= 0) query_name_ = absl::StrCat(kQcur, options_.query_layer);
}

void AttentionCapture::Install(llama_context_params& cparams) {
  cparams.cb_eval = &AttentionCapture::Callback;
  cparams.cb_eval_user_data = this;
}

bool AttentionCapture::Wants(int32_t layer) const {
  if (layer < 0) return false;
  return options_.layers.empty() ||
         std::find(options_.layers.begin(), options_.layers.end(), layer) !=
             options_.layers.end();
}

LayerAttention& AttentionCapture::Slot(int32_t layer) {
  if (by_layer_.size() <= static_cast<size_t>(layer)) by_layer_.resize(layer + 1);
  LayerAttention& slot = by_layer_[layer];
  if (slot.step != steps_) {
    // First write of this step: forget the previous step's parts.
    slot = LayerAttention();
    slot.layer = layer;
    slot.step = steps_;
  }
  return slot;
}

const LayerAttention* AttentionCapture::layer(int32_t layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= by_layer_.size()) return nullptr;
  const LayerAttention& slot = by_layer_[layer];
  return slot.step == steps_ && !slot.weights.empty() ? &slot : nullptr;
}

std::vector<const LayerAttention*> AttentionCapture::layers() const {
  std::vector<const LayerAttention*> out;
  for (size_t l = 0; l < by_layer_.size(); ++l) {
    if (const LayerAttention* a = layer(static_cast<int32_t>(l)); a != nullptr) out.push_back(a);
  }
  return out;
}

absl::Span<const uint8_t> AttentionCapture::visible() const {
  for (const LayerAttention& slot : by_layer_) {
    if (slot.step == steps_ && !slot.visible.empty()) return slot.visible;
  }
  return {};
}

bool AttentionCapture::Ask(const ggml_tensor* t) const {
  const absl::string_view name = ggml_get_name(t);
  if (t->op == GGML_OP_FLASH_ATTN_EXT) return Wants(FlashAttnLayer(t));
  if (t->op == GGML_OP_SOFT_MAX) return Wants(LayerAfter(name, kSoftMax));
  if (t->op == GGML_OP_ROPE) return Wants(LayerAfter(name, kQcur));
  return !query_name_.empty() && name == query_name_;
}

void AttentionCapture::Take(const ggml_tensor* t) {
  const absl::string_view name = ggml_get_name(t);
  if (t->op != GGML_OP_ROPE && t->op != GGML_OP_SOFT_MAX && t->op != GGML_OP_FLASH_ATTN_EXT) {
    // The pre-RoPE query (QueryCapture's rule): the projection [n_embd_q,
    // n_tokens] or its reshape [head_dim, n_head, n_tokens]; last token.
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return;
    const bool flat = t->op == GGML_OP_MUL_MAT || t->op == GGML_OP_ADD;
    const int64_t n_tokens = std::max<int64_t>(1, flat ? t->ne[1] : t->ne[2]);
    const int64_t row = ggml_nelements(t) / n_tokens;
    recovery_query_.resize(static_cast<size_t>(row));
    ggml_backend_tensor_get(const_cast<ggml_tensor*>(t), recovery_query_.data(),
                            (n_tokens - 1) * row * sizeof(float), row * sizeof(float));
    return;
  }
  if (t->op == GGML_OP_ROPE) {
    // Post-RoPE query: [head_dim, n_head, n_tokens] f32.
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return;
    LayerAttention& slot = Slot(LayerAfter(name, kQcur));
    slot.head_dim = static_cast<uint32_t>(t->ne[0]);
    const int64_t row = t->ne[0] * t->ne[1];
    slot.query.resize(static_cast<size_t>(row));
    ggml_backend_tensor_get(const_cast<ggml_tensor*>(t), slot.query.data(),
                            (t->ne[2] - 1) * row * sizeof(float), row * sizeof(float));
    return;
  }
  if (t->op == GGML_OP_SOFT_MAX) {
    // [n_kv, n_tokens, n_head, 1] f32, contiguous; src[1] is the mask.
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->ne[3] != 1) return;
    LayerAttention& slot = Slot(LayerAfter(name, kSoftMax));
    const int64_t n_kv = t->ne[0], n_tokens = t->ne[1], n_head = t->ne[2];
    slot.n_kv = static_cast<uint32_t>(n_kv);
    slot.n_head = static_cast<uint32_t>(n_head);
    slot.from_flash_attn = false;
    slot.weights.resize(static_cast<size_t>(n_head * n_kv));
    for (int64_t h = 0; h < n_head; ++h) {
      ggml_backend_tensor_get(const_cast<ggml_tensor*>(t), slot.weights.data() + h * n_kv,
                              static_cast<size_t>(h * t->nb[2] + (n_tokens - 1) * t->nb[1]),
                              n_kv * sizeof(float));
    }
    slot.visible.assign(static_cast<size_t>(n_kv), 1);
    if (const ggml_tensor* mask = t->src[1]; mask != nullptr && Readable(mask->type)) {
      const char* m = Fetch(mask, &scratch_);
      for (int64_t i = 0; i < n_kv; ++i) {
        const float v = Element(m, mask->type, i * mask->nb[0] + (n_tokens - 1) * mask->nb[1]);
        slot.visible[i] = std::isfinite(v) ? 1 : 0;
      }
    }
    return;
  }
  // Flash attention: softmax(scale * q . k + mask) from the node's inputs.
  const ggml_tensor* q = t->src[0];
  const ggml_tensor* k = t->src[1];
  const ggml_tensor* mask = t->src[3];
  const ggml_tensor* sinks = t->src[4];
  float scale = 0, max_bias = 0, softcap = 0;
  std::memcpy(&scale, &t->op_params[0], sizeof(float));
  std::memcpy(&max_bias, &t->op_params[1], sizeof(float));
  std::memcpy(&softcap, &t->op_params[2], sizeof(float));
  // ALiBi, logit soft-capping and attention sinks are not Llama's: left out.
  if (q == nullptr || k == nullptr || sinks != nullptr || max_bias != 0 || softcap != 0 ||
      !Readable(q->type) || !Readable(k->type) || q->ne[3] != 1 || k->ne[3] != 1) {
    return;
  }
  const int64_t d = q->ne[0], n_tokens = q->ne[1], n_head = q->ne[2];
  const int64_t n_kv = k->ne[1], n_head_kv = k->ne[2];
  if (k->ne[0] != d || n_head_kv == 0 || n_head % n_head_kv != 0) return;
  LayerAttention& slot = Slot(FlashAttnLayer(t));
  slot.n_kv = static_cast<uint32_t>(n_kv);
  slot.n_head = static_cast<uint32_t>(n_head);
  slot.n_head_kv = static_cast<uint32_t>(n_head_kv);
  slot.from_flash_attn = true;
  slot.visible.assign(static_cast<size_t>(n_kv), 1);
  std::vector<double> bias(static_cast<size_t>(n_kv), 0.0);
  if (mask != nullptr && Readable(mask->type)) {
    const char* m = Fetch(mask, &scratch_);
    for (int64_t i = 0; i < n_kv; ++i) {
      const float v = Element(m, mask->type, i * mask->nb[0] + (n_tokens - 1) * mask->nb[1]);
      bias[i] = v;
      slot.visible[i] = std::isfinite(v) ? 1 : 0;
    }
  }
  std::vector<float> qv(static_cast<size_t>(n_head * d));
  {
    const char* qb = Fetch(q, &scratch_);
    for (int64_t h = 0; h < n_head; ++h) {
      for (int64_t i = 0; i < d; ++i) {
        qv[h * d + i] = Element(qb, q->type, i * q->nb[0] + (n_tokens - 1) * q->nb[1] + h * q->nb[2]);
      }
    }
  }
  const char* kb = Fetch(k, &scratch_);
  const int64_t group = n_head / n_head_kv;
  slot.weights.assign(static_cast<size_t>(n_head * n_kv), 0.0f);
  std::vector<float> krow(static_cast<size_t>(d));
  std::vector<double> logits(static_cast<size_t>(n_head * n_kv),
                             -std::numeric_limits<double>::infinity());
  for (int64_t c = 0; c < n_kv; ++c) {
    if (!slot.visible[c]) continue;
    for (int64_t g = 0; g < n_head_kv; ++g) {
      for (int64_t i = 0; i < d; ++i) {
        krow[i] = Element(kb, k->type, i * k->nb[0] + c * k->nb[1] + g * k->nb[2]);
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) dot += double(qv[h * d + i]) * krow[i];
        logits[h * n_kv + c] = scale * dot + bias[c];
      }
    }
  }
  for (int64_t h = 0; h < n_head; ++h) {
    double top = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < n_kv; ++c) top = std::max(top, logits[h * n_kv + c]);
    if (!std::isfinite(top)) continue;
    double sum = 0;
    for (int64_t c = 0; c < n_kv; ++c) sum += std::exp(logits[h * n_kv + c] - top);
    for (int64_t c = 0; c < n_kv; ++c) {
      slot.weights[h * n_kv + c] = static_cast<float>(std::exp(logits[h * n_kv + c] - top) / sum);
    }
  }
}

bool AttentionCapture::Callback(struct ggml_tensor* t, bool ask, void* user_data) {
  auto* self = static_cast<AttentionCapture*>(user_data);
  if (ask) return self->Ask(t);
  if (self->Ask(t)) self->Take(t);
  return true;  // Never stop the graph.
}

absl::Status CellPositions::Update(absl::Span<const uint8_t> visible, uint32_t n_batch_tokens,
                                   llama_pos last_position) {
  if (valid_ && n_batch_tokens == 1) {
    // One decoded token, nothing else changed: one cell appears.
    int64_t appeared = -1;
    int n_appeared = 0;
    bool vanished = false;
    const size_t n = std::max(visible.size(), positions_.size());
    for (size_t i = 0; i < n; ++i) {
      const bool was = i < positions_.size() && positions_[i] >= 0;
      const bool is = i < visible.size() && visible[i] != 0;
      if (is && !was) {
        appeared = static_cast<int64_t>(i);
        ++n_appeared;
      } else if (was && !is) {
        vanished = true;
      }
    }
    if (n_appeared == 1 && !vanished) {
      positions_.resize(visible.size(), -1);
      positions_[appeared] = last_position;
      return absl::OkStatus();
    }
  }
  return Resync(visible, last_position);
}

absl::Status CellPositions::Resync(absl::Span<const uint8_t> visible, llama_pos last_position) {
  valid_ = false;
  ++full_reads_;
  const size_t size = llama_state_seq_get_size(ctx_, seq_);
  if (size == 0) return absl::InternalError("llama_state_seq_get_size failed");
  if (blob_.size() < size) blob_.resize(size);
  if (llama_state_seq_get_data(ctx_, reinterpret_cast<uint8_t*>(blob_.data()), size, seq_) !=
      size) {
    return absl::InternalError("llama_state_seq_get_data wrote a short state");
  }
  EVOKE_ASSIGN_OR_RETURN(SeqState state, ParseSeqState(absl::string_view(blob_.data(), size)));
  std::vector<int32_t> seen;  // In cell order, as the mask orders cells.
  for (int32_t p : state.positions) {
    if (p <= last_position) seen.push_back(p);
  }
  positions_.assign(visible.size(), -1);
  size_t next = 0;
  for (size_t i = 0; i < visible.size(); ++i) {
    if (visible[i] == 0) continue;
    if (next == seen.size()) break;
    positions_[i] = seen[next++];
  }
  const size_t n_visible =
      static_cast<size_t>(std::count_if(visible.begin(), visible.end(), [](uint8_t v) { return v; }));
  if (n_visible != seen.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the mask shows ", n_visible, " visible cells, llama.cpp's state of sequence ", seq_,
        " holds ", seen.size(), " at positions <= ", last_position));
  }
  valid_ = true;
  return absl::OkStatus();
}

absl::Status ObserveStep(const AttentionCapture& capture, const CellPositions& cells,
                         uint32_t n_head_kv, const BlockOfPosition& block_of,
                         policy::AttentionStats* stats) {
  const auto& opts = stats->options();
  if (n_head_kv != opts.n_heads) {
    return absl::InvalidArgumentError(absl::StrCat("n_head_kv ", n_head_kv,
                                                   " differs from the stats' n_heads ",
                                                   opts.n_heads));
  }
  std::vector<policy::BlockHandle> blocks;
  std::vector<uint32_t> in_block;
  std::vector<uint32_t> cell_of;
  std::vector<float> row;
  const absl::Span<const int32_t> pos = cells.positions();
  for (const LayerAttention* la : capture.layers()) {
    if (la->layer < 0 || static_cast<uint32_t>(la->layer) >= opts.n_layers) {
      return absl::InvalidArgumentError(absl::StrCat("captured layer ", la->layer,
                                                     " is outside the stats' ", opts.n_layers));
    }
    if (la->n_head % n_head_kv != 0) {
      return absl::InvalidArgumentError(absl::StrCat("n_head ", la->n_head,
                                                     " is not a multiple of n_head_kv ",
                                                     n_head_kv));
    }
    if (pos.size() < la->n_kv) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cell positions cover ", pos.size(), " cells, layer ", la->layer, " attends over ",
          la->n_kv));
    }
    blocks.clear();
    in_block.clear();
    cell_of.clear();
    for (uint32_t c = 0; c < la->n_kv; ++c) {
      if (!la->visible[c]) continue;
      if (pos[c] < 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("cell ", c, " is visible but has no known position"));
      }
      cell_of.push_back(c);
    }
    // In position order, not cell order: after evictions and splices
    // llama.cpp fills freed cells, so cell neighbours need not be position
    // neighbours, and SnapKV's max-pool must see position neighbours.
    std::sort(cell_of.begin(), cell_of.end(),
              [&](uint32_t a, uint32_t b) { return pos[a] < pos[b]; });
    for (uint32_t c : cell_of) {
      const auto [block, index] = block_of(pos[c]);
      blocks.push_back(block);
      in_block.push_back(index);
    }
    const uint32_t group = la->n_head / n_head_kv;
    for (uint32_t g = 0; g < n_head_kv; ++g) {
      row.assign(cell_of.size(), 0.0f);
      for (uint32_t h = g * group; h < (g + 1) * group; ++h) {
        const float* w = la->weights.data() + size_t{h} * la->n_kv;
        for (size_t j = 0; j < cell_of.size(); ++j) row[j] += w[cell_of[j]];
      }
      EVOKE_RETURN_IF_ERROR(
          stats->Observe(static_cast<uint32_t>(la->layer), g, blocks, in_block, row));
    }
  }
  stats->EndStep();
  return absl::OkStatus();
}

}  // namespace evoke::llama
