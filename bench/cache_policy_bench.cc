// evoke-cache-policies: the agent trace (sim/agent_trace.h) replayed through
// offline models of eviction policies (sim/cache_policy.h), including
// Belady's offline bound, at a few tier-1 sizes and trace seeds. It answers
// "which policy would keep more of what the next turns read, and how much
// room is there above LRU at all" in seconds, before anything is built
// into the engine; evoke-agent-trace measures the engine itself.
//
//   build/bench/evoke-cache-policies --seeds 1,2,3 --tier1-mib 4,8,16
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "sim/agent_trace.h"
#include "sim/cache_policy.h"

int main(int argc, char** argv) {
  using namespace evoke::sim;  // NOLINT: a tool's main.
  CLI::App app{"evoke-cache-policies: offline eviction-policy models on the agent trace"};
  std::string seeds = "1,2,3", sizes = "4,8,16";
  std::string policies = "lru,slru,arc,w-tinylfu,session-lru,optimal";
  uint64_t block_kib = 16;
  double fill = 0.95;
  uint32_t sessions = AgentTraceOptions().sessions;
  std::string json;
  app.add_option("--seeds", seeds, "Trace seeds, comma-separated")->capture_default_str();
  app.add_option("--sessions", sessions)->capture_default_str();
  app.add_option("--tier1-mib", sizes, "Tier-1 sizes, comma-separated")->capture_default_str();
  app.add_option("--block-kib", block_kib, "Block payload")->capture_default_str();
  app.add_option("--fill", fill,
                 "The share of tier 1 the model fills (the engine's high watermark)")
      ->capture_default_str();
  app.add_option("--policies", policies)->capture_default_str();
  app.add_option("--json", json, "Also write the results here");
  CLI11_PARSE(app, argc, argv);

  std::vector<CachePolicyKind> kinds;
  for (absl::string_view name : absl::StrSplit(policies, ',')) {
    absl::StatusOr<CachePolicyKind> k = ParseCachePolicy(std::string(name));
    if (!k.ok()) {
      std::fprintf(stderr, "--policies: %s\n", std::string(k.status().message()).c_str());
      return 2;
    }
    kinds.push_back(*k);
  }
  std::vector<std::string> rows;
  std::printf("%-5s %-9s %-9s %-12s %10s %10s\n", "seed", "tier1 MiB", "blocks", "policy",
              "hit %", "vs lru");
  for (absl::string_view seed_text : absl::StrSplit(seeds, ',')) {
    AgentTraceOptions o;
    o.seed = std::stoull(std::string(seed_text));
    o.sessions = sessions;
    const AgentTrace trace = GenerateAgentTrace(o);
    const std::vector<BlockAccess> accesses = AgentTraceAccesses(trace);
    std::printf("seed %llu: %s\n", static_cast<unsigned long long>(o.seed),
                DescribeAgentTrace(trace).c_str());
    for (absl::string_view size_text : absl::StrSplit(sizes, ',')) {
      const uint64_t mib = std::stoull(std::string(size_text));
      const auto capacity = static_cast<uint64_t>(static_cast<double>(mib << 20) * fill /
                                                  static_cast<double>(block_kib << 10));
      const double lru = SimulateCache(accesses, CachePolicyKind::kLru, capacity).hit_ratio();
      for (CachePolicyKind k : kinds) {
        const CacheSimResult r = SimulateCache(accesses, k, capacity);
        std::printf("%-5llu %-9llu %-9llu %-12s %10.1f %+10.1f\n",
                    static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(mib),
                    static_cast<unsigned long long>(capacity), CachePolicyName(k).c_str(),
                    100 * r.hit_ratio(), 100 * (r.hit_ratio() - lru));
        rows.push_back(absl::StrFormat(
            "{\"seed\": %d, \"tier1_mib\": %d, \"capacity_blocks\": %d, \"policy\": \"%s\", "
            "\"reads\": %d, \"hits\": %d, \"hit_ratio\": %.4f, \"vs_lru\": %.4f}",
            o.seed, mib, capacity, CachePolicyName(k), r.reads, r.hits, r.hit_ratio(),
            r.hit_ratio() - lru));
      }
    }
  }
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"results\": [\n  " << absl::StrJoin(rows, ",\n  ") << "\n]}\n";
  }
  return 0;
}
