// A synthetic multi-session agent workload, to measure what a cache does
// for agents (issue #28): sessions that open on one of a few shared system
// prompts (Zipf popularity), take turns separated by tool calls (short
// pauses the agent framework knows about) or user think time (longer, not
// announced), and users who come back much later to a finished session.
//
// The trace is a list of turns in time order. A turn reads its session's
// whole context (the system prompt's blocks, then every block the session
// wrote before) and then writes its new blocks. Deterministic for a seed.
#ifndef EVOKE_SIM_AGENT_TRACE_H_
#define EVOKE_SIM_AGENT_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace evoke::sim {

struct AgentTraceOptions {
  uint64_t seed = 1;
  uint32_t sessions = 300;
  double mean_arrival_gap_s = 2.0;   // Poisson arrivals.
  uint32_t system_prompts = 16;
  double prompt_zipf_s = 1.0;        // Popularity of the system prompts.
  uint32_t prompt_blocks = 16;       // Blocks per system prompt.
  double mean_turns = 6.0;           // Per visit: 1 + geometric.
  uint32_t min_new_blocks = 2;       // Blocks a turn writes: uniform.
  uint32_t max_new_blocks = 6;
  double tool_call_probability = 0.7;  // Else the user thinks.
  double tool_median_s = 4.0;        // Log-normal pauses (sigma 1).
  double think_median_s = 20.0;
  double max_pause_s = 300.0;
  double return_probability = 0.3;   // A finished session comes back...
  double return_median_s = 300.0;    // ...this long after (log-normal).
};

struct AgentTurn {
  double time_s = 0;       // When the turn starts.
  uint32_t session = 0;
  uint32_t prompt = 0;     // Its system prompt.
  uint32_t context_blocks = 0;  // Session blocks written before this turn.
  uint32_t new_blocks = 0;
  // The pause that follows (0: the session's visit ends), and whether it is
  // a tool call (the framework knows it is coming and roughly how long).
  double pause_s = 0;
  bool tool_call = false;
};

struct AgentTrace {
  AgentTraceOptions options;
  std::vector<AgentTurn> turns;  // By time.
};

AgentTrace GenerateAgentTrace(const AgentTraceOptions& options);

// One line: sessions, turns, blocks read and written, tool calls, returns.
std::string DescribeAgentTrace(const AgentTrace& trace);

}  // namespace evoke::sim

#endif  // EVOKE_SIM_AGENT_TRACE_H_
