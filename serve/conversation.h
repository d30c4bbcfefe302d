// evoke-serve's policy-managed conversations: one slot's conversation that
// is longer than the slot's share of the KV budget. A policy (policy/policy.h,
// EVOKE by default) keeps it within its budget: it evicts blocks to evoked
// as the conversation grows and, if it recovers, brings the blocks a query
// needs back to the tail, K re-anchored (engines/llama/policy_engine.h).
//
// The books (which block sits where, which are stored) live here, so a
// conversation continues under its policy only in the slot that holds it:
// its next turn decodes only what the turn adds. Its evicted blocks are a
// session of their own in evoked, dropped with the conversation.
//
// Not thread-safe: the engine's thread drives it, between llama_decode calls.
#ifndef EVOKE_SERVE_CONVERSATION_H_
#define EVOKE_SERVE_CONVERSATION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engines/llama/attention_capture.h"
#include "engines/llama/kv_adapter.h"
#include "engines/llama/policy_engine.h"
#include "evoke/client.h"
#include "llama.h"
#include "policy/policy.h"

namespace evoke::serve {

struct PolicyConfig {
  std::string policy = "evoke";  // One of policy::PolicyNames().
  policy::PolicyParams params;   // block_tokens as the server's.
  uint64_t budget_tokens = 0;    // Cells one conversation may hold.
  uint32_t summary_layer = 0;    // evoked's --summary-layer.
};

// What a conversation's policy did (summed into EngineStats).
struct ConversationStats {
  uint64_t evicted = 0, recovered = 0, recovery_failures = 0, lost = 0;
};

class PolicyConversation {
 public:
  // Open starts a conversation on `adapter_options.seq`, whose cells hold
  // `adopt` at positions [0, adopt.size()) (the start of the prompt, kept
  // from the slot or loaded from evoked; at most the budget) and nothing
  // else. Its evicted blocks go to evoked as session
  // `adapter_options.session_id`. `capture` (installed in the context) may
  // be null only for policies that neither recover nor read attention.
  static absl::StatusOr<std::unique_ptr<PolicyConversation>> Open(
      llama_context* ctx, const llama_context_params& cparams, llama::AttentionCapture* capture,
      Client* client, llama::AdapterOptions adapter_options, const PolicyConfig& config,
      absl::Span<const llama_token> adopt);
  // Removes the conversation's cells and drops its session in evoked.
  ~PolicyConversation();

  // Keep returns how many leading tokens of `prompt` the conversation keeps
  // when it continues with it: all it decoded when they begin the prompt
  // (and leave its last token to decode), else the tokens before its last
  // block boundary when the prompt differs only after it. nullopt: the
  // prompt does not continue this conversation.
  std::optional<size_t> Keep(absl::Span<const llama_token> prompt) const;

  // A turn: BeginTurn rolls back what differs after the last block
  // boundary (to `keep`, Keep's answer); then ContinueTurn decodes the
  // prompt from *prefilled (= keep at first) under the policy, at most
  // `max_tokens` tokens a call, so that other slots decode between the
  // calls: the prompt but its last token, then a recovery point at the
  // prompt's end and the last token (its logits: llama_get_logits_ith(ctx,
  // -1)), when it returns true.
  absl::Status BeginTurn(absl::Span<const llama_token> prompt, size_t keep);
  absl::StatusOr<bool> ContinueTurn(absl::Span<const llama_token> prompt, size_t* prefilled,
                                    size_t max_tokens);
  // Decode decodes one generated token (its logits at -1).
  absl::Status Decode(llama_token token);

  // Every token decoded, in the conversation's order (the positions in the
  // cache differ: recovered blocks sit at the tail).
  const std::vector<llama_token>& history() const { return history_; }
  ConversationStats stats() const;

 private:
  PolicyConversation() = default;

  llama_context* ctx_ = nullptr;
  Client* client_ = nullptr;
  std::string ns_, session_id_;
  std::unique_ptr<llama::KvAdapter> adapter_;
  std::unique_ptr<llama::LlamaPolicySession> session_;
  std::vector<llama_token> history_;
};

}  // namespace evoke::serve

#endif  // EVOKE_SERVE_CONVERSATION_H_
