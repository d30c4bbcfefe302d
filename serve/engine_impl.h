// evoke-serve's engine, inside: the request waiting for a slot, the slot,
// and EngineImpl, whose methods live in engine.cc (start, the loop, text)
// and engine_slots.cc (choosing a slot, prefilling, decoding, ending).
// Private to serve/.
#ifndef EVOKE_SERVE_ENGINE_IMPL_H_
#define EVOKE_SERVE_ENGINE_IMPL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engines/llama/attention_capture.h"
#include "engines/llama/kv_adapter.h"
#include "engines/llama/random_model.h"
#include "llama.h"
#include "serve/conversation.h"
#include "serve/engine.h"

namespace evoke::serve {

struct SamplerDeleter {
  void operator()(llama_sampler* s) const { llama_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<llama_sampler, SamplerDeleter>;

inline ApiError ServerError(const std::string& message) {
  ApiError e;
  e.http_status = 500;
  e.type = "server_error";
  e.message = message;
  return e;
}

inline ApiError Busy(const std::string& message) {
  ApiError e;
  e.http_status = 429;
  e.type = "requests";
  e.code = "rate_limit_exceeded";
  e.message = message;
  return e;
}

inline ApiError Stopping() {
  ApiError e;
  e.http_status = 503;
  e.type = "server_error";
  e.message = "evoke-serve is stopping";
  return e;
}

inline ApiError TooLong(const std::string& param, const std::string& message) {
  ApiError e = InvalidParam(param, message);
  e.code = "context_length_exceeded";
  return e;
}

struct Pending {
  std::shared_ptr<RequestStream> stream;
  GenerationRequest request;
  std::vector<llama_token> prompt;  // Tokenized by the submitting thread.
  absl::Time deadline;
};

struct Slot {
  llama_seq_id seq = 0;
  std::unique_ptr<llama::KvAdapter> adapter;
  std::vector<llama_token> tokens;  // Decoded, at positions [0, n) (no conv).
  // A conversation longer than the slot's share, under the policy; then
  // `tokens` is empty and conv->history() is what the slot holds.
  std::unique_ptr<PolicyConversation> conv;
  ConversationStats counted;  // conv's stats already in EngineStats.
  std::string session;        // X-Evoke-Session of its last request.
  uint64_t last_used = 0;
  // The request it serves (none: idle).
  std::shared_ptr<RequestStream> stream;
  SamplerPtr sampler;
  std::unique_ptr<StopMatcher> stop;
  llama_token next = -1;  // Sampled, not decoded yet.
  int64_t generated = 0, max_tokens = 0;
  Usage usage;
  // The request's prompt; [0, prefilled) of it is in the cache (or in
  // conv's), the rest is decoded by the engine's steps, a chunk at a time.
  std::vector<llama_token> prompt;
  size_t prefilled = 0;
  bool active() const { return stream != nullptr; }
  bool prefilling() const { return active() && prefilled < prompt.size(); }
  const std::vector<llama_token>& history() const { return conv ? conv->history() : tokens; }
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& o, Client* client) : options_(o), client_(client) {}
  ~EngineImpl() override {
    Shutdown();
    slots_.clear();  // Adapters before the context.
    ctx_.reset();
    model_.reset();
  }

  absl::Status Init();

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  std::shared_ptr<RequestStream> Submit(GenerationRequest request) override {
    auto stream = std::make_shared<RequestStream>();
    // Here, on the caller's thread: a long prompt's tokenization never
    // holds up the decoding of others (the vocabulary is read-only).
    std::vector<llama_token> prompt = Tokenize(Render(request));
    absl::MutexLock lock(&mu_);
    ++stats_.requests;
    if (stop_) {
      stream->Fail(Stopping());
      return stream;
    }
    if (queue_.size() >= options_.max_queue) {
      ++stats_.rejected_busy;
      stream->Fail(Busy(absl::StrCat("all ", options_.slots, " slots are busy and ",
                                     queue_.size(), " requests wait; retry later")));
      return stream;
    }
    queue_.push_back(
        {stream, std::move(request), std::move(prompt), absl::Now() + options_.queue_wait});
    return stream;
  }

  EngineStats stats() const override {
    absl::MutexLock lock(&mu_);
    EngineStats s = stats_;
    s.queued = static_cast<uint32_t>(queue_.size());
    return s;
  }
  const std::string& model_name() const override { return name_; }
  int64_t created() const override { return created_; }
  const Limits& limits() const override { return limits_; }

 private:
  enum class Started { kYes, kFailed, kLater };

  void Loop();
  Started Start(Pending& p);
  void Step();
  // Emit handles a sampled token: its text, and whether the request ends.
  void Emit(Slot& s, llama_token token);
  void FinishSlot(Slot& s, const std::string& reason);
  void FailSlot(Slot& s, const ApiError& e);
  // Detach ends the slot's hold on its request (stream, sampler, stops).
  void Detach(Slot& s);
  void ClearSlot(Slot& s);
  std::vector<llama_token> Tokenize(const std::string& text) const;
  std::string Render(const GenerationRequest& r) const;
  std::string Piece(llama_token t) const;
  SamplerPtr MakeSampler(const Sampling& s);
  uint64_t CellsInUse() const;
  uint64_t CellsOf(const Slot& s) const;
  // The slot for `p`: the idle slot its X-Evoke-Session names, else the one
  // holding the longest start of its prompt, else an empty or the coldest.
  // `*keep`: the tokens of the slot's history that begin the prompt.
  Slot* Choose(const Pending& p, size_t* keep);
  // Gives up idle slots' cells (least recently used first) until `need`
  // more cells fit beside the others; false when only an active request's
  // end can make room.
  bool MakeRoom(const Slot& slot, uint64_t need);
  // StartPolicy continues (or starts) `slot`'s conversation under the
  // policy with the prompt; `keep`: tokens of the slot's history that begin
  // it. False with the request failed.
  bool StartPolicy(Slot& slot, Pending& p, size_t keep, Usage* usage);
  // OrderPrefills sorts prompts being decoded: the one admitted first, then
  // the others shortest remaining first. PrefillQuantum: the tokens `s` may
  // decode this step, of `left` (the first of several gets half of `step`).
  static std::vector<Slot*>& OrderPrefills(std::vector<Slot*>* slots);
  static size_t PrefillQuantum(const Slot& s, const std::vector<Slot*>& order, size_t left,
                               size_t step);
  // LoadPrefix loads the prompt's prefix blocks evoked holds into the slot
  // (at most max_tokens) and returns the tokens loaded; a failure is
  // counted and logged, and the slot cleared (0).
  uint64_t LoadPrefix(Slot& slot, absl::Span<const llama_token> prompt, uint32_t max_tokens);
  // CountPrompt adds an admitted prompt to the stats: `tokens` in all, of
  // which `reused` from the slot and `loaded` from evoked; the rest are
  // prefilled.
  void CountPrompt(uint64_t tokens, uint64_t reused, uint64_t loaded);
  // Account adds the slot's conversation's new policy counts to the stats.
  void Account(Slot& s);
  void Count(uint64_t EngineStats::*field, uint64_t n = 1) {
    absl::MutexLock lock(&mu_);
    stats_.*field += n;
  }

  const EngineOptions options_;
  Client* const client_;
  std::string name_;
  int64_t created_ = 0;
  Limits limits_;
  llama::ModelPtr model_;
  llama::ContextPtr ctx_;
  const llama_vocab* vocab_ = nullptr;
  std::string chat_template_;  // Empty: the plain "role : content" form.
  std::vector<Slot> slots_;    // Only the engine's thread touches them.
  llama_context_params cparams_{};
  bool policy_on_ = false;
  PolicyConfig policy_;        // Of conversations longer than share_.
  uint64_t share_ = 0;         // A slot's share of the budget: kv_budget / slots.
  std::unique_ptr<llama::AttentionCapture> capture_;
  llama::AdapterOptions conv_adapter_;  // What each conversation's adapter shares.
  std::string instance_;
  uint64_t conversations_ = 0;
  uint64_t max_prompt_default_ = 0;  // Under a policy: the model's trained context at least.
  uint64_t tick_ = 0;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace evoke::serve

#endif  // EVOKE_SERVE_ENGINE_IMPL_H_
