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
#include "sim/report.h"
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
  Session s(p, MakeScript(Task::kMultifact, 0, p, 1), 1);
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
    EXPECT_EQ(r->probes, s.script().n_probes);
    EXPECT_GT(r->bytes_moved, r->blocks_saved * PayloadBytes(p, 4));
  }
  // A recovery-less policy at the same budget on the same session passes
  // only the probes whose fact is still resident.
  RunConfig rc;
  rc.policy = "streaming_llm";
  rc.layer_budgets = std::vector<uint32_t>(p.n_layers, 512);
  absl::StatusOr<RunResult> r = RunSession(s, rc, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const ProbeRecord& pr : r->probe_records) {
    if (pr.resident == 0) {
      EXPECT_FALSE(pr.passed) << "fact " << pr.fact;
    }
  }
}

// The recovery query's alignment decides what recovery finds: an oracle
// query (rho = 1) brings the facts back, a query orthogonal to the fact
// (rho = 0) does no better than a recovery-less policy could by chance.
TEST(SimE2E, RecoveryDependsOnQueryAlignment) {
  GridSpec spec;
  spec.tasks = {Task::kMultifact};
  spec.policies = {"evoke", "infllm"};
  spec.budgets = {512};
  spec.alignments = {0.0, 1.0};
  spec.seed_begin = 0;
  spec.seed_end = 3;
  spec.params.session_tokens = 3072;
  spec.threads = 2;
  std::unique_ptr<EvokedProcess> evoked = StartEvoked(spec.params);
  ASSERT_NE(evoked, nullptr);
  std::vector<ProbeRow> log;
  absl::StatusOr<std::vector<Cell>> cells = RunGrid(spec, evoked.get(), &log);
  ASSERT_TRUE(cells.ok()) << cells.status();
  ASSERT_EQ(cells->size(), 4u);  // (evoke, infllm) x (0, 1).
  for (const Cell& c : *cells) {
    EXPECT_EQ(c.blocks_verified, c.blocks_recovered) << Label(c);
    EXPECT_EQ(c.recovery_failures, 0u) << Label(c);
    if (c.alignment == 1.0) {
      EXPECT_GE(c.rate(), 0.8) << Label(c);
    } else {
      EXPECT_LE(c.rate(), 0.5) << Label(c);
    }
  }
  // At rho = 0 a probe passes only on a fact that was still resident or
  // came back by chance; at rho = 1 most facts come back.
  EXPECT_GT((*cells)[1].rate(), (*cells)[0].rate() + 0.3);
  EXPECT_GT((*cells)[3].rate(), (*cells)[2].rate() + 0.3);
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
