// evoke-llama-bench: the EVOKE study's headline on the real llama.cpp.
//
// For each range of R tokens, on one llama.cpp context holding R tokens of a
// random-weight Llama (the 1B shape by default), in the same run:
//   evict   KvAdapter::Evict(0, R): llama.cpp state copy, canonical layout,
//           Save to evoked, remove from the cache
//   restore KvAdapter::Restore: Load, write back at the original positions
//   splice  KvAdapter::Splice at positions shifted by 64 (re-anchored by evoked)
//   prefill llama_decode of the same R tokens into the emptied context
// and reports save+load and load-only as ratios to the re-prefill.
//
//   evoke-llama-bench [--shape 1b|tiny] [--ranges 64,256,1024,2048]
//                     [--repeats 3] [--prefill-repeats 1] [--threads N]
//                     [--target SOCKET] [--json FILE] [--inline]
//
// It starts its own evoked (temp dir, 2 GiB tier 1) unless --target names a
// running one.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <numeric>
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
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Row {
  uint32_t tokens = 0;
  uint64_t block_bytes = 0;
  double evict_ms = 0, read_ms = 0, restore_ms = 0, splice_ms = 0, prefill_ms = 0;
  double memcpy_ms = 0;  // One memcpy of the block's bytes (warm buffers).
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"evoke-llama-bench: evict/splice vs re-prefill on the real llama.cpp"};
  std::string shape_name = "1b", target, json_path;
  std::vector<uint32_t> ranges = {64, 256, 1024, 2048};
  int repeats = 3, prefill_repeats = 1;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  app.add_option("--shape", shape_name, "Model shape: 1b (16x2048, 8 KV heads) or tiny")
      ->check(CLI::IsMember({"1b", "tiny"}));
  app.add_option("--ranges", ranges, "Range lengths in tokens")->delimiter(',');
  app.add_option("--repeats", repeats, "Repeats of evict/restore/splice (median reported)");
  app.add_option("--prefill-repeats", prefill_repeats, "Repeats of the re-prefill");
  app.add_option("--threads", threads, "llama.cpp threads (default: all cores)");
  app.add_option("--target", target, "Use the evoked on this socket instead of starting one");
  app.add_option("--json", json_path, "Also write the results as JSON to FILE");
  bool inline_bytes = false;
  app.add_flag("--inline", inline_bytes,
               "Move block bytes inside gRPC messages instead of shared memory");
  CLI11_PARSE(app, argc, argv);
  if (ranges.empty() || repeats < 1 || prefill_repeats < 1) {
    std::fprintf(stderr, "evoke-llama-bench: --ranges, --repeats and --prefill-repeats must be set\n");
    return 2;
  }

  evoke::testing::TempDir dir;
  std::unique_ptr<evoke::testing::DaemonProcess> daemon;
  std::unique_ptr<evoke::Client> client;
  if (target.empty()) {
    auto d = evoke::testing::DaemonProcess::Start(
        dir.path(), {"--pinned-bytes", "2GiB", "--max-message-bytes", "200MiB"});
    if (!d.ok()) {
      std::fprintf(stderr, "evoke-llama-bench: %s\n", d.status().ToString().c_str());
      return 1;
    }
    daemon = std::move(d).value();
    client = daemon->Connect(200ull << 20);
  } else {
    evoke::ClientOptions o;
    o.target = target;
    o.max_message_bytes = 200ull << 20;
    auto c = evoke::Client::Connect(o);
    if (c.ok()) client = std::move(c).value();
  }
  if (client == nullptr) {
    std::fprintf(stderr, "evoke-llama-bench: cannot connect to evoked\n");
    return 1;
  }

  evoke::bench::StartLlama();
  const evoke::llama::RandomLlamaShape shape =
      shape_name == "1b" ? evoke::llama::OneBLlamaShape() : evoke::llama::TinyLlamaShape();
  double build_s = 0;
  evoke::llama::ModelPtr model = evoke::bench::BuildModel(shape, "evoke-llama-bench", &build_s);
  if (model == nullptr) return 1;
  std::printf("model: random llama, %u layers, %u wide, %u heads, %u KV heads, FFN %u, vocab %u "
              "(built in %.1f s); %d threads; bytes %s\n",
              shape.n_layer, shape.n_embd, shape.n_head, shape.n_head_kv, shape.n_ff,
              shape.n_vocab, build_s, threads,
              inline_bytes ? "inline in gRPC messages" : "through shared memory");

  const uint32_t max_range = *std::max_element(ranges.begin(), ranges.end());
  const llama_context_params cp = evoke::bench::BenchContextParams(max_range + 128, threads);
  evoke::llama::ContextPtr ctx(llama_init_from_model(model.get(), cp));
  if (ctx == nullptr) {
    std::fprintf(stderr, "evoke-llama-bench: llama_init_from_model failed\n");
    return 1;
  }
  evoke::llama::AdapterOptions options;
  options.ns = "bench";
  options.model_id = "random-llama-" + shape_name;
  options.session_id = "llama-bench-" + std::to_string(getpid());
  options.shared_memory = !inline_bytes;
  auto adapter = evoke::llama::KvAdapter::Open(ctx.get(), cp, client.get(), options);
  if (!adapter.ok()) {
    std::fprintf(stderr, "evoke-llama-bench: %s\n", adapter.status().ToString().c_str());
    return 1;
  }
  llama_memory_t mem = llama_get_memory(ctx.get());

  std::mt19937 gen(7);
  std::uniform_int_distribution<llama_token> pick(0, static_cast<llama_token>(shape.n_vocab) - 1);
  std::vector<Row> rows;
  for (uint32_t r : ranges) {
    std::vector<llama_token> tokens(r);
    for (llama_token& t : tokens) t = pick(gen);
    Row row;
    row.tokens = r;
    std::vector<double> evict, read, restore, splice, prefill;
    llama_memory_clear(mem, true);
    if (!evoke::llama::DecodeTokens(ctx.get(), tokens, 0)) {
      std::fprintf(stderr, "evoke-llama-bench: prefill of %u tokens failed\n", r);
      return 1;
    }
    for (int i = 0; i < repeats; ++i) {
      auto t0 = Clock::now();
      auto range = (*adapter)->Read(0, r);
      auto t1 = Clock::now();
      if (!range.ok()) {
        std::fprintf(stderr, "read: %s\n", range.status().ToString().c_str());
        return 1;
      }
      read.push_back(Ms(t0, t1));
      t0 = Clock::now();
      auto e = (*adapter)->Evict(0, r);
      t1 = Clock::now();
      if (!e.ok()) {
        std::fprintf(stderr, "evict: %s\n", e.status().ToString().c_str());
        return 1;
      }
      evict.push_back(Ms(t0, t1));
      row.block_bytes = e->payload_bytes;
      t0 = Clock::now();
      auto back = (*adapter)->Restore(e->id);
      t1 = Clock::now();
      if (!back.ok()) {
        std::fprintf(stderr, "restore: %s\n", back.status().ToString().c_str());
        return 1;
      }
      restore.push_back(Ms(t0, t1));
      // Out again, and spliced back 64 positions later (re-anchored by evoked).
      llama_memory_seq_rm(mem, 0, -1, -1);
      t0 = Clock::now();
      auto moved = (*adapter)->Splice(e->id, 64);
      t1 = Clock::now();
      if (!moved.ok()) {
        std::fprintf(stderr, "splice: %s\n", moved.status().ToString().c_str());
        return 1;
      }
      splice.push_back(Ms(t0, t1));
      // Back to [0, r) for the next repeat: restore the original once more.
      llama_memory_seq_rm(mem, 0, -1, -1);
      if (!(*adapter)->Restore(e->id).ok()) return 1;
      (void)client->Delete({e->id});
    }
    {
      // The memory floor: one memcpy of the same bytes between warm buffers.
      std::vector<char> src(row.block_bytes, 1), dst(row.block_bytes, 0);
      std::vector<double> copies;
      for (int i = 0; i < std::max(repeats, 3); ++i) {
        const auto t0 = Clock::now();
        std::memcpy(dst.data(), src.data(), src.size());
        copies.push_back(Ms(t0, Clock::now()));
        src[i % src.size()] ^= dst[(i * 7919) % dst.size()];  // Keep the copy observable.
      }
      row.memcpy_ms = Median(copies);
    }
    for (int i = 0; i < prefill_repeats; ++i) {
      llama_memory_seq_rm(mem, 0, -1, -1);
      const auto t0 = Clock::now();
      if (!evoke::llama::DecodeTokens(ctx.get(), tokens, 0)) return 1;
      prefill.push_back(Ms(t0, Clock::now()));
    }
    row.evict_ms = Median(evict);
    row.read_ms = Median(read);
    row.restore_ms = Median(restore);
    row.splice_ms = Median(splice);
    row.prefill_ms = Median(prefill);
    rows.push_back(row);
    std::printf("%5u tokens: block %7.2f MiB (%llu B/token)  memcpy %6.2f ms  evict %8.2f ms  "
                "restore %8.2f ms  splice %8.2f ms  (Read alone %7.2f ms)  re-prefill %10.1f ms  "
                "prefill/(evict+restore) %7.1fx  prefill/restore %7.1fx  prefill/splice %7.1fx\n",
                r, row.block_bytes / 1048576.0,
                static_cast<unsigned long long>(row.block_bytes / r), row.memcpy_ms, row.evict_ms,
                row.restore_ms, row.splice_ms, row.read_ms, row.prefill_ms,
                row.prefill_ms / (row.evict_ms + row.restore_ms), row.prefill_ms / row.restore_ms,
                row.prefill_ms / row.splice_ms);
    std::fflush(stdout);
  }

  if (!json_path.empty()) {
    std::vector<std::string> items;
    for (const Row& r : rows) {
      items.push_back(absl::StrFormat(
          "{\"tokens\":%u,\"block_bytes\":%u,\"memcpy_ms\":%.3f,\"evict_ms\":%.3f,"
          "\"read_ms\":%.3f,\"restore_ms\":%.3f,\"splice_ms\":%.3f,\"prefill_ms\":%.3f}",
          r.tokens, r.block_bytes, r.memcpy_ms, r.evict_ms, r.read_ms, r.restore_ms,
          r.splice_ms, r.prefill_ms));
    }
    if (!evoke::bench::WriteJsonRows(
            json_path,
            absl::StrFormat("\"shape\":\"%s\",\"threads\":%d,\"shared_memory\":%s",
                            shape_name, threads, inline_bytes ? "false" : "true"),
            items)) {
      return 1;
    }
  }
  return 0;
}
