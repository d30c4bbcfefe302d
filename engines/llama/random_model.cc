#include "engines/llama/random_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"

namespace evoke::llama {
namespace {

struct FillParams {
  uint64_t seed;
  float weight_std;
};

uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t HashName(const char* name) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (; *name; ++name) h = (h ^ static_cast<unsigned char>(*name)) * 1099511628211ULL;
  return h;
}

// Fills one tensor: norms and RoPE factors with 1, biases with 0, everything else uniform in [-a, a] with
// a = sqrt(3) * std (the standard deviation asked for). Two values per
// 64-bit draw keep 5 GB of f32 to a few seconds.
void FillTensor(ggml_tensor* tensor, void* user_data) {
  const FillParams& p = *static_cast<const FillParams*>(user_data);
  const int64_t n = ggml_nelements(tensor);
  const absl::string_view name = ggml_get_name(tensor);
  // llama_model_init_from_user creates the optional tensors too: RoPE
  // frequency factors must be 1 and biases 0 for this to be a plain Llama.
  const bool ones = absl::StrContains(name, "norm") || absl::StrContains(name, "rope_f");
  const bool zeros = absl::EndsWith(name, ".bias");
  std::vector<float> values(static_cast<size_t>(n));
  if (ones || zeros) {
    std::fill(values.begin(), values.end(), ones ? 1.0f : 0.0f);
  } else {
    uint64_t state = p.seed * 0x2545f4914f6cdd1dULL ^ HashName(ggml_get_name(tensor));
    const float a = std::sqrt(3.0f) * p.weight_std;
    const float scale = 2.0f * a / 4294967296.0f;
    for (int64_t i = 0; i < n; i += 2) {
      const uint64_t r = SplitMix(state);
      values[i] = static_cast<float>(static_cast<uint32_t>(r)) * scale - a;
      if (i + 1 < n) values[i + 1] = static_cast<float>(static_cast<uint32_t>(r >> 32)) * scale - a;
    }
  }
  if (tensor->type == GGML_TYPE_F32) {
    ggml_backend_tensor_set(tensor, values.data(), 0, ggml_nbytes(tensor));
  } else if (tensor->type == GGML_TYPE_F16) {
    std::vector<ggml_fp16_t> half(values.size());
    ggml_fp32_to_fp16_row(values.data(), half.data(), n);
    ggml_backend_tensor_set(tensor, half.data(), 0, ggml_nbytes(tensor));
  }
}

}  // namespace

RandomLlamaShape TinyLlamaShape() { return RandomLlamaShape{}; }

RandomLlamaShape OneBLlamaShape() {
  RandomLlamaShape s;
  s.n_layer = 16;
  s.n_embd = 2048;
  s.n_head = 32;
  s.n_head_kv = 8;
  s.n_ff = 8192;
  s.n_vocab = 32000;
  s.weight_std = 0.02f;
  return s;
}

absl::StatusOr<ModelPtr> MakeRandomLlamaModel(const RandomLlamaShape& shape) {
  gguf_context* meta = gguf_init_empty();
  gguf_set_val_str(meta, "general.architecture", "llama");
  gguf_set_val_str(meta, "general.name", "evoke-random-llama");
  gguf_set_val_u32(meta, "llama.context_length", shape.n_ctx_train);
  gguf_set_val_u32(meta, "llama.embedding_length", shape.n_embd);
  gguf_set_val_u32(meta, "llama.block_count", shape.n_layer);
  gguf_set_val_u32(meta, "llama.feed_forward_length", shape.n_ff);
  gguf_set_val_u32(meta, "llama.attention.head_count", shape.n_head);
  gguf_set_val_u32(meta, "llama.attention.head_count_kv", shape.n_head_kv);
  gguf_set_val_f32(meta, "llama.attention.layer_norm_rms_epsilon", shape.rms_eps);
  gguf_set_val_f32(meta, "llama.rope.freq_base", shape.rope_freq_base);
  gguf_set_val_u32(meta, "llama.vocab_size", shape.n_vocab);
  gguf_set_val_str(meta, "tokenizer.ggml.model", "none");

  FillParams fill{shape.seed, shape.weight_std};
  llama_model_params params = llama_model_default_params();
  params.n_gpu_layers = 0;
  llama_model* model = llama_model_init_from_user(meta, FillTensor, &fill, params);
  gguf_free(meta);
  if (model == nullptr) {
    return absl::InternalError(
        absl::StrCat("llama_model_init_from_user refused a random llama model with ",
                     shape.n_layer, " layers, ", shape.n_embd, " wide (see llama.cpp's log)"));
  }
  return ModelPtr(model);
}

bool DecodeTokens(llama_context* ctx, absl::Span<const llama_token> tokens, llama_pos first,
                  llama_seq_id seq) {
  const size_t n_batch = std::max<uint32_t>(1, llama_n_batch(ctx));
  for (size_t i = 0; i < tokens.size(); i += n_batch) {
    const size_t n = std::min(n_batch, tokens.size() - i);
    llama_batch batch = llama_batch_init(static_cast<int32_t>(n), 0, 1);
    for (size_t j = 0; j < n; ++j) {
      batch.token[j] = tokens[i + j];
      batch.pos[j] = first + static_cast<llama_pos>(i + j);
      batch.n_seq_id[j] = 1;
      batch.seq_id[j][0] = seq;
      batch.logits[j] = i + j + 1 == tokens.size();
    }
    batch.n_tokens = static_cast<int32_t>(n);
    const int32_t rc = llama_decode(ctx, batch);
    llama_batch_free(batch);
    if (rc != 0) return false;
  }
  llama_synchronize(ctx);
  return true;
}

}  // namespace evoke::llama
