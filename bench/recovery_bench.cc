// Google Benchmark of the recovery query (RecoveryIndex::Search) beside its
// baseline in the same run, the plain scalar f32 scan (SearchExact):
//   8 KV heads x head_dim 128 mean-key summaries, 32 query heads (GQA 4),
//   k = 8, over 1k / 10k / 100k / 1M candidate blocks; Search on the calling
//   thread plus EVOKE_BENCH_SCAN_THREADS pool threads (default 2, as evoked's
//   --copy-threads), Search on one thread, and the scalar scan.
//   build/bench/evoke_recovery_bench --benchmark_min_time=0.5
//   build/bench/evoke_recovery_bench --quick --json R.json --chart R.svg
//
// Besides Google Benchmark's flags: --json FILE writes its JSON (the same as
// --benchmark_out=FILE --benchmark_out_format=json, with the command line
// beside the date in "context"), --chart FILE.svg draws that JSON (p50
// latency against candidates, per variant) with scripts/bench-chart.py, and
// --quick stands for --benchmark_min_time=0.05.
//
// The indexes read exact values through an ExactSource, as evoked's does
// (from the engine's metadata; here from one array of the rows' f32 values),
// so they hold no f32 copy.
//
// Counters: p50_ms / p99_ms of the timed queries (Google Benchmark's own time
// is the mean); rescored: rows scored exactly per query (mean); bytes_per_row:
// memory_bytes() / rows; recall_at_8 of Search against SearchExact's top 8
// and exact_queries, the share of queries whose ids and scores are equal, over
// 64 planted queries (each query is one block's keys, scaled per query head,
// plus noise as large as the keys: the answer is known, the scores are close).
// EVOKE_BENCH_OUTLIERS=R gives every row 2 outlier channels per head of R
// times the rest (real K caches have ~100).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <memory>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "bench/chart.h"
#include "common/chain_hash.h"
#include "common/fingerprint.h"
#include "common/copy_pool.h"
#include "recovery/recovery_index.h"

namespace evoke {
namespace {

constexpr uint32_t kKvHeads = 8, kDim = 128, kQueryHeads = 32, kTopK = 8;
constexpr int kRecallQueries = 64;
// The serial index (a second copy of the table) is built up to this size.
constexpr size_t kSerialMaxRows = 1000000;

v1::LayoutFingerprint Fingerprint() {
  return MakeFingerprint("bench", "llama-3-8b",
                         {.n_layers = 32, .n_kv_heads = kKvHeads, .head_dim = kDim});
}

// One index per candidate count, built once. Prefix blocks, so each is
// indexed in one scope (the layout's); the scan is the same code a session
// scope runs.
// Scan threads of the parallel variant: what evoked gives the index
// (--copy-threads, default 2) on this machine's cores.
int ScanThreads() {
  static const int n = [] {
    const char* env = std::getenv("EVOKE_BENCH_SCAN_THREADS");
    return env != nullptr ? std::atoi(env) : 2;
  }();
  return n;
}

CopyPool& Pool() {
  static auto* pool = new CopyPool(ScanThreads());
  return *pool;
}

struct Corpus {
  // The engine's stand-in: every row's f32 values, and where each id's are.
  std::vector<float> values;
  absl::flat_hash_map<BlockId, uint32_t> row_of;
  void Fill(const ExactRows& rows) const {
    const size_t width = static_cast<size_t>(kKvHeads) * kDim;
    for (size_t i = 0; i < rows.ids.size(); ++i) {
      auto it = row_of.find(rows.ids[i]);
      if (it == row_of.end() || rows.heads * rows.dim != width) continue;
      std::copy_n(values.data() + static_cast<size_t>(it->second) * width, width,
                  rows.values + i * width);
      rows.found[i] = 1;
    }
  }
  RecoveryIndex index{&Pool(), [this](const ExactRows& rows) { Fill(rows); }};
  // The same rows, scanned on the calling thread.
  RecoveryIndex serial{nullptr, [this](const ExactRows& rows) { Fill(rows); }};
  std::string scope;
  std::vector<std::vector<float>> planted;  // Keys of the blocks queries aim at.
};

Corpus& CorpusOf(size_t rows) {
  static auto* corpora = new std::map<size_t, std::unique_ptr<Corpus>>();
  std::unique_ptr<Corpus>& c = (*corpora)[rows];
  if (c != nullptr) return *c;
  c = std::make_unique<Corpus>();
  const v1::LayoutFingerprint fp = Fingerprint();
  c->scope = ModelScopeKey(DigestFingerprint(fp));
  std::mt19937 rng(static_cast<uint32_t>(rows));
  std::normal_distribution<float> normal;
  // Keys share a per-head mean direction (as real keys do) plus noise.
  std::vector<float> shared(kKvHeads * kDim);
  for (float& x : shared) x = normal(rng);
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = fp;
  meta.set_kind(v1::BLOCK_KIND_PREFIX);
  v1::Summary* s = meta.add_summaries();
  s->set_kind(v1::SUMMARY_MEAN_KEYS);
  s->set_layer(0);
  s->set_heads(kKvHeads);
  s->set_dim(kDim);
  s->mutable_values()->Resize(kKvHeads * kDim, 0.0f);
  std::uniform_int_distribution<size_t> pick(0, rows - 1);
  const char* outlier_env = std::getenv("EVOKE_BENCH_OUTLIERS");
  const float outlier = outlier_env != nullptr ? std::strtof(outlier_env, nullptr) : 0.0f;
  std::vector<uint32_t> outliers;
  for (uint32_t h = 0; outlier > 0 && h < kKvHeads; ++h) {
    for (int j = 0; j < 2; ++j) outliers.push_back(h * kDim + rng() % kDim);
  }
  const size_t width = static_cast<size_t>(kKvHeads) * kDim;
  c->values.resize(rows * width);
  c->row_of.reserve(rows);
  std::vector<size_t> aims;
  for (int i = 0; i < kRecallQueries; ++i) aims.push_back(pick(rng));
  std::sort(aims.begin(), aims.end());
  size_t next_aim = 0;
  for (size_t row = 0; row < rows; ++row) {
    float* v = s->mutable_values()->mutable_data();
    for (uint32_t i = 0; i < kKvHeads * kDim; ++i) v[i] = 0.5f * shared[i] + normal(rng);
    for (uint32_t o : outliers) v[o] = outlier * (1 + 0.1f * normal(rng));
    std::copy_n(v, width, c->values.data() + row * width);
    c->row_of[SessionBlockId("bench", "corpus", row)] = static_cast<uint32_t>(row);
    while (next_aim < aims.size() && aims[next_aim] == row) {
      c->planted.emplace_back(v, v + kKvHeads * kDim);
      ++next_aim;
    }
    c->index.Add(SessionBlockId("bench", "corpus", row), meta);  // Any unique id.
    if (rows <= kSerialMaxRows) c->serial.Add(SessionBlockId("bench", "corpus", row), meta);
  }
  return *c;
}

std::vector<float> QueryFor(const std::vector<float>& keys, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> q(kQueryHeads * kDim);
  const uint32_t group = kQueryHeads / kKvHeads;
  for (uint32_t h = 0; h < kQueryHeads; ++h) {
    const float scale = 0.5f + 0.25f * static_cast<float>(h % group);
    for (uint32_t d = 0; d < kDim; ++d) {
      q[h * kDim + d] = scale * keys[(h / group) * kDim + d] + normal(rng);
    }
  }
  return q;
}

RecoveryQuery MakeQuery(const Corpus& c, const std::vector<float>& q) {
  RecoveryQuery query;
  query.scope = c.scope;
  query.kind = v1::SUMMARY_MEAN_KEYS;
  query.layer = 0;
  query.queries = q;
  query.n_query_heads = kQueryHeads;
  query.k = kTopK;
  return query;
}

// Recall@8 of Search against SearchExact, and the share of queries whose
// answers are identical (ids in order and scores).
std::pair<double, double> Recall(const Corpus& c) {
  std::mt19937 rng(7);
  size_t found = 0, total = 0, same = 0;
  for (const std::vector<float>& keys : c.planted) {
    const std::vector<float> q = QueryFor(keys, rng);
    const RecoveryQuery query = MakeQuery(c, q);
    auto exact = c.index.SearchExact(query);
    auto approx = c.index.Search(query, nullptr);
    if (!exact.ok() || !approx.ok()) return {-1, -1};
    bool equal = exact->size() == approx->size();
    for (size_t i = 0; i < exact->size(); ++i) {
      ++total;
      for (const RecoveryHit& a : *approx) found += a.id == (*exact)[i].id;
      equal = equal && i < approx->size() && (*approx)[i].id == (*exact)[i].id &&
              (*approx)[i].score == (*exact)[i].score;
    }
    same += equal;
  }
  return {total == 0 ? 0 : static_cast<double>(found) / total,
          c.planted.empty() ? 0 : static_cast<double>(same) / c.planted.size()};
}

enum class Mode { kParallel, kSerial, kScalar };

template <Mode kMode>
void SearchLoop(benchmark::State& state) {
  const Corpus& c = CorpusOf(static_cast<size_t>(state.range(0)));
  std::mt19937 rng(11);
  std::vector<std::vector<float>> queries;
  for (const std::vector<float>& keys : c.planted) queries.push_back(QueryFor(keys, rng));
  std::vector<double> ms;
  size_t i = 0;
  uint64_t rescored = 0, rescored_sum = 0;
  for (auto _ : state) {
    const RecoveryQuery query = MakeQuery(c, queries[i++ % queries.size()]);
    const auto t0 = std::chrono::steady_clock::now();
    auto hits = kMode == Mode::kScalar   ? c.index.SearchExact(query)
                : kMode == Mode::kSerial ? c.serial.Search(query, nullptr, &rescored)
                                         : c.index.Search(query, nullptr, &rescored);
    rescored_sum += rescored;
    const auto t1 = std::chrono::steady_clock::now();
    if (!hits.ok() || hits->size() != kTopK) {
      state.SkipWithError("search failed or returned fewer than k hits");
      return;
    }
    benchmark::DoNotOptimize(hits);
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  state.counters["p50_ms"] = ms[ms.size() / 2];
  state.counters["p99_ms"] = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  state.counters["candidates"] = static_cast<double>(state.range(0));
  state.counters["rows_per_s"] =
      benchmark::Counter(static_cast<double>(state.range(0)) * state.iterations(),
                         benchmark::Counter::kIsRate);
  state.counters["rescored"] = static_cast<double>(rescored_sum) / ms.size();
  if (kMode == Mode::kParallel) {
    const auto [recall, same] = Recall(c);
    state.counters["recall_at_8"] = recall;
    state.counters["exact_queries"] = same;
    state.counters["scan_threads"] = ScanThreads() + 1;
    state.counters["bytes_per_row"] =
        static_cast<double>(c.index.memory_bytes()) / static_cast<double>(state.range(0));
  }
}

void BM_RecoverSearch(benchmark::State& state) { SearchLoop<Mode::kParallel>(state); }
void BM_RecoverSearchOneThread(benchmark::State& state) { SearchLoop<Mode::kSerial>(state); }
void BM_RecoverScalarBaseline(benchmark::State& state) { SearchLoop<Mode::kScalar>(state); }

BENCHMARK(BM_RecoverSearch)->RangeMultiplier(10)->Range(1000, 1000000)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RecoverSearchOneThread)->RangeMultiplier(10)->Range(1000, 1000000)
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_RecoverScalarBaseline)->RangeMultiplier(10)->Range(1000, 1000000)
    ->Unit(benchmark::kMillisecond)->UseRealTime();

// Main: Google Benchmark's main, plus --json, --chart and --quick (above).
int Main(int argc, char** argv) {
  const std::string command = CommandLine(argc, argv);
  std::string json_path, chart_path;
  bool quick = false, min_time_given = false;
  std::vector<std::string> args = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    std::string* value = a == "--json" ? &json_path : a == "--chart" ? &chart_path : nullptr;
    if (value != nullptr) {
      if (i + 1 == argc) {
        std::fprintf(stderr, "evoke_recovery_bench: %s needs a FILE\n", argv[i]);
        return 2;
      }
      *value = argv[++i];
    } else if (absl::StartsWith(a, "--json=")) {
      json_path = std::string(a.substr(7));
    } else if (absl::StartsWith(a, "--chart=")) {
      chart_path = std::string(a.substr(8));
    } else if (a == "--quick") {
      quick = true;
    } else {
      min_time_given = min_time_given || absl::StartsWith(a, "--benchmark_min_time");
      args.emplace_back(a);
    }
  }
  if (!chart_path.empty()) {
    if (absl::Status s = CheckChartFlags(chart_path, EVOKE_BENCH_CHART_SCRIPT); !s.ok()) {
      std::fprintf(stderr, "evoke_recovery_bench: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  char tmpl[] = "/tmp/evoke-recovery-bench-XXXXXX";
  std::string temp_dir;
  if (!chart_path.empty() && json_path.empty()) {  // --chart alone: the JSON in a temp dir.
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("evoke_recovery_bench: mkdtemp");
      return 1;
    }
    temp_dir = tmpl;
    json_path = temp_dir + "/results.json";
  }
  if (quick && !min_time_given) args.emplace_back("--benchmark_min_time=0.05");
  if (!json_path.empty()) {
    args.push_back("--benchmark_out=" + json_path);
    args.emplace_back("--benchmark_out_format=json");
  }
  std::vector<char*> c_args;
  for (std::string& a : args) c_args.push_back(a.data());
  int c_argc = static_cast<int>(c_args.size());
  c_args.push_back(nullptr);
  benchmark::Initialize(&c_argc, c_args.data());
  if (benchmark::ReportUnrecognizedArguments(c_argc, c_args.data())) return 1;
  benchmark::AddCustomContext("command", command);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  int code = 0;
  if (!chart_path.empty()) {
    const absl::Status drawn = DrawChart(EVOKE_BENCH_CHART_SCRIPT, json_path, chart_path);
    if (!drawn.ok()) {
      std::fprintf(stderr, "evoke_recovery_bench: --chart: %s\n", drawn.ToString().c_str());
      code = 1;
    }
  }
  if (!temp_dir.empty()) {
    std::remove(json_path.c_str());
    rmdir(temp_dir.c_str());
  }
  return code;
}

}  // namespace
}  // namespace evoke

int main(int argc, char** argv) { return evoke::Main(argc, argv); }
