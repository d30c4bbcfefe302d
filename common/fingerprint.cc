#include "common/fingerprint.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <cstring>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace evoke {
namespace {

// One normalized field: its name, a canonical byte encoding (what is hashed)
// and a readable rendering (what error messages show).
struct Field {
  absl::string_view name;
  std::string canonical;
  std::string readable;
};

std::string EncodeU64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

std::string EncodeDouble(double v) {
  if (v == 0) v = 0;  // Folds -0.0 into +0.0.
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return EncodeU64(bits);
}

Field StringField(absl::string_view name, const std::string& v) {
  return {name, v, absl::StrCat("\"", v, "\"")};
}
Field UintField(absl::string_view name, uint64_t v) {
  return {name, EncodeU64(v), absl::StrCat(v)};
}
Field DoubleField(absl::string_view name, double v) {
  return {name, EncodeDouble(v), absl::StrFormat("%.17g", v)};
}

std::vector<Field> CanonicalFields(const v1::LayoutFingerprint& raw) {
  const v1::LayoutFingerprint fp = NormalizeFingerprint(raw);
  const v1::RopeParams& r = fp.rope();
  std::vector<Field> f;
  f.push_back(StringField("namespace", fp.namespace_()));
  f.push_back(StringField("model_id", fp.model_id()));
  f.push_back(StringField("model_revision", fp.model_revision()));
  f.push_back({"k_dtype", EncodeU64(fp.k_dtype()), DTypeName(fp.k_dtype())});
  f.push_back({"v_dtype", EncodeU64(fp.v_dtype()), DTypeName(fp.v_dtype())});
  f.push_back(UintField("n_layers", fp.n_layers()));
  f.push_back(UintField("n_kv_heads", fp.n_kv_heads()));
  f.push_back(UintField("head_dim", fp.head_dim()));
  f.push_back({"layout", EncodeU64(fp.layout()),
               v1::Layout_Name(fp.layout()).empty()
                   ? absl::StrCat(static_cast<int>(fp.layout()))
                   : v1::Layout_Name(fp.layout())});
  f.push_back({"rope.type", EncodeU64(r.type()),
               v1::RopeType_Name(r.type()).empty()
                   ? absl::StrCat(static_cast<int>(r.type()))
                   : v1::RopeType_Name(r.type())});
  f.push_back(UintField("rope.rotary_dim", r.rotary_dim()));
  f.push_back(DoubleField("rope.freq_base", r.freq_base()));
  f.push_back(DoubleField("rope.freq_scale", r.freq_scale()));
  f.push_back({"rope.scaling", EncodeU64(r.scaling()),
               v1::RopeScaling_Name(r.scaling()).empty()
                   ? absl::StrCat(static_cast<int>(r.scaling()))
                   : v1::RopeScaling_Name(r.scaling())});
  std::string factors;
  for (float x : r.freq_factors()) factors += EncodeDouble(x);
  f.push_back({"rope.freq_factors", factors,
               absl::StrCat("[", absl::StrJoin(r.freq_factors(), ","), "]")});
  f.push_back(DoubleField("rope.yarn_ext_factor", r.yarn_ext_factor()));
  f.push_back(DoubleField("rope.yarn_attn_factor", r.yarn_attn_factor()));
  f.push_back(DoubleField("rope.yarn_beta_fast", r.yarn_beta_fast()));
  f.push_back(DoubleField("rope.yarn_beta_slow", r.yarn_beta_slow()));
  f.push_back(UintField("rope.n_ctx_orig", r.n_ctx_orig()));
  f.push_back(UintField("tp_rank", fp.tp_rank()));
  f.push_back(UintField("tp_size", fp.tp_size()));
  // Last, and hashed only when set: ids of blocks without a group are what
  // they were before the field existed.
  f.push_back(StringField("trust_group", fp.trust_group()));
  return f;
}

}  // namespace

std::string DTypeName(int dtype) {
  switch (dtype) {
    case v1::DTYPE_F16:
      return "f16";
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_F32:
      return "f32";
    case v1::DTYPE_OPAQUE:
      return "opaque";
    default:
      return absl::StrCat("unspecified(", dtype, ")");
  }
}

v1::LayoutFingerprint MakeFingerprint(absl::string_view ns, absl::string_view model_id,
                                      const CacheShape& shape) {
  v1::LayoutFingerprint fp;
  fp.set_namespace_(std::string(ns));
  fp.set_model_id(std::string(model_id));
  fp.set_k_dtype(shape.k_dtype);
  fp.set_v_dtype(shape.v_dtype);
  fp.set_n_layers(shape.n_layers);
  fp.set_n_kv_heads(shape.n_kv_heads);
  fp.set_head_dim(shape.head_dim);
  fp.set_layout(shape.layout);
  return fp;
}

v1::LayoutFingerprint NormalizeFingerprint(const v1::LayoutFingerprint& fp) {
  v1::LayoutFingerprint out = fp;
  v1::RopeParams* r = out.mutable_rope();
  if (r->type() == v1::ROPE_TYPE_UNSPECIFIED) r->set_type(v1::ROPE_NONE);
  if (r->type() == v1::ROPE_NONE) {
    r->Clear();
    r->set_type(v1::ROPE_NONE);
  } else {
    if (r->freq_scale() == 0) r->set_freq_scale(1.0);
    if (r->rotary_dim() == 0) r->set_rotary_dim(out.head_dim());
  }
  if (out.tp_size() == 0) out.set_tp_size(1);
  return out;
}

namespace {

FingerprintDigest ComputeDigest(const v1::LayoutFingerprint& fp) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  static constexpr absl::string_view kDomain = "evoke/fingerprint/v1";
  XXH3_128bits_update(&state, kDomain.data(), kDomain.size());
  for (const Field& field : CanonicalFields(fp)) {
    if (field.name == "trust_group" && field.canonical.empty()) continue;
    const std::string name_len = EncodeU64(field.name.size());
    const std::string value_len = EncodeU64(field.canonical.size());
    XXH3_128bits_update(&state, name_len.data(), name_len.size());
    XXH3_128bits_update(&state, field.name.data(), field.name.size());
    XXH3_128bits_update(&state, value_len.data(), value_len.size());
    XXH3_128bits_update(&state, field.canonical.data(), field.canonical.size());
  }
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return FingerprintDigest(h.high64, h.low64);
}

}  // namespace

FingerprintDigest DigestFingerprint(const v1::LayoutFingerprint& fp) {
  // A batch carries the same fingerprint on every block: remember recent
  // digests by the message's bytes (cheap to produce) rather than rebuild the
  // canonical encoding each time. Per thread, so no locking.
  thread_local absl::flat_hash_map<std::string, FingerprintDigest> cache;
  std::string key;
  fp.SerializeToString(&key);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 256) cache.clear();
  const FingerprintDigest digest = ComputeDigest(fp);
  cache.emplace(std::move(key), digest);
  return digest;
}

std::string FingerprintMismatch(const v1::LayoutFingerprint& stored,
                                const v1::LayoutFingerprint& requested) {
  const std::vector<Field> a = CanonicalFields(stored);
  const std::vector<Field> b = CanonicalFields(requested);
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].canonical != b[i].canonical) {
      return absl::StrCat(a[i].name, ": stored ", a[i].readable,
                          ", requested ", b[i].readable);
    }
  }
  return "";
}

std::string DescribeFingerprint(const v1::LayoutFingerprint& raw) {
  const v1::LayoutFingerprint fp = NormalizeFingerprint(raw);
  std::string rope;
  switch (fp.rope().type()) {
    case v1::ROPE_NORM:
      rope = "norm";
      break;
    case v1::ROPE_NEOX:
      rope = "neox";
      break;
    default:
      rope = "none";
  }
  return absl::StrCat(
      "ns=", fp.namespace_(), " model=", fp.model_id(),
      fp.model_revision().empty() ? "" : "@", fp.model_revision(),
      " k=", DTypeName(fp.k_dtype()), " v=", DTypeName(fp.v_dtype()),
      " layers=", fp.n_layers(), " kv_heads=", fp.n_kv_heads(),
      " head_dim=", fp.head_dim(), " layout=",
      fp.layout() == v1::LAYOUT_CANONICAL_V1 ? "canonical_v1"
      : fp.layout() == v1::LAYOUT_OPAQUE     ? "opaque"
                                             : "unspecified",
      " rope=", rope, " tp=", fp.tp_rank(), "/", fp.tp_size(),
      fp.trust_group().empty() ? "" : " trust_group=", fp.trust_group());
}

}  // namespace evoke
