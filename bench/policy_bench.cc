// evoke_policy_bench: the cost of one decode step's policy decision
// (ChooseEvictions + ChooseRecoveries) on a 128k-token context: 2,048
// resident blocks of 64 tokens, attention statistics for 32 layers x 8 KV
// heads read at the all-layers scope, resident mean-keys summaries
// (8 KV heads x 128 dims), and an in-memory source holding 2,048 stored
// pre-scored blocks. Also the cost of AttentionStats::Observe per (layer,
// head) row of 128k tokens.
//
//   evoke_policy_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true   (one line)
#include <algorithm>
#include <cstdint>
#include <utility>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "policy/attention_stats.h"
#include "policy/fake_recovery_source.h"
#include "policy/policy.h"

namespace evoke::policy {
namespace {

constexpr uint32_t kBlocks = 2048, kBlockTokens = 64, kLayers = 32, kKvHeads = 8;
constexpr uint32_t kQueryHeads = 32, kHeadDim = 128;
constexpr uint64_t kTokens = uint64_t{kBlocks} * kBlockTokens;

struct Context {
  std::vector<ResidentBlock> resident;
  std::vector<std::vector<float>> summaries;
  std::unique_ptr<AttentionStats> attention;
  FakeRecoverySource source;
  std::vector<float> query;

  Context() {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    summaries.resize(kBlocks);
    for (uint32_t i = 0; i < kBlocks; ++i) {
      ResidentBlock b;
      b.handle = i;
      b.first_token = uint64_t{i} * kBlockTokens;
      b.n_tokens = kBlockTokens;
      b.first_position = static_cast<int64_t>(b.first_token);
      b.recovered = i % 16 == 0;  // Some came back from evoked.
      summaries[i].resize(kKvHeads * kHeadDim);
      for (float& v : summaries[i]) v = normal(rng);
      b.summary = summaries[i];
      resident.push_back(b);
    }
    // Stored (evicted) blocks: handles after the resident ones, pre-scored.
    for (uint32_t i = 0; i < kBlocks; ++i) {
      source.AddWithScore(kBlocks + i, kBlockTokens, 50.0f * uniform(rng));
    }
    query.resize(kQueryHeads * kHeadDim);
    for (float& v : query) v = normal(rng);
    // One observed decode step over every layer and head.
    attention = std::make_unique<AttentionStats>(AttentionStats::Options{
        .n_layers = kLayers, .n_heads = kKvHeads, .window = 32, .pool_kernel = 5});
    std::vector<BlockHandle> of(kTokens);
    for (uint64_t t = 0; t < kTokens; ++t) of[t] = t / kBlockTokens;
    std::vector<float> row(kTokens);
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kKvHeads; ++h) {
        for (float& w : row) w = uniform(rng) / kTokens;
        (void)attention->Observe(l, h, of, {}, row);
      }
    }
    attention->EndStep();
  }
};

Context& Shared() {
  static Context* context = new Context();
  return *context;
}

void BM_Decision(benchmark::State& state, const char* name) {
  Context& c = Shared();
  std::unique_ptr<Policy> policy = std::move(MakePolicy(name)).value();
  CacheView view;
  view.budget_tokens = kTokens;  // Full: the next token evicts one block.
  view.pending_tokens = 0;
  view.session_tokens = kTokens;
  view.resident = c.resident;
  view.attention = c.attention.get();
  const RecoveryQuery query{c.query, kQueryHeads};
  for (auto _ : state) {
    auto evictions = policy->ChooseEvictions(view, 1);
    auto recoveries = policy->ChooseRecoveries(view, query, c.source);
    if (!evictions.ok() || evictions->empty() || !recoveries.ok()) {
      state.SkipWithError("decision failed");
      break;
    }
    benchmark::DoNotOptimize(evictions->data());
    benchmark::DoNotOptimize(recoveries->data());
  }
}
BENCHMARK_CAPTURE(BM_Decision, recency, "recency")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Decision, streaming_llm, "streaming_llm")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Decision, h2o, "h2o")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Decision, snapkv, "snapkv")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Decision, infllm, "infllm")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Decision, evoke, "evoke")->Unit(benchmark::kMicrosecond);

// Baselines measured in the same run (the floors of the work above):
// sorting 2,048 (score, index) pairs, which every scored eviction order
// does; 2,048 dot products of 8 x 128 floats, which EVOKE's resident gate
// does once per resident summary; summing one 128k-token row into its
// 2,048 blocks, the least an Observe can do.
void BM_BaselineSortBlocks(benchmark::State& state) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<double> uniform;
  std::vector<std::pair<double, uint32_t>> keys(kBlocks), work;
  for (uint32_t i = 0; i < kBlocks; ++i) keys[i] = {uniform(rng), i};
  for (auto _ : state) {
    work = keys;
    std::sort(work.begin(), work.end());
    benchmark::DoNotOptimize(work.data());
  }
}
BENCHMARK(BM_BaselineSortBlocks)->Unit(benchmark::kMicrosecond);

void BM_BaselineDotSummaries(benchmark::State& state) {
  Context& c = Shared();
  const float* q = c.query.data();
  for (auto _ : state) {
    float worst = 0;
    for (const std::vector<float>& summary : c.summaries) {
      // 16 partial sums: a plain loop the compiler can vectorize without
      // reassociating a single float sum.
      float part[16] = {};
      for (uint32_t i = 0; i < kKvHeads * kHeadDim; i += 16) {
        for (uint32_t j = 0; j < 16; ++j) part[j] += q[i + j] * summary[i + j];
      }
      float dot = 0;
      for (float p : part) dot += p;
      worst = std::min(worst, dot);
    }
    benchmark::DoNotOptimize(worst);
  }
}
BENCHMARK(BM_BaselineDotSummaries)->Unit(benchmark::kMicrosecond);

void BM_BaselineRowSum(benchmark::State& state) {
  std::vector<float> row(kTokens, 1.0f / kTokens);
  std::vector<double> per_block(kBlocks);
  for (auto _ : state) {
    for (uint32_t b = 0; b < kBlocks; ++b) {
      double sum = 0;
      for (uint32_t t = 0; t < kBlockTokens; ++t) sum += row[uint64_t{b} * kBlockTokens + t];
      per_block[b] += sum;
    }
    benchmark::DoNotOptimize(per_block.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(kTokens));
}
BENCHMARK(BM_BaselineRowSum)->Unit(benchmark::kMicrosecond);

// The fake source's own cost (sorting 2,048 pre-scored blocks), part of the
// infllm and evoke figures above; evoked's Recover replaces it in an engine.
void BM_FakeSourceRank(benchmark::State& state) {
  Context& c = Shared();
  const RecoveryQuery query{c.query, kQueryHeads};
  for (auto _ : state) {
    auto r = c.source.Rank(query, 8, std::nullopt);
    benchmark::DoNotOptimize(r->data());
  }
}
BENCHMARK(BM_FakeSourceRank)->Unit(benchmark::kMicrosecond);

// One (layer, head) row of a 128k-token context, pooled (kernel 5) or not.
void BM_AttentionObserveRow(benchmark::State& state) {
  const uint32_t kernel = static_cast<uint32_t>(state.range(0));
  AttentionStats stats({.n_layers = kLayers, .n_heads = kKvHeads, .window = 32,
                        .pool_kernel = kernel});
  std::vector<BlockHandle> of(kTokens);
  for (uint64_t t = 0; t < kTokens; ++t) of[t] = t / kBlockTokens;
  std::vector<float> row(kTokens, 1.0f / kTokens);
  // One whole step first: the blocks' statistics are allocated then, not in
  // the timed rows.
  for (uint32_t w = 0; w < kLayers * kKvHeads; ++w) {
    (void)stats.Observe(w / kKvHeads, w % kKvHeads, of, {}, row);
  }
  stats.EndStep();
  uint32_t r = 0;
  for (auto _ : state) {
    (void)stats.Observe(r / kKvHeads, r % kKvHeads, of, {}, row);
    r = (r + 1) % (kLayers * kKvHeads);
    if (r == 0) stats.EndStep();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(kTokens));
}
BENCHMARK(BM_AttentionObserveRow)->Arg(1)->Arg(5)->Unit(benchmark::kMicrosecond);

// EndStep after a step that touched every block (one token each): slides
// the window of 2,048 blocks x 32 x 8 rows.
void BM_AttentionEndStep(benchmark::State& state) {
  Context& c = Shared();
  std::vector<BlockHandle> of(kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) of[i] = i;
  const std::vector<float> row(kBlocks, 1.0f / kBlocks);
  for (auto _ : state) {
    state.PauseTiming();
    (void)c.attention->Observe(0, 0, of, {}, row);
    state.ResumeTiming();
    c.attention->EndStep();
  }
}
BENCHMARK(BM_AttentionEndStep)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace evoke::policy

BENCHMARK_MAIN();
