// Setup shared by the llama.cpp benchmarks (evoke-llama-bench,
// evoke-llama-prefix-bench, evoke-llama-fidelity).
#ifndef EVOKE_BENCH_LLAMA_BENCH_UTIL_H_
#define EVOKE_BENCH_LLAMA_BENCH_UTIL_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "engines/llama/random_model.h"
#include "ggml.h"
#include "llama.h"

namespace evoke::bench {

using Clock = std::chrono::steady_clock;

inline double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Quiets llama.cpp's informational logging (warnings and errors print) and
// initialises its backend.
inline void StartLlama() {
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
}

// The benchmarks' context: sequence 0 plus a scratch sequence in one unified
// f16 cache, batches of 512, `threads` threads; flash attention as llama.cpp
// chooses.
inline llama_context_params BenchContextParams(uint32_t n_ctx, int threads) {
  llama_context_params p = llama_context_default_params();
  p.n_ctx = n_ctx;
  p.n_batch = 512;
  p.n_ubatch = 512;
  p.n_seq_max = 2;
  p.kv_unified = true;
  p.n_threads = threads;
  p.n_threads_batch = threads;
  p.type_k = GGML_TYPE_F16;
  p.type_v = GGML_TYPE_F16;
  return p;
}

// BuildModel builds a random Llama of `shape` and says how long it took
// (`*seconds`); null after printing the error, prefixed by `program`.
inline llama::ModelPtr BuildModel(const llama::RandomLlamaShape& shape, const char* program,
                                  double* seconds) {
  const auto start = Clock::now();
  absl::StatusOr<llama::ModelPtr> model = llama::MakeRandomLlamaModel(shape);
  *seconds = Ms(start, Clock::now()) / 1000;
  if (!model.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, model.status().ToString().c_str());
    return nullptr;
  }
  return std::move(model).value();
}

// WriteJsonRows writes one JSON object to `path`: `members` (JSON members
// without braces, e.g. "\"shape\":\"1b\"") and "rows", the array of
// `rows` (each a JSON object). False when the file cannot be written.
inline bool WriteJsonRows(const std::string& path, const std::string& members,
                          const std::vector<std::string>& rows) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  std::fprintf(f, "{%s,\"rows\":[%s]}\n", members.c_str(), absl::StrJoin(rows, ",").c_str());
  return std::fclose(f) == 0;
}

}  // namespace evoke::bench

#endif  // EVOKE_BENCH_LLAMA_BENCH_UTIL_H_
