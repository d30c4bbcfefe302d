// Helpers shared by the llama.cpp end-to-end tests.
#ifndef EVOKE_TESTS_LLAMA_TEST_UTIL_H_
#define EVOKE_TESTS_LLAMA_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engines/llama/kv_adapter.h"
#include "engines/llama/random_model.h"
#include "engines/llama/seq_state.h"
#include "common/block_validation.h"
#include "common/half.h"
#include "ggml.h"
#include "llama.h"

namespace evoke::testing {

// Silences llama.cpp's informational logging (warnings and errors print).
inline void QuietLlamaLog(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

inline std::vector<llama_token> RandomTokens(size_t n, uint32_t seed, llama_token vocab = 256) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<llama_token> d(0, vocab - 1);
  std::vector<llama_token> t(n);
  for (llama_token& x : t) x = d(gen);
  return t;
}

// Views of one layer of a canonical payload of n tokens.
struct LayerBytes {
  absl::string_view k, v;
};
inline LayerBytes LayerOf(absl::string_view payload, size_t n_tokens,
                          const v1::LayoutFingerprint& fp, uint32_t layer) {
  const uint64_t elems = uint64_t{fp.n_kv_heads()} * fp.head_dim();
  const uint64_t k_row = elems * DTypeBytes(fp.k_dtype()), v_row = elems * DTypeBytes(fp.v_dtype());
  const uint64_t off = layer * n_tokens * (k_row + v_row);
  return {payload.substr(off, n_tokens * k_row), payload.substr(off + n_tokens * k_row, n_tokens * v_row)};
}

inline LayerBytes LayerOf(const llama::CanonicalRange& r, const v1::LayoutFingerprint& fp,
                          uint32_t layer) {
  return LayerOf(r.payload, r.positions.size(), fp, layer);
}

inline std::vector<float> WidenBytes(absl::string_view bytes, v1::DType dtype) {
  std::vector<float> out;
  if (dtype == v1::DTYPE_F32) {
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), bytes.size());
  } else {
    out.resize(bytes.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = HalfToFloat(h);
    }
  }
  return out;
}

// The worst relative error over head vectors: max of |a - b| / |b|.
inline double WorstHeadRelError(const std::vector<float>& a, const std::vector<float>& b,
                                uint32_t head_dim) {
  double worst = 0;
  for (size_t h = 0; h + head_dim <= a.size() && h + head_dim <= b.size(); h += head_dim) {
    double diff = 0, norm = 0;
    for (uint32_t i = 0; i < head_dim; ++i) {
      diff += (a[h + i] - b[h + i]) * double(a[h + i] - b[h + i]);
      norm += double(b[h + i]) * b[h + i];
    }
    worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-30)));
  }
  return worst;
}

// The tests' context: sequence 0 plus a scratch sequence in one unified
// cache, n_batch = n_ubatch, a cache of `type` for K and V.
inline llama_context_params TestContextParams(uint32_t n_ctx, uint32_t n_batch, ggml_type type,
                                              bool flash_attn, int32_t n_threads = 2) {
  llama_context_params p = llama_context_default_params();
  p.n_ctx = n_ctx;
  p.n_batch = n_batch;
  p.n_ubatch = n_batch;
  p.n_seq_max = 2;
  p.kv_unified = true;
  p.n_threads = n_threads;
  p.n_threads_batch = n_threads;
  p.type_k = type;
  p.type_v = type;
  p.flash_attn_type = flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  return p;
}

// The context of the shared-prefix tests, in the test and in its engine
// processes alike: prompts are decoded in chunks of 64 tokens (n_batch), the
// prefix block size, so that a loaded prefix and a prefill compute the
// tokens after it in the same chunks.
inline llama_context_params PrefixContextParams() {
  return TestContextParams(512, 64, GGML_TYPE_F16, /*flash_attn=*/true);
}

// Quiets llama.cpp's logging and initialises its backend; then builds the
// tests' random-weight Llama of `shape`.
inline absl::StatusOr<llama::ModelPtr> InitRandomModel(
    const llama::RandomLlamaShape& shape = llama::TinyLlamaShape()) {
  llama_log_set(QuietLlamaLog, nullptr);
  llama_backend_init();
  return llama::MakeRandomLlamaModel(shape);
}

// Adapter options of the tests' model.
inline llama::AdapterOptions TestAdapterOptions(const std::string& ns, const std::string& session) {
  llama::AdapterOptions o;
  o.ns = ns;
  o.model_id = "random-llama-tiny";
  o.session_id = session;
  return o;
}

}  // namespace evoke::testing

#endif  // EVOKE_TESTS_LLAMA_TEST_UTIL_H_
