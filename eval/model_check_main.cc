// evoke-model-check: does llama.cpp compute what training computed?
//
//   evoke-model-check --model models/evoke-recall.gguf
//                     --reference models/evoke-recall.ref [--tolerance 2e-3]
//
// Loads the model as evoke-eval does (OpenEvalModel: refusals name the file
// and the reason), runs the reference session's tokens through llama.cpp
// (flash attention off, as evoke-eval runs; llama.cpp's CPU flash attention
// rounds to f16 whatever the cache type) with an f32 KV cache and again with
// the f16 cache evoke-eval uses, and
// compares the logits of the last positions with the PyTorch logits that
// export_gguf.py wrote. Exit 0 when, with the f32 cache, every logit is
// within --tolerance of PyTorch's and every argmax agrees; 1 otherwise; 2 on
// usage errors. The f16 figures are reported, not gated.
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "eval/eval_model.h"

int main(int argc, char** argv) {
  CLI::App app{"evoke-model-check: llama.cpp's logits against the training framework's"};
  std::string model_path, reference_path;
  double tolerance = 2e-3;
  int threads = 2;
  app.add_option("--model", model_path, "GGUF model")->required();
  app.add_option("--reference", reference_path, "reference logits (export_gguf.py)")->required();
  app.add_option("--tolerance", tolerance, "largest |logit difference| allowed, f32 cache");
  app.add_option("--threads", threads, "llama.cpp threads");
  CLI11_PARSE(app, argc, argv);

  evoke::eval::StartLlama();
  auto model = evoke::eval::OpenEvalModel(model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "evoke-model-check: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  auto ref = evoke::eval::ReadReferenceLogits(reference_path);
  if (!ref.ok()) {
    std::fprintf(stderr, "evoke-model-check: %s\n", std::string(ref.status().message()).c_str());
    return 1;
  }
  bool ok = true;
  for (ggml_type type : {GGML_TYPE_F32, GGML_TYPE_F16}) {
    auto a = evoke::eval::CompareLogits(model->get(), *ref, type, threads);
    if (!a.ok()) {
      std::fprintf(stderr, "evoke-model-check: %s\n", std::string(a.status().message()).c_str());
      return 1;
    }
    const bool f32 = type == GGML_TYPE_F32;
    std::printf("%s cache: %u positions of %zu tokens, max |logit diff| %.3g (logits up to %.3g), "
                "argmax agrees at %u/%u\n",
                f32 ? "f32" : "f16", a->positions, ref->tokens.size(), a->max_abs_diff,
                a->max_logit, a->argmax_agree, a->positions);
    if (f32 && (a->max_abs_diff > tolerance || a->argmax_agree != a->positions)) ok = false;
  }
  std::printf("%s (gate: f32 cache, max |logit diff| <= %.3g and every argmax agrees)\n",
              ok ? "PASS" : "FAIL", tolerance);
  return ok ? 0 : 1;
}
