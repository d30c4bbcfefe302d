#include "sim/params.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/fingerprint.h"

namespace evoke::sim {

absl::Status SimParams::Validate() const {
  auto bad = [](absl::string_view field, auto... why) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", why...));
  };
  if (n_layers == 0 || n_layers > 1024) return bad("n_layers", n_layers, " not in [1, 1024]");
  if (n_kv_heads == 0) return bad("n_kv_heads", "0");
  if (n_query_heads == 0 || n_query_heads % n_kv_heads != 0) {
    return bad("n_query_heads", n_query_heads, " is not a multiple of n_kv_heads ", n_kv_heads);
  }
  if (head_dim < 2 || head_dim % 2 != 0) return bad("head_dim", head_dim, " must be even");
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
  if (!(query_alignment >= 0 && query_alignment <= 1)) {
    return bad("query_alignment", query_alignment, " not in [0, 1]");
  }
  if (!(lure_cos_min >= 0 && lure_cos_min <= lure_cos_max && lure_cos_max < 1)) {
    return bad("lure_cos_min/max", lure_cos_min, ", ", lure_cos_max,
               ": need 0 <= min <= max < 1");
  }
  if (filler_sample_every == 0) return bad("filler_sample_every", "0");
  if (multifact_min_facts == 0 || multifact_min_facts > multifact_max_facts) {
    return bad("multifact_min_facts", multifact_min_facts, " not in [1, multifact_max_facts]");
  }
  if (turn_tokens <= reference_tokens + 2 * fact_tokens * (1 + lures_per_fact)) {
    return bad("turn_tokens", turn_tokens, " too small");
  }
  if (session_tokens < 4 * turn_tokens) return bad("session_tokens", session_tokens, " too small");
  // Multifact places every fact and lure in the first half of the session
  // at most (room for the rejection sampling of span positions).
  const uint64_t spans = static_cast<uint64_t>(multifact_max_facts) * (1 + lures_per_fact);
  if (4 * spans * fact_tokens > session_tokens) {
    return bad("multifact_max_facts", multifact_max_facts, " too many for session_tokens ",
               session_tokens);
  }
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
  line("lures_per_fact", lures_per_fact);
  line("lure_cos", absl::StrCat("[", lure_cos_min, ", ", lure_cos_max, "]"));
  line("query_norm", query_norm);
  line("query_noise", query_noise);
  line("query_alignment (default)", query_alignment);
  line("filler_query_noise", filler_query_noise);
  line("recency_per_1k_tokens", recency_per_1k_tokens);
  line("filler_sample_every", filler_sample_every);
  line("pass_threshold", pass_threshold);
  line("min_layers", min_layers);
  line("recovery_layer", recovery_layer);
  line("session_tokens", session_tokens);
  line("turn_tokens", turn_tokens);
  line("answer_tokens", answer_tokens);
  line("reference_tokens", reference_tokens);
  line("reference_every", reference_every);
  line("multifact_facts", absl::StrCat("[", multifact_min_facts, ", ", multifact_max_facts, "]"));
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

}  // namespace evoke::sim
