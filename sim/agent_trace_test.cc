#include "sim/agent_trace.h"

#include <map>

#include "gtest/gtest.h"

namespace evoke::sim {
namespace {

TEST(AgentTraceTest, IsRepeatableOrderedAndShapedAsAsked) {
  AgentTraceOptions o;
  o.sessions = 400;
  const AgentTrace a = GenerateAgentTrace(o);
  const AgentTrace b = GenerateAgentTrace(o);
  ASSERT_EQ(a.turns.size(), b.turns.size());
  for (size_t i = 0; i < a.turns.size(); ++i) {
    EXPECT_EQ(a.turns[i].time_s, b.turns[i].time_s);
    EXPECT_EQ(a.turns[i].session, b.turns[i].session);
  }
  o.seed = 2;
  EXPECT_NE(GenerateAgentTrace(o).turns.size(), a.turns.size());

  std::map<uint32_t, uint32_t> written;  // Per session, blocks so far.
  std::map<uint32_t, int> prompt_uses;
  size_t tools = 0, pauses = 0, sessions_with_return = 0;
  std::map<uint32_t, int> visits_ended;
  for (size_t i = 0; i < a.turns.size(); ++i) {
    const AgentTurn& t = a.turns[i];
    if (i > 0) {
      EXPECT_LE(a.turns[i - 1].time_s, t.time_s);
    }
    // A turn reads what its session wrote before, in order.
    EXPECT_EQ(t.context_blocks, written[t.session]) << i;
    written[t.session] += t.new_blocks;
    EXPECT_GE(t.new_blocks, o.min_new_blocks);
    EXPECT_LE(t.new_blocks, o.max_new_blocks);
    EXPECT_LE(t.pause_s, o.max_pause_s);
    if (t.pause_s > 0) {
      ++pauses;
      tools += t.tool_call;
    } else if (++visits_ended[t.session] == 2) {
      ++sessions_with_return;
    }
    ++prompt_uses[t.prompt];
  }
  EXPECT_EQ(written.size(), o.sessions);
  // Tool calls and returns near the asked probabilities; the most popular
  // prompt (Zipf) used most.
  EXPECT_NEAR(static_cast<double>(tools) / pauses, o.tool_call_probability, 0.05);
  EXPECT_NEAR(static_cast<double>(sessions_with_return) / o.sessions, o.return_probability,
              0.07);
  EXPECT_GT(prompt_uses[0], prompt_uses[o.system_prompts - 1] * 4);
}

}  // namespace
}  // namespace evoke::sim
