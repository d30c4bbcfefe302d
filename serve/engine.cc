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
#include "serve/engine_impl.h"

namespace evoke::serve {

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


absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options,
                                                     Client* client) {
  auto engine = std::make_unique<EngineImpl>(options, client);
  absl::Status s = engine->Init();
  if (!s.ok()) return s;
  return engine;
}

}  // namespace evoke::serve
