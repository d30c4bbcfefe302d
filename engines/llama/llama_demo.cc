// evoke-llama-demo: the real llama.cpp against a running evoked.
//
//   evoke-llama-demo [SOCKET]   (default: $EVOKE_SOCKET, else ./evoked.sock)
//
// A random-weight Llama (the tests' tiny shape) prefills 128 tokens; the
// adapter evicts positions [32, 96) to evoked and restores them, and the
// next-token logits are compared bit for bit with a context that never
// evicted; then the same range is evicted again and spliced at the tail,
// K re-anchored by evoked. Exit status 0 when every check holds.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engines/llama/kv_adapter.h"
#include "engines/llama/random_model.h"

namespace {

using evoke::llama::ContextPtr;
using evoke::llama::DecodeTokens;

void QuietLog(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

double Ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since)
      .count();
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "evoke-llama-demo: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  evoke::ClientOptions options;
  if (argc > 1) options.target = argv[1];
  auto client = evoke::Client::Connect(options);
  if (!client.ok()) return Fail(client.status().ToString());

  llama_log_set(QuietLog, nullptr);
  llama_backend_init();
  const evoke::llama::RandomLlamaShape shape = evoke::llama::TinyLlamaShape();
  auto model = evoke::llama::MakeRandomLlamaModel(shape);
  if (!model.ok()) return Fail(model.status().ToString());
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_seq_max = 2;
  cp.kv_unified = true;
  cp.n_threads = cp.n_threads_batch = 2;
  ContextPtr reference(llama_init_from_model(model->get(), cp));
  ContextPtr ctx(llama_init_from_model(model->get(), cp));
  if (reference == nullptr || ctx == nullptr) return Fail("llama_init_from_model failed");

  std::mt19937 gen(1);
  std::uniform_int_distribution<llama_token> pick(0, static_cast<llama_token>(shape.n_vocab) - 1);
  std::vector<llama_token> prompt(128);
  for (llama_token& t : prompt) t = pick(gen);
  const llama_token next = 7;
  const size_t n_vocab = shape.n_vocab;
  if (!DecodeTokens(reference.get(), prompt, 0) || !DecodeTokens(reference.get(), {next}, 128)) {
    return Fail("llama_decode failed");
  }
  const std::vector<float> expected(llama_get_logits_ith(reference.get(), -1),
                                    llama_get_logits_ith(reference.get(), -1) + n_vocab);
  if (!DecodeTokens(ctx.get(), prompt, 0)) return Fail("llama_decode failed");
  std::printf("llama.cpp: random Llama (%u layers, %u wide, %u KV heads), 128 tokens prefilled\n",
              shape.n_layer, shape.n_embd, shape.n_head_kv);

  evoke::llama::AdapterOptions o;
  o.ns = "demo";
  o.model_id = "random-llama-tiny";
  o.session_id = "llama-demo-" + std::to_string(std::random_device()());
  auto adapter = evoke::llama::KvAdapter::Open(ctx.get(), cp, client->get(), o);
  if (!adapter.ok()) return Fail(adapter.status().ToString());

  auto t0 = std::chrono::steady_clock::now();
  auto evicted = (*adapter)->Evict(32, 96);
  if (!evicted.ok()) return Fail(evicted.status().ToString());
  std::printf("evict [32, 96): %zu tokens, %llu bytes to evoked in %.2f ms; the cache now holds "
              "positions [0, 32) and [96, 128)\n",
              evicted->positions.size(), static_cast<unsigned long long>(evicted->payload_bytes),
              Ms(t0));
  t0 = std::chrono::steady_clock::now();
  auto restored = (*adapter)->Restore(evicted->id);
  if (!restored.ok()) return Fail(restored.status().ToString());
  std::printf("restore: back at [32, 96) in %.2f ms (served from %s)\n", Ms(t0),
              evoke::v1::Tier_Name(restored->served_from).c_str());
  if (!DecodeTokens(ctx.get(), {next}, 128)) return Fail("llama_decode failed");
  const float* got = llama_get_logits_ith(ctx.get(), -1);
  const bool equal = std::memcmp(got, expected.data(), n_vocab * sizeof(float)) == 0;
  std::printf("next-token logits vs a context that never evicted: %s\n",
              equal ? "bitwise equal" : "DIFFERENT");
  if (!equal) return 1;

  // Out again, then spliced at the tail: positions [129, 193).
  auto before = (*adapter)->Read(32, 96);
  if (!before.ok()) return Fail(before.status().ToString());
  auto again = (*adapter)->Evict(32, 96);
  if (!again.ok()) return Fail(again.status().ToString());
  t0 = std::chrono::steady_clock::now();
  auto spliced = (*adapter)->Splice(again->id, 129);
  if (!spliced.ok()) return Fail(spliced.status().ToString());
  auto after = (*adapter)->Read(129, 193);
  if (!after.ok()) return Fail(after.status().ToString());
  // Canonical layout: per layer, 64 K rows then 64 V rows of equal size.
  const size_t half = before->payload.size() / shape.n_layer / 2;
  bool v_same = true, k_moved = true;
  for (uint32_t l = 0; l < shape.n_layer; ++l) {
    const size_t k = 2 * l * half, v = k + half;
    v_same = v_same && before->payload.compare(v, half, after->payload, v, half) == 0;
    k_moved = k_moved && before->payload.compare(k, half, after->payload, k, half) != 0;
  }
  std::printf("splice: the same 64 tokens at [%d, %d] in %.2f ms; K re-anchored by evoked (%s), "
              "V %s\n",
              spliced->positions.front(), spliced->positions.back(), Ms(t0),
              k_moved ? "rotated" : "NOT ROTATED", v_same ? "byte-identical" : "DIFFERENT");
  if (!v_same || !k_moved) return 1;
  if (!DecodeTokens(ctx.get(), {next}, 193)) return Fail("llama_decode after the splice failed");
  std::printf("decoding continues at position 193\n");
  return 0;
}
