#include "sim/evaluation.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "policy/layer_budgets.h"
#include "sim/evoked_process.h"
#include "sim/runner.h"

namespace evoke::sim {

std::vector<uint32_t> LayerBudgets(const LayerBudgetScheme& scheme, uint32_t n_layers,
                                   uint32_t budget) {
  if (!scheme.fixed.empty()) return scheme.fixed;
  if (scheme.name == "pyramid") return policy::PyramidBudgets(n_layers, budget);
  return policy::UniformBudgets(n_layers, budget);
}

namespace {

struct Config {
  std::string policy;
  uint32_t budget;
  size_t scheme;
  double alignment;  // < 0: a recovery-less policy.
};

struct SessionKey {
  Task task;
  uint32_t variant;
  uint64_t seed;
};

}  // namespace

absl::StatusOr<std::vector<Cell>> RunGrid(const GridSpec& spec, const EvokedProcess* evoked,
                                          std::vector<ProbeRow>* probe_log) {
  const SimParams& p = spec.params;
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  // Each task, policy, budget and budget scheme once: a repeated one would
  // run the same evoked session twice at the same time and count it twice.
  auto once = [](const auto& values, auto name_of, absl::string_view what) -> absl::Status {
    absl::flat_hash_set<std::string> seen;
    for (const auto& v : values) {
      if (!seen.insert(name_of(v)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": \"", name_of(v), "\" is given twice"));
      }
    }
    return absl::OkStatus();
  };
  EVOKE_RETURN_IF_ERROR(once(spec.tasks, [](Task t) { return TaskName(t); }, "tasks"));
  EVOKE_RETURN_IF_ERROR(once(spec.policies, [](const std::string& n) { return n; }, "policies"));
  EVOKE_RETURN_IF_ERROR(
      once(spec.budgets, [](uint32_t b) { return absl::StrCat(b); }, "budgets"));
  EVOKE_RETURN_IF_ERROR(
      once(spec.schemes, [](const LayerBudgetScheme& l) { return l.name; }, "layer budgets"));
  std::vector<double> alignments = spec.alignments;
  if (alignments.empty()) alignments = {p.query_alignment};
  for (double a : alignments) {
    if (!(a >= 0 && a <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("query alignment: ", a, " not in [0, 1]"));
    }
  }
  EVOKE_RETURN_IF_ERROR(once(
      alignments, [](double a) { return absl::StrFormat("%.4f", a); }, "query alignments"));
  std::vector<Config> configs;
  bool any_recovering = false;
  for (size_t si = 0; si < spec.schemes.size(); ++si) {
    std::vector<uint32_t> budgets = spec.budgets;
    if (!spec.schemes[si].fixed.empty()) {
      budgets = {static_cast<uint32_t>(std::lround(policy::MeanBudget(spec.schemes[si].fixed)))};
    }
    for (const std::string& pol : spec.policies) {
      // A mean budget below what the policy accepts is refused (single
      // layers of a non-uniform plan below it are raised and counted).
      policy::PolicyParams params = spec.policy_params;
      params.block_tokens = p.block_tokens;
      params.sink_tokens = p.sink_tokens;
      absl::StatusOr<uint64_t> least = policy::MinBudget(pol, params);
      if (!least.ok()) return least.status();
      for (uint32_t b : budgets) {
        if (b < *least) {
          return absl::InvalidArgumentError(absl::StrCat(
              "budgets: ", b, " tokens is below the least ", pol, " accepts (", *least,
              " with blocks of ", p.block_tokens, " and ", p.sink_tokens, " sink tokens)"));
        }
        if (IsRecovering(pol)) {
          for (double a : alignments) configs.push_back({pol, b, si, a});
        } else {
          configs.push_back({pol, b, si, -1});
        }
      }
      any_recovering = any_recovering || IsRecovering(pol);
    }
  }
  if (any_recovering && evoked == nullptr) {
    return absl::InvalidArgumentError("a recovering policy needs a running evoked");
  }
  std::vector<SessionKey> sessions;
  for (Task t : spec.tasks) {
    for (uint64_t seed = spec.seed_begin; seed < spec.seed_end; ++seed) {
      for (uint32_t v = 0; v < TaskVariants(t); ++v) sessions.push_back({t, v, seed});
    }
  }
  std::vector<RunResult> results(sessions.size() * configs.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  absl::Status first_error;
  auto worker = [&] {
    std::unique_ptr<Client> client;
    if (any_recovering) {
      absl::StatusOr<std::unique_ptr<Client>> c = evoked->Connect();
      if (!c.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = c.status();
        return;
      }
      client = std::move(*c);
    }
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= sessions.size()) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error.ok()) return;
      }
      const SessionKey& k = sessions[i];
      Session session(p, MakeScript(k.task, k.variant, p, k.seed), k.seed);
      for (size_t ci = 0; ci < configs.size(); ++ci) {
        const Config& c = configs[ci];
        RunConfig rc;
        rc.policy = c.policy;
        rc.layer_budgets = LayerBudgets(spec.schemes[c.scheme], p.n_layers, c.budget);
        rc.policy_params = spec.policy_params;
        if (c.alignment >= 0) rc.query_alignment = c.alignment;
        EvokedLink link;
        link.client = client.get();
        link.session_id = absl::StrCat("sim-", TaskName(k.task), "-v", k.variant, "-s", k.seed,
                                       "-", c.policy, "-b", c.budget, "-",
                                       spec.schemes[c.scheme].name, "-a",
                                       absl::StrFormat("%.4f", c.alignment));
        absl::StatusOr<RunResult> r = RunSession(session, rc, &link);
        if (!r.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.ok()) {
            first_error = absl::Status(
                r.status().code(),
                absl::StrCat(TaskName(k.task), " variant ", k.variant, " seed ", k.seed, " ",
                             c.policy, " b=", c.budget, " (", spec.schemes[c.scheme].name,
                             "): ", r.status().message()));
          }
          return;
        }
        results[i * configs.size() + ci] = std::move(*r);
      }
    }
  };
  const uint32_t n_threads = std::max(1u, spec.threads);
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < n_threads; ++t) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) return first_error;
  // Aggregate in a fixed order: task, scheme, policy, budget.
  std::vector<Cell> cells;
  for (Task t : spec.tasks) {
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      const Config& c = configs[ci];
      Cell cell;
      cell.task = TaskName(t);
      cell.policy = c.policy;
      cell.alignment = c.alignment;
      cell.budget = c.budget;
      cell.layer_budgets = spec.schemes[c.scheme].name;
      for (size_t si = 0; si < sessions.size(); ++si) {
        if (sessions[si].task != t) continue;
        const RunResult& r = results[si * configs.size() + ci];
        ++cell.sessions;
        cell.session_rate_sum += r.rate();
        cell.probes += r.probes;
        cell.passes += r.passes;
        cell.blocks_saved += r.blocks_saved;
        cell.blocks_recovered += r.blocks_recovered;
        cell.blocks_verified += r.blocks_verified;
        cell.bytes_moved += r.bytes_moved;
        cell.decode_steps += r.decode_steps;
        cell.recovery_failures += r.recovery_failures;
        cell.engine_seconds += r.engine_seconds;
        if (probe_log == nullptr) continue;
        for (size_t pi = 0; pi < r.probe_records.size(); ++pi) {
          const ProbeRecord& pr = r.probe_records[pi];
          ProbeRow row;
          row.task = cell.task;
          row.variant = sessions[si].variant;
          row.seed = sessions[si].seed;
          row.policy = c.policy;
          row.alignment = c.alignment;
          row.budget = c.budget;
          row.layer_budgets = cell.layer_budgets;
          row.probe = static_cast<uint32_t>(pi);
          row.fact = pr.fact;
          row.resident = pr.resident;
          row.distance = pr.distance;
          row.mass = pr.mass;
          row.layers = pr.layers;
          row.passed = pr.passed;
          probe_log->push_back(row);
        }
      }
      cells.push_back(cell);
    }
  }
  return cells;
}

}  // namespace evoke::sim
