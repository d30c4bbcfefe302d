#include "common/block_validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/chain_hash.h"
#include "common/fingerprint.h"
#include "common/hash128.h"

namespace evoke {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view name,
                     absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ".", name, ": ", problem));
}

absl::Status CheckRange(absl::string_view field, absl::string_view name,
                        uint64_t value, uint64_t lo, uint64_t hi) {
  if (value < lo || value > hi) {
    return Invalid(field, name,
                   absl::StrCat(value, " is out of range [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckLength(absl::string_view field, absl::string_view name,
                         absl::string_view value, size_t lo, size_t hi) {
  if (value.size() < lo || value.size() > hi) {
    return Invalid(field, name,
                   value.empty() ? std::string("is required")
                                 : absl::StrCat("length ", value.size(),
                                                " is out of range [", lo, ", ",
                                                hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRope(const v1::RopeParams& rope, uint32_t head_dim,
                          absl::string_view field) {
  if (!v1::RopeType_IsValid(rope.type())) {
    return Invalid(field, "type", absl::StrCat("unknown rope type ", rope.type()));
  }
  if (rope.type() == v1::ROPE_NONE || rope.type() == v1::ROPE_TYPE_UNSPECIFIED) {
    return absl::OkStatus();
  }
  if (!v1::RopeScaling_IsValid(rope.scaling())) {
    return Invalid(field, "scaling",
                   absl::StrCat("unknown rope scaling ", rope.scaling()));
  }
  const uint32_t rotary_dim = rope.rotary_dim() == 0 ? head_dim : rope.rotary_dim();
  if (rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return Invalid(field, "rotary_dim",
                   absl::StrCat(rotary_dim, " must be even and <= head_dim ",
                                head_dim));
  }
  if (!(std::isfinite(rope.freq_base()) && rope.freq_base() > 0)) {
    return Invalid(field, "freq_base",
                   absl::StrCat(rope.freq_base(), " must be finite and > 0"));
  }
  if (!(std::isfinite(rope.freq_scale()) && rope.freq_scale() >= 0)) {
    return Invalid(field, "freq_scale",
                   absl::StrCat(rope.freq_scale(), " must be finite and >= 0"));
  }
  const struct {
    const char* name;
    float value;
  } yarn_floats[] = {{"yarn_ext_factor", rope.yarn_ext_factor()},
                     {"yarn_attn_factor", rope.yarn_attn_factor()},
                     {"yarn_beta_fast", rope.yarn_beta_fast()},
                     {"yarn_beta_slow", rope.yarn_beta_slow()}};
  for (const auto& f : yarn_floats) {
    if (!std::isfinite(f.value)) {
      return Invalid(field, f.name, absl::StrCat(f.value, " must be finite"));
    }
  }
  if (rope.scaling() == v1::ROPE_SCALING_YARN) {
    if (rope.yarn_ext_factor() < 0) {
      return Invalid(field, "yarn_ext_factor",
                     absl::StrCat(rope.yarn_ext_factor(),
                                  " is llama.cpp's \"not set\"; send the value it "
                                  "resolves to (1 for YaRN), >= 0"));
    }
    if (rope.yarn_attn_factor() < 0) {
      return Invalid(field, "yarn_attn_factor",
                     absl::StrCat(rope.yarn_attn_factor(), " must be >= 0"));
    }
    if (rope.yarn_ext_factor() > 0) {
      if (!(rope.yarn_beta_fast() > 0)) {
        return Invalid(field, "yarn_beta_fast",
                       absl::StrCat(rope.yarn_beta_fast(),
                                    " must be > 0 when yarn_ext_factor > 0"));
      }
      if (!(rope.yarn_beta_slow() > 0)) {
        return Invalid(field, "yarn_beta_slow",
                       absl::StrCat(rope.yarn_beta_slow(),
                                    " must be > 0 when yarn_ext_factor > 0"));
      }
      if (rope.n_ctx_orig() == 0) {
        return Invalid(field, "n_ctx_orig",
                       "must be > 0 when yarn_ext_factor > 0 (llama.cpp resolves 0 "
                       "to the model's training context: send that)");
      }
      if (rope.freq_base() == 1) {
        return Invalid(field, "freq_base",
                       "1 has no YaRN ramp (it divides by ln(freq_base)); "
                       "use yarn_ext_factor 0");
      }
    }
  }
  if (!rope.freq_factors().empty()) {
    if (static_cast<uint32_t>(rope.freq_factors_size()) != rotary_dim / 2) {
      return Invalid(field, "freq_factors",
                     absl::StrCat("has ", rope.freq_factors_size(),
                                  " entries, expected rotary_dim / 2 = ",
                                  rotary_dim / 2));
    }
    for (int i = 0; i < rope.freq_factors_size(); ++i) {
      const float f = rope.freq_factors(i);
      if (!(std::isfinite(f) && f > 0)) {
        return Invalid(field, absl::StrCat("freq_factors[", i, "]"),
                       absl::StrCat(f, " must be finite and > 0"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint32_t DTypeBytes(int dtype) {
  switch (dtype) {
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
      return 2;
    case v1::DTYPE_F32:
      return 4;
    default:
      return 0;
  }
}

absl::StatusOr<uint64_t> CanonicalPayloadBytes(const v1::LayoutFingerprint& fp,
                                               uint32_t n_tokens,
                                               uint32_t n_layers) {
  const uint32_t k = DTypeBytes(fp.k_dtype());
  const uint32_t v = DTypeBytes(fp.v_dtype());
  if (k == 0 || v == 0) {
    return absl::InvalidArgumentError(
        "canonical layout needs k_dtype and v_dtype of f16, bf16 or f32");
  }
  unsigned __int128 total = n_layers;
  total *= n_tokens;
  total *= fp.n_kv_heads();
  total *= fp.head_dim();
  total *= (k + v);
  if (total > std::numeric_limits<uint64_t>::max()) {
    return absl::InvalidArgumentError("payload size overflows 64 bits");
  }
  return static_cast<uint64_t>(total);
}

absl::Status ValidateFingerprint(const v1::LayoutFingerprint& fp,
                                 const BlockLimits& limits,
                                 absl::string_view field) {
  if (auto s = CheckLength(field, "namespace", fp.namespace_(), 1, 128); !s.ok())
    return s;
  if (auto s = CheckLength(field, "model_id", fp.model_id(), 1, 256); !s.ok())
    return s;
  if (auto s = CheckLength(field, "model_revision", fp.model_revision(), 0, 256);
      !s.ok())
    return s;
  if (auto s = CheckLength(field, "trust_group", fp.trust_group(), 0, 128); !s.ok())
    return s;
  if (!v1::Layout_IsValid(fp.layout()) || fp.layout() == v1::LAYOUT_UNSPECIFIED) {
    return Invalid(field, "layout",
                   fp.layout() == v1::LAYOUT_UNSPECIFIED
                       ? std::string("is required (LAYOUT_CANONICAL_V1 or LAYOUT_OPAQUE)")
                       : absl::StrCat("unknown layout version ",
                                      static_cast<int>(fp.layout())));
  }
  const bool canonical = fp.layout() == v1::LAYOUT_CANONICAL_V1;
  for (const auto& [name, dtype] :
       {std::pair<const char*, int>{"k_dtype", fp.k_dtype()},
        std::pair<const char*, int>{"v_dtype", fp.v_dtype()}}) {
    if (!v1::DType_IsValid(dtype)) {
      return Invalid(field, name, absl::StrCat("unknown dtype ", dtype));
    }
    if (dtype == v1::DTYPE_UNSPECIFIED) {
      return Invalid(field, name, "is required");
    }
    if (canonical && DTypeBytes(dtype) == 0) {
      return Invalid(field, name,
                     absl::StrCat(DTypeName(dtype),
                                  " is not allowed in the canonical layout "
                                  "(f16, bf16 or f32)"));
    }
  }
  if (auto s = CheckRange(field, "n_layers", fp.n_layers(), 1, limits.max_layers);
      !s.ok())
    return s;
  if (auto s = CheckRange(field, "n_kv_heads", fp.n_kv_heads(), 1,
                          limits.max_kv_heads);
      !s.ok())
    return s;
  if (auto s = CheckRange(field, "head_dim", fp.head_dim(), 1, limits.max_head_dim);
      !s.ok())
    return s;
  if (auto s = ValidateRope(fp.rope(), fp.head_dim(), absl::StrCat(field, ".rope"));
      !s.ok())
    return s;
  if (auto s = CheckRange(field, "tp_size", fp.tp_size(), 0, 4096); !s.ok())
    return s;
  const uint32_t tp_size = fp.tp_size() == 0 ? 1 : fp.tp_size();
  if (fp.tp_rank() >= tp_size) {
    return Invalid(field, "tp_rank",
                   absl::StrCat(fp.tp_rank(), " must be < tp_size ", tp_size));
  }
  return absl::OkStatus();
}

namespace {

// ValidateSummaries checks a block's summaries (at most 8; kinds, layers,
// shapes matching the fingerprint, finite values, no duplicates).
absl::Status ValidateSummaries(const v1::BlockMeta& meta, const BlockLimits& limits,
                               const std::string& m) {
  const v1::LayoutFingerprint& fp = meta.fingerprint();
  if (meta.summaries_size() > 8) {
    return Invalid(m, "summaries",
                   absl::StrCat("has ", meta.summaries_size(), " summaries, at most 8"));
  }
  uint64_t summary_bytes = 0;
  for (const v1::Summary& s : meta.summaries()) {
    summary_bytes += static_cast<uint64_t>(s.values_size()) * sizeof(float);
  }
  if (summary_bytes > limits.max_summary_bytes) {
    return Invalid(m, "summaries",
                   absl::StrCat("hold ", FormatByteSize(summary_bytes),
                                " of values, above the per-block cap of ",
                                FormatByteSize(limits.max_summary_bytes)));
  }
  std::vector<std::pair<int, uint32_t>> seen;
  for (int i = 0; i < meta.summaries_size(); ++i) {
    const v1::Summary& s = meta.summaries(i);
    const std::string sf = absl::StrCat(m, ".summaries[", i, "]");
    if (!v1::SummaryKind_IsValid(s.kind()) || s.kind() == v1::SUMMARY_KIND_UNSPECIFIED) {
      return Invalid(sf, "kind",
                     s.kind() == v1::SUMMARY_KIND_UNSPECIFIED
                         ? std::string("is required")
                         : absl::StrCat("unknown summary kind ", static_cast<int>(s.kind())));
    }
    if (s.kind() == v1::SUMMARY_EMBEDDING) {
      if (s.heads() != 1) return Invalid(sf, "heads", absl::StrCat(s.heads(), " must be 1 for an embedding"));
      if (s.dim() == 0 || s.dim() > 8192) {
        return Invalid(sf, "dim", absl::StrCat(s.dim(), " is out of range [1, 8192]"));
      }
      if (s.layer() != 0) return Invalid(sf, "layer", "must be 0 for an embedding");
    } else {
      if (s.layer() < meta.layer_begin() || s.layer() >= meta.layer_end()) {
        return Invalid(sf, "layer", absl::StrCat(s.layer(), " is outside the block's layers [",
                                                 meta.layer_begin(), ", ", meta.layer_end(), ")"));
      }
      if (s.heads() != fp.n_kv_heads()) {
        return Invalid(sf, "heads", absl::StrCat(s.heads(), " must equal n_kv_heads ",
                                                 fp.n_kv_heads()));
      }
      if (s.dim() != fp.head_dim()) {
        return Invalid(sf, "dim", absl::StrCat(s.dim(), " must equal head_dim ", fp.head_dim()));
      }
      if (s.kind() == v1::SUMMARY_REPR_KEYS && (s.r() == 0 || s.r() > meta.n_tokens())) {
        return Invalid(sf, "r", absl::StrCat(s.r(), " must be in [1, n_tokens ", meta.n_tokens(), "]"));
      }
    }
    if (static_cast<uint64_t>(s.values_size()) != static_cast<uint64_t>(s.heads()) * s.dim()) {
      return Invalid(sf, "values", absl::StrCat("has ", s.values_size(), " floats, expected heads x dim = ",
                                                static_cast<uint64_t>(s.heads()) * s.dim()));
    }
    for (float v : s.values()) {
      if (!std::isfinite(v)) return Invalid(sf, "values", "must all be finite");
    }
    const std::pair<int, uint32_t> key(s.kind(), s.layer());
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return Invalid(sf, "kind", "duplicates another summary of the same kind and layer");
    }
    seen.push_back(key);
  }
  return absl::OkStatus();
}

// ParentOf: a prefix block's parent id (all zeros for the first block).
absl::StatusOr<BlockId> ParentOf(const v1::BlockMeta& meta) {
  if (meta.parent_id().empty()) return BlockId();
  return Hash128::FromBytes(meta.parent_id());
}

// ChainIdOf: the id a prefix block's own content gives it:
// PrefixBlockId(parent, tokens, fingerprint).
BlockId ChainIdOf(const BlockId& parent, const v1::BlockMeta& meta) {
  return PrefixBlockId(parent, absl::MakeConstSpan(meta.tokens().data(), meta.tokens_size()),
                       DigestFingerprint(meta.fingerprint()));
}

absl::Status ValidateBlock(const v1::BlockMeta& meta, uint64_t payload_bytes,
                           const BlockLimits& limits, absl::string_view field,
                           bool for_save) {
  const std::string m = absl::StrCat(field, ".meta");
  auto id = Hash128::FromBytes(meta.id());
  if (!id.ok()) return Invalid(m, "id", id.status().message());
  if (!meta.has_fingerprint()) return Invalid(m, "fingerprint", "is required");
  const v1::LayoutFingerprint& fp = meta.fingerprint();
  if (auto s = ValidateFingerprint(fp, limits, absl::StrCat(m, ".fingerprint"));
      !s.ok())
    return s;
  if (auto s = CheckRange(m, "n_tokens", meta.n_tokens(), 1, limits.max_tokens);
      !s.ok())
    return s;
  if (meta.layer_begin() >= meta.layer_end() ||
      meta.layer_end() > fp.n_layers()) {
    return Invalid(m, "layer_end",
                   absl::StrCat("layers [", meta.layer_begin(), ", ",
                                meta.layer_end(),
                                ") must be non-empty and within n_layers ",
                                fp.n_layers()));
  }
  // The caps come before anything walks the lists (the chain hash over the
  // tokens, the positions loop).
  if (for_save) {
    const uint64_t token_bytes = static_cast<uint64_t>(meta.tokens_size()) * 4;
    if (token_bytes > limits.max_token_bytes) {
      return Invalid(m, "tokens",
                     absl::StrCat("has ", meta.tokens_size(), " entries (",
                                  FormatByteSize(token_bytes),
                                  "), above the per-block cap of ",
                                  FormatByteSize(limits.max_token_bytes)));
    }
    const uint64_t position_bytes = static_cast<uint64_t>(meta.positions_size()) * 4;
    if (position_bytes > limits.max_position_bytes) {
      return Invalid(m, "positions",
                     absl::StrCat("has ", meta.positions_size(), " entries (",
                                  FormatByteSize(position_bytes),
                                  "), above the per-block cap of ",
                                  FormatByteSize(limits.max_position_bytes)));
    }
  }
  if (!meta.positions().empty()) {
    if (static_cast<uint32_t>(meta.positions_size()) != meta.n_tokens()) {
      return Invalid(m, "positions",
                     absl::StrCat("has ", meta.positions_size(),
                                  " entries, expected n_tokens = ",
                                  meta.n_tokens()));
    }
    for (int i = 0; i < meta.positions_size(); ++i) {
      if (meta.positions(i) < 0) {
        return Invalid(m, absl::StrCat("positions[", i, "]"),
                       absl::StrCat(meta.positions(i), " is negative"));
      }
    }
  } else {
    const int64_t last =
        static_cast<int64_t>(meta.first_position()) + meta.n_tokens() - 1;
    if (meta.first_position() < 0 || last > std::numeric_limits<int32_t>::max()) {
      return Invalid(m, "first_position",
                     absl::StrCat(meta.first_position(), " + n_tokens ",
                                  meta.n_tokens(),
                                  " must stay within [0, 2^31)"));
    }
  }
  switch (meta.kind()) {
    case v1::BLOCK_KIND_SESSION: {
      if (auto s = CheckLength(m, "session_id", meta.session_id(), 1, 256); !s.ok())
        return s;
      const BlockId expected =
          SessionBlockId(fp.namespace_(), meta.session_id(), meta.sequence());
      if (*id != expected) {
        return Invalid(m, "id",
                       absl::StrCat("does not match SessionBlockId(namespace, "
                                    "session_id, sequence) = ",
                                    expected.ToHex()));
      }
      break;
    }
    case v1::BLOCK_KIND_PREFIX: {
      absl::StatusOr<BlockId> parent = ParentOf(meta);
      if (!parent.ok()) return Invalid(m, "parent_id", parent.status().message());
      if (!meta.tokens().empty()) {
        if (static_cast<uint32_t>(meta.tokens_size()) != meta.n_tokens()) {
          return Invalid(m, "tokens",
                         absl::StrCat("has ", meta.tokens_size(),
                                      " entries, expected n_tokens = ",
                                      meta.n_tokens()));
        }
        const BlockId expected = ChainIdOf(*parent, meta);
        if (*id != expected) {
          return Invalid(m, "id",
                         absl::StrCat("does not match PrefixBlockId(parent_id, "
                                      "tokens, fingerprint) = ",
                                      expected.ToHex()));
        }
      }
      break;
    }
    default:
      return Invalid(m, "kind",
                     meta.kind() == v1::BLOCK_KIND_UNSPECIFIED
                         ? std::string("is required (BLOCK_KIND_PREFIX or "
                                       "BLOCK_KIND_SESSION)")
                         : absl::StrCat("unknown block kind ",
                                        static_cast<int>(meta.kind())));
  }
  if (for_save) {
    if (absl::Status sums = ValidateSummaries(meta, limits, m); !sums.ok()) return sums;
  }
  const std::string payload = absl::StrCat(field, ".payload");
  if (payload_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(payload, ": is empty"));
  }
  if (payload_bytes > limits.max_block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        payload, ": ", FormatByteSize(payload_bytes),
        " exceeds the maximum block size ", FormatByteSize(limits.max_block_bytes),
        " (--max-block-bytes)"));
  }
  if (fp.layout() == v1::LAYOUT_CANONICAL_V1) {
    auto expected = CanonicalPayloadBytes(fp, meta.n_tokens(),
                                          meta.layer_end() - meta.layer_begin());
    if (!expected.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(payload, ": ", expected.status().message()));
    }
    if (*expected != payload_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          payload, ": length ", payload_bytes,
          " does not match the canonical layout (layers ",
          meta.layer_end() - meta.layer_begin(), " x tokens ", meta.n_tokens(),
          " x kv_heads ", fp.n_kv_heads(), " x head_dim ", fp.head_dim(),
          " x (", DTypeBytes(fp.k_dtype()), " + ", DTypeBytes(fp.v_dtype()),
          " bytes) = ", *expected, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateBlockForSave(const v1::BlockMeta& meta, uint64_t payload_bytes,
                                  const BlockLimits& limits, absl::string_view field) {
  return ValidateBlock(meta, payload_bytes, limits, field, /*for_save=*/true);
}

absl::Status CheckRecordIdentity(const BlockId& id, const v1::BlockMeta& meta) {
  if (meta.id() != id.ToBytes()) return absl::DataLossError("meta.id: differs from the key");
  if (!meta.has_checksum()) return absl::DataLossError("meta.checksum: is missing");
  const v1::LayoutFingerprint& fp = meta.fingerprint();
  switch (meta.kind()) {
    case v1::BLOCK_KIND_SESSION:
      if (SessionBlockId(fp.namespace_(), meta.session_id(), meta.sequence()) != id) {
        return absl::DataLossError("meta.id: is not the id of its session and sequence");
      }
      return absl::OkStatus();
    case v1::BLOCK_KIND_PREFIX: {
      if (meta.tokens().empty() || static_cast<uint32_t>(meta.tokens_size()) != meta.n_tokens()) {
        return absl::DataLossError(
            "meta.tokens: a prefix record must carry its tokens (its id is checked against them)");
      }
      absl::StatusOr<BlockId> parent = ParentOf(meta);
      if (!parent.ok()) return absl::DataLossError("meta.parent_id: is not 16 bytes");
      if (ChainIdOf(*parent, meta) != id) {
        return absl::DataLossError(
            "meta.id: is not PrefixBlockId(parent_id, tokens, fingerprint)");
      }
      return absl::OkStatus();
    }
    default:
      return absl::DataLossError("meta.kind: is not a known block kind");
  }
}

absl::Status ValidateStoredBlock(const v1::BlockMeta& meta, uint64_t payload_bytes,
                                 const BlockLimits& limits, absl::string_view field) {
  return ValidateBlock(meta, payload_bytes, limits, field, /*for_save=*/false);
}

}  // namespace evoke
