#include "sim/script.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sim/random.h"

namespace evoke::sim {

std::string TaskName(Task task) {
  switch (task) {
    case Task::kNiah:
      return "niah";
    case Task::kMultifact:
      return "multifact";
    case Task::kAgentic:
      return "agentic";
  }
  return "?";
}

absl::StatusOr<Task> ParseTask(absl::string_view name) {
  for (Task t : AllTasks()) {
    if (TaskName(t) == name) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("task: unknown \"", name, "\" (known: niah, multifact, agentic)"));
}

std::vector<Task> AllTasks() { return {Task::kNiah, Task::kMultifact, Task::kAgentic}; }

uint32_t TaskVariants(Task task) { return task == Task::kNiah ? kNiahVariants : 1; }

namespace {

// The layout stream of a session (the other streams are the Session's).
constexpr uint64_t kLayoutStream = 3;

struct Span {
  uint32_t start;
  int32_t fact;
};

class ScriptBuilder {
 public:
  // With `turn_points`, a noise recovery point is inserted at every turn
  // boundary the tokens reach.
  ScriptBuilder(const SimParams& p, TaskScript* s, bool turn_points)
      : p_(p), s_(s), turn_points_(turn_points) {}

  uint32_t tokens() const { return s_->n_tokens; }

  void Filler(uint32_t n) { Tokens(Event::Kind::kFiller, n, -1); }
  void Fact(int32_t f) {
    s_->facts[static_cast<size_t>(f)].first_token = s_->n_tokens;
    Tokens(Event::Kind::kFact, p_.fact_tokens, f);
  }
  void Reference(int32_t f, uint32_t n) { Tokens(Event::Kind::kReference, n, f); }
  void Recovery(int32_t f) { s_->events.push_back({Event::Kind::kRecovery, 0, f}); }
  void Probe(int32_t f) {
    s_->events.push_back({Event::Kind::kProbe, 0, f});
    ++s_->n_probes;
  }
  // Tokens up to `end`, the facts of `spans` (non-overlapping, starting at
  // or after tokens()) where they start, filler elsewhere.
  void Spans(std::vector<Span> spans, uint32_t end) {
    std::sort(spans.begin(), spans.end(),
              [](const Span& a, const Span& b) { return a.start < b.start; });
    for (const Span& sp : spans) {
      Filler(sp.start - tokens());
      Fact(sp.fact);
    }
    Filler(end - tokens());
  }

 private:
  void Tokens(Event::Kind kind, uint32_t n, int32_t f) {
    while (n > 0) {
      const uint32_t take =
          turn_points_ ? std::min(n, p_.turn_tokens - s_->n_tokens % p_.turn_tokens) : n;
      if (!s_->events.empty() && s_->events.back().kind == kind && s_->events.back().fact == f) {
        s_->events.back().count += take;
      } else {
        s_->events.push_back({kind, take, f});
      }
      s_->n_tokens += take;
      n -= take;
      if (turn_points_ && s_->n_tokens % p_.turn_tokens == 0) Recovery(-1);
    }
  }
  const SimParams& p_;
  TaskScript* s_;
  bool turn_points_;
};

// PlaceSpans returns `n` span starts in [lo, hi - fact_tokens], uniform by
// rejection, overlapping neither each other nor `taken` (which gets them).
std::vector<uint32_t> PlaceSpans(Normal& rng, uint32_t n, uint32_t len, uint32_t lo, uint32_t hi,
                                 std::vector<uint32_t>* taken) {
  std::vector<uint32_t> out;
  auto free_at = [&](uint32_t start) {
    for (uint32_t t : *taken) {
      if (start < t + len && t < start + len) return false;
    }
    return true;
  };
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t start = lo;
    bool found = false;
    for (int attempt = 0; attempt < 100000 && !found; ++attempt) {
      start = static_cast<uint32_t>(rng.UniformInt(lo, hi - len));
      found = free_at(start);
    }
    // Validate() leaves room enough that rejection always finds a place;
    // a scan keeps this total anyway.
    for (start = found ? start : lo; !found && start + len <= hi; ++start) found = free_at(start);
    if (!found) break;
    taken->push_back(start);
    out.push_back(start);
  }
  return out;
}

// AddLures appends p.lures_per_fact lures of `fact` to the script's facts
// and returns their ids.
std::vector<int32_t> AddLures(const SimParams& p, Normal& rng, int32_t fact, TaskScript* s) {
  std::vector<int32_t> ids;
  for (uint32_t i = 0; i < p.lures_per_fact; ++i) {
    FactInfo lure;
    lure.lure_of = fact;
    lure.cosine = p.lure_cos_min + (p.lure_cos_max - p.lure_cos_min) * rng.Uniform();
    ids.push_back(static_cast<int32_t>(s->facts.size()));
    s->facts.push_back(lure);
  }
  return ids;
}

void Niah(const SimParams& p, Normal& rng, TaskScript* s) {
  ScriptBuilder b(p, s, /*turn_points=*/true);
  const uint32_t body = p.session_tokens - p.answer_tokens;
  const double depth =
      (std::min(s->variant, kNiahVariants - 1) + rng.Uniform()) / static_cast<double>(kNiahVariants);
  const uint32_t room = body - p.sink_tokens - p.fact_tokens;
  const uint32_t at =
      p.sink_tokens + static_cast<uint32_t>(std::lround(depth * static_cast<double>(room)));
  s->facts.push_back(FactInfo());
  std::vector<uint32_t> taken = {at};
  std::vector<Span> spans = {{at, 0}};
  const std::vector<int32_t> lures = AddLures(p, rng, 0, s);
  const std::vector<uint32_t> starts =
      PlaceSpans(rng, static_cast<uint32_t>(lures.size()), p.fact_tokens, p.sink_tokens, body,
                 &taken);
  for (size_t i = 0; i < starts.size(); ++i) spans.push_back({starts[i], lures[i]});
  b.Spans(spans, body);
  b.Recovery(0);
  b.Probe(0);
  b.Filler(p.answer_tokens);
}

void Multifact(const SimParams& p, Normal& rng, TaskScript* s) {
  ScriptBuilder b(p, s, /*turn_points=*/true);
  const uint32_t k =
      static_cast<uint32_t>(rng.UniformInt(p.multifact_min_facts, p.multifact_max_facts));
  const uint32_t body = p.session_tokens - k * p.answer_tokens;
  s->facts.resize(k);
  std::vector<int32_t> ids;
  for (uint32_t f = 0; f < k; ++f) ids.push_back(static_cast<int32_t>(f));
  for (uint32_t f = 0; f < k; ++f) {
    const std::vector<int32_t> lures = AddLures(p, rng, static_cast<int32_t>(f), s);
    ids.insert(ids.end(), lures.begin(), lures.end());
  }
  std::vector<uint32_t> taken;
  const std::vector<uint32_t> starts = PlaceSpans(rng, static_cast<uint32_t>(ids.size()),
                                                  p.fact_tokens, p.sink_tokens, body, &taken);
  std::vector<Span> spans;
  for (size_t i = 0; i < starts.size(); ++i) spans.push_back({starts[i], ids[i]});
  b.Spans(spans, body);
  // Probes in a random order (Fisher-Yates).
  std::vector<int32_t> order(ids.begin(), ids.begin() + k);
  for (uint32_t i = k; i > 1; --i) std::swap(order[i - 1], order[rng.UniformInt(0, i - 1)]);
  for (int32_t f : order) {
    b.Recovery(f);
    b.Probe(f);
    b.Filler(p.answer_tokens);
  }
}

void Agentic(const SimParams& p, Normal& rng, TaskScript* s) {
  ScriptBuilder b(p, s, /*turn_points=*/false);
  const uint32_t T = p.session_tokens;
  const uint32_t turns = (T - p.answer_tokens) / p.turn_tokens;  // Whole turns.
  s->facts.push_back(FactInfo());
  const std::vector<int32_t> lures = AddLures(p, rng, 0, s);
  // Turn kinds: turn 0 states the fact; later ones refer to it with
  // probability 1 / reference_every.
  std::vector<bool> reference(turns, false);
  std::vector<uint32_t> distractor_turns;
  for (uint32_t t = 1; t < turns; ++t) {
    reference[t] = rng.UniformInt(0, p.reference_every - 1) == 0;
    if (!reference[t]) distractor_turns.push_back(t);
  }
  // Spans per turn: the fact in turn 0, each lure in a random distractor
  // turn (turn 0 when there is none).
  std::vector<std::vector<int32_t>> turn_facts(turns);
  turn_facts[0].push_back(0);
  for (int32_t lure : lures) {
    const uint32_t t =
        distractor_turns.empty()
            ? 0
            : distractor_turns[rng.UniformInt(0, distractor_turns.size() - 1)];
    turn_facts[t].push_back(lure);
  }
  int32_t distractor = -1;  // Last distractor fact stated.
  for (uint32_t t = 0; t < turns; ++t) {
    const uint32_t start = t * p.turn_tokens;
    const uint32_t end = start + p.turn_tokens;
    if (reference[t]) {
      b.Recovery(0);
      b.Probe(0);
      b.Reference(0, p.reference_tokens);
      b.Filler(end - b.tokens());
      continue;
    }
    if (t > 0) {
      b.Recovery(distractor);
      distractor = static_cast<int32_t>(s->facts.size());
      s->facts.push_back(FactInfo());
      turn_facts[t].push_back(distractor);
    }
    std::vector<uint32_t> taken;
    const std::vector<uint32_t> starts =
        PlaceSpans(rng, static_cast<uint32_t>(turn_facts[t].size()), p.fact_tokens,
                   std::max(start, p.sink_tokens), end, &taken);
    std::vector<Span> spans;
    for (size_t i = 0; i < starts.size(); ++i) spans.push_back({starts[i], turn_facts[t][i]});
    b.Spans(spans, end);
  }
  b.Filler(T - p.answer_tokens - b.tokens());
  b.Recovery(0);
  b.Probe(0);
  b.Filler(p.answer_tokens);
}

}  // namespace

TaskScript MakeScript(Task task, uint32_t variant, const SimParams& params, uint64_t seed) {
  TaskScript s;
  s.task = task;
  s.variant = variant;
  Normal rng(StreamSeed(seed, static_cast<uint64_t>(task) << 8 | variant, kLayoutStream));
  switch (task) {
    case Task::kNiah:
      Niah(params, rng, &s);
      break;
    case Task::kMultifact:
      Multifact(params, rng, &s);
      break;
    case Task::kAgentic:
      Agentic(params, rng, &s);
      break;
  }
  return s;
}

}  // namespace evoke::sim
