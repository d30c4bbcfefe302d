#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "serve/engine_impl.h"

namespace evoke::serve {

uint64_t EngineImpl::CellsOf(const Slot& s) const {
  if (s.conv != nullptr) return share_;  // Its policy keeps it within.
  if (!s.active()) return s.tokens.size();
  return std::max(s.tokens.size(), s.prompt.size()) +
         static_cast<uint64_t>(s.max_tokens - s.generated);
}

uint64_t EngineImpl::CellsInUse() const {
  uint64_t n = 0;
  for (const Slot& s : slots_) n += CellsOf(s);
  return n;
}

Slot* EngineImpl::Choose(const Pending& p, size_t* keep) {
  const std::vector<llama_token>& prompt = p.prompt;
  // What of the slot's history the prompt may keep: the same conversation
  // (the slot's tokens all begin the prompt, or the prompt is all in the
  // slot) or a shared start of a block at least. A shorter shared start
  // (BOS, "user :") is not worth keeping: evoked's prefix blocks serve
  // better, and it is no reason to take over another conversation's slot.
  auto common = [&](const Slot& s) -> size_t {
    const std::vector<llama_token>& h = s.history();
    const size_t n = static_cast<size_t>(
        std::mismatch(h.begin(), h.end(), prompt.begin(), prompt.end()).first - h.begin());
    if (n < options_.block_tokens && n < h.size() && n + 1 < prompt.size()) return 0;
    return n;
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
    const size_t n = common(s);
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
      loaded = LoadPrefix(*slot, prompt, std::numeric_limits<uint32_t>::max());
      slot->tokens.assign(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(loaded));
    }
    const size_t from = slot->tokens.size();
    usage.cached_tokens = static_cast<int64_t>(from);
    slot->prefilled = from;  // Step decodes the rest, in chunks.
    CountPrompt(prompt.size(), keep, loaded);
  }
  slot->prompt = prompt;
  slot->session = r.session;
  slot->stream = p.stream;
  slot->sampler = MakeSampler(r.sampling);
  slot->stop = std::make_unique<StopMatcher>(r.sampling.stop);
  slot->generated = 0;
  slot->max_tokens = max_tokens;
  slot->usage = usage;
  slot->last_used = ++tick_;
  p.stream->Admitted(usage);
  return Started::kYes;  // Its prompt is decoded by Step, with the others' tokens.
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
    if (adopt == 0) adopt = loaded = LoadPrefix(slot, prompt, static_cast<uint32_t>(share_));
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
    keep = adopt;
    Count(&EngineStats::policy_conversations);
  } else {
    keep = *slot.conv->Keep(prompt);
    reused = keep;
  }
  usage->cached_tokens = static_cast<int64_t>(keep);
  absl::Status s = slot.conv->BeginTurn(prompt, keep);
  slot.prefilled = keep;
  Account(slot);
  if (!s.ok()) {
    ClearSlot(slot);
    Count(&EngineStats::failed);
    p.stream->Fail(ServerError(absl::StrCat("decoding the prompt under the policy: ",
                                            s.message())));
    return false;
  }
  CountPrompt(prompt.size(), reused, loaded);
  return true;
}

uint64_t EngineImpl::LoadPrefix(Slot& slot, absl::Span<const llama_token> prompt,
                                uint32_t max_tokens) {
  absl::StatusOr<llama::PrefixResult> got =
      slot.adapter->LoadLongestPrefix(prompt, options_.block_tokens, max_tokens);
  if (got.ok()) return got->tokens;
  Count(&EngineStats::prefix_load_errors);
  std::fprintf(stderr, "evoke-serve: loading a prefix from evoked: %s\n",
               got.status().ToString().c_str());
  ClearSlot(slot);
  return 0;
}

void EngineImpl::CountPrompt(uint64_t tokens, uint64_t reused, uint64_t loaded) {
  absl::MutexLock lock(&mu_);
  stats_.prompt_tokens += tokens;
  stats_.reused_from_slot += reused;
  stats_.loaded_from_evoked += loaded;
  stats_.prefilled += tokens - reused - loaded;
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

std::vector<Slot*>& EngineImpl::OrderPrefills(std::vector<Slot*>* slots) {
  std::sort(slots->begin(), slots->end(), [](const Slot* a, const Slot* b) {
    return std::make_pair(a->prompt.size() - a->prefilled, a->last_used) <
           std::make_pair(b->prompt.size() - b->prefilled, b->last_used);
  });
  auto oldest = std::min_element(slots->begin(), slots->end(), [](const Slot* a, const Slot* b) {
    return a->last_used < b->last_used;
  });
  if (oldest != slots->end()) std::rotate(slots->begin(), oldest, oldest + 1);
  return *slots;
}

size_t EngineImpl::PrefillQuantum(const Slot& s, const std::vector<Slot*>& order, size_t left,
                                  size_t step) {
  if (&s == order.front() && order.size() > 1) return std::min(left, step / 2);
  return left;
}

void EngineImpl::Step() {
  // One llama_decode for the slots outside a policy: a token for each that
  // generates, then chunks of the prompts being prefilled, up to kStepTokens
  // in all. Policy-managed slots decode on their own, before it: a token
  // for each that generates, and chunks of their prompts.
  constexpr size_t kStepTokens = 256;
  struct Part {
    Slot* slot;
    size_t first, n;  // Batch entries [first, first + n).
    bool last;        // The prompt's end, or a generated token: sample after.
  };
  std::vector<Part> parts;
  std::vector<Slot*> prefills;     // Outside a policy.
  std::vector<Slot*> policy_prefills;
  size_t batch_tokens = 0, policy_tokens = 0;
  for (Slot& s : slots_) {
    if (!s.active()) continue;
    if (s.stream->cancelled()) {
      Count(&EngineStats::cancelled);
      FinishSlot(s, "");
      continue;
    }
    if (s.conv != nullptr && s.prefilling()) {
      policy_prefills.push_back(&s);
    } else if (s.conv != nullptr) {
      // Under the policy, alone: it acts between tokens.
      absl::Status st = s.conv->Decode(s.next);
      Account(s);
      if (!st.ok()) {
        FailSlot(s, ServerError(absl::StrCat("decoding under the policy: ", st.message())));
      } else {
        Emit(s, llama_sampler_sample(s.sampler.get(), ctx_.get(), -1));
      }
    } else if (s.prefilling()) {
      prefills.push_back(&s);
    } else {
      parts.push_back({&s, batch_tokens, 1, true});
      ++batch_tokens;
    }
  }
  // Prompts are decoded up to kStepTokens a step (for each kind): the one
  // that has waited longest first, with at most half of the step when others
  // wait too, so that no prompt waits behind a stream of short ones; then
  // the rest shortest remaining first, so that a turn adding a few tokens to
  // a conversation gets its answer at once. The others' decoding goes on
  // meanwhile.
  for (Slot* s : OrderPrefills(&policy_prefills)) {
    const size_t quantum = PrefillQuantum(*s, policy_prefills, kStepTokens - policy_tokens,
                                          kStepTokens);
    if (quantum == 0) break;
    const size_t before = s->prefilled;
    absl::StatusOr<bool> done = s->conv->ContinueTurn(s->prompt, &s->prefilled, quantum);
    policy_tokens += s->prefilled - before;
    Account(*s);
    if (!done.ok()) {
      FailSlot(*s, ServerError(absl::StrCat("decoding under the policy: ",
                                            done.status().message())));
    } else if (*done) {
      Emit(*s, llama_sampler_sample(s->sampler.get(), ctx_.get(), -1));
    }
  }
  const size_t generating = batch_tokens;
  for (Slot* s : OrderPrefills(&prefills)) {
    const size_t n = std::min(PrefillQuantum(*s, prefills, kStepTokens - batch_tokens,
                                             kStepTokens - generating),
                              s->prompt.size() - s->prefilled);
    if (n == 0) break;
    parts.push_back({s, batch_tokens, n, s->prefilled + n == s->prompt.size()});
    batch_tokens += n;
  }
  if (parts.empty()) return;
  llama_batch batch = llama_batch_init(static_cast<int32_t>(batch_tokens), 0, 1);
  for (const Part& part : parts) {
    Slot& s = *part.slot;
    const bool prefill = s.prefilling();
    for (size_t k = 0; k < part.n; ++k) {
      const size_t i = part.first + k;
      batch.token[i] = prefill ? s.prompt[s.prefilled + k] : s.next;
      batch.pos[i] = static_cast<llama_pos>(s.tokens.size() + k);
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = s.seq;
      batch.logits[i] = part.last && k + 1 == part.n;
    }
  }
  batch.n_tokens = static_cast<int32_t>(batch_tokens);
  const int32_t rc = llama_decode(ctx_.get(), batch);
  llama_batch_free(batch);
  if (rc != 0) {
    for (const Part& part : parts) {
      FailSlot(*part.slot, ServerError(absl::StrCat("llama_decode: ", rc)));
    }
    return;
  }
  for (const Part& part : parts) {
    Slot& s = *part.slot;
    if (s.prefilling()) {
      s.tokens.insert(s.tokens.end(), s.prompt.begin() + static_cast<ptrdiff_t>(s.prefilled),
                      s.prompt.begin() + static_cast<ptrdiff_t>(s.prefilled + part.n));
      s.prefilled += part.n;
    } else {
      s.tokens.push_back(s.next);
    }
    if (part.last) {
      Emit(s, llama_sampler_sample(s.sampler.get(), ctx_.get(),
                                   static_cast<int32_t>(part.first + part.n - 1)));
    }
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
  if (s.conv != nullptr && s.conv->history().empty()) {
    // Cancelled before its first chunk: nothing to keep.
    Detach(s);
    ClearSlot(s);
    return;
  }
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
  s.prompt.clear();
  s.prefilled = 0;
}

void EngineImpl::ClearSlot(Slot& s) {
  Account(s);
  s.conv.reset();  // Its cells, and its session in evoked.
  s.counted = {};
  llama_memory_seq_rm(llama_get_memory(ctx_.get()), s.seq, -1, -1);
  s.tokens.clear();
  s.session.clear();
}

}  // namespace evoke::serve
