// evoke-eval: every policy on a GGUF model in llama.cpp, through a real
// evoked, on generated tasks (eval/tasks.h), graded by exact match.
//
//   evoke-eval --model FILE --tasks niah,multifact,agentic --policies LIST
//              --budgets LIST --seeds A-B [--context N] --json FILE
//              [--chart FILE.svg]
//
// Policies: full (the whole session in the cache, no evoked: the model's
// own quality), recency, streaming_llm, h2o, snapkv, infllm, evoke. Each
// (task, policy, budget) cell runs the sessions of seeds A..B of the
// evaluation split (never training sessions). Unless --evoked names a
// running daemon's socket, evoke-eval starts its own evoked with a small
// tier 1 (--pinned-bytes), so that blocks spill to RocksDB. See
// eval/session_runner.h for what the engine does and what it is told.
//
// Exit: 0 when every cell ran (sessions that failed are counted in the
// cell's "errors", and their probes as not passed); 1 when the model is
// refused, evoked cannot start, or the output cannot be written; 2 for bad
// flags (each message names its flag).
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "eval/eval_model.h"
#include "eval/report.h"
#include "eval/session_runner.h"
#include "eval/tasks.h"
#include "policy/policy.h"
#include "sim/evoked_process.h"

namespace {

using evoke::eval::Cell;

int Usage(const std::string& message) {
  std::fprintf(stderr, "evoke-eval: %s\n", message.c_str());
  return 2;
}

bool ParseSeeds(const std::string& text, uint64_t* first, uint64_t* last) {
  std::vector<std::string> parts = absl::StrSplit(text, '-');
  if (parts.size() == 1) parts.push_back(parts[0]);
  return parts.size() == 2 && absl::SimpleAtoi(parts[0], first) &&
         absl::SimpleAtoi(parts[1], last) && *first <= *last;
}

struct Job {
  size_t cell;
  uint64_t seed;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"evoke-eval: eviction and recovery policies on a real model, graded by exact "
               "match"};
  std::string model_path, json_path, chart_path, seeds_text = "0-29", evoked_socket;
  std::string pinned_bytes = "2MiB", params_spec;
  std::vector<std::string> tasks = {"niah", "multifact", "agentic"};
  std::vector<std::string> policies = {"full",   "recency", "streaming_llm", "h2o",
                                       "snapkv", "infllm",  "evoke"};
  std::vector<uint64_t> budgets = {512, 1024, 2048};
  uint32_t context = 4096, block = 64;
  int32_t summary_layer = -1;
  int jobs = 2, threads = 1;
  uint32_t prefetch = 0;
  bool quick = false;
  app.add_option("--model", model_path, "GGUF model (Llama architecture, evoke's vocabulary)")
      ->required();
  app.add_option("--tasks", tasks, "niah, multifact, agentic")->delimiter(',');
  app.add_option("--policies", policies, "full and/or policies")->delimiter(',');
  app.add_option("--budgets", budgets, "KV budgets in tokens")->delimiter(',');
  app.add_option("--seeds", seeds_text, "evaluation seeds A-B (inclusive)");
  app.add_option("--context", context, "tokens per session (default 4096)");
  app.add_option("--json", json_path, "write the results as JSON");
  app.add_option("--chart", chart_path, "write a pass-rate chart (SVG)");
  app.add_option("--block", block, "tokens per KV block (default 64)");
  app.add_option("--policy-params", params_spec, "policy parameters, key=value,...");
  app.add_option("--summary-layer", summary_layer,
                 "layer evoked summarises and recovery queries come from (default: middle)");
  app.add_option("--evoked", evoked_socket, "use the evoked at this socket instead of starting one");
  app.add_option("--pinned-bytes", pinned_bytes, "tier 1 of the evoked started here (default 2MiB)");
  app.add_option("--jobs", jobs, "sessions run at once (default 2)");
  app.add_option("--threads", threads, "llama.cpp threads per session (default 1)");
  app.add_option("--prefetch", prefetch,
                 "preloading: after each recovery ranking, prefetch the next N ranked blocks "
                 "into evoked's tier 1 (default 0: none)");
  app.add_flag("--quick", quick, "one short cell: context 1024 and the first 4 seeds");
  CLI11_PARSE(app, argc, argv);

  uint64_t first_seed = 0, last_seed = 0;
  if (!ParseSeeds(seeds_text, &first_seed, &last_seed)) {
    return Usage("--seeds: '" + seeds_text + "' is not A-B with A <= B");
  }
  if (quick) {
    context = std::min<uint32_t>(context, 1024);
    last_seed = std::min(last_seed, first_seed + 3);
  }
  if (jobs < 1 || threads < 1) return Usage("--jobs and --threads: at least 1");
  std::vector<evoke::eval::TaskKind> kinds;
  for (const std::string& t : tasks) {
    auto k = evoke::eval::ParseTaskKind(t);
    if (!k.ok() || evoke::eval::TrainingOnly(*k)) {
      return Usage("--tasks: '" + t + "' is not one of niah, multifact, agentic");
    }
    if (context < evoke::eval::MinSessionLength(*k)) {
      return Usage(absl::StrCat("--context: ", context, " is below the ",
                                evoke::eval::MinSessionLength(*k), " tokens task ", t, " needs"));
    }
    kinds.push_back(*k);
  }
  evoke::policy::PolicyParams params;
  params.block_tokens = block;
  if (!params_spec.empty()) {
    absl::Status s = evoke::policy::ParsePolicyParams(params_spec, &params);
    if (!s.ok()) return Usage("--policy-params: " + std::string(s.message()));
  }
  const std::vector<std::string> known = evoke::policy::PolicyNames();
  for (const std::string& p : policies) {
    if (p == evoke::eval::kFullPolicy) continue;
    if (std::find(known.begin(), known.end(), p) == known.end()) {
      return Usage("--policies: unknown policy '" + p + "' (full, " + absl::StrJoin(known, ", ") +
                   ")");
    }
    for (uint64_t b : budgets) {
      absl::Status s = evoke::policy::ValidateBudget(p, params, b);
      if (!s.ok()) {
        auto min = evoke::policy::MinBudget(p, params);
        return Usage(absl::StrCat("--budgets: ", b, " is below what ", p, " protects",
                                  min.ok() ? absl::StrCat(" (at least ", *min, " tokens)") : "",
                                  ": ", s.message()));
      }
    }
  }

  evoke::eval::StartLlama();
  auto model = evoke::eval::OpenEvalModel(model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "evoke-eval: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const int32_t n_layer = llama_model_n_layer(model->get());
  if (summary_layer < 0) summary_layer = n_layer / 2;
  if (summary_layer >= n_layer) {
    return Usage(absl::StrCat("--summary-layer: ", summary_layer, " but the model has ", n_layer,
                              " layers"));
  }

  std::unique_ptr<evoke::sim::EvokedProcess> daemon;
  if (evoked_socket.empty()) {
    evoke::sim::EvokedProcessOptions eo;
    eo.pinned_bytes = pinned_bytes;
    eo.summary_layer = static_cast<uint32_t>(summary_layer);
    auto d = evoke::sim::EvokedProcess::Start(eo);
    if (!d.ok()) {
      std::fprintf(stderr, "evoke-eval: %s\n", d.status().ToString().c_str());
      return 1;
    }
    daemon = *std::move(d);
    evoked_socket = daemon->socket();
  }

  std::vector<Cell> cells;
  for (size_t t = 0; t < kinds.size(); ++t) {
    for (const std::string& p : policies) {
      const bool full = p == evoke::eval::kFullPolicy;
      for (size_t b = 0; b < (full ? 1 : budgets.size()); ++b) {
        Cell c;
        c.task = tasks[t];
        c.policy = p;
        c.budget = full ? 0 : budgets[b];
        c.context = context;
        cells.push_back(c);
      }
    }
  }
  std::vector<Job> work;
  for (size_t c = 0; c < cells.size(); ++c) {
    for (uint64_t s = first_seed; s <= last_seed; ++s) work.push_back({c, s});
  }
  std::mutex mu;
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  const auto kind_of = [&](const Cell& c) { return *evoke::eval::ParseTaskKind(c.task); };
  auto worker = [&](int id) {
    evoke::ClientOptions co;
    co.target = evoked_socket;
    co.connect_timeout = absl::Seconds(5);
    co.call_timeout = absl::Seconds(30);
    std::unique_ptr<evoke::Client> client;
    for (size_t i; (i = next.fetch_add(1)) < work.size();) {
      const Job& job = work[i];
      Cell& cell = cells[job.cell];
      auto session = evoke::eval::MakeSession(evoke::eval::Split::kEval, kind_of(cell), context,
                                              job.seed);
      if (!session.ok()) {
        std::lock_guard<std::mutex> l(mu);
        cell.AddError(0, std::string(session.status().message()));
        continue;
      }
      if (client == nullptr && cell.policy != evoke::eval::kFullPolicy) {
        auto c = evoke::Client::Connect(co);
        if (c.ok()) client = *std::move(c);
      }
      evoke::eval::RunOptions ro;
      ro.policy = cell.policy;
      ro.params = params;
      ro.budget_tokens = cell.budget;
      ro.summary_layer = static_cast<uint32_t>(summary_layer);
      ro.threads = threads;
      ro.prefetch = prefetch;
      ro.session_id = absl::StrFormat("%s-%s-%u-%u-%d-%d", cell.task, cell.policy, cell.budget,
                                      job.seed, getpid(), id);
      absl::StatusOr<evoke::eval::SessionResult> r =
          client == nullptr && cell.policy != evoke::eval::kFullPolicy
              ? absl::UnavailableError("evoked: cannot connect to " + evoked_socket)
              : evoke::eval::RunSession(model->get(), client.get(), *session, ro);
      std::lock_guard<std::mutex> l(mu);
      if (r.ok()) {
        cell.Add(*r);
      } else {
        cell.AddError(static_cast<uint32_t>(session->probes.size()), r.status().ToString());
      }
      const size_t d = ++done;
      if (d % 10 == 0 || d == work.size()) {
        std::fprintf(stderr, "evoke-eval: %zu/%zu sessions\n", d, work.size());
      }
    }
  };
  std::vector<std::thread> pool;
  for (int j = 0; j < jobs; ++j) pool.emplace_back(worker, j);
  for (std::thread& t : pool) t.join();
  // evoked's own view of the run (its tiers' hits, and what preloading's
  // prefetches came to), when it answers.
  std::string evoked_counters = "null";
  {
    evoke::ClientOptions co;
    co.target = evoked_socket;
    co.connect_timeout = absl::Seconds(5);
    if (auto c = evoke::Client::Connect(co); c.ok()) {
      if (absl::StatusOr<evoke::v1::StatResponse> s = (*c)->Stat(); s.ok()) {
        const evoke::v1::Counters& k = s->counters();
        evoked_counters = absl::StrFormat(
            "{\"hits_tier1\":%u,\"hits_tier2\":%u,\"prefetched\":%u,\"prefetch_hits\":%u,"
            "\"prefetch_unused\":%u}",
            k.hits_tier1(), k.hits_tier2(), k.prefetched(), k.prefetch_hits(),
            k.prefetch_unused());
      }
    }
  }

  const std::string note = absl::StrFormat(
      "%s; context %u tokens, blocks of %u, recovery layer %d, evaluation seeds %u-%u",
      model_path, context, block, summary_layer, first_seed, last_seed);
  std::printf("evoke-eval: %s\n\n%s", note.c_str(), evoke::eval::CellsToMarkdown(cells).c_str());
  if (!json_path.empty()) {
    std::vector<std::string> args(argv, argv + argc);
    std::string command;
    for (const std::string& a : args) absl::StrAppend(&command, command.empty() ? "" : " ", a);
    std::string escaped;
    for (char ch : command) {
      if (ch == '"' || ch == '\\') escaped += '\\';
      escaped += ch;
    }
    const std::string header = absl::StrFormat(
        "\"command\":\"%s\",\"model\":\"%s\",\"context\":%u,\"block\":%u,\"summary_layer\":%d,"
        "\"seeds\":[%u,%u],\"evoked_counters\":%s",
        escaped, model_path, context, block, summary_layer, first_seed, last_seed,
        evoked_counters);
    std::ofstream f(json_path + ".tmp");
    f << evoke::eval::CellsToJson(cells, header);
    f.close();
    if (!f.good() || std::rename((json_path + ".tmp").c_str(), json_path.c_str()) != 0) {
      std::fprintf(stderr, "evoke-eval: --json: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  if (!chart_path.empty()) {
    std::ofstream f(chart_path);
    f << evoke::eval::CellsToSvg(cells, "evoke-eval: " + note);
    if (!f.good()) {
      std::fprintf(stderr, "evoke-eval: --chart: cannot write %s\n", chart_path.c_str());
      return 1;
    }
  }
  return 0;
}
