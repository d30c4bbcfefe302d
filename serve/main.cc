// evoke-serve: an OpenAI-compatible server on llama.cpp whose conversations
// are kept in evoked (serve/engine.h says how), so that a returning
// conversation, after its slot was given up or the server restarted,
// continues from evoked instead of being prefilled again.
//
//   evoke-serve [--model FILE.gguf] [--port 8080] [--socket EVOKED.sock]
//
// Without --socket it starts its own evoked, with its data in --data-dir
// (kept across starts). SIGINT / SIGTERM stop it cleanly.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "llama.h"
#include "serve/engine.h"
#include "serve/http_server.h"
#include "sim/evoked_process.h"

namespace {

// The trained model: next to the build tree or the installed binary, or in
// the working directory.
std::string DefaultModel() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::vector<std::filesystem::path> candidates;
  if (!ec) {
    candidates.push_back(self.parent_path().parent_path().parent_path() / "models" /
                         "evoke-recall.gguf");
    candidates.push_back(self.parent_path().parent_path() / "share" / "evoke" /
                         "evoke-recall.gguf");
  }
  candidates.push_back("models/evoke-recall.gguf");
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c, ec)) return c.string();
  }
  return "models/evoke-recall.gguf";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace evoke;  // NOLINT: a tool's main.
  CLI::App app{"evoke-serve: an OpenAI-compatible server whose conversations live in evoked"};
  serve::EngineOptions eo;
  serve::HttpOptions ho;
  std::string socket, evoked_binary, data_dir = "evoke-serve-data", pinned = "256MiB";
  int64_t queue_wait_ms = 30000;
  int64_t evoked_timeout_ms = 5000;
  bool no_save = false;
  eo.model_path = DefaultModel();
  app.add_option("--model", eo.model_path, "GGUF model (default: the trained evoke-recall)")
      ->capture_default_str();
  app.add_option("--model-name", eo.model_name, "The id clients ask for (default: file stem)");
  app.add_option("--host", ho.host)->capture_default_str();
  app.add_option("--port", ho.port, "0: any free port")->capture_default_str();
  app.add_option("--api-key", ho.api_key, "Require Authorization: Bearer KEY");
  app.add_option("--socket", socket, "Use this evoked (else start one)");
  app.add_option("--evoked", evoked_binary, "evoked to start (default: next to this build)");
  app.add_option("--data-dir", data_dir, "The started evoked's directory (kept)")
      ->capture_default_str();
  app.add_option("--evoked-pinned-bytes", pinned, "The started evoked's tier 1")
      ->capture_default_str();
  app.add_option("--slots", eo.slots, "Requests decoding at once")->capture_default_str();
  app.add_option("--kv-budget", eo.kv_budget, "KV cells all conversations share")
      ->capture_default_str();
  app.add_option("--block-tokens", eo.block_tokens, "Tokens per prefix block in evoked")
      ->capture_default_str();
  app.add_option("--max-prompt-tokens", eo.max_prompt_tokens,
                 "0: kv-budget - 1, or with a policy the model's trained context if more")
      ->capture_default_str();
  app.add_option("--default-max-tokens", eo.default_max_tokens)->capture_default_str();
  app.add_option("--max-tokens", eo.max_tokens_limit, "The most a request may ask for")
      ->capture_default_str();
  app.add_option("--max-queue", eo.max_queue, "Requests waiting for a slot, at most")
      ->capture_default_str();
  app.add_option("--queue-wait-ms", queue_wait_ms, "Then 429")->capture_default_str();
  app.add_option("--threads", eo.threads, "llama.cpp threads (0: all cores)")
      ->capture_default_str();
  app.add_option("--namespace", eo.ns, "evoked namespace")->capture_default_str();
  app.add_option("--evoked-timeout-ms", evoked_timeout_ms,
                 "Deadline of each call to evoked (saves and loads stall decoding meanwhile)")
      ->check(CLI::Range(int64_t{10}, int64_t{600000}))
      ->capture_default_str();
  app.add_flag("--no-save-prefixes", no_save, "Do not write conversations to evoked");
  app.add_option("--policy", eo.policy,
                 "Policy of conversations longer than a slot's share of the KV budget "
                 "(kv-budget / slots): evoke, infllm, snapkv, h2o, streaming_llm, recency; "
                 "none refuses them")
      ->capture_default_str();
  app.add_option("--policy-params", eo.policy_params, "key=value,... (e.g. evoke_topk=4)");
  app.add_option("--summary-layer", eo.summary_layer,
                 "Layer whose query recovers blocks: evoked's --summary-layer (-1: the middle)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  eo.queue_wait = absl::Milliseconds(queue_wait_ms);
  // A thread for each request that may wait or decode, and some for /health,
  // /metrics and requests refused at once.
  ho.threads = static_cast<int>(eo.slots + eo.max_queue + 16);
  eo.save_prefixes = !no_save;

  // Signals go to one thread, which stops the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<sim::EvokedProcess> evoked;
  if (socket.empty()) {
    sim::EvokedProcessOptions po;
    po.binary = evoked_binary;
    po.dir = data_dir;
    po.pinned_bytes = pinned;
    po.summary_layer = eo.summary_layer;  // The engine asks Recover for the same layer.
    absl::StatusOr<std::unique_ptr<sim::EvokedProcess>> p = sim::EvokedProcess::Start(po);
    if (!p.ok()) {
      std::fprintf(stderr, "evoke-serve: %s\n", p.status().ToString().c_str());
      return 1;
    }
    evoked = *std::move(p);
    socket = evoked->socket();
  }
  ClientOptions co;
  co.target = socket;
  co.connect_timeout = absl::Seconds(5);
  // Saves and loads run on the engine's thread, between decode steps: a slow
  // evoked costs every slot at most this much per call, then the request is
  // prefilled instead (a load) or its blocks go unsaved (counted).
  co.call_timeout = absl::Milliseconds(evoked_timeout_ms);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(co);
  if (!client.ok()) {
    std::fprintf(stderr, "evoke-serve: evoked at %s: %s\n", socket.c_str(),
                 client.status().ToString().c_str());
    return 1;
  }
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
  absl::StatusOr<std::unique_ptr<serve::Engine>> engine = serve::Engine::Open(eo, client->get());
  if (!engine.ok()) {
    std::fprintf(stderr, "evoke-serve: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  serve::HttpServer server(engine->get(), ho);
  absl::StatusOr<int> port = server.Bind();
  if (!port.ok()) {
    std::fprintf(stderr, "evoke-serve: %s\n", port.status().ToString().c_str());
    return 1;
  }
  std::printf("evoke-serve: listening on http://%s:%d (model %s, %u slots, KV budget %u tokens, "
              "policy %s, evoked at %s)\n",
              ho.host.c_str(), *port, (*engine)->model_name().c_str(), eo.slots, eo.kv_budget,
              eo.policy.c_str(), socket.c_str());
  std::fflush(stdout);
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    (*engine)->Shutdown();  // Requests in flight end (503) so that handlers return.
    server.Stop();
  });
  server.Serve();
  // Served until a signal; wake the stopper if Serve ended otherwise.
  pthread_kill(stopper.native_handle(), SIGTERM);
  stopper.join();
  engine->reset();
  llama_backend_free();
  std::printf("evoke-serve: stopped\n");
  return 0;
}
