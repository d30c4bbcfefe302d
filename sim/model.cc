#include "sim/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fingerprint.h"

namespace evoke::sim {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Independent streams of one session: keys, directions, filler queries,
// event queries.
uint64_t StreamSeed(uint64_t seed, Task task, uint32_t variant, uint64_t stream) {
  return SplitMix(SplitMix(SplitMix(seed) ^ (static_cast<uint64_t>(task) << 8 | variant)) ^
                  stream);
}

}  // namespace

absl::Status SimParams::Validate() const {
  auto bad = [](absl::string_view field, auto... why) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", why...));
  };
  if (n_layers == 0 || n_layers > 1024) return bad("n_layers", n_layers, " not in [1, 1024]");
  if (n_kv_heads == 0) return bad("n_kv_heads", "0");
  if (n_query_heads == 0 || n_query_heads % n_kv_heads != 0) {
    return bad("n_query_heads", n_query_heads, " is not a multiple of n_kv_heads ", n_kv_heads);
  }
  if (head_dim == 0 || head_dim % 2 != 0) return bad("head_dim", head_dim, " must be even");
  if (rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return bad("rotary_dim", rotary_dim, " must be even and <= head_dim");
  }
  if (retrieval_layers.empty()) return bad("retrieval_layers", "empty");
  for (uint32_t l : retrieval_layers) {
    if (l >= n_layers) return bad("retrieval_layers", l, " >= n_layers");
  }
  if (min_layers == 0 || min_layers > retrieval_layers.size()) {
    return bad("min_layers", min_layers, " not in [1, retrieval layers]");
  }
  if (recovery_layer >= n_layers) return bad("recovery_layer", recovery_layer, " >= n_layers");
  if (block_tokens == 0) return bad("block_tokens", "0");
  if (fact_tokens == 0) return bad("fact_tokens", "0");
  if (turn_tokens <= reference_tokens + fact_tokens) {
    return bad("turn_tokens", turn_tokens, " too small");
  }
  if (session_tokens < 4 * turn_tokens) return bad("session_tokens", session_tokens, " too small");
  if (reference_every < 2) return bad("reference_every", reference_every, " < 2");
  return absl::OkStatus();
}

std::string SimParams::Describe() const {
  std::string out;
  auto line = [&](absl::string_view name, auto value) {
    absl::StrAppend(&out, name, " = ", value, "\n");
  };
  line("n_layers", n_layers);
  line("n_kv_heads", n_kv_heads);
  line("n_query_heads", n_query_heads);
  line("head_dim", head_dim);
  line("rope", absl::StrCat(rope_type == v1::ROPE_NEOX ? "neox" : "norm", " rotary_dim ",
                            rotary_dim, " base ", rope_base));
  line("key_noise", key_noise);
  line("retrieval_layers", absl::StrJoin(retrieval_layers, ","));
  line("alpha_retrieval", alpha_retrieval);
  line("alpha_other", alpha_other);
  line("fact_tokens", fact_tokens);
  line("query_norm", query_norm);
  line("query_noise", query_noise);
  line("filler_query_noise", filler_query_noise);
  line("recency_per_1k_tokens", recency_per_1k_tokens);
  line("pass_threshold", pass_threshold);
  line("min_layers", min_layers);
  line("recovery_layer", recovery_layer);
  line("session_tokens", session_tokens);
  line("turn_tokens", turn_tokens);
  line("answer_tokens", answer_tokens);
  line("reference_tokens", reference_tokens);
  line("reference_every", reference_every);
  line("block_tokens", block_tokens);
  line("sink_tokens", sink_tokens);
  return out;
}

bool SimParams::IsRetrievalLayer(uint32_t layer) const {
  return std::find(retrieval_layers.begin(), retrieval_layers.end(), layer) !=
         retrieval_layers.end();
}

v1::LayoutFingerprint SimFingerprint(const SimParams& params) {
  CacheShape shape;
  shape.k_dtype = v1::DTYPE_F16;
  shape.v_dtype = v1::DTYPE_F16;
  shape.n_layers = params.n_layers;
  shape.n_kv_heads = params.n_kv_heads;
  shape.head_dim = params.head_dim;
  v1::LayoutFingerprint fp = MakeFingerprint("evoke-sim", "evoke-sim-synthetic", shape);
  fp.mutable_rope()->set_type(params.rope_type);
  fp.mutable_rope()->set_rotary_dim(params.rotary_dim);
  fp.mutable_rope()->set_freq_base(params.rope_base);
  fp.mutable_rope()->set_freq_scale(1.0);
  return fp;
}

absl::StatusOr<RopePlan> SimRopePlan(const SimParams& params) {
  return MakeRopePlan(SimFingerprint(params));
}

std::string TaskName(Task task) {
  switch (task) {
    case Task::kNiah:
      return "niah";
    case Task::kMultifact:
      return "multifact";
    case Task::kAgentic:
      return "agentic";
  }
  return "?";
}

absl::StatusOr<Task> ParseTask(absl::string_view name) {
  for (Task t : AllTasks()) {
    if (TaskName(t) == name) return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("task: unknown \"", name, "\" (known: niah, multifact, agentic)"));
}

std::vector<Task> AllTasks() { return {Task::kNiah, Task::kMultifact, Task::kAgentic}; }

uint32_t TaskVariants(Task task) { return task == Task::kNiah ? kNiahVariants : 1; }

namespace {

class ScriptBuilder {
 public:
  ScriptBuilder(const SimParams& p, TaskScript* s) : p_(p), s_(s) {}

  uint32_t tokens() const { return s_->n_tokens; }

  // Filler with a noise recovery point at every turn boundary it crosses.
  void FillerWithTurns(uint32_t n) {
    while (n > 0) {
      const uint32_t to_boundary = p_.turn_tokens - s_->n_tokens % p_.turn_tokens;
      const uint32_t take = std::min(n, to_boundary);
      Filler(take);
      n -= take;
      if (n > 0 || s_->n_tokens % p_.turn_tokens == 0) {
        if (s_->n_tokens % p_.turn_tokens == 0) Recovery(-1);
      }
    }
  }
  void Filler(uint32_t n) { Tokens(Event::Kind::kFiller, n, -1); }
  void Fact(int32_t f) {
    Tokens(Event::Kind::kFact, p_.fact_tokens, f);
    s_->n_facts = std::max<uint32_t>(s_->n_facts, static_cast<uint32_t>(f) + 1);
  }
  void Reference(int32_t f, uint32_t n) { Tokens(Event::Kind::kReference, n, f); }
  void Recovery(int32_t f) { s_->events.push_back({Event::Kind::kRecovery, 0, f}); }
  void Probe(int32_t f) {
    s_->events.push_back({Event::Kind::kProbe, 0, f});
    ++s_->n_probes;
  }

 private:
  void Tokens(Event::Kind kind, uint32_t n, int32_t f) {
    if (n == 0) return;
    if (!s_->events.empty() && s_->events.back().kind == kind && s_->events.back().fact == f) {
      s_->events.back().count += n;
    } else {
      s_->events.push_back({kind, n, f});
    }
    s_->n_tokens += n;
  }
  const SimParams& p_;
  TaskScript* s_;
};

}  // namespace

TaskScript MakeScript(Task task, uint32_t variant, const SimParams& p) {
  TaskScript s;
  s.task = task;
  s.variant = variant;
  ScriptBuilder b(p, &s);
  const uint32_t T = p.session_tokens;
  switch (task) {
    case Task::kNiah: {
      const double depth = kNiahDepths[std::min(variant, kNiahVariants - 1)];
      const uint32_t body = T - p.answer_tokens;
      const uint32_t at =
          static_cast<uint32_t>(std::lround(depth * static_cast<double>(body - p.fact_tokens)));
      b.FillerWithTurns(at);
      b.Fact(0);
      b.FillerWithTurns(body - b.tokens());
      b.Recovery(0);
      b.Probe(0);
      b.Filler(p.answer_tokens);
      break;
    }
    case Task::kMultifact: {
      b.Filler(128);
      for (int32_t f = 0; f < 5; ++f) {
        b.Fact(f);
        b.Filler(64);
      }
      b.FillerWithTurns(T - 5 * p.answer_tokens - b.tokens());
      for (int32_t f = 0; f < 5; ++f) {
        b.Recovery(f);
        b.Probe(f);
        b.Filler(p.answer_tokens);
      }
      break;
    }
    case Task::kAgentic: {
      b.Filler(128);
      b.Fact(0);
      b.Filler(p.turn_tokens - b.tokens());
      int32_t distractor = 0;  // Last distractor fact stated (0: none yet).
      uint32_t turn = 1;
      while (b.tokens() + p.turn_tokens <= T - p.answer_tokens) {
        const uint32_t start = b.tokens();
        if (turn % p.reference_every == 0) {
          b.Recovery(0);
          b.Probe(0);
          b.Reference(0, p.reference_tokens);
        } else {
          b.Recovery(distractor > 0 ? distractor : -1);
          b.Filler(p.turn_tokens / 4);
          b.Fact(++distractor);
        }
        b.Filler(start + p.turn_tokens - b.tokens());
        ++turn;
      }
      b.Filler(T - p.answer_tokens - b.tokens());
      b.Recovery(0);
      b.Probe(0);
      b.Filler(p.answer_tokens);
      break;
    }
  }
  return s;
}

float Normal::Next() {
  if (have_) {
    have_ = false;
    return spare_;
  }
  // Two uniforms in (0, 1] from the top 53 bits.
  // One 64-bit draw gives both uniforms (32 bits each), float math.
  const uint64_t bits = rng_();
  const float u1 = (static_cast<float>(bits >> 40) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  const float u2 = static_cast<float>((bits >> 8) & 0xffffff) * (1.0f / 16777216.0f);
  const float r = std::sqrt(-2.0f * std::log(u1));
  const float a = 6.2831853f * u2;
  spare_ = r * std::sin(a);
  have_ = true;
  return r * std::cos(a);
}

void Normal::Fill(absl::Span<float> out, float stddev) {
  for (float& x : out) x = Next() * stddev;
}

Session::Session(const SimParams& params, TaskScript script, uint64_t seed)
    : params_(params), script_(std::move(script)), seed_(seed) {
  const SimParams& p = params_;
  const uint32_t tf = p.token_floats();
  const uint32_t d = p.head_dim;
  // Fact directions.
  const uint32_t n_facts = std::max(1u, script_.n_facts);
  directions_.resize(static_cast<size_t>(n_facts) * p.n_layers * p.n_kv_heads * d);
  Normal dir_rng(StreamSeed(seed, script_.task, script_.variant, 1));
  for (size_t v = 0; v < directions_.size() / d; ++v) {
    float* u = directions_.data() + v * d;
    double norm = 0;
    for (uint32_t i = 0; i < d; ++i) {
      u[i] = dir_rng.Next();
      norm += static_cast<double>(u[i]) * u[i];
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(norm));
    for (uint32_t i = 0; i < d; ++i) u[i] *= inv;
  }
  // Keys.
  keys_.resize(static_cast<size_t>(script_.n_tokens) * tf);
  fact_of_.assign(script_.n_tokens, -1);
  uint64_t t = 0;
  for (const Event& e : script_.events) {
    if (e.kind == Event::Kind::kFact) {
      for (uint32_t i = 0; i < e.count; ++i) fact_of_[t + i] = e.fact;
    }
    if (e.kind == Event::Kind::kFiller || e.kind == Event::Kind::kFact ||
        e.kind == Event::Kind::kReference) {
      t += e.count;
    }
  }
  Normal key_rng(StreamSeed(seed, script_.task, script_.variant, 2));
  key_rng.Fill(absl::MakeSpan(keys_), static_cast<float>(p.key_noise));
  for (uint64_t tok = 0; tok < script_.n_tokens; ++tok) {
    const int32_t f = fact_of_[tok];
    if (f < 0) continue;
    for (uint32_t l = 0; l < p.n_layers; ++l) {
      const float a = static_cast<float>(p.Alpha(l));
      for (uint32_t h = 0; h < p.n_kv_heads; ++h) {
        float* k = keys_.data() + tok * tf + (static_cast<size_t>(l) * p.n_kv_heads + h) * d;
        absl::Span<const float> u = Direction(l, h, static_cast<uint32_t>(f));
        for (uint32_t i = 0; i < d; ++i) k[i] += a * u[i];
      }
    }
  }
}

absl::Span<const float> Session::Direction(uint32_t layer, uint32_t head, uint32_t fact) const {
  const SimParams& p = params_;
  const size_t at = ((static_cast<size_t>(fact) * p.n_layers + layer) * p.n_kv_heads + head) *
                    p.head_dim;
  return absl::MakeConstSpan(directions_.data() + at, p.head_dim);
}

std::vector<float> Session::EventQuery(uint32_t index, int32_t fact) const {
  const SimParams& p = params_;
  std::vector<float> q(static_cast<size_t>(p.n_layers) * p.n_query_heads * p.head_dim);
  Normal rng(StreamSeed(seed_, script_.task, script_.variant, 0x100 + index));
  rng.Fill(absl::MakeSpan(q), static_cast<float>(fact >= 0 ? p.query_noise
                                                           : p.filler_query_noise));
  if (fact < 0) return q;
  const float norm = static_cast<float>(p.query_norm);
  for (uint32_t l = 0; l < p.n_layers; ++l) {
    for (uint32_t qh = 0; qh < p.n_query_heads; ++qh) {
      absl::Span<const float> u = Direction(l, qh / p.kv_group(), static_cast<uint32_t>(fact));
      float* out = q.data() + (static_cast<size_t>(l) * p.n_query_heads + qh) * p.head_dim;
      for (uint32_t i = 0; i < p.head_dim; ++i) out[i] += norm * u[i];
    }
  }
  return q;
}

}  // namespace evoke::sim
