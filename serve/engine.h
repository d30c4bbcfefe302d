// evoke-serve's engine: one llama.cpp context whose unified KV cache of
// `kv_budget` cells all conversations share, `slots` sequences decoding
// together (one batched llama_decode per step, a token for each active
// request), and evoked behind it.
//
// Conversations are recognised by their tokens, with no session id: a
// request's prompt is matched against what each idle slot holds (the
// longest common prefix is kept, only the rest is prefilled), else against
// the prefix blocks evoked holds (KvAdapter::LoadLongestPrefix: content-
// addressed blocks of `block_tokens` tokens, chained from the first), which
// every request's full blocks are saved as when it ends (write-through, so
// they outlive the slot, a restart of evoke-serve, and are shared by every
// evoke-serve on the host). An idle slot's cells are given up, least
// recently used first, when a new request needs room; they are in evoked.
//
// Requests beyond the slots wait in a queue (at most `max_queue`, each at
// most `queue_wait`), then are refused with 429.
//
// Not yet: a KV budget smaller than one conversation (evicting within a
// conversation under a policy, and recovering from evoked, as
// LlamaPolicySession does for one sequence). A conversation longer than
// kv_budget is refused (400, context_length_exceeded).
#ifndef EVOKE_SERVE_ENGINE_H_
#define EVOKE_SERVE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "evoke/client.h"
#include "serve/openai_api.h"
#include "serve/request_stream.h"

namespace evoke::serve {

struct EngineOptions {
  std::string model_path;         // A GGUF file (Llama-architecture, attention only).
  std::string model_name;         // The id clients ask for; empty: the file's stem.
  uint32_t slots = 4;             // Requests decoding at once.
  uint32_t kv_budget = 8192;      // KV cells all conversations share.
  uint32_t block_tokens = 64;     // Prefix blocks saved to evoked.
  uint32_t max_prompt_tokens = 0;  // 0: kv_budget - 1.
  int64_t default_max_tokens = 256;
  int64_t max_tokens_limit = 4096;  // The most a request may ask for.
  uint32_t max_queue = 64;
  absl::Duration queue_wait = absl::Seconds(30);
  int threads = 0;                // 0: the machine's cores.
  std::string ns = "default";     // evoked namespace of the blocks.
  bool save_prefixes = true;      // Write-through of each request's full blocks.
};

struct EngineStats {
  uint64_t requests = 0, completed = 0, failed = 0, cancelled = 0, rejected_busy = 0;
  uint64_t prompt_tokens = 0;
  uint64_t reused_from_slot = 0;    // Prompt tokens a slot still held.
  uint64_t loaded_from_evoked = 0;  // Prompt tokens whose KV came from evoked.
  uint64_t prefilled = 0;           // Prompt tokens computed.
  uint64_t generated = 0;
  uint64_t prefix_blocks_saved = 0, prefix_save_errors = 0, prefix_load_errors = 0;
  uint64_t slots_given_up = 0;      // Idle slots' cells freed for another request.
  uint32_t active = 0, queued = 0;
};

class Engine {
 public:
  // Open loads the model, makes the context and a KvAdapter per slot over
  // `client` (which must outlive the engine), and starts the engine's
  // thread. NOT_FOUND / INVALID_ARGUMENT / FAILED_PRECONDITION for a model
  // it cannot serve, INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const EngineOptions& options,
                                                      Client* client);
  virtual ~Engine() = default;

  // Submit queues `request` (its model already checked) and returns its
  // stream at once (a full queue: a 429 on it).
  virtual std::shared_ptr<RequestStream> Submit(GenerationRequest request) = 0;
  // Shutdown ends every request, waiting or decoding, with a 503 and
  // refuses new ones the same way; then the engine's thread stops. (The
  // destructor does it too.)
  virtual void Shutdown() = 0;
  virtual EngineStats stats() const = 0;
  virtual const std::string& model_name() const = 0;
  virtual int64_t created() const = 0;  // The model file's time (Unix s).
  virtual const Limits& limits() const = 0;
};

}  // namespace evoke::serve

#endif  // EVOKE_SERVE_ENGINE_H_
