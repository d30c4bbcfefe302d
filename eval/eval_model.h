// evoke::eval model loading: a GGUF that evoke-eval can run, or a clear
// refusal, and the check that llama.cpp computes what training computed.
#ifndef EVOKE_EVAL_EVAL_MODEL_H_
#define EVOKE_EVAL_EVAL_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engines/llama/random_model.h"
#include "llama.h"

namespace evoke::eval {

// StartLlama initialises llama.cpp's backend, with its log cut to errors
// (on stderr): the tools' own output stays readable.
void StartLlama();

// OpenEvalModel loads `path` on the CPU and checks that evoke-eval can use
// it. Every refusal names the file and the reason:
//   NOT_FOUND            no such file;
//   INVALID_ARGUMENT     llama.cpp cannot load it (not a GGUF, truncated...);
//   FAILED_PRECONDITION  its architecture is not "llama"; it has recurrent
//                        or hybrid layers, or sliding-window attention; its
//                        vocabulary is not evoke's task vocabulary
//                        (eval/tasks.h), word for word.
// Call StartLlama() (or llama_backend_init()) first.
absl::StatusOr<llama::ModelPtr> OpenEvalModel(const std::string& path);

// The reference logits export_gguf.py writes beside a model: the tokens of
// one session and the training framework's logits at its last positions.
struct ReferenceLogits {
  std::vector<int32_t> tokens;
  uint32_t positions = 0;  // The last `positions` tokens have logits.
  uint32_t n_vocab = 0;
  std::vector<float> logits;  // positions x n_vocab.
};

// ReadReferenceLogits parses the file; NOT_FOUND or DATA_LOSS (bad magic,
// truncated) naming the file.
absl::StatusOr<ReferenceLogits> ReadReferenceLogits(const std::string& path);

struct LogitsAgreement {
  double max_abs_diff = 0;   // Over all compared logits.
  double max_logit = 0;      // max |logit| of the reference, for scale.
  uint32_t argmax_agree = 0;  // Positions whose argmax is the same.
  uint32_t positions = 0;
};

// CompareLogits runs `ref.tokens` through `model` in llama.cpp (one
// sequence, the cache of `cache_type`, flash attention off as in
// evoke-eval, `threads` threads) and compares the logits of the last
// ref.positions tokens with the reference. INVALID_ARGUMENT when the
// vocabulary sizes differ; INTERNAL when llama.cpp fails.
absl::StatusOr<LogitsAgreement> CompareLogits(llama_model* model, const ReferenceLogits& ref,
                                              ggml_type cache_type, int threads);

}  // namespace evoke::eval

#endif  // EVOKE_EVAL_EVAL_MODEL_H_
