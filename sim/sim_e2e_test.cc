// evoke-sim against a real evoked: recovering policies save, spill to
// RocksDB, Recover and load re-anchored blocks, each checked.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "sim/evaluation.h"
#include "sim/evoked_process.h"
#include "sim/model.h"
#include "sim/runner.h"

#ifndef EVOKE_SIM_EVOKED_PATH
#define EVOKE_SIM_EVOKED_PATH "evoked"
#endif

namespace evoke::sim {
namespace {

std::unique_ptr<EvokedProcess> StartEvoked(const SimParams& p) {
  EvokedProcessOptions o;
  o.binary = EVOKE_SIM_EVOKED_PATH;
  o.pinned_bytes = "4MiB";  // 8 blocks of 512 KiB: the rest spills.
  o.summary_layer = p.recovery_layer;
  absl::StatusOr<std::unique_ptr<EvokedProcess>> e = EvokedProcess::Start(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

TEST(SimE2E, MultifactRecoversVerifiedBlocksThroughEvoked) {
  SimParams p;
  p.session_tokens = 3072;
  std::unique_ptr<EvokedProcess> evoked = StartEvoked(p);
  ASSERT_NE(evoked, nullptr);
  absl::StatusOr<std::unique_ptr<Client>> client = evoked->Connect();
  ASSERT_TRUE(client.ok()) << client.status();
  Session s(p, MakeScript(Task::kMultifact, 0, p), 1);
  for (const char* pol : {"evoke", "infllm"}) {
    RunConfig rc;
    rc.policy = pol;
    rc.layer_budgets = std::vector<uint32_t>(p.n_layers, 512);
    EvokedLink link{client->get(), std::string("e2e-") + pol};
    absl::StatusOr<RunResult> r = RunSession(s, rc, &link);
    ASSERT_TRUE(r.ok()) << pol << ": " << r.status();
    EXPECT_GT(r->blocks_saved, 0u) << pol;
    EXPECT_GT(r->blocks_recovered, 0u) << pol;
    EXPECT_EQ(r->blocks_verified, r->blocks_recovered) << pol;
    EXPECT_EQ(r->recovery_failures, 0u) << pol;
    EXPECT_EQ(r->probes, 5u);
    EXPECT_GT(r->bytes_moved, r->blocks_saved * PayloadBytes(p, 4));
  }
  // A recovery-less policy at the same budget on the same session.
  RunConfig rc;
  rc.policy = "streaming_llm";
  rc.layer_budgets = std::vector<uint32_t>(p.n_layers, 512);
  absl::StatusOr<RunResult> r = RunSession(s, rc, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->passes, 0u);
}

TEST(SimE2E, FullBudgetRecoveringPoliciesPassEveryProbe) {
  GridSpec spec;
  spec.policies = {"infllm", "evoke"};
  spec.budgets = {8192};
  spec.seed_begin = 0;
  spec.seed_end = 1;
  spec.params.session_tokens = 3072;
  spec.threads = 2;
  std::unique_ptr<EvokedProcess> evoked = StartEvoked(spec.params);
  ASSERT_NE(evoked, nullptr);
  absl::StatusOr<std::vector<Cell>> cells = RunGrid(spec, evoked.get());
  ASSERT_TRUE(cells.ok()) << cells.status();
  for (const Cell& c : *cells) {
    EXPECT_EQ(c.passes, c.probes) << c.task << " " << c.policy;
    EXPECT_EQ(c.blocks_saved, 0u);
  }
}

}  // namespace
}  // namespace evoke::sim
