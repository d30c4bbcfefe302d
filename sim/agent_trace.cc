#include "sim/agent_trace.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_format.h"

namespace evoke::sim {
namespace {

double LogNormal(std::mt19937_64& rng, double median, double cap) {
  std::lognormal_distribution<double> d(std::log(median), 1.0);
  return std::min(d(rng), cap);
}

}  // namespace

AgentTrace GenerateAgentTrace(const AgentTraceOptions& o) {
  AgentTrace trace;
  trace.options = o;
  std::mt19937_64 rng(o.seed);
  std::vector<double> weights;
  for (uint32_t p = 0; p < o.system_prompts; ++p) {
    weights.push_back(1.0 / std::pow(p + 1.0, o.prompt_zipf_s));
  }
  std::discrete_distribution<uint32_t> prompt(weights.begin(), weights.end());
  std::exponential_distribution<double> arrival(1.0 / o.mean_arrival_gap_s);
  // Turns per visit: 1 + geometric with mean mean_turns - 1.
  std::geometric_distribution<uint32_t> extra_turns(1.0 / std::max(1.0, o.mean_turns));
  std::uniform_int_distribution<uint32_t> new_blocks(o.min_new_blocks, o.max_new_blocks);
  std::bernoulli_distribution tool(o.tool_call_probability);
  std::bernoulli_distribution returns(o.return_probability);

  double start = 0;
  for (uint32_t s = 0; s < o.sessions; ++s) {
    start += arrival(rng);
    const uint32_t p = prompt(rng);
    uint32_t written = 0;
    double t = start;
    // The first visit, then perhaps one return.
    for (int visit = 0; visit < 2; ++visit) {
      const uint32_t turns = 1 + extra_turns(rng);
      for (uint32_t k = 0; k < turns; ++k) {
        AgentTurn turn;
        turn.time_s = t;
        turn.session = s;
        turn.prompt = p;
        turn.context_blocks = written;
        turn.new_blocks = new_blocks(rng);
        written += turn.new_blocks;
        if (k + 1 < turns) {
          turn.tool_call = tool(rng);
          turn.pause_s = LogNormal(rng, turn.tool_call ? o.tool_median_s : o.think_median_s,
                                   o.max_pause_s);
          t += turn.pause_s;
        }
        trace.turns.push_back(turn);
      }
      if (visit == 1 || !returns(rng)) break;
      t += LogNormal(rng, o.return_median_s, 10 * o.return_median_s);
    }
  }
  std::stable_sort(trace.turns.begin(), trace.turns.end(),
                   [](const AgentTurn& a, const AgentTurn& b) { return a.time_s < b.time_s; });
  return trace;
}

std::string DescribeAgentTrace(const AgentTrace& trace) {
  uint64_t read = 0, written = 0, tools = 0;
  for (const AgentTurn& t : trace.turns) {
    read += trace.options.prompt_blocks + t.context_blocks;
    written += t.new_blocks;
    tools += t.tool_call;
  }
  const double span = trace.turns.empty() ? 0 : trace.turns.back().time_s;
  return absl::StrFormat(
      "%u sessions, %zu turns over %.0f s, %u system prompts (zipf %.2f), %llu blocks read, "
      "%llu written, %llu tool calls",
      trace.options.sessions, trace.turns.size(), span, trace.options.system_prompts,
      trace.options.prompt_zipf_s, static_cast<unsigned long long>(read),
      static_cast<unsigned long long>(written), static_cast<unsigned long long>(tools));
}

}  // namespace evoke::sim
