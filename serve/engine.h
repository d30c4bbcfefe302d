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
//
// Conversations longer than a slot's share of the budget (kv_budget /
// slots, what llama-server gives each slot too) run under a policy
// (serve/conversation.h, EVOKE by default): it evicts blocks to evoked as
// the conversation grows and brings back those its queries need, so the
// slot never holds more than its share. Such a conversation continues in
// its slot with only what each turn adds decoded; when it comes back to
// another slot (after a restart, say), its prefix blocks evoked holds are
// loaded, up to the share, and the rest is decoded under the policy.
// Each of those slots decodes its tokens one llama_decode at a time (the
// policy acts between tokens); the others decode in one batch.
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
  // The policy of conversations longer than a slot's share (one of
  // policy::PolicyNames()), or "none": those are refused
  // (context_length_exceeded).
  std::string policy = "evoke";
  std::string policy_params;      // "key=value,..." (policy::ParsePolicyParams).
  // The layer whose pre-RoPE query recovers blocks: evoked's --summary-layer.
  // -1: the middle layer (evoked's default).
  int32_t summary_layer = -1;
  // Names this process's conversation sessions in evoked (unique per
  // process; empty: pid and start time).
  std::string instance;
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
  // Policy-managed conversations (longer than a slot's share).
  uint64_t policy_conversations = 0;  // Started (a conversation continued is not counted).
  uint64_t policy_evicted = 0, policy_recovered = 0, policy_recovery_failures = 0;
  uint64_t policy_blocks_lost = 0;   // Evicted unsaved while evoked was down.
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
