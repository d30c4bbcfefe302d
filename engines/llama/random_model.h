// Llama-architecture models with random weights, built in memory.
//
// llama_model_init_from_user() builds a model from GGUF metadata (written
// here with the public gguf.h calls) and a callback that fills each tensor:
// no file and no download. Tests use a tiny shape; benchmarks a 1B-like one.
// The weights are deterministic for a seed. Norm weights and RoPE
// frequency factors are 1, biases 0, the others
// uniform with standard deviation `weight_std`.
#ifndef EVOKE_CLIENT_LLAMA_RANDOM_MODEL_H_
#define EVOKE_CLIENT_LLAMA_RANDOM_MODEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "llama.h"

namespace evoke::llama {

struct RandomLlamaShape {
  uint32_t n_layer = 2;
  uint32_t n_embd = 256;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  uint32_t n_ff = 512;
  uint32_t n_vocab = 256;
  uint32_t n_ctx_train = 8192;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
  float weight_std = 0.05f;
  uint64_t seed = 1;
};

// The shape of the tests: 2 layers, 256 wide, 4 heads, 2 KV heads.
RandomLlamaShape TinyLlamaShape();
// The benchmark's Llama-3.2-1B-like shape: 16 layers, 2048 wide, 32 heads,
// 8 KV heads (head_dim 64), FFN 8192, vocabulary 32000.
RandomLlamaShape OneBLlamaShape();

struct ModelDeleter {
  void operator()(llama_model* m) const { llama_model_free(m); }
};
using ModelPtr = std::unique_ptr<llama_model, ModelDeleter>;
struct ContextDeleter {
  void operator()(llama_context* c) const { llama_free(c); }
};
using ContextPtr = std::unique_ptr<llama_context, ContextDeleter>;

// MakeRandomLlamaModel builds the model on the CPU. INTERNAL when llama.cpp
// refuses the metadata.
absl::StatusOr<ModelPtr> MakeRandomLlamaModel(const RandomLlamaShape& shape);

// DecodeTokens decodes `tokens` into sequence `seq` at positions first,
// first + 1, ..., in batches of llama_n_batch(ctx), asking for the logits of
// the last token only, and waits for the result. False when llama_decode
// fails.
bool DecodeTokens(llama_context* ctx, absl::Span<const llama_token> tokens, llama_pos first,
                  llama_seq_id seq = 0);

}  // namespace evoke::llama

#endif  // EVOKE_CLIENT_LLAMA_RANDOM_MODEL_H_
