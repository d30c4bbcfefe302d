#include "eval/report.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace evoke::eval {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;

TEST(Wilson95Test, KnownValues) {
  // Wilson score intervals at z = 1.96 (textbook values).
  auto [lo, hi] = Wilson95(0, 10);
  EXPECT_THAT(lo, DoubleNear(0.0, 1e-9));
  EXPECT_THAT(hi, DoubleNear(0.2775, 1e-4));
  std::tie(lo, hi) = Wilson95(5, 10);
  EXPECT_THAT(lo, DoubleNear(0.2366, 1e-4));
  EXPECT_THAT(hi, DoubleNear(0.7634, 1e-4));
  std::tie(lo, hi) = Wilson95(30, 30);
  EXPECT_THAT(lo, DoubleNear(0.8865, 1e-4));
  EXPECT_THAT(hi, DoubleNear(1.0, 1e-9));
  std::tie(lo, hi) = Wilson95(0, 0);
  EXPECT_EQ(lo, 0.0);
  EXPECT_EQ(hi, 1.0);
}

SessionResult Session(uint32_t passes, uint32_t probes) {
  SessionResult r;
  for (uint32_t i = 0; i < probes; ++i) {
    ProbeResult p;
    p.pass = i < passes;
    p.fact_rank = i == 0 ? -1 : static_cast<int32_t>(i);
    r.probes.push_back(p);
  }
  r.passes = passes;
  r.steps = 100;
  r.seconds = 0.5;
  return r;
}

TEST(CellTest, IntervalsAreOverSessionsAndOverProbes) {
  Cell c;
  c.task = "multifact";
  c.policy = "evoke";
  c.budget = 1024;
  c.Add(Session(4, 4));  // A session where everything passed...
  c.Add(Session(0, 8));  // ...and one where nothing did.
  EXPECT_EQ(c.passes, 4u);
  EXPECT_EQ(c.n, 12u);
  EXPECT_EQ(c.sessions, 2u);
  EXPECT_DOUBLE_EQ(c.rate(), 4.0 / 12);
  EXPECT_DOUBLE_EQ(c.session_mean(), 0.5);  // Sessions weigh the same.
  // Two sessions say little: the interval over sessions is far wider.
  const auto ws = c.wilson_sessions();
  const auto wp = c.wilson_probes();
  EXPECT_GT(ws.second - ws.first, wp.second - wp.first);
  EXPECT_DOUBLE_EQ(c.ms_per_step(), 1000.0 * 1.0 / 200);
  EXPECT_EQ(c.fact_rank["resident"], 2u);
  EXPECT_EQ(c.fact_rank["1"], 2u);
  c.AddError(5, "evoked: unavailable");
  EXPECT_EQ(c.errors, 1u);
  EXPECT_EQ(c.n, 17u);
  EXPECT_EQ(c.sessions, 3u);
  EXPECT_DOUBLE_EQ(c.session_mean(), 1.0 / 3);
}

TEST(ReportTest, JsonMarkdownAndSvgCarryTheCells) {
  Cell full;
  full.task = "niah";
  full.policy = "full";
  full.Add(Session(1, 1));
  Cell a;
  a.task = "niah";
  a.policy = "recency";
  a.budget = 512;
  a.Add(Session(0, 1));
  a.AddError(1, "a \"quoted\" message");
  const std::vector<Cell> cells = {full, a};
  const nlohmann::json j = nlohmann::json::parse(CellsToJson(cells, "\"context\":4096"));
  EXPECT_EQ(j["context"], 4096);
  ASSERT_EQ(j["cells"].size(), 2u);
  EXPECT_EQ(j["cells"][1]["first_error"], "a \"quoted\" message");
  EXPECT_EQ(j["cells"][1]["sessions"], 2);
  EXPECT_EQ(j["cells"][0]["fact_rank"].size(), 0u) << "no ranks for the full cache";
  const std::string md = CellsToMarkdown(cells);
  EXPECT_THAT(md, HasSubstr("| niah | full | all |"));
  EXPECT_THAT(md, HasSubstr("| niah | recency | 512 |"));
  const std::string svg = CellsToSvg(cells, "t");
  EXPECT_THAT(svg, HasSubstr("data-policy=\"recency\" data-x=\"512\" data-y=\"0.0000\""));
  EXPECT_THAT(svg, HasSubstr("data-policy=\"full\""));
}

}  // namespace
}  // namespace evoke::eval
