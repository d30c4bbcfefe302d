// evoke-llama-fidelity: how far each eviction policy's budgeted cache moves
// llama.cpp's next-token distribution from the same model with its full
// context.
//
// A reference run decodes a random prompt and then greedily for --steps
// tokens with a cache holding everything. Then, for each policy and budget,
// a budgeted session (LlamaPolicySession: evictions to a real evoked,
// recoveries for infllm and evoke) is teacher-forced on exactly the same
// tokens, and at each step after the prompt we compare its next-token
// distribution with the reference's: top-1 agreement and KL(full || budgeted).
//
// THE MODEL HAS RANDOM WEIGHTS: this checks the mechanics (evictions,
// recoveries and re-anchored splices change the distribution only as much as
// the missing context does; a broken splice shows as a jump), it is NOT a
// claim about the quality of any policy on a real model.
//
//   evoke-llama-fidelity [--shape tiny|small] [--policies recency,...]
//                        [--budgets 128,256] [--block 32] [--prompt 64]
//                        [--steps 300] [--weight-std 0.2] [--threads N]
//                        [--json FILE]
//
// It starts its own evoked (temp dir) with --summary-layer at the model's
// middle layer, the layer the recovery query and summaries use.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/llama_bench_util.h"
#include "engines/llama/attention_capture.h"
#include "engines/llama/kv_adapter.h"
#include "engines/llama/policy_engine.h"
#include "engines/llama/random_model.h"
#include "policy/policy.h"
#include "testing/daemon_process.h"
#include "testing/temp_dir.h"

namespace {

using evoke::bench::Clock;

const char kDisclaimer[] =
    "Random-weight model: a mechanics check of evictions, recoveries and splices on the real "
    "llama.cpp, NOT a claim about any policy's quality on a real model.";

// log-softmax of logits, in double.
std::vector<double> LogSoftmax(const float* logits, int n) {
  double top = -INFINITY;
  for (int i = 0; i < n; ++i) top = std::max(top, double(logits[i]));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - top);
  const double lse = top + std::log(sum);
  std::vector<double> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out[i] = double(logits[i]) - lse;
  return out;
}

int Argmax(const float* logits, int n) {
  return static_cast<int>(std::max_element(logits, logits + n) - logits);
}

struct Row {
  std::string policy;
  uint64_t budget = 0;
  uint32_t compared = 0;
  double top1 = 0;     // Share of steps whose argmax matches the reference.
  double mean_kl = 0;  // Mean KL(full || budgeted), nats.
  double max_kl = 0;
  uint64_t max_cells = 0;
  uint64_t saved = 0, dropped = 0, recovered = 0, recovery_failures = 0;
  double seconds = 0;
  std::string error;
};

llama_context_params Params(uint32_t n_ctx, int threads) {
  llama_context_params p = evoke::bench::BenchContextParams(n_ctx, threads);
  p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{std::string("evoke-llama-fidelity: next-token agreement and KL of budgeted "
                           "caches vs the full context on llama.cpp. ") + kDisclaimer};
  std::string shape_name = "tiny", json_path;
  std::vector<std::string> policies = evoke::policy::PolicyNames();
  std::vector<uint64_t> budgets = {128, 256};
  uint32_t block = 32, prompt_tokens = 64, steps = 300;
  float weight_std = 0.2f;
  int threads = static_cast<int>(std::min(4u, std::max(1u, std::thread::hardware_concurrency())));
  app.add_option("--shape", shape_name,
                 "tiny (2 layers, 256 wide) or small (4 layers, 512 wide, 8 heads, 2 KV heads, "
                 "vocab 4096)")
      ->check(CLI::IsMember({"tiny", "small"}));
  app.add_option("--policies", policies, "Policies (default: all)")->delimiter(',');
  app.add_option("--budgets", budgets, "Budgets in tokens")->delimiter(',');
  app.add_option("--weight-std", weight_std,
                 "Standard deviation of the random weights (default 0.2; at the tests' 0.05 "
                 "attention is nearly uniform and no policy changes anything)");
  app.add_option("--block", block, "Block size in tokens (default 32)");
  app.add_option("--prompt", prompt_tokens, "Random prompt tokens before the compared steps");
  app.add_option("--steps", steps, "Compared decode steps (default 300)");
  app.add_option("--threads", threads, "llama.cpp threads");
  app.add_option("--json", json_path, "Also write the results as JSON to FILE");
  CLI11_PARSE(app, argc, argv);
  if (steps == 0 || prompt_tokens == 0 || budgets.empty() || policies.empty() || block == 0) {
    std::fprintf(stderr, "evoke-llama-fidelity: --steps, --prompt, --block, --budgets and "
                         "--policies must be non-empty / positive\n");
    return 2;
  }

  evoke::bench::StartLlama();
  evoke::llama::RandomLlamaShape shape = evoke::llama::TinyLlamaShape();
  if (shape_name == "small") {
    shape.n_layer = 4;
    shape.n_embd = 512;
    shape.n_head = 8;
    shape.n_head_kv = 2;
    shape.n_ff = 1024;
    shape.n_vocab = 4096;
  }
  shape.weight_std = weight_std;
  double build_s = 0;
  evoke::llama::ModelPtr model =
      evoke::bench::BuildModel(shape, "evoke-llama-fidelity", &build_s);
  if (model == nullptr) return 1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model.get()));
  const uint32_t summary_layer = shape.n_layer / 2;

  evoke::testing::TempDir dir;
  auto daemon = evoke::testing::DaemonProcess::Start(
      dir.path(), {"--summary-layer", std::to_string(summary_layer)});
  if (!daemon.ok()) {
    std::fprintf(stderr, "evoke-llama-fidelity: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<evoke::Client> client = (*daemon)->Connect();
  if (client == nullptr) return 1;

  // The reference: full context, greedy.
  const uint32_t total = prompt_tokens + steps;
  std::vector<llama_token> tokens;
  std::mt19937 gen(5);
  std::uniform_int_distribution<llama_token> pick(0, static_cast<llama_token>(n_vocab) - 1);
  for (uint32_t i = 0; i < prompt_tokens; ++i) tokens.push_back(pick(gen));
  std::vector<std::vector<double>> ref_logp;  // Per compared step.
  std::vector<int> ref_top;
  {
    llama_context_params p = Params(total + 64, threads);
    evoke::llama::ContextPtr ctx(llama_init_from_model(model.get(), p));
    if (ctx == nullptr) return 1;
    for (uint32_t i = 0; i < total; ++i) {
      if (!evoke::llama::DecodeTokens(ctx.get(), {tokens[i]}, static_cast<llama_pos>(i))) return 1;
      if (i + 1 < prompt_tokens) continue;
      const float* l = llama_get_logits_ith(ctx.get(), -1);
      ref_logp.push_back(LogSoftmax(l, n_vocab));
      ref_top.push_back(Argmax(l, n_vocab));
      if (tokens.size() < total) tokens.push_back(ref_top.back());
    }
  }

  std::printf("evoke-llama-fidelity: %s\n", kDisclaimer);
  std::printf("model: random llama '%s' (%u layers, %u wide, %u heads, %u KV heads, vocab %d, "
              "weight std %.2f); prompt %u tokens, %u compared steps (teacher-forced on the full-context greedy "
              "tokens), blocks of %u, recovery layer %u\n\n",
              shape_name.c_str(), shape.n_layer, shape.n_embd, shape.n_head, shape.n_head_kv,
              n_vocab, weight_std, prompt_tokens, steps + 1, block, summary_layer);

  std::vector<Row> rows;
  auto quote_safe = [](std::string s) {
    std::replace(s.begin(), s.end(), '"', '\'');
    std::replace(s.begin(), s.end(), '\\', '/');
    return s;
  };
  for (uint64_t budget : budgets) {
    for (const std::string& name : policies) {
      Row row;
      row.policy = name;
      row.budget = budget;
      const auto t0 = Clock::now();
      evoke::llama::AttentionCapture capture({.layers = {}, .query_layer =
                                                              static_cast<int32_t>(summary_layer)});
      llama_context_params p = Params(static_cast<uint32_t>(budget) + 256, threads);
      capture.Install(p);
      evoke::llama::ContextPtr ctx(llama_init_from_model(model.get(), p));
      if (ctx == nullptr) return 1;
      evoke::llama::AdapterOptions ao;
      ao.ns = "fidelity";
      ao.model_id = "random-llama-" + shape_name;
      ao.session_id = absl::StrFormat("%s-%u-%d", name, budget, getpid());
      auto adapter = evoke::llama::KvAdapter::Open(ctx.get(), p, client.get(), ao);
      if (!adapter.ok()) {
        std::fprintf(stderr, "evoke-llama-fidelity: %s\n", adapter.status().ToString().c_str());
        return 1;
      }
      evoke::llama::SessionOptions so;
      so.policy = name;
      so.params.block_tokens = block;
      so.budget_tokens = budget;
      so.summary_layer = summary_layer;
      auto session = evoke::llama::LlamaPolicySession::Create(
          ctx.get(), &capture, adapter->get(), client.get(), ao.ns, ao.session_id, so);
      if (!session.ok()) {
        row.error = std::string(session.status().message());
        rows.push_back(row);
        continue;
      }
      double kl_sum = 0;
      uint32_t agree = 0;
      for (uint32_t i = 0; i < total && row.error.empty(); ++i) {
        absl::Status s = (*session)->Decode(tokens[i]);
        if (!s.ok()) {
          row.error = std::string(s.message());
          break;
        }
        if (i + 1 < prompt_tokens) continue;
        const size_t k = i + 1 - prompt_tokens;
        const float* l = llama_get_logits_ith(ctx.get(), -1);
        const std::vector<double> logp = LogSoftmax(l, n_vocab);
        double kl = 0;
        for (int v = 0; v < n_vocab; ++v) {
          kl += std::exp(ref_logp[k][v]) * (ref_logp[k][v] - logp[v]);
        }
        kl = std::max(kl, 0.0);
        kl_sum += kl;
        row.max_kl = std::max(row.max_kl, kl);
        agree += Argmax(l, n_vocab) == ref_top[k];
        ++row.compared;
      }
      row.top1 = row.compared ? double(agree) / row.compared : 0;
      row.mean_kl = row.compared ? kl_sum / row.compared : 0;
      row.max_cells = (*session)->max_cells_used();
      row.saved = (*session)->driver_stats().blocks_saved;
      row.dropped = (*session)->driver_stats().blocks_dropped;
      row.recovered = (*session)->driver_stats().blocks_recovered;
      row.recovery_failures = (*session)->driver_stats().recovery_failures;
      row.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      rows.push_back(row);
      (void)client->DropSession(ao.ns, ao.session_id);
    }
  }

  std::printf("| policy | budget | steps | top-1 agreement | mean KL (nats) | max KL | max cells | "
              "saved | dropped | recovered | recovery failures | s |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    if (!r.error.empty()) {
      std::printf("| %s | %llu | error: %s |\n", r.policy.c_str(),
                  static_cast<unsigned long long>(r.budget), r.error.c_str());
      continue;
    }
    std::printf("| %s | %llu | %u | %.3f | %.4f | %.4f | %llu | %llu | %llu | %llu | %llu | %.1f |\n",
                r.policy.c_str(), static_cast<unsigned long long>(r.budget), r.compared, r.top1,
                r.mean_kl, r.max_kl, static_cast<unsigned long long>(r.max_cells),
                static_cast<unsigned long long>(r.saved),
                static_cast<unsigned long long>(r.dropped),
                static_cast<unsigned long long>(r.recovered),
                static_cast<unsigned long long>(r.recovery_failures), r.seconds);
  }
  std::printf("\n%s\n", kDisclaimer);

  if (!json_path.empty()) {
    std::vector<std::string> items;
    for (const Row& r : rows) {
      items.push_back(absl::StrFormat(
          "{\"policy\":\"%s\",\"budget\":%u,\"steps\":%u,\"top1\":%.6f,\"mean_kl\":%.6f,"
          "\"max_kl\":%.6f,\"max_cells\":%u,\"saved\":%u,\"dropped\":%u,\"recovered\":%u,"
          "\"recovery_failures\":%u,\"seconds\":%.3f,\"error\":\"%s\"}",
          r.policy, r.budget, r.compared, r.top1, r.mean_kl, r.max_kl, r.max_cells, r.saved,
          r.dropped, r.recovered, r.recovery_failures, r.seconds, quote_safe(r.error)));
    }
    if (!evoke::bench::WriteJsonRows(
            json_path,
            absl::StrFormat("\"note\":\"%s\",\"shape\":\"%s\",\"weight_std\":%.3f,"
                            "\"prompt\":%u,\"steps\":%u,\"block\":%u",
                            kDisclaimer, shape_name, weight_std, prompt_tokens, steps, block),
            items)) {
      return 1;
    }
  }
  bool failed = false;
  for (const Row& r : rows) failed |= !r.error.empty() || r.max_cells > r.budget;
  return failed ? 1 : 0;
}
