// evoke-llama-prefix-bench: time to first token with and without a prefix
// shared through evoked, on the real llama.cpp (random-weight Llama, the 1B
// shape by default).
//
// For each prompt length L (a shared prefix of L tokens, a multiple of the
// 64-token block, followed by --question unique tokens):
//   seed     engine A prefills the prefix and saves its blocks as
//            content-addressed prefix blocks (KvAdapter::SavePrefix);
//   cold     engine B, with an empty cache, prefills the whole prompt: the
//            time to its first token's logits;
//   shared   engine B, emptied again, loads the longest stored prefix
//            (KvAdapter::LoadLongestPrefix: Lookup, Load, write into the
//            cache) and prefills the question only: the same measure.
// The ratio cold / shared is the time-to-first-token speed-up. Engines A
// and B are two llama.cpp contexts of one process here (the shared-prefix
// test, tests/llama_prefix_e2e_test.cc, runs them as two processes); the
// bytes go through evoked either way.
//
//   evoke-llama-prefix-bench [--shape 1b|tiny] [--lengths 256,512,1024]
//                            [--question 16] [--repeats 1] [--threads N]
//                            [--json FILE]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/llama_bench_util.h"
#include "engines/llama/kv_adapter.h"
#include "engines/llama/random_model.h"
#include "testing/daemon_process.h"
#include "testing/temp_dir.h"

namespace {

using evoke::bench::Clock;
using evoke::bench::Ms;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

constexpr uint32_t kBlock = 64;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"evoke-llama-prefix-bench: time to first token with and without a prefix "
               "shared through evoked, on llama.cpp"};
  std::string shape_name = "1b", json_path;
  std::vector<uint32_t> lengths = {256, 512, 1024};
  uint32_t question = 16;
  int repeats = 1;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("--shape", shape_name, "Model shape: 1b (16x2048, 8 KV heads) or tiny")
      ->check(CLI::IsMember({"1b", "tiny"}));
  app.add_option("--lengths", lengths, "Shared prefix lengths (multiples of 64)")->delimiter(',');
  app.add_option("--question", question, "Unique tokens after the prefix (default 16)");
  app.add_option("--repeats", repeats, "Repeats (median reported)");
  app.add_option("--threads", threads, "llama.cpp threads (default: all cores)");
  app.add_option("--json", json_path, "Also write the results as JSON to FILE");
  CLI11_PARSE(app, argc, argv);
  if (lengths.empty() || repeats < 1 || question == 0 ||
      std::any_of(lengths.begin(), lengths.end(),
                  [](uint32_t l) { return l == 0 || l % kBlock != 0; })) {
    std::fprintf(stderr, "evoke-llama-prefix-bench: --lengths must be positive multiples of "
                         "64, --question and --repeats positive\n");
    return 2;
  }

  evoke::testing::TempDir dir;
  // Tier 1 sized to the shape: the 1B prefixes are 32 KiB per token.
  auto daemon = evoke::testing::DaemonProcess::Start(
      dir.path(), {"--pinned-bytes", shape_name == "1b" ? "2GiB" : "128MiB",
                   "--max-message-bytes", "200MiB"});
  if (!daemon.ok()) {
    std::fprintf(stderr, "evoke-llama-prefix-bench: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<evoke::Client> client = (*daemon)->Connect(200ull << 20);
  if (client == nullptr) return 1;

  evoke::bench::StartLlama();
  const evoke::llama::RandomLlamaShape shape =
      shape_name == "1b" ? evoke::llama::OneBLlamaShape() : evoke::llama::TinyLlamaShape();
  double build_s = 0;
  evoke::llama::ModelPtr model =
      evoke::bench::BuildModel(shape, "evoke-llama-prefix-bench", &build_s);
  if (model == nullptr) return 1;
  std::printf("model: random llama, %u layers, %u wide, %u heads, %u KV heads (built in %.1f s); "
              "%d threads; prefix blocks of %u tokens, %u-token question\n",
              shape.n_layer, shape.n_embd, shape.n_head, shape.n_head_kv,
              build_s, threads, kBlock, question);

  const uint32_t max_len = *std::max_element(lengths.begin(), lengths.end());
  const llama_context_params cp =
      evoke::bench::BenchContextParams(max_len + question + 64, threads);
  evoke::llama::ContextPtr a(llama_init_from_model(model.get(), cp));
  evoke::llama::ContextPtr b(llama_init_from_model(model.get(), cp));
  if (a == nullptr || b == nullptr) return 1;
  evoke::llama::AdapterOptions options;
  options.ns = "prefix-bench";
  options.model_id = "random-llama-" + shape_name;
  options.session_id = "engine-a-" + std::to_string(getpid());
  auto adapter_a = evoke::llama::KvAdapter::Open(a.get(), cp, client.get(), options);
  options.session_id = "engine-b-" + std::to_string(getpid());
  auto adapter_b = evoke::llama::KvAdapter::Open(b.get(), cp, client.get(), options);
  if (!adapter_a.ok() || !adapter_b.ok()) {
    std::fprintf(stderr, "evoke-llama-prefix-bench: adapter: %s %s\n",
                 adapter_a.status().ToString().c_str(), adapter_b.status().ToString().c_str());
    return 1;
  }
  llama_memory_t mem_a = llama_get_memory(a.get());
  llama_memory_t mem_b = llama_get_memory(b.get());

  std::mt19937 gen(11);
  std::uniform_int_distribution<llama_token> pick(0, static_cast<llama_token>(shape.n_vocab) - 1);
  std::vector<std::string> items;
  std::printf("| shared prefix | question | cold TTFT (ms) | shared TTFT (ms) | of which load "
              "(ms) | speed-up | prefix bytes (MiB) | seed: prefill + save (ms) |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (uint32_t len : lengths) {
    std::vector<llama_token> prompt(len + question);
    for (llama_token& t : prompt) t = pick(gen);
    const std::vector<llama_token> prefix(prompt.begin(), prompt.begin() + len);
    // Seed: engine A prefills the prefix and saves it.
    llama_memory_clear(mem_a, true);
    const auto s0 = Clock::now();
    if (!evoke::llama::DecodeTokens(a.get(), prefix, 0)) return 1;
    auto saved = (*adapter_a)->SavePrefix(prefix, kBlock);
    const double seed_ms = Ms(s0, Clock::now());
    if (!saved.ok()) {
      std::fprintf(stderr, "save: %s\n", saved.status().ToString().c_str());
      return 1;
    }
    std::vector<double> cold, shared, load;
    uint64_t bytes = 0;
    for (int r = 0; r < repeats; ++r) {
      llama_memory_clear(mem_b, true);
      auto t0 = Clock::now();
      if (!evoke::llama::DecodeTokens(b.get(), prompt, 0)) return 1;
      cold.push_back(Ms(t0, Clock::now()));
      llama_memory_clear(mem_b, true);
      t0 = Clock::now();
      auto loaded = (*adapter_b)->LoadLongestPrefix(prompt, kBlock);
      const auto t1 = Clock::now();
      if (!loaded.ok() || loaded->tokens != len) {
        std::fprintf(stderr, "load: %s\n",
                     loaded.ok() ? "not the whole prefix" : loaded.status().ToString().c_str());
        return 1;
      }
      const std::vector<llama_token> rest(prompt.begin() + len, prompt.end());
      if (!evoke::llama::DecodeTokens(b.get(), rest, static_cast<llama_pos>(len))) return 1;
      shared.push_back(Ms(t0, Clock::now()));
      load.push_back(Ms(t0, t1));
      bytes = loaded->payload_bytes;
    }
    const double c = Median(cold), s = Median(shared), l = Median(load);
    std::printf("| %u | %u | %.1f | %.1f | %.1f | %.1fx | %.1f | %.1f |\n", len, question, c, s, l,
                c / s, bytes / 1048576.0, seed_ms);
    std::fflush(stdout);
    items.push_back(absl::StrFormat(
        "{\"prefix_tokens\":%u,\"question_tokens\":%u,\"cold_ttft_ms\":%.3f,"
        "\"shared_ttft_ms\":%.3f,\"load_ms\":%.3f,\"speedup\":%.3f,\"prefix_bytes\":%u,"
        "\"seed_ms\":%.3f}",
        len, question, c, s, l, c / s, bytes, seed_ms));
  }
  if (!json_path.empty() &&
      !evoke::bench::WriteJsonRows(
          json_path, absl::StrFormat("\"shape\":\"%s\",\"threads\":%d", shape_name, threads),
          items)) {
    return 1;
  }
  return 0;
}
