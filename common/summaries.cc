#include "common/summaries.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/block_validation.h"
#include "common/half.h"
#include "common/rope.h"
#include "common/status_macros.h"

namespace evoke {

uint32_t DefaultSummaryLayer(const v1::BlockMeta& meta) {
  return meta.layer_begin() + (meta.layer_end() - meta.layer_begin()) / 2;
}

absl::StatusOr<KeysOfLayer> LocateKeys(const v1::BlockMeta& meta, uint64_t payload_bytes,
                                       uint32_t layer) {
  const v1::LayoutFingerprint& fp = meta.fingerprint();
  if (fp.layout() != v1::LAYOUT_CANONICAL_V1) {
    return absl::InvalidArgumentError("layout: keys can only be read from canonical blocks");
  }
  if (layer < meta.layer_begin() || layer >= meta.layer_end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer: ", layer, " is outside the block's layers [", meta.layer_begin(), ", ",
        meta.layer_end(), ")"));
  }
  EVOKE_ASSIGN_OR_RETURN(
      const uint64_t expected,
      CanonicalPayloadBytes(fp, meta.n_tokens(), meta.layer_end() - meta.layer_begin()));
  if (expected != payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload: ", payload_bytes, " bytes, the layout needs ", expected));
  }
  KeysOfLayer k;
  EVOKE_ASSIGN_OR_RETURN(k.plan, MakeRopePlan(fp));
  k.k_dtype = fp.k_dtype();
  k.n_tokens = meta.n_tokens();
  k.n_heads = fp.n_kv_heads();
  k.head_dim = fp.head_dim();
  const uint64_t row_elems = static_cast<uint64_t>(k.n_heads) * k.head_dim;
  const uint64_t layer_stride =
      row_elems * k.n_tokens * (DTypeBytes(fp.k_dtype()) + DTypeBytes(fp.v_dtype()));
  k.offset = (layer - meta.layer_begin()) * layer_stride;
  k.positions = OriginalPositions(meta);
  return k;
}

absl::StatusOr<std::vector<float>> UnrotatedKeys(const v1::BlockMeta& meta,
                                                 const uint8_t* payload,
                                                 uint64_t payload_bytes, uint32_t layer) {
  EVOKE_ASSIGN_OR_RETURN(const KeysOfLayer where, LocateKeys(meta, payload_bytes, layer));
  const v1::LayoutFingerprint& fp = meta.fingerprint();
  const RopePlan& plan = where.plan;
  const uint64_t row_elems = static_cast<uint64_t>(where.n_heads) * where.head_dim;
  const uint8_t* k = payload + where.offset;
  std::vector<float> keys(row_elems * meta.n_tokens());
  for (uint64_t i = 0; i < keys.size(); ++i) {
    switch (fp.k_dtype()) {
      case v1::DTYPE_F32:
        std::memcpy(&keys[i], k + i * 4, 4);
        break;
      case v1::DTYPE_F16: {
        uint16_t h;
        std::memcpy(&h, k + i * 2, 2);
        keys[i] = HalfToFloat(h);
        break;
      }
      default: {
        uint16_t b;
        std::memcpy(&b, k + i * 2, 2);
        keys[i] = Bf16ToFloat(b);
      }
    }
  }
  // Rotate each token back to position 0 (one definition of the angles).
  std::vector<int64_t> delta = where.positions;
  for (int64_t& d : delta) d = -d;
  RotateKeys(plan, v1::DTYPE_F32, keys.data(), meta.n_tokens(), fp.n_kv_heads(), delta);
  return keys;
}

namespace {

// CheckFinite refuses a summary computed from NaN or infinite keys (or keys
// whose rotation overflowed float): it would score NaN in Recover, where a
// NaN compared false against every bound and ranked first (issue #11). A
// client's own summaries with NaN are refused at Save; this keeps the daemon's
// from being kept.
absl::Status CheckFinite(const v1::Summary& s, uint32_t layer) {
  for (int i = 0; i < s.values_size(); ++i) {
    if (!std::isfinite(s.values(i))) {
      const uint32_t dim = s.dim() == 0 ? 1 : s.dim();
      return absl::InvalidArgumentError(absl::StrCat(
          "payload: the keys of layer ", layer, " are not all finite (head ",
          static_cast<uint32_t>(i) / dim, ", dimension ", static_cast<uint32_t>(i) % dim,
          " summarizes to ", s.values(i), "); no summary"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Summary> MeanKeysSummary(const v1::BlockMeta& meta, const uint8_t* payload,
                                            uint64_t payload_bytes, uint32_t layer) {
  EVOKE_ASSIGN_OR_RETURN(std::vector<float> keys,
                         UnrotatedKeys(meta, payload, payload_bytes, layer));
  const uint32_t heads = meta.fingerprint().n_kv_heads();
  const uint32_t dim = meta.fingerprint().head_dim();
  std::vector<double> sum(static_cast<size_t>(heads) * dim, 0.0);
  for (uint32_t t = 0; t < meta.n_tokens(); ++t) {
    const float* row = keys.data() + static_cast<size_t>(t) * heads * dim;
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += row[i];
  }
  v1::Summary s;
  s.set_kind(v1::SUMMARY_MEAN_KEYS);
  s.set_layer(layer);
  s.set_heads(heads);
  s.set_dim(dim);
  for (double v : sum) s.add_values(static_cast<float>(v / meta.n_tokens()));
  EVOKE_RETURN_IF_ERROR(CheckFinite(s, layer));
  return s;
}

std::vector<uint32_t> TopTokensPerHead(absl::Span<const float> attention, uint32_t n_tokens,
                                       uint32_t n_heads, uint32_t r) {
  std::vector<uint32_t> out;
  out.reserve(static_cast<size_t>(n_heads) * r);
  std::vector<uint32_t> order(n_tokens);
  for (uint32_t h = 0; h < n_heads; ++h) {
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + r, order.end(), [&](uint32_t a, uint32_t b) {
      const float x = attention[static_cast<size_t>(a) * n_heads + h];
      const float y = attention[static_cast<size_t>(b) * n_heads + h];
      return x != y ? x > y : a < b;
    });
    out.insert(out.end(), order.begin(), order.begin() + r);
  }
  return out;
}

absl::StatusOr<v1::Summary> ReprKeysSummary(const v1::BlockMeta& meta, const uint8_t* payload,
                                            uint64_t payload_bytes, uint32_t layer,
                                            absl::Span<const float> attention, uint32_t r) {
  const uint32_t heads = meta.fingerprint().n_kv_heads();
  const uint32_t dim = meta.fingerprint().head_dim();
  const uint32_t n = meta.n_tokens();
  if (attention.size() != static_cast<size_t>(n) * heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention: has ", attention.size(), " floats, expected n_tokens x n_kv_heads = ",
        static_cast<size_t>(n) * heads));
  }
  if (r == 0 || r > n) {
    return absl::InvalidArgumentError(absl::StrCat("r: ", r, " must be in [1, ", n, "]"));
  }
  if (!std::all_of(attention.begin(), attention.end(), [](float a) { return std::isfinite(a); })) {
    return absl::InvalidArgumentError("attention: not all finite");
  }
  EVOKE_ASSIGN_OR_RETURN(std::vector<float> keys,
                         UnrotatedKeys(meta, payload, payload_bytes, layer));
  const std::vector<uint32_t> top = TopTokensPerHead(attention, n, heads, r);
  v1::Summary s;
  s.set_kind(v1::SUMMARY_REPR_KEYS);
  s.set_layer(layer);
  s.set_heads(heads);
  s.set_dim(dim);
  s.set_r(r);
  for (uint32_t h = 0; h < heads; ++h) {
    for (uint32_t d = 0; d < dim; ++d) {
      double sum = 0;
      for (uint32_t j = 0; j < r; ++j) {
        const uint32_t t = top[static_cast<size_t>(h) * r + j];
        sum += keys[(static_cast<size_t>(t) * heads + h) * dim + d];
      }
      s.add_values(static_cast<float>(sum / r));
    }
  }
  EVOKE_RETURN_IF_ERROR(CheckFinite(s, layer));
  return s;
}

}  // namespace evoke
