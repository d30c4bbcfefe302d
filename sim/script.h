// evoke-sim's tasks: the script of one session (which tokens are filler,
// which state a fact, where the recovery points and probes are). Layouts are
// drawn per seed: where each fact sits, how many facts a multi-fact session
// has, where the lures go, which agentic turns refer to the fact
// (docs/simulator.md describes each task).
#ifndef EVOKE_SIM_SCRIPT_H_
#define EVOKE_SIM_SCRIPT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sim/params.h"

namespace evoke::sim {

enum class Task { kNiah, kMultifact, kAgentic };
std::string TaskName(Task task);
absl::StatusOr<Task> ParseTask(absl::string_view name);
std::vector<Task> AllTasks();

// NIAH runs one session per depth stratum and seed: variant v puts the
// needle at a depth drawn uniformly in [v, v + 1) / kNiahVariants of the
// session.
inline constexpr uint32_t kNiahVariants = 5;

// Variants of a task per seed (NIAH: one session per depth stratum).
uint32_t TaskVariants(Task task);

// One event of a session script.
struct Event {
  enum class Kind {
    kFiller,     // `count` filler tokens.
    kFact,       // `count` tokens of fact `fact`.
    kReference,  // `count` filler tokens whose queries look for `fact`.
    kRecovery,   // A recovery point with a query for `fact` (-1: noise).
    kProbe,      // Does the model retrieve `fact` now?
  };
  Kind kind = Kind::kFiller;
  uint32_t count = 0;
  int32_t fact = -1;
};

// A fact of a session: a probed fact, a lure of one, or an agentic
// distractor. Every fact has one span of fact_tokens tokens.
struct FactInfo {
  int32_t lure_of = -1;      // The probed fact this is a lure of, or -1.
  double cosine = 0;         // Lures: cosine of its direction with lure_of's.
  uint64_t first_token = 0;  // Where its span starts.
};

struct TaskScript {
  Task task = Task::kMultifact;
  uint32_t variant = 0;  // NIAH: the depth stratum; 0 otherwise.
  std::vector<Event> events;
  std::vector<FactInfo> facts;  // Indexed by fact id.
  uint32_t n_tokens = 0;        // Tokens of the session.
  uint32_t n_probes = 0;

  uint32_t n_facts() const { return static_cast<uint32_t>(facts.size()); }
};

// MakeScript builds the script of `task` for `seed` (the layout's own
// random stream; the same (task, variant, params, seed) gives the same
// script). Every probe is preceded by a recovery point for its fact.
//   niah       one needle in depth stratum `variant`, its lures anywhere
//              else, filler with a noise recovery point every turn_tokens;
//              then a recovery point and a probe for the needle;
//   multifact  multifact_{min,max}_facts facts and their lures at uniform
//              random places of the session, filler with turn recovery
//              points; then per fact, in a random order: recovery point,
//              probe, answer_tokens filler;
//   agentic    the fact in the first turn, then turns of turn_tokens: each
//              refers to the fact with probability 1 / reference_every
//              (recovery point, probe, reference tokens), the others are
//              distractor turns that state a new distractor fact (and hold
//              the fact's lures) at random places and start with a recovery
//              point for the previous distractor; a final probe.
// `params` must be valid (SimParams::Validate).
TaskScript MakeScript(Task task, uint32_t variant, const SimParams& params, uint64_t seed);

}  // namespace evoke::sim

#endif  // EVOKE_SIM_SCRIPT_H_
