#include "serve/engine.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "engines/llama/attention_capture.h"
#include "engines/llama/kv_adapter.h"
#include "engines/llama/random_model.h"
#include "llama.h"
#include "policy/policy.h"
#include "serve/conversation.h"

namespace evoke::serve {
namespace {

struct SamplerDeleter {
  void operator()(llama_sampler* s) const { llama_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<llama_sampler, SamplerDeleter>;

ApiError ServerError(const std::string& message) {
  ApiError e;
  e.http_status = 500;
  e.type = "server_error";
  e.message = message;
  return e;
}

ApiError Busy(const std::string& message) {
  ApiError e;
  e.http_status = 429;
  e.type = "requests";
  e.code = "rate_limit_exceeded";
  e.message = message;
  return e;
}

ApiError Stopping() {
  ApiError e;
  e.http_status = 503;
  e.type = "server_error";
  e.message = "evoke-serve is stopping";
  return e;
}

ApiError TooLong(const std::string& param, const std::string& message) {
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
  bool active() const { return stream != nullptr; }
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

absl::Status EngineImpl::Init() {
  // llama.cpp takes at most 256 sequences; one is the adapters' scratch.
  if (options_.slots == 0 || options_.slots > 255) {
    return absl::InvalidArgumentError("slots: must be in [1, 255]");
  }
  policy_on_ = options_.policy != "none";
  if (!policy_on_ && options_.max_prompt_tokens >= options_.kv_budget) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_prompt_tokens: ", options_.max_prompt_tokens,
                     " leaves no room to answer in kv_budget ", options_.kv_budget));
  }
  if (options_.block_tokens == 0) return absl::InvalidArgumentError("block_tokens: 0");
  if (options_.max_queue == 0) {
    return absl::InvalidArgumentError("max_queue: 0 (every request waits in it, if briefly)");
  }
  if (options_.kv_budget < 2 * options_.block_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("kv_budget: ", options_.kv_budget,
                                                   " is less than two blocks of ",
                                                   options_.block_tokens, " tokens"));
  }
  share_ = options_.kv_budget / options_.slots;
  if (policy_on_) {
    policy_.policy = options_.policy;
    policy_.params.block_tokens = options_.block_tokens;
    if (absl::Status ps = policy::ParsePolicyParams(options_.policy_params, &policy_.params);
        !ps.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("policy_params: ", ps.message()));
    }
    policy_.budget_tokens = share_;
    if (absl::Status b = policy::ValidateBudget(policy_.policy, policy_.params, share_); !b.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "policy ", options_.policy, " with a slot's share of kv_budget / slots = ", share_,
          " tokens: ", b.message()));
    }
  }
  instance_ = !options_.instance.empty()
                  ? options_.instance
                  : absl::StrCat(getpid(), "-", absl::ToUnixMillis(absl::Now()));
  struct stat st;
  if (::stat(options_.model_path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model ", options_.model_path, ": no such file"));
  }
  created_ = st.st_mtime;
  name_ = options_.model_name.empty()
              ? std::filesystem::path(options_.model_path).stem().string()
              : options_.model_name;
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.progress_callback = [](float, void*) { return true; };  // No dots on stderr.
  model_.reset(llama_model_load_from_file(options_.model_path.c_str(), mp));
  if (model_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", options_.model_path, ": llama.cpp cannot load it (see its log above)"));
  }
  if (llama_model_is_recurrent(model_.get()) || llama_model_is_hybrid(model_.get()) ||
      llama_model_n_swa(model_.get()) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model ", options_.model_path, ": evoke-serve needs full attention in every layer"));
  }
  vocab_ = llama_model_get_vocab(model_.get());
  const int32_t n_layer = llama_model_n_layer(model_.get());
  const int32_t summary = options_.summary_layer < 0 ? n_layer / 2 : options_.summary_layer;
  if (summary >= n_layer) {
    return absl::InvalidArgumentError(absl::StrCat("summary_layer: ", summary,
                                                   ", but the model has ", n_layer, " layers"));
  }
  policy_.summary_layer = static_cast<uint32_t>(summary);
  if (const char* t = llama_model_chat_template(model_.get(), nullptr)) chat_template_ = t;
  llama_context_params p = llama_context_default_params();
  // Policy-managed slots stage a block at a time in the scratch sequence
  // (evictions, recoveries) beyond their share: room for it.
  p.n_ctx = options_.kv_budget + (policy_on_ ? 3 * options_.block_tokens + 64 : 0);
  p.n_batch = 512;
  p.n_ubatch = 512;
  p.n_seq_max = options_.slots + 1;  // The last: the adapters' scratch sequence.
  p.kv_unified = true;
  const int threads = options_.threads > 0
                          ? options_.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  p.n_threads = threads;
  p.n_threads_batch = threads;
  p.type_k = GGML_TYPE_F16;
  p.type_v = GGML_TYPE_F16;
  p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  if (policy_on_) {
    EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<policy::Policy> probe,
                           policy::MakePolicy(policy_.policy, policy_.params));
    const policy::PolicyInfo& info = probe->info();
    if (info.recovers || info.needs_attention) {
      // The recovery query's layer; attention of every layer only for the
      // policies that read it.
      llama::AttentionCaptureOptions co;
      co.query_layer = summary;
      if (!info.needs_attention) co.layers = {summary};
      capture_ = std::make_unique<llama::AttentionCapture>(co);
      capture_->Install(p);
    }
  }
  ctx_.reset(llama_init_from_model(model_.get(), p));
  if (ctx_ == nullptr) return absl::InternalError("llama_init_from_model failed");
  char desc[256];
  llama_model_desc(model_.get(), desc, sizeof(desc));
  for (uint32_t i = 0; i < options_.slots; ++i) {
    llama::AdapterOptions ao;
    ao.ns = options_.ns;
    ao.model_id = absl::StrCat("gguf:", name_);
    // What identifies the weights across copies of the file, cheaply.
    ao.model_revision = absl::StrCat(desc, "/", llama_model_size(model_.get()), "/",
                                     llama_model_n_params(model_.get()));
    ao.session_id = absl::StrCat("evoke-serve/", name_, "/slot-", i);
    ao.seq = static_cast<llama_seq_id>(i);
    ao.scratch_seq = static_cast<llama_seq_id>(options_.slots);
    conv_adapter_ = ao;
    absl::StatusOr<std::unique_ptr<llama::KvAdapter>> a =
        llama::KvAdapter::Open(ctx_.get(), p, client_, ao);
    if (!a.ok()) return a.status();
    Slot s;
    s.seq = ao.seq;
    s.adapter = *std::move(a);
    slots_.push_back(std::move(s));
  }
  cparams_ = p;
  max_prompt_default_ = std::max<uint64_t>(options_.kv_budget - 1,
                                           llama_model_n_ctx_train(model_.get()));
  limits_.models = {name_};
  limits_.max_tokens = policy_on_ ? options_.max_tokens_limit
                                  : std::min<int64_t>(options_.max_tokens_limit,
                                                      options_.kv_budget);
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void EngineImpl::Loop() {
  for (;;) {
    std::vector<Pending> admit;
    uint32_t active = 0;
    for (const Slot& s : slots_) active += s.active();
    {
      absl::MutexLock lock(&mu_);
      auto work = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stop_ || active > 0 || (!queue_.empty() && active < options_.slots);
      };
      mu_.AwaitWithTimeout(absl::Condition(&work), absl::Milliseconds(100));
      if (stop_) break;
      // Admit while slots are free, whatever a request's deadline: it bounds
      // the wait for a slot, and there is one.
      while (!queue_.empty() && active + admit.size() < options_.slots) {
        admit.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      const absl::Time now = absl::Now();
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (it->stream->cancelled()) {
          ++stats_.cancelled;
          it = queue_.erase(it);
        } else if (it->deadline <= now) {
          ++stats_.rejected_busy;
          it->stream->Fail(Busy(absl::StrCat("all ", options_.slots,
                                             " slots stayed busy; retry later")));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (size_t i = 0; i < admit.size(); ++i) {
      if (Start(admit[i]) == Started::kLater) {
        // No room until a request ends: back to the queue's front, in order.
        absl::MutexLock lock(&mu_);
        for (size_t j = admit.size(); j-- > i;) queue_.push_front(std::move(admit[j]));
        break;
      }
    }
    Step();
    absl::MutexLock lock(&mu_);
    stats_.active = 0;
    for (const Slot& s : slots_) stats_.active += s.active();
  }
  for (Slot& s : slots_) {
    if (s.active()) FailSlot(s, Stopping());
  }
  absl::MutexLock lock(&mu_);
  for (Pending& p : queue_) p.stream->Fail(Stopping());
  queue_.clear();
}

uint64_t EngineImpl::CellsOf(const Slot& s) const {
  if (s.conv != nullptr) return share_;  // Its policy keeps it within.
  uint64_t n = s.tokens.size();
  if (s.active()) n += static_cast<uint64_t>(s.max_tokens - s.generated);
  return n;
}

uint64_t EngineImpl::CellsInUse() const {
  uint64_t n = 0;
  for (const Slot& s : slots_) n += CellsOf(s);
  return n;
}

Slot* EngineImpl::Choose(const Pending& p, size_t* keep) {
  const std::vector<llama_token>& prompt = p.prompt;
  auto common = [&](const Slot& s) {
    const std::vector<llama_token>& h = s.history();
    return static_cast<size_t>(std::mismatch(h.begin(), h.end(), prompt.begin(), prompt.end())
                                   .first - h.begin());
  };
  Slot* slot = nullptr;
  *keep = 0;
  if (!p.request.session.empty()) {
    for (Slot& s : slots_) {
      if (!s.active() && s.session == p.request.session) {
        *keep = common(s);
        return &s;
      }
    }
  }
  for (Slot& s : slots_) {
    if (s.active()) continue;
    size_t n = common(s);
    // The same conversation (the slot's tokens all begin the prompt, or the
    // prompt is all in the slot) or a shared start of a block at least. A
    // shorter shared start (BOS, "user :") is no reason to take over another
    // conversation's slot: an empty or the coldest one, and evoked, serve
    // better.
    if (n < options_.block_tokens && n < s.history().size() && n + 1 < prompt.size()) n = 0;
    if (slot == nullptr || n > *keep ||
        (n == *keep && *keep == 0 &&
         std::make_pair(!s.history().empty(), s.last_used) <
             std::make_pair(!slot->history().empty(), slot->last_used))) {
      slot = &s;
      *keep = n;
    }
  }
  return slot;
}

bool EngineImpl::MakeRoom(const Slot& slot, uint64_t need) {
  while (CellsInUse() - CellsOf(slot) + need > options_.kv_budget) {
    Slot* victim = nullptr;
    for (Slot& s : slots_) {
      if (&s == &slot || s.active() || s.history().empty()) continue;
      if (victim == nullptr || s.last_used < victim->last_used) victim = &s;
    }
    if (victim == nullptr) return false;
    ClearSlot(*victim);
    Count(&EngineStats::slots_given_up);
  }
  return true;
}

EngineImpl::Started EngineImpl::Start(Pending& p) {
  const GenerationRequest& r = p.request;
  if (p.stream->cancelled()) {
    Count(&EngineStats::cancelled);
    return Started::kFailed;
  }
  const std::vector<llama_token>& prompt = p.prompt;
  const char* param = r.endpoint == Endpoint::kChat ? "messages" : "prompt";
  const uint64_t max_prompt = options_.max_prompt_tokens > 0 ? options_.max_prompt_tokens
                              : policy_on_ ? max_prompt_default_
                                           : options_.kv_budget - 1;
  if (prompt.empty() || prompt.size() > max_prompt) {
    Count(&EngineStats::failed);
    p.stream->Fail(prompt.empty()
                       ? InvalidParam(param, "the prompt is empty after tokenization")
                       : TooLong(param, absl::StrCat("the prompt is ", prompt.size(),
                                                     " tokens; this server takes at most ",
                                                     max_prompt)));
    return Started::kFailed;
  }
  int64_t max_tokens = 0;
  if (policy_on_) {
    max_tokens = r.max_tokens.value_or(options_.default_max_tokens);
  } else {
    const int64_t room =
        static_cast<int64_t>(options_.kv_budget) - static_cast<int64_t>(prompt.size());
    max_tokens = r.max_tokens.value_or(std::min(options_.default_max_tokens, room));
    if (max_tokens > room || room < 1) {
      Count(&EngineStats::failed);
      p.stream->Fail(TooLong("max_tokens", absl::StrCat(
          "the prompt (", prompt.size(), " tokens) and max_tokens (", max_tokens,
          ") exceed the server's KV budget of ", options_.kv_budget, " tokens")));
      return Started::kFailed;
    }
  }
  max_tokens = std::max<int64_t>(max_tokens, 1);
  size_t keep = 0;
  Slot* slot = Choose(p, &keep);
  // Under the policy: a conversation the slot's policy holds and this
  // prompt continues, or one that cannot fit the slot's share.
  const bool continues = slot->conv != nullptr && slot->conv->Keep(prompt).has_value();
  const bool managed =
      policy_on_ && (continues || prompt.size() + static_cast<uint64_t>(max_tokens) > share_);
  if (slot->conv != nullptr && !continues) {
    ClearSlot(*slot);
    keep = 0;
  }
  keep = std::min(keep, prompt.size() - 1);  // The last token is decoded for its logits.
  const uint64_t need = managed ? share_ : prompt.size() + static_cast<uint64_t>(max_tokens);
  if (!MakeRoom(*slot, need)) {
    bool any_active = false;
    for (const Slot& s : slots_) any_active |= s.active();
    if (any_active) return Started::kLater;  // Room comes back when one ends.
    // Cannot happen within the checks above; never wait for nothing.
    Count(&EngineStats::failed);
    p.stream->Fail(ServerError("no room in the KV cache for this request"));
    return Started::kFailed;
  }
  Usage usage;
  usage.prompt_tokens = static_cast<int64_t>(prompt.size());
  if (managed) {
    if (!StartPolicy(*slot, p, keep, &usage)) return Started::kFailed;
  } else {
    if (keep < slot->tokens.size()) {
      llama_memory_seq_rm(llama_get_memory(ctx_.get()), slot->seq,
                          static_cast<llama_pos>(keep), -1);
      slot->tokens.resize(keep);
    }
    uint64_t loaded = 0;
    if (keep == 0) {
      absl::StatusOr<llama::PrefixResult> got =
          slot->adapter->LoadLongestPrefix(prompt, options_.block_tokens);
      if (got.ok()) {
        loaded = got->tokens;
      } else {
        Count(&EngineStats::prefix_load_errors);
        std::fprintf(stderr, "evoke-serve: loading a prefix from evoked: %s\n",
                     got.status().ToString().c_str());
        ClearSlot(*slot);
      }
      slot->tokens.assign(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(loaded));
    }
    const size_t from = slot->tokens.size();
    usage.cached_tokens = static_cast<int64_t>(from);
    if (!llama::DecodeTokens(ctx_.get(), absl::MakeConstSpan(prompt).subspan(from),
                             static_cast<llama_pos>(from), slot->seq)) {
      ClearSlot(*slot);
      Count(&EngineStats::failed);
      p.stream->Fail(ServerError("llama_decode failed on the prompt"));
      return Started::kFailed;
    }
    slot->tokens = prompt;
    absl::MutexLock lock(&mu_);
    stats_.prompt_tokens += prompt.size();
    stats_.reused_from_slot += keep;
    stats_.loaded_from_evoked += loaded;
    stats_.prefilled += prompt.size() - from;
  }
  slot->session = r.session;
  slot->stream = p.stream;
  slot->sampler = MakeSampler(r.sampling);
  slot->stop = std::make_unique<StopMatcher>(r.sampling.stop);
  slot->generated = 0;
  slot->max_tokens = max_tokens;
  slot->usage = usage;
  slot->last_used = ++tick_;
  p.stream->Admitted(usage);
  Emit(*slot, llama_sampler_sample(slot->sampler.get(), ctx_.get(), -1));
  return Started::kYes;
}

bool EngineImpl::StartPolicy(Slot& slot, Pending& p, size_t keep, Usage* usage) {
  const std::vector<llama_token>& prompt = p.prompt;
  uint64_t reused = 0, loaded = 0;
  if (slot.conv == nullptr) {
    // A new conversation under the policy adopts what the slot holds of the
    // prompt, or else the prompt's prefix blocks evoked holds, up to the
    // slot's share; the policy takes it from there.
    size_t adopt = std::min<size_t>(keep, share_);
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), slot.seq, static_cast<llama_pos>(adopt),
                        -1);
    slot.tokens.resize(adopt);
    reused = adopt;
    if (adopt == 0) {
      absl::StatusOr<llama::PrefixResult> got = slot.adapter->LoadLongestPrefix(
          prompt, options_.block_tokens, static_cast<uint32_t>(share_));
      if (got.ok()) {
        adopt = loaded = got->tokens;
      } else {
        Count(&EngineStats::prefix_load_errors);
        std::fprintf(stderr, "evoke-serve: loading a prefix from evoked: %s\n",
                     got.status().ToString().c_str());
        ClearSlot(slot);
      }
    }
    llama::AdapterOptions ao = conv_adapter_;
    ao.seq = slot.seq;
    ao.session_id = absl::StrCat("evoke-serve/", name_, "/", instance_, "/", ++conversations_);
    absl::StatusOr<std::unique_ptr<PolicyConversation>> conv = PolicyConversation::Open(
        ctx_.get(), cparams_, capture_.get(), client_, ao, policy_,
        absl::MakeConstSpan(prompt).subspan(0, adopt));
    slot.tokens.clear();
    if (!conv.ok()) {
      ClearSlot(slot);
      Count(&EngineStats::failed);
      p.stream->Fail(ServerError(absl::StrCat("starting the conversation's policy: ",
                                              conv.status().message())));
      return false;
    }
    slot.conv = *std::move(conv);
    slot.counted = {};
    keep = adopt;
    Count(&EngineStats::policy_conversations);
  } else {
    keep = *slot.conv->Keep(prompt);
    reused = keep;
  }
  usage->cached_tokens = static_cast<int64_t>(keep);
  absl::Status s = slot.conv->Prefill(prompt, keep);
  Account(slot);
  if (!s.ok()) {
    ClearSlot(slot);
    Count(&EngineStats::failed);
    p.stream->Fail(ServerError(absl::StrCat("decoding the prompt under the policy: ",
                                            s.message())));
    return false;
  }
  absl::MutexLock lock(&mu_);
  stats_.prompt_tokens += prompt.size();
  stats_.reused_from_slot += reused;
  stats_.loaded_from_evoked += loaded;
  stats_.prefilled += prompt.size() - keep;
  return true;
}

void EngineImpl::Account(Slot& s) {
  if (s.conv == nullptr) return;
  const ConversationStats now = s.conv->stats();
  absl::MutexLock lock(&mu_);
  stats_.policy_evicted += now.evicted - s.counted.evicted;
  stats_.policy_recovered += now.recovered - s.counted.recovered;
  stats_.policy_recovery_failures += now.recovery_failures - s.counted.recovery_failures;
  stats_.policy_blocks_lost += now.lost - s.counted.lost;
  s.counted = now;
}

void EngineImpl::Step() {
  std::vector<Slot*> batch_slots;
  for (Slot& s : slots_) {
    if (!s.active()) continue;
    if (s.stream->cancelled()) {
      Count(&EngineStats::cancelled);
      FinishSlot(s, "");
      continue;
    }
    if (s.conv != nullptr) {
      // Under the policy: one token at a time (it acts between tokens).
      if (absl::Status st = s.conv->Decode(s.next); !st.ok()) {
        FailSlot(s, ServerError(absl::StrCat("decoding under the policy: ", st.message())));
        continue;
      }
      Emit(s, llama_sampler_sample(s.sampler.get(), ctx_.get(), -1));
      continue;
    }
    batch_slots.push_back(&s);
  }
  if (batch_slots.empty()) return;
  llama_batch batch = llama_batch_init(static_cast<int32_t>(batch_slots.size()), 0, 1);
  for (size_t i = 0; i < batch_slots.size(); ++i) {
    Slot& s = *batch_slots[i];
    batch.token[i] = s.next;
    batch.pos[i] = static_cast<llama_pos>(s.tokens.size());
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = s.seq;
    batch.logits[i] = true;
  }
  batch.n_tokens = static_cast<int32_t>(batch_slots.size());
  const int32_t rc = llama_decode(ctx_.get(), batch);
  llama_batch_free(batch);
  if (rc != 0) {
    for (Slot* s : batch_slots) FailSlot(*s, ServerError(absl::StrCat("llama_decode: ", rc)));
    return;
  }
  for (size_t i = 0; i < batch_slots.size(); ++i) {
    Slot& s = *batch_slots[i];
    s.tokens.push_back(s.next);
    Emit(s, llama_sampler_sample(s.sampler.get(), ctx_.get(), static_cast<int32_t>(i)));
  }
}

void EngineImpl::Emit(Slot& s, llama_token token) {
  s.next = -1;
  if (llama_vocab_is_eog(vocab_, token)) {
    FinishSlot(s, "stop");
    return;
  }
  ++s.generated;
  ++s.usage.completion_tokens;
  Count(&EngineStats::generated);
  const std::string text = s.stop->Push(Piece(token));
  if (!text.empty()) s.stream->Text(text);
  if (s.stop->stopped()) {
    FinishSlot(s, "stop");
  } else if (s.generated >= s.max_tokens) {
    FinishSlot(s, "length");
  } else {
    s.next = token;
  }
}

void EngineImpl::FinishSlot(Slot& s, const std::string& reason) {
  if (!reason.empty()) {
    const std::string rest = s.stop->Flush();
    if (!rest.empty()) s.stream->Text(rest);
    Count(&EngineStats::completed);  // Before the client can see the end.
    s.stream->Finish(reason, s.usage);
  }
  Account(s);
  // A policy's conversation keeps its blocks in its own session instead.
  if (s.conv == nullptr && options_.save_prefixes && s.tokens.size() >= options_.block_tokens) {
    absl::StatusOr<llama::PrefixResult> saved =
        s.adapter->SavePrefix(s.tokens, options_.block_tokens);
    if (saved.ok()) {
      Count(&EngineStats::prefix_blocks_saved, saved->blocks);
    } else {
      Count(&EngineStats::prefix_save_errors);
      std::fprintf(stderr, "evoke-serve: saving a conversation's blocks to evoked: %s\n",
                   saved.status().ToString().c_str());
    }
  }
  Detach(s);
  s.last_used = ++tick_;
}

void EngineImpl::FailSlot(Slot& s, const ApiError& e) {
  Count(&EngineStats::failed);
  s.stream->Fail(e);
  Detach(s);
  ClearSlot(s);
}

void EngineImpl::Detach(Slot& s) {
  s.stream.reset();
  s.sampler.reset();
  s.stop.reset();
  s.next = -1;
}

void EngineImpl::ClearSlot(Slot& s) {
  Account(s);
  s.conv.reset();  // Its cells, and its session in evoked.
  s.counted = {};
  llama_memory_seq_rm(llama_get_memory(ctx_.get()), s.seq, -1, -1);
  s.tokens.clear();
  s.session.clear();
}

std::vector<llama_token> EngineImpl::Tokenize(const std::string& text) const {
  std::vector<llama_token> out(text.size() + 2);
  int32_t n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), out.data(),
                             static_cast<int32_t>(out.size()), /*add_special=*/false,
                             /*parse_special=*/true);
  if (n < 0) {
    out.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab_, text.data(), static_cast<int32_t>(text.size()), out.data(),
                       static_cast<int32_t>(out.size()), false, true);
  }
  out.resize(static_cast<size_t>(std::max(n, 0)));
  if (llama_vocab_get_add_bos(vocab_) && llama_vocab_bos(vocab_) != LLAMA_TOKEN_NULL) {
    out.insert(out.begin(), llama_vocab_bos(vocab_));
  }
  return out;
}

std::string EngineImpl::Render(const GenerationRequest& r) const {
  if (r.endpoint == Endpoint::kCompletion) return r.prompt;
  if (!chat_template_.empty()) {
    std::vector<llama_chat_message> msgs;
    for (const ChatMessage& m : r.messages) msgs.push_back({m.role.c_str(), m.content.c_str()});
    std::string buf(4096, '\0');
    for (int attempt = 0; attempt < 2; ++attempt) {
      const int32_t n = llama_chat_apply_template(chat_template_.c_str(), msgs.data(),
                                                  msgs.size(), true, buf.data(),
                                                  static_cast<int32_t>(buf.size()));
      if (n < 0) break;  // A template llama.cpp does not know: the plain form.
      if (static_cast<size_t>(n) <= buf.size()) return buf.substr(0, static_cast<size_t>(n));
      buf.resize(static_cast<size_t>(n));
    }
  }
  // The plain form, as evoke's task language writes agent turns ("user :
  // ... assistant :"); system text goes first, unprefixed.
  std::string out;
  for (const ChatMessage& m : r.messages) {
    if (m.role == "system" || m.role == "developer") {
      absl::StrAppend(&out, m.content, " ");
    } else {
      absl::StrAppend(&out, m.role, " : ", m.content, " ");
    }
  }
  return out + "assistant :";
}

std::string EngineImpl::Piece(llama_token t) const {
  char buf[256];
  const int32_t n = llama_token_to_piece(vocab_, t, buf, sizeof(buf), 0, false);
  if (n >= 0) return std::string(buf, static_cast<size_t>(n));
  std::string big(static_cast<size_t>(-n), '\0');
  const int32_t m = llama_token_to_piece(vocab_, t, big.data(), -n, 0, false);
  big.resize(static_cast<size_t>(std::max(m, 0)));
  return big;
}

SamplerPtr EngineImpl::MakeSampler(const Sampling& s) {
  SamplerPtr chain(llama_sampler_chain_init(llama_sampler_chain_default_params()));
  if (s.temperature <= 0) {
    llama_sampler_chain_add(chain.get(), llama_sampler_init_greedy());
  } else {
    llama_sampler_chain_add(chain.get(), llama_sampler_init_top_p(static_cast<float>(s.top_p), 1));
    llama_sampler_chain_add(chain.get(),
                            llama_sampler_init_temp(static_cast<float>(s.temperature)));
    llama_sampler_chain_add(chain.get(), llama_sampler_init_dist(
        s.seed ? static_cast<uint32_t>(*s.seed) : LLAMA_DEFAULT_SEED));
  }
  return chain;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options,
                                                     Client* client) {
  auto engine = std::make_unique<EngineImpl>(options, client);
  absl::Status s = engine->Init();
  if (!s.ok()) return s;
  return engine;
}

}  // namespace evoke::serve
