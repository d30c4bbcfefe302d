#include "serve/conversation.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace evoke::serve {

absl::StatusOr<std::unique_ptr<PolicyConversation>> PolicyConversation::Open(
    llama_context* ctx, const llama_context_params& cparams, llama::AttentionCapture* capture,
    Client* client, llama::AdapterOptions adapter_options, const PolicyConfig& config,
    absl::Span<const llama_token> adopt) {
  if (adopt.size() > config.budget_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("adopt: ", adopt.size(),
                                                   " tokens exceed the conversation's budget of ",
                                                   config.budget_tokens));
  }
  auto c = std::unique_ptr<PolicyConversation>(new PolicyConversation());
  c->ctx_ = ctx;
  c->client_ = client;
  c->ns_ = adapter_options.ns;
  c->session_id_ = adapter_options.session_id;
  EVOKE_ASSIGN_OR_RETURN(c->adapter_,
                         llama::KvAdapter::Open(ctx, cparams, client, std::move(adapter_options)));
  llama::SessionOptions so;
  so.policy = config.policy;
  so.params = config.params;
  so.budget_tokens = config.budget_tokens;
  so.summary_layer = config.summary_layer;
  so.adopt = true;
  EVOKE_ASSIGN_OR_RETURN(c->session_,
                         llama::LlamaPolicySession::Create(ctx, capture, c->adapter_.get(), client,
                                                           c->ns_, c->session_id_, so));
  EVOKE_RETURN_IF_ERROR(c->session_->Adopt(adopt));
  c->history_.assign(adopt.begin(), adopt.end());
  return c;
}

PolicyConversation::~PolicyConversation() {
  if (adapter_ != nullptr) {
    llama_memory_seq_rm(llama_get_memory(ctx_), adapter_->seq(), -1, -1);
  }
  session_.reset();
  adapter_.reset();
  // Its blocks are of no use without the books: let evoked free them.
  if (client_ != nullptr && !session_id_.empty()) (void)client_->DropSession(ns_, session_id_);
}

std::optional<size_t> PolicyConversation::Keep(absl::Span<const llama_token> prompt) const {
  if (prompt.empty()) return std::nullopt;
  const size_t n =
      std::mismatch(history_.begin(), history_.end(), prompt.begin(), prompt.end()).first -
      history_.begin();
  // The prompt's last token is decoded for its logits.
  const size_t target = std::min(n, prompt.size() - 1);
  if (target == history_.size()) return target;
  const size_t boundary = history_.size() - session_->pending_tokens();
  if (target >= boundary) return boundary;
  return std::nullopt;
}

absl::Status PolicyConversation::BeginTurn(absl::Span<const llama_token> prompt, size_t keep) {
  if (keep >= prompt.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("keep: ", keep, " leaves nothing of a prompt of ", prompt.size()));
  }
  if (keep < history_.size()) {
    EVOKE_ASSIGN_OR_RETURN(uint64_t dropped, session_->DropPending());
    history_.resize(history_.size() - dropped);
    if (history_.size() != keep) {
      return absl::InternalError(absl::StrCat("rolled back to ", history_.size(),
                                              " tokens, not ", keep));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> PolicyConversation::ContinueTurn(absl::Span<const llama_token> prompt,
                                                      size_t* prefilled, size_t max_tokens) {
  if (*prefilled != history_.size() || *prefilled >= prompt.size()) {
    return absl::InternalError(absl::StrCat("turn at ", *prefilled, " of ", prompt.size(),
                                            " tokens, history ", history_.size()));
  }
  const size_t body_end = prompt.size() - 1;
  if (*prefilled < body_end) {
    const size_t n = std::min(max_tokens, body_end - *prefilled);
    const absl::Span<const llama_token> run = prompt.subspan(*prefilled, n);
    EVOKE_RETURN_IF_ERROR(session_->DecodeMany(run));
    history_.insert(history_.end(), run.begin(), run.end());
    *prefilled += n;
    if (*prefilled < body_end) return false;
  }
  EVOKE_RETURN_IF_ERROR(session_->RecoverAtPromptEnd());
  EVOKE_RETURN_IF_ERROR(Decode(prompt.back()));
  *prefilled = prompt.size();
  return true;
}

absl::Status PolicyConversation::Decode(llama_token token) {
  EVOKE_RETURN_IF_ERROR(session_->Decode(token));
  history_.push_back(token);
  return absl::OkStatus();
}

ConversationStats PolicyConversation::stats() const {
  ConversationStats s;
  const policy::DriverStats& d = session_->driver_stats();
  s.evicted = d.blocks_saved + d.blocks_dropped;
  s.recovered = d.blocks_recovered;
  s.recovery_failures = d.recovery_failures;
  s.lost = session_->engine_stats().blocks_lost;
  return s;
}

}  // namespace evoke::serve
