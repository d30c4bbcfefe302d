#include "common/rope.h"

#include <cassert>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/block_validation.h"
#include "common/fingerprint.h"
#include "common/half.h"
#include "common/status_macros.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define EVOKE_ROPE_F16C 1
#endif

namespace evoke {
namespace {

#ifdef EVOKE_ROPE_F16C
// F16C conversions, 8 elements at a time: widening is exact and narrowing
// rounds to nearest even, exactly as HalfToFloat / FloatToHalf (common/half.h)
// do for every non-NaN value. Built for F16C whatever the compiler's target;
// called only when the CPU has it.
__attribute__((target("avx,f16c"))) void HalvesToFloats(const uint8_t* src, float* dst,
                                                        size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    __m128i h;
    std::memcpy(&h, src + 2 * i, sizeof(h));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
}
__attribute__((target("avx,f16c"))) void FloatsToHalves(const float* src, uint8_t* dst,
                                                        size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    std::memcpy(dst + 2 * i, &h, sizeof(h));
  }
}
bool CpuHasF16c() {
  static const bool has = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return has;
}
#endif

// ggml's MAX / MIN macros, kept as ternaries so that NaN propagates exactly
// as it does there.
template <typename A, typename B>
auto GgmlMax(A a, B b) {
  return a > b ? a : b;
}
template <typename A, typename B>
auto GgmlMin(A a, B b) {
  return a < b ? a : b;
}

constexpr float kGgmlPi = 3.14159265358979323846f;

// ggml_rope_yarn_corr_dim: the dimension at which a rotation completes n_rot
// turns over n_ctx_orig positions. Float, as in ggml.
float YarnCorrDim(int n_dims, float n_ctx_orig, float n_rot, float base) {
  return static_cast<float>(n_dims) *
         std::log(n_ctx_orig / (n_rot * 2 * kGgmlPi)) / (2 * std::log(base));
}

// ggml_rope_yarn_corr_dims: start and end correction dims.
void YarnCorrDims(int n_dims, float n_ctx_orig, float freq_base, float beta_fast,
                  float beta_slow, float dims[2]) {
  const float start = std::floor(YarnCorrDim(n_dims, n_ctx_orig, beta_fast, freq_base));
  const float end = std::ceil(YarnCorrDim(n_dims, n_ctx_orig, beta_slow, freq_base));
  dims[0] = GgmlMax(0.0f, start);
  dims[1] = GgmlMin(static_cast<float>(n_dims - 1), end);
}

// rope_yarn_ramp (i0 is the even dimension index; i0 / 2 is integer division),
// in double. ggml computes it in float, but the angle it feeds is a double
// multiplied by the shift: a float ramp (relative error ~6e-8) put an error of
// ~1.3e-10 x |shift| radians into every re-anchor (issue #11: 1e-5 on f32
// blocks from a shift of 2^17, 0.3 of the norm at 2^31). The corr dims are
// integers (floor / ceil, clamped to [0, n_dims - 1]), exact in either type,
// so which pairs ramp is still decided exactly as in ggml.
double YarnRamp(double low, double high, int i0) {
  const double y = static_cast<double>(i0 / 2) - low;
  const double r = y / GgmlMax(0.001, high - low);
  return 1.0 - GgmlMin(1.0, GgmlMax(0.0, r));
}

// Storage codecs: load / store one element at any alignment.
template <v1::DType D>
struct Codec;

template <>
struct Codec<v1::DTYPE_F16> {
  static constexpr size_t kBytes = 2;
  static float Load(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return HalfToFloat(h);
  }
  static void Store(uint8_t* p, float f) {
    const uint16_t h = FloatToHalf(f);
    std::memcpy(p, &h, 2);
  }
};

template <>
struct Codec<v1::DTYPE_BF16> {
  static constexpr size_t kBytes = 2;
  static float Load(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return Bf16ToFloat(h);
  }
  static void Store(uint8_t* p, float f) {
    const uint16_t h = FloatToBf16(f);
    std::memcpy(p, &h, 2);
  }
};

template <>
struct Codec<v1::DTYPE_F32> {
  static constexpr size_t kBytes = 4;
  static float Load(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  static void Store(uint8_t* p, float f) { std::memcpy(p, &f, 4); }
};

// Widen / Narrow move the n rotated elements of one head between storage
// and floats: in bulk with F16C for f16 when `f16c`, else element by element.
// Both are exact when widening and round to nearest even when narrowing.
template <v1::DType D>
void Widen(const uint8_t* src, float* dst, size_t n, [[maybe_unused]] bool f16c) {
#ifdef EVOKE_ROPE_F16C
  if constexpr (D == v1::DTYPE_F16) {
    if (f16c) return HalvesToFloats(src, dst, n);
  }
#endif
  for (size_t i = 0; i < n; ++i) dst[i] = Codec<D>::Load(src + i * Codec<D>::kBytes);
}

template <v1::DType D>
void Narrow(const float* src, uint8_t* dst, size_t n, [[maybe_unused]] bool f16c) {
#ifdef EVOKE_ROPE_F16C
  if constexpr (D == v1::DTYPE_F16) {
    if (f16c) return FloatsToHalves(src, dst, n);
  }
#endif
  for (size_t i = 0; i < n; ++i) Codec<D>::Store(dst + i * Codec<D>::kBytes, src[i]);
}

template <v1::DType D>
void RotateSection(const RopePlan& plan, uint8_t* k, uint32_t n_tokens,
                   uint32_t n_heads, absl::Span<const int64_t> delta) {
  using C = Codec<D>;
  const size_t n_pairs = plan.rotary_dim / 2;
  const bool neox = plan.type == v1::ROPE_NEOX;
  const size_t head_bytes = static_cast<size_t>(plan.head_dim) * C::kBytes;
#ifdef EVOKE_ROPE_F16C
  const bool f16c = D == v1::DTYPE_F16 && plan.rotary_dim % 8 == 0 && CpuHasF16c();
#else
  const bool f16c = false;
#endif
  std::vector<float> cos_t(n_pairs), sin_t(n_pairs), x(plan.rotary_dim);
  int64_t table_delta = 0;  // The delta cos_t / sin_t hold (0: none yet).
  for (uint32_t t = 0; t < n_tokens; ++t) {
    if (delta[t] == 0) continue;
    // Re-anchoring usually moves every token by the same delta: one table.
    if (delta[t] != table_delta) {
      const double d = static_cast<double>(delta[t]);
      for (size_t i = 0; i < n_pairs; ++i) {
        const double angle = d * plan.omega[i];
        cos_t[i] = static_cast<float>(std::cos(angle));
        sin_t[i] = static_cast<float>(std::sin(angle));
      }
      table_delta = delta[t];
    }
    uint8_t* row = k + static_cast<size_t>(t) * n_heads * head_bytes;
    for (uint32_t h = 0; h < n_heads; ++h) {
      uint8_t* head = row + h * head_bytes;
      Widen<D>(head, x.data(), plan.rotary_dim, f16c);
      for (size_t i = 0; i < n_pairs; ++i) {
        const size_t j0 = neox ? i : 2 * i;
        const size_t j1 = neox ? i + n_pairs : 2 * i + 1;
        const float x0 = x[j0];
        const float x1 = x[j1];
        const float c = cos_t[i];
        const float s = sin_t[i];
        // Two roundings per product, one per sum: the device kernel computes
        // the same with __fmul_rn / __fadd_rn.
        const float a = x0 * c;
        const float b = x1 * s;
        const float e = x0 * s;
        const float f = x1 * c;
        x[j0] = a - b;
        x[j1] = e + f;
      }
      Narrow<D>(x.data(), head, plan.rotary_dim, f16c);
    }
  }
}

absl::Status InvalidPlan(absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("plan: ", problem));
}

}  // namespace

absl::StatusOr<RopePlan> MakeRopePlan(const v1::LayoutFingerprint& raw) {
  const v1::LayoutFingerprint fp = NormalizeFingerprint(raw);
  // Only head_dim and rope matter here: check them with block_validation's
  // own rules on a probe whose other fields are trivially valid, so that the
  // rules (and messages) live in one place.
  v1::LayoutFingerprint probe;
  probe.set_namespace_("rope");
  probe.set_model_id("rope");
  probe.set_k_dtype(v1::DTYPE_F32);
  probe.set_v_dtype(v1::DTYPE_F32);
  probe.set_n_layers(1);
  probe.set_n_kv_heads(1);
  probe.set_head_dim(fp.head_dim());
  probe.set_layout(v1::LAYOUT_CANONICAL_V1);
  *probe.mutable_rope() = fp.rope();
  EVOKE_RETURN_IF_ERROR(ValidateFingerprint(probe, BlockLimits{}, "fingerprint"));

  const v1::RopeParams& r = fp.rope();
  RopePlan plan;
  plan.head_dim = fp.head_dim();
  if (r.type() == v1::ROPE_NONE) {
    plan.type = v1::ROPE_NONE;
    return plan;
  }
  if (r.scaling() == v1::ROPE_SCALING_DYNAMIC_NTK) {
    return absl::FailedPreconditionError(
        "fingerprint.rope.scaling: ROPE_SCALING_DYNAMIC_NTK angles depend on "
        "the sequence length, so a block saved with them cannot be re-anchored");
  }
  plan.type = r.type();
  plan.rotary_dim = r.rotary_dim();
  const uint32_t n_pairs = plan.rotary_dim / 2;
  const double scale = r.freq_scale();
  const bool yarn_ramp =
      r.scaling() == v1::ROPE_SCALING_YARN && r.yarn_ext_factor() != 0.0f;
  float corr_dims[2] = {0, 0};
  if (yarn_ramp) {
    YarnCorrDims(static_cast<int>(plan.rotary_dim), static_cast<float>(r.n_ctx_orig()),
                 static_cast<float>(r.freq_base()), r.yarn_beta_fast(),
                 r.yarn_beta_slow(), corr_dims);
  }
  plan.omega.resize(n_pairs);
  for (uint32_t i = 0; i < n_pairs; ++i) {
    double base = std::pow(r.freq_base(), -2.0 * i / plan.rotary_dim);
    if (!r.freq_factors().empty()) base /= r.freq_factors(i);
    double omega = scale * base;
    if (yarn_ramp) {
      const double ramp_mix =
          YarnRamp(corr_dims[0], corr_dims[1], static_cast<int>(2 * i)) *
          static_cast<double>(r.yarn_ext_factor());
      omega = scale * base * (1.0 - ramp_mix) + base * ramp_mix;
    }
    if (!std::isfinite(omega)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fingerprint.rope: the angle table is not finite at pair ", i,
          " (freq_base ", r.freq_base(), ", freq_scale ", scale,
          yarn_ramp ? absl::StrCat(", yarn corr dims [", corr_dims[0], ", ",
                                   corr_dims[1], "]")
                    : std::string(),
          ")"));
    }
    plan.omega[i] = omega;
  }
  return plan;
}

void RotateKeys(const RopePlan& plan, v1::DType dtype, void* k, uint32_t n_tokens,
                uint32_t n_heads, absl::Span<const int64_t> delta) {
  if (plan.type != v1::ROPE_NORM && plan.type != v1::ROPE_NEOX) return;
  assert(delta.size() == n_tokens);
  assert(plan.omega.size() == plan.rotary_dim / 2);
  assert(plan.rotary_dim <= plan.head_dim);
  uint8_t* bytes = static_cast<uint8_t*>(k);
  switch (dtype) {
    case v1::DTYPE_F16:
      RotateSection<v1::DTYPE_F16>(plan, bytes, n_tokens, n_heads, delta);
      break;
    case v1::DTYPE_BF16:
      RotateSection<v1::DTYPE_BF16>(plan, bytes, n_tokens, n_heads, delta);
      break;
    case v1::DTYPE_F32:
      RotateSection<v1::DTYPE_F32>(plan, bytes, n_tokens, n_heads, delta);
      break;
    default:
      assert(false && "RotateKeys: dtype must be f16, bf16 or f32");
      break;
  }
}

absl::StatusOr<CanonicalKSections> CheckCanonicalReanchor(
    const RopePlan& plan, const v1::BlockMeta& meta, uint64_t payload_bytes,
    absl::Span<const int64_t> delta) {
  const v1::LayoutFingerprint& fp = meta.fingerprint();
  if (fp.layout() != v1::LAYOUT_CANONICAL_V1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "meta.fingerprint.layout: re-anchoring needs LAYOUT_CANONICAL_V1, got ",
        v1::Layout_IsValid(fp.layout()) ? v1::Layout_Name(fp.layout())
                                        : absl::StrCat(static_cast<int>(fp.layout()))));
  }
  if (meta.layer_begin() >= meta.layer_end() || meta.layer_end() > fp.n_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("meta.layer_end: layers [", meta.layer_begin(), ", ",
                     meta.layer_end(), ") must be non-empty and within n_layers ",
                     fp.n_layers()));
  }
  CanonicalKSections s;
  s.n_layers = meta.layer_end() - meta.layer_begin();
  s.n_tokens = meta.n_tokens();
  s.n_heads = fp.n_kv_heads();
  s.head_dim = fp.head_dim();
  s.k_dtype = fp.k_dtype();
  auto expected = CanonicalPayloadBytes(fp, s.n_tokens, s.n_layers);
  if (!expected.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload: ", expected.status().message()));
  }
  if (*expected != payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload: length ", payload_bytes,
        " does not match the canonical layout (layers ", s.n_layers, " x tokens ",
        s.n_tokens, " x kv_heads ", s.n_heads, " x head_dim ", s.head_dim, " x (",
        DTypeBytes(fp.k_dtype()), " + ", DTypeBytes(fp.v_dtype()),
        " bytes) = ", *expected, ")"));
  }
  if (delta.size() != s.n_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta: has ", delta.size(), " entries, expected n_tokens = ", s.n_tokens));
  }
  const uint64_t elements =
      static_cast<uint64_t>(s.n_tokens) * s.n_heads * s.head_dim;
  s.k_section_bytes = elements * DTypeBytes(fp.k_dtype());
  s.layer_stride_bytes = elements * (DTypeBytes(fp.k_dtype()) + DTypeBytes(fp.v_dtype()));

  // The plan must be the one of this block's fingerprint (at least in shape).
  const v1::RopeParams rope = NormalizeFingerprint(fp).rope();
  if (plan.type != rope.type()) {
    return InvalidPlan(absl::StrCat("built for rope type ",
                                    v1::RopeType_Name(plan.type), ", block has ",
                                    v1::RopeType_Name(rope.type())));
  }
  if (plan.type == v1::ROPE_NONE) return s;
  if (plan.type != v1::ROPE_NORM && plan.type != v1::ROPE_NEOX) {
    return InvalidPlan(absl::StrCat("unknown rope type ", static_cast<int>(plan.type)));
  }
  if (plan.head_dim != s.head_dim || plan.rotary_dim != rope.rotary_dim()) {
    return InvalidPlan(absl::StrCat("built for head_dim ", plan.head_dim,
                                    " rotary_dim ", plan.rotary_dim,
                                    ", block has head_dim ", s.head_dim,
                                    " rotary_dim ", rope.rotary_dim()));
  }
  if (plan.rotary_dim == 0 || plan.rotary_dim % 2 != 0 ||
      plan.rotary_dim > plan.head_dim || plan.omega.size() != plan.rotary_dim / 2) {
    return InvalidPlan(absl::StrCat("rotary_dim ", plan.rotary_dim, " with ",
                                    plan.omega.size(), " frequencies, head_dim ",
                                    plan.head_dim));
  }
  return s;
}

absl::Status ReanchorCanonicalBlock(const RopePlan& plan, const v1::BlockMeta& meta,
                                    uint8_t* payload, uint64_t payload_bytes,
                                    absl::Span<const int64_t> delta) {
  EVOKE_ASSIGN_OR_RETURN(const CanonicalKSections s,
                         CheckCanonicalReanchor(plan, meta, payload_bytes, delta));
  if (plan.type == v1::ROPE_NONE) return absl::OkStatus();
  for (uint32_t l = 0; l < s.n_layers; ++l) {
    RotateKeys(plan, s.k_dtype, payload + l * s.layer_stride_bytes, s.n_tokens,
               s.n_heads, delta);
  }
  return absl::OkStatus();
}

std::vector<int64_t> OriginalPositions(const v1::BlockMeta& meta) {
  std::vector<int64_t> out(meta.n_tokens());
  if (!meta.positions().empty()) {
    for (size_t t = 0; t < out.size() && t < static_cast<size_t>(meta.positions_size());
         ++t) {
      out[t] = meta.positions(static_cast<int>(t));
    }
  } else {
    for (size_t t = 0; t < out.size(); ++t) {
      out[t] = static_cast<int64_t>(meta.first_position()) + static_cast<int64_t>(t);
    }
  }
  return out;
}

}  // namespace evoke
