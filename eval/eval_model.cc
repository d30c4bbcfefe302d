#include "eval/eval_model.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "eval/tasks.h"

namespace evoke::eval {
namespace {

std::string MetaString(const llama_model* model, const char* key) {
  char buf[256];
  const int32_t n = llama_model_meta_val_str(model, key, buf, sizeof(buf));
  return n < 0 ? std::string() : std::string(buf);
}

// The text llama.cpp stores for a vocabulary word (export_gguf.py): the
// control words as they are, the others after U+2581.
std::string StoredWord(const std::string& word) {
  if (word == "<unk>" || word == "<s>" || word == "</s>") return word;
  return "\xe2\x96\x81" + word;
}

}  // namespace

void StartLlama() {
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
}

absl::StatusOr<llama::ModelPtr> OpenEvalModel(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model ", path, ": no such file"));
  }
  llama_model_params params = llama_model_default_params();
  params.n_gpu_layers = 0;
  llama::ModelPtr model(llama_model_load_from_file(path.c_str(), params));
  if (model == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", path, ": llama.cpp cannot load it (not a GGUF model, or damaged; "
                     "see llama.cpp's log above)"));
  }
  const std::string arch = MetaString(model.get(), "general.architecture");
  if (arch != "llama") {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", path, ": architecture '", arch, "'; evoke-eval runs Llama-architecture models"));
  }
  if (llama_model_is_recurrent(model.get()) || llama_model_is_hybrid(model.get())) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", path, ": recurrent or hybrid layers; evoke-eval needs attention "
                     "only (its KV cache is what the policies manage)"));
  }
  if (llama_model_n_swa(model.get()) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", path, ": sliding-window attention (window ", llama_model_n_swa(model.get()),
        "); evoke-eval needs full attention in every layer"));
  }
  const llama_vocab* vocab = llama_model_get_vocab(model.get());
  const auto& words = GetVocabulary().words();
  const int32_t n = llama_vocab_n_tokens(vocab);
  if (n != static_cast<int32_t>(words.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", path, ": a vocabulary of ", n, " tokens; evoke's task vocabulary has ",
        words.size(), " (eval/tasks.h): this model was not trained on evoke's tasks"));
  }
  for (int32_t i = 0; i < n; ++i) {
    const char* text = llama_vocab_get_text(vocab, i);
    if (text == nullptr || StoredWord(words[static_cast<size_t>(i)]) != text) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model ", path, ": token ", i, " is '", text == nullptr ? "" : text, "', evoke's task ",
          "vocabulary has '", words[static_cast<size_t>(i)], "' there"));
    }
  }
  return model;
}

absl::StatusOr<ReferenceLogits> ReadReferenceLogits(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("reference ", path, ": cannot open"));
  char magic[8];
  uint32_t head[3];
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(head), sizeof(head));
  if (!f || std::memcmp(magic, "EVREFLG1", 8) != 0) {
    return absl::DataLossError(absl::StrCat("reference ", path, ": not an EVREFLG1 file"));
  }
  ReferenceLogits ref;
  const uint32_t n_tokens = head[0];
  ref.positions = head[1];
  ref.n_vocab = head[2];
  if (n_tokens == 0 || n_tokens > (1u << 20) || ref.positions > n_tokens || ref.n_vocab == 0 ||
      ref.n_vocab > (1u << 20)) {
    return absl::DataLossError(absl::StrCat("reference ", path, ": implausible header"));
  }
  ref.tokens.resize(n_tokens);
  ref.logits.resize(size_t{ref.positions} * ref.n_vocab);
  f.read(reinterpret_cast<char*>(ref.tokens.data()),
         static_cast<std::streamsize>(ref.tokens.size() * sizeof(int32_t)));
  f.read(reinterpret_cast<char*>(ref.logits.data()),
         static_cast<std::streamsize>(ref.logits.size() * sizeof(float)));
  if (!f) return absl::DataLossError(absl::StrCat("reference ", path, ": truncated"));
  return ref;
}

absl::StatusOr<LogitsAgreement> CompareLogits(llama_model* model, const ReferenceLogits& ref,
                                              ggml_type cache_type, int threads) {
  const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  if (static_cast<uint32_t>(n_vocab) != ref.n_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", n_vocab,
                                                   " tokens, the reference ", ref.n_vocab));
  }
  const uint32_t n = static_cast<uint32_t>(ref.tokens.size());
  llama_context_params p = llama_context_default_params();
  p.n_ctx = n + 16;
  p.n_batch = n;
  p.n_ubatch = std::min<uint32_t>(n, 512);
  p.n_threads = threads;
  p.n_threads_batch = threads;
  p.type_k = cache_type;
  p.type_v = cache_type;
  p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama::ContextPtr ctx(llama_init_from_model(model, p));
  if (ctx == nullptr) return absl::InternalError("llama_init_from_model failed");
  llama_batch batch = llama_batch_init(static_cast<int32_t>(n), 0, 1);
  for (uint32_t i = 0; i < n; ++i) {
    batch.token[i] = ref.tokens[i];
    batch.pos[i] = static_cast<llama_pos>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = i + ref.positions >= n;
  }
  batch.n_tokens = static_cast<int32_t>(n);
  const int32_t rc = llama_decode(ctx.get(), batch);
  llama_batch_free(batch);
  if (rc != 0) return absl::InternalError(absl::StrCat("llama_decode failed (", rc, ")"));
  LogitsAgreement out;
  out.positions = ref.positions;
  for (uint32_t j = 0; j < ref.positions; ++j) {
    const float* got = llama_get_logits_ith(ctx.get(), static_cast<int32_t>(n - ref.positions + j));
    if (got == nullptr) return absl::InternalError("llama.cpp returned no logits");
    const float* want = ref.logits.data() + size_t{j} * ref.n_vocab;
    for (uint32_t v = 0; v < ref.n_vocab; ++v) {
      out.max_abs_diff = std::max(out.max_abs_diff, std::fabs(double(got[v]) - double(want[v])));
      out.max_logit = std::max(out.max_logit, std::fabs(double(want[v])));
    }
    out.argmax_agree += std::max_element(got, got + ref.n_vocab) - got ==
                        std::max_element(want, want + ref.n_vocab) - want;
  }
  return out;
}

}  // namespace evoke::eval
