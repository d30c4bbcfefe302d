// evoke-agent-trace: a multi-session agent workload (sim/agent_trace.h) run
// against the real storage engine (tier 1 of a few sizes, a real tier 2 on
// disk, the engine's own eviction), with and without hints from the engine:
// KeepSession around tool calls, retention classes (see Config). Reports, per tier-1 size and
// policy, where each block a turn reads came from: tier 1, tier 2 (a
// stall of one disk read) or nowhere (recomputed: a stall of re-prefill),
// and a modeled stall from two stated costs.
//
//   build/bench/evoke-agent-trace --json out.json
//
// Virtual time: the trace's clock drives the engine's (keeps expire on it);
// after each turn the run waits for the spiller, so a run is repeatable.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "sim/agent_trace.h"
#include "storage/tier_manager.h"
#include "testing/blocks.h"
#include "testing/engine.h"
#include "testing/fake_clock.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

// Policies: "lru" (no hints), "keep" (KeepSession for each tool call's
// pause), "keep+end-low" (also: a session whose visit ends is given class
// LOW, and NORMAL again when it comes back), "keep+prompt-high" (also: the
// shared system prompts' blocks are class HIGH).
struct Config {
  uint64_t tier1_mib = 0;
  std::string policy = "lru";
  bool keep() const { return policy != "lru"; }
  bool end_low() const { return policy == "keep+end-low"; }
  bool prompt_high() const { return policy == "keep+prompt-high"; }
};

struct Result {
  Config config;
  uint64_t reads = 0, tier1 = 0, tier2 = 0, recomputed = 0, keep_overrides = 0;
  double stall_ms = 0;
};

struct RunOptions {
  uint64_t block_bytes = 16 << 10;
  uint64_t spill_mib = 64;
  double tier2_us = 30;        // Modeled: one block read from tier 2.
  double recompute_ms = 1.5;   // Modeled: one block's tokens prefilled again.
  double keep_margin_s = 2;    // Added to the tool call's pause.
  double kept_fraction = TierManagerOptions().kept_tier1_fraction;
};

v1::BlockMeta MetaOf(const std::string& session, uint64_t seq) {
  return evoke::testing::SessionMeta(evoke::testing::OpaqueFingerprint(), session, seq, 16, 0,
                                     1, 0);
}

absl::Status SaveOne(TierManager& tm, const v1::BlockMeta& meta, uint64_t seed, uint64_t bytes) {
  const std::string payload = evoke::testing::Payload(seed, bytes);
  const SaveItem item{&meta, payload.size(), false};
  HostSaveSource source({payload});
  return tm.Save({&item, 1}, source, false, absl::InfiniteFuture(), 1).status();
}

absl::StatusOr<Result> Run(const sim::AgentTrace& trace, const Config& config,
                           const RunOptions& o) {
  evoke::testing::TempDir dir;
  evoke::testing::FakeClock clock;
  const absl::Time epoch = clock.Now();
  TierManagerOptions options;
  options.spill_bytes = o.spill_mib << 20;
  options.kept_tier1_fraction = o.kept_fraction;
  options.clock = &clock;
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<TierManager> tm,
                         evoke::testing::OpenEngine(dir.Join("db"), config.tier1_mib << 20,
                                                    options, nullptr));
  Result r;
  r.config = config;
  absl::flat_hash_set<uint32_t> ended;  // Sessions given class LOW.
  // The ids of a session's blocks [0, n) that the engine holds.
  auto held = [&](const std::string& session, uint64_t n) {
    std::vector<BlockId> ids;
    for (uint64_t i = 0; i < n; ++i) {
      const BlockId id = evoke::testing::IdOf(MetaOf(session, i));
      if (tm->Describe(id).ok()) ids.push_back(id);
    }
    return ids;
  };
  for (const sim::AgentTurn& turn : trace.turns) {
    clock.Set(epoch + absl::Seconds(turn.time_s));
    const std::string session = absl::StrCat("s", turn.session);
    const std::string prompt = absl::StrCat("prompt", turn.prompt);
    std::vector<std::pair<std::string, uint64_t>> context;
    for (uint32_t i = 0; i < trace.options.prompt_blocks; ++i) context.emplace_back(prompt, i);
    for (uint32_t i = 0; i < turn.context_blocks; ++i) context.emplace_back(session, i);
    std::vector<BlockId> present;
    for (const auto& [name, seq] : context) {
      const v1::BlockMeta meta = MetaOf(name, seq);
      const BlockId id = evoke::testing::IdOf(meta);
      ++r.reads;
      absl::StatusOr<BlockInfo> info = tm->Describe(id);
      if (info.ok() && info->location == BlockLocation::kHost) {
        ++r.tier1;
        present.push_back(id);
      } else if (info.ok() && info->location == BlockLocation::kDisk) {
        ++r.tier2;
        present.push_back(id);
      } else {
        // Gone (or never written, for a prompt's first use): prefilled
        // again and saved, as an engine would.
        ++r.recomputed;
        if (info.ok()) EVOKE_RETURN_IF_ERROR(tm->Delete({&id, 1}));
        EVOKE_RETURN_IF_ERROR(SaveOne(*tm, meta, seq, o.block_bytes));
        if (config.prompt_high() && name == prompt) {
          EVOKE_RETURN_IF_ERROR(
              tm->SetRetention({&id, 1}, RetentionClass::kHigh, absl::ZeroDuration()));
        }
      }
    }
    if (config.end_low() && ended.erase(turn.session) > 0) {
      // Back: its blocks compete by recency again.
      const std::vector<BlockId> ids = held(session, turn.context_blocks);
      if (!ids.empty()) {
        EVOKE_RETURN_IF_ERROR(
            tm->SetRetention(ids, RetentionClass::kNormal, absl::ZeroDuration()));
      }
    }
    if (!present.empty()) {
      StringLoadSink sink;
      std::vector<v1::BlockMeta> metas;
      std::vector<LoadedInfo> infos;
      EVOKE_RETURN_IF_ERROR(tm->Load(present, evoke::testing::OpaqueFingerprint(), sink,
                                     &metas, &infos));
    }
    for (uint32_t i = 0; i < turn.new_blocks; ++i) {
      const uint64_t seq = turn.context_blocks + i;
      EVOKE_RETURN_IF_ERROR(SaveOne(*tm, MetaOf(session, seq), seq, o.block_bytes));
    }
    if (config.end_low() && turn.pause_s == 0) {
      const std::vector<BlockId> ids = held(session, turn.context_blocks + turn.new_blocks);
      if (!ids.empty()) {
        EVOKE_RETURN_IF_ERROR(tm->SetRetention(ids, RetentionClass::kLow, absl::ZeroDuration()));
      }
      ended.insert(turn.session);
    }
    if (config.keep() && turn.tool_call) {
      EVOKE_RETURN_IF_ERROR(
          tm->KeepSession("ns", session, absl::Seconds(turn.pause_s + o.keep_margin_s))
              .status());
    }
    tm->WaitForSpillerIdle(absl::Seconds(30));
  }
  r.keep_overrides = tm->Stats().counters.keep_overrides;
  r.stall_ms = r.tier2 * o.tier2_us / 1000 + r.recomputed * o.recompute_ms;
  return r;
}

}  // namespace
}  // namespace evoke

int main(int argc, char** argv) {
  using namespace evoke;  // NOLINT: a tool's main.
  CLI::App app{"evoke-agent-trace: tier-1 hit ratio and stall on a multi-session agent trace"};
  sim::AgentTraceOptions trace_options;
  RunOptions o;
  std::string sizes = "4,8,16";
  std::string json;
  app.add_option("--seed", trace_options.seed)->capture_default_str();
  app.add_option("--sessions", trace_options.sessions)->capture_default_str();
  app.add_option("--tier1-mib", sizes, "Tier-1 sizes to run, comma-separated")
      ->capture_default_str();
  app.add_option("--spill-mib", o.spill_mib, "Tier 2's budget")->capture_default_str();
  app.add_option("--block-kib", o.block_bytes, "Block payload (bytes)")->capture_default_str();
  app.add_option("--tier2-us", o.tier2_us, "Modeled stall of a tier-2 read, per block")
      ->capture_default_str();
  app.add_option("--recompute-ms", o.recompute_ms, "Modeled stall of re-prefill, per block")
      ->capture_default_str();
  app.add_option("--kept-fraction", o.kept_fraction,
                 "The share of tier 1 keeps may protect (TierManagerOptions)")
      ->capture_default_str();
  std::string policies = "lru,keep";
  app.add_option("--policies", policies,
                 "lru, keep, keep+end-low, keep+prompt-high (comma-separated)")
      ->capture_default_str();
  app.add_option("--json", json, "Also write the results here");
  CLI11_PARSE(app, argc, argv);

  const sim::AgentTrace trace = sim::GenerateAgentTrace(trace_options);
  std::printf("trace: %s\n", sim::DescribeAgentTrace(trace).c_str());
  std::printf("keeps protect at most %.2f of tier 1\n", o.kept_fraction);
  std::printf("block %llu B, spill budget %llu MiB; stall model: %.0f us per tier-2 block, "
              "%.2f ms per recomputed block\n\n",
              static_cast<unsigned long long>(o.block_bytes),
              static_cast<unsigned long long>(o.spill_mib), o.tier2_us, o.recompute_ms);
  std::printf("%-10s %-16s %10s %10s %10s %10s %12s %10s\n", "tier1 MiB", "policy", "reads",
              "tier1 %", "tier2 %", "recomp %", "stall s", "overrides");
  std::vector<std::string> rows;
  for (absl::string_view size : absl::StrSplit(sizes, ',')) {
    for (absl::string_view policy : absl::StrSplit(policies, ',')) {
      Config c{std::stoull(std::string(size)), std::string(policy)};
      if (c.keep() && c.policy != "keep" && !c.end_low() && !c.prompt_high()) {
        std::fprintf(stderr, "--policies: unknown policy %s\n", c.policy.c_str());
        return 2;
      }
      absl::StatusOr<Result> r = Run(trace, c, o);
      if (!r.ok()) {
        std::fprintf(stderr, "tier1 %llu MiB %s: %s\n",
                     static_cast<unsigned long long>(c.tier1_mib), c.policy.c_str(),
                     r.status().ToString().c_str());
        return 1;
      }
      const double n = static_cast<double>(r->reads);
      std::printf("%-10llu %-16s %10llu %10.1f %10.1f %10.1f %12.2f %10llu\n",
                  static_cast<unsigned long long>(c.tier1_mib), c.policy.c_str(),
                  static_cast<unsigned long long>(r->reads), 100 * r->tier1 / n,
                  100 * r->tier2 / n, 100 * r->recomputed / n, r->stall_ms / 1000,
                  static_cast<unsigned long long>(r->keep_overrides));
      std::fflush(stdout);
      rows.push_back(absl::StrFormat(
          "{\"tier1_mib\": %d, \"policy\": \"%s\", \"reads\": %d, \"tier1\": %d, "
          "\"tier2\": %d, \"recomputed\": %d, \"stall_ms\": %.1f, \"keep_overrides\": %d}",
          c.tier1_mib, c.policy, r->reads, r->tier1, r->tier2, r->recomputed,
          r->stall_ms, r->keep_overrides));
    }
  }
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"trace\": \"" << sim::DescribeAgentTrace(trace) << "\", \"seed\": "
        << trace_options.seed << ", \"results\": [\n  " << absl::StrJoin(rows, ",\n  ")
        << "\n]}\n";
  }
  return 0;
}
