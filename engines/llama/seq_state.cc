#include "engines/llama/seq_state.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/block_validation.h"
#include "common/fingerprint.h"
#include "common/status_macros.h"

namespace evoke::llama {
namespace {

// Reads little-endian scalars and byte runs from a blob, remembering where
// it failed.
class Reader {
 public:
  explicit Reader(absl::string_view blob) : blob_(blob) {}

  template <typename T>
  bool Read(T* out, const char* what) {
    if (blob_.size() - offset_ < sizeof(T)) return Fail(what);
    std::memcpy(out, blob_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }
  bool Bytes(uint64_t n, absl::string_view* out, const char* what) {
    if (blob_.size() - offset_ < n) return Fail(what);
    *out = blob_.substr(offset_, n);
    offset_ += n;
    return true;
  }
  // `count` rows of `row` bytes, without overflowing the product.
  bool Rows(uint64_t row, uint64_t count, absl::string_view* out, const char* what) {
    if (count != 0 && row > remaining() / count) return Fail(what);
    return Bytes(row * count, out, what);
  }
  size_t remaining() const { return blob_.size() - offset_; }
  absl::Status error() const {
    return absl::DataLossError(absl::StrCat("llama.cpp sequence state truncated at byte ",
                                            offset_, " of ", blob_.size(), " (reading ",
                                            failed_, ")"));
  }

 private:
  bool Fail(const char* what) {
    failed_ = what;
    return false;
  }
  absl::string_view blob_;
  size_t offset_ = 0;
  const char* failed_ = "";
};

// Appends to a string whose capacity is kept between blobs.
class Writer {
 public:
  Writer(std::string* out, size_t reserve) : out_(*out) {
    out_.clear();
    out_.reserve(reserve);
  }
  template <typename T>
  void Put(T value) {
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void Append(const char* data, size_t n) { out_.append(data, n); }
  // Grows the blob by n bytes and returns where they start.
  char* Extend(size_t n) {
    const size_t at = out_.size();
    out_.resize(at + n);
    return out_.data() + at;
  }

 private:
  std::string& out_;
};

// Records layer 0's K or V type and row size in *type0 / *row0, and checks
// that every later layer has the same.
absl::Status SameAsLayer0(const char* kv, uint32_t layer, int32_t type, uint64_t row,
                          int32_t* type0, uint64_t* row0) {
  if (layer == 0) {
    *type0 = type;
    *row0 = row;
  } else if (type != *type0 || row != *row0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "llama.cpp sequence state: layer ", layer, " ", kv, " has type ", type, " and ", row,
        "-byte rows, layer 0 has type ", *type0, " and ", *row0,
        "; per-layer KV shapes are not supported"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::DType> DTypeOfGgmlType(int32_t ggml_type, absl::string_view what) {
  switch (ggml_type) {
    case kGgmlTypeF32:
      return v1::DTYPE_F32;
    case kGgmlTypeF16:
      return v1::DTYPE_F16;
    case kGgmlTypeBF16:
      return v1::DTYPE_BF16;
    default:
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": ggml type ", ggml_type,
          " is not f16, bf16 or f32; quantized KV caches cannot be re-anchored or "
          "summarised, so the evoke adapter refuses them"));
  }
}

int32_t GgmlTypeOfDType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return kGgmlTypeF32;
    case v1::DTYPE_F16:
      return kGgmlTypeF16;
    case v1::DTYPE_BF16:
      return kGgmlTypeBF16;
    default:
      return -1;
  }
}

absl::StatusOr<SeqState> ParseSeqState(absl::string_view blob) {
  Reader r(blob);
  uint32_t magic = 0, n_stream = 0, cell_count = 0;
  int32_t seq_id = 0;
  if (!r.Read(&magic, "magic")) return r.error();
  if (magic != kSeqStateMagic) {
    return absl::FailedPreconditionError(absl::StrCat(
        "llama.cpp sequence state: magic 0x", absl::Hex(magic), ", expected 0x",
        absl::Hex(kSeqStateMagic), " (the adapter is pinned to one llama.cpp release)"));
  }
  if (!r.Read(&seq_id, "seq_id") || !r.Read(&n_stream, "n_stream")) return r.error();
  if (n_stream != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "llama.cpp KV cache has ", n_stream,
        " streams; the evoke adapter needs one unified cache (llama_context_params.kv_unified "
        "= true)"));
  }
  if (!r.Read(&cell_count, "cell_count")) return r.error();
  SeqState s;
  // Every count is checked against the bytes left before anything is sized
  // by it (issue #11: a 20-byte blob claiming 2^32 cells asked for 16 GiB).
  // A cell takes 12 bytes: pos, n_seq_id, seq_id.
  if (cell_count > r.remaining() / 12) {
    return absl::DataLossError(absl::StrCat(
        "llama.cpp sequence state: ", cell_count, " cells need at least ",
        uint64_t{cell_count} * 12, " bytes, ", r.remaining(), " remain"));
  }
  if (cell_count == 0) {
    if (r.remaining() != 0) {
      return absl::DataLossError(absl::StrCat("llama.cpp sequence state: ", r.remaining(),
                                              " bytes after an empty sequence"));
    }
    return s;
  }
  s.positions.resize(cell_count);
  for (uint32_t i = 0; i < cell_count; ++i) {
    uint32_t n_seq = 0;
    int32_t cell_seq = 0;
    if (!r.Read(&s.positions[i], "cell position") || !r.Read(&n_seq, "cell n_seq_id")) {
      return r.error();
    }
    if (n_seq != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "llama.cpp sequence state: cell ", i, " belongs to ", n_seq,
          " sequences; expected exactly 1"));
    }
    if (!r.Read(&cell_seq, "cell seq_id")) return r.error();
  }
  uint32_t v_trans = 0;
  if (!r.Read(&v_trans, "v_trans") || !r.Read(&s.n_layer, "n_layer")) return r.error();
  s.v_trans = v_trans != 0;
  // A layer takes at least 24 bytes even with empty rows: K type and row
  // size (12), V type and row size, or type, element size and n_embd_v (12).
  if (s.n_layer > r.remaining() / 24) {
    return absl::DataLossError(absl::StrCat(
        "llama.cpp sequence state: ", s.n_layer, " layers need at least ",
        uint64_t{s.n_layer} * 24, " bytes, ", r.remaining(), " remain"));
  }
  s.k.resize(s.n_layer);
  s.v.resize(s.n_layer);
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    int32_t type = 0;
    uint64_t row = 0;
    if (!r.Read(&type, "k_type") || !r.Read(&row, "k row size")) return r.error();
    EVOKE_RETURN_IF_ERROR(SameAsLayer0("K", l, type, row, &s.k_type, &s.k_row_bytes));
    if (!r.Rows(row, cell_count, &s.k[l], "K rows")) return r.error();
  }
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    int32_t type = 0;
    uint64_t row = 0;
    if (!r.Read(&type, "v_type")) return r.error();
    if (s.v_trans) {
      uint32_t elem = 0, n_embd = 0;
      if (!r.Read(&elem, "v element size") || !r.Read(&n_embd, "n_embd_v")) return r.error();
      row = uint64_t{elem} * n_embd;
      if (l == 0) {
        s.v_elem_bytes = elem;
      } else if (elem != s.v_elem_bytes) {
        return absl::FailedPreconditionError(absl::StrCat(
            "llama.cpp sequence state: layer ", l, " V has ", elem,
            "-byte elements, layer 0 has ", s.v_elem_bytes,
            "; per-layer KV shapes are not supported"));
      }
    } else if (!r.Read(&row, "v row size")) {
      return r.error();
    }
    EVOKE_RETURN_IF_ERROR(SameAsLayer0("V", l, type, row, &s.v_type, &s.v_row_bytes));
    if (!r.Rows(row, cell_count, &s.v[l], "V rows")) return r.error();
  }
  if (r.remaining() != 0) {
    return absl::DataLossError(absl::StrCat("llama.cpp sequence state: ", r.remaining(),
                                            " unexpected trailing bytes"));
  }
  return s;
}

uint64_t CanonicalBytes(const SeqState& s) {
  return uint64_t{s.n_layer} * s.positions.size() * (s.k_row_bytes + s.v_row_bytes);
}

absl::StatusOr<CanonicalRange> ToCanonical(const SeqState& s, uint32_t n_kv_heads,
                                           uint32_t head_dim) {
  CanonicalRange out;
  // Sized by what the state holds (its views), never by a product of its
  // counts alone: ToCanonicalInto checks that the two agree.
  uint64_t held = 0;
  for (absl::string_view k : s.k) held += k.size();
  for (absl::string_view v : s.v) held += v.size();
  if (CanonicalBytes(s) > held) {
    return absl::InvalidArgumentError(absl::StrCat("state: ", held, " bytes of rows, ",
                                                   CanonicalBytes(s), " claimed"));
  }
  out.payload.resize(CanonicalBytes(s));
  absl::StatusOr<std::vector<int32_t>> positions =
      ToCanonicalInto(s, n_kv_heads, head_dim, absl::MakeSpan(out.payload));
  if (!positions.ok()) return positions.status();
  out.positions = std::move(positions).value();
  return out;
}

absl::StatusOr<std::vector<int32_t>> ToCanonicalInto(const SeqState& s, uint32_t n_kv_heads,
                                                     uint32_t head_dim, absl::Span<char> out_bytes) {
  const size_t n = s.positions.size();
  absl::StatusOr<v1::DType> k_dtype = DTypeOfGgmlType(s.k_type, "type_k");
  if (!k_dtype.ok()) return k_dtype.status();
  absl::StatusOr<v1::DType> v_dtype = DTypeOfGgmlType(s.v_type, "type_v");
  if (!v_dtype.ok()) return v_dtype.status();
  const uint64_t elems = uint64_t{n_kv_heads} * head_dim;
  const uint64_t k_row = elems * DTypeBytes(*k_dtype);
  const uint64_t v_row = elems * DTypeBytes(*v_dtype);
  if (s.k_row_bytes != k_row || s.v_row_bytes != v_row) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama.cpp KV rows are ", s.k_row_bytes, " (K) and ", s.v_row_bytes,
        " (V) bytes; n_kv_heads ", n_kv_heads, " x head_dim ", head_dim, " needs ", k_row,
        " and ", v_row));
  }
  if (s.v_trans && s.v_elem_bytes != DTypeBytes(*v_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama.cpp transposed V has ", s.v_elem_bytes, "-byte elements; type_v needs ",
        DTypeBytes(*v_dtype)));
  }
  if (s.k.size() != s.n_layer || s.v.size() != s.n_layer) {
    return absl::InvalidArgumentError(absl::StrCat("state: ", s.k.size(), " K and ", s.v.size(),
                                                   " V layers for n_layer ", s.n_layer));
  }
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    if (s.k[l].size() != n * k_row || s.v[l].size() != n * v_row) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state: layer ", l, " holds ", s.k[l].size(), " K and ", s.v[l].size(),
          " V bytes; ", n, " cells need ", n * k_row, " and ", n * v_row));
    }
  }
  if (out_bytes.size() < CanonicalBytes(s)) {
    return absl::InvalidArgumentError(absl::StrCat("dst: ", out_bytes.size(), " bytes, the block needs ",
                                                   CanonicalBytes(s)));
  }

  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return s.positions[a] < s.positions[b]; });
  std::vector<int32_t> positions(n);
  for (size_t i = 0; i < n; ++i) {
    positions[i] = s.positions[order[i]];
    if (i > 0 && positions[i] == positions[i - 1]) {
      return absl::FailedPreconditionError(
          absl::StrCat("llama.cpp sequence holds position ", positions[i], " twice"));
    }
  }
  const bool identity = std::is_sorted(s.positions.begin(), s.positions.end());

  char* dst = out_bytes.data();
  const uint32_t v_elem = DTypeBytes(*v_dtype);
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const char* k = s.k[l].data();
    if (identity) {
      std::memcpy(dst, k, n * k_row);
    } else {
      for (size_t i = 0; i < n; ++i) std::memcpy(dst + i * k_row, k + order[i] * k_row, k_row);
    }
    dst += n * k_row;
    const char* v = s.v[l].data();
    if (!s.v_trans) {
      if (identity) {
        std::memcpy(dst, v, n * v_row);
      } else {
        for (size_t i = 0; i < n; ++i) std::memcpy(dst + i * v_row, v + order[i] * v_row, v_row);
      }
    } else {
      // Transposed: element j of cell c is at (j * n + c) * v_elem.
      for (size_t i = 0; i < n; ++i) {
        char* row = dst + i * v_row;
        const size_t c = order[i];
        for (uint64_t j = 0; j < elems; ++j) {
          std::memcpy(row + j * v_elem, v + (j * n + c) * v_elem, v_elem);
        }
      }
    }
    dst += n * v_row;
  }
  return positions;
}

absl::StatusOr<std::string> ToSeqStateBlob(absl::string_view payload,
                                           absl::Span<const int32_t> positions,
                                           const CacheFormat& f, int32_t seq_id) {
  std::string out;
  absl::Status s = WriteSeqStateBlob(payload, positions, f, seq_id, &out);
  if (!s.ok()) return s;
  return out;
}

absl::Status WriteSeqStateBlob(absl::string_view payload, absl::Span<const int32_t> positions,
                               const CacheFormat& f, int32_t seq_id, std::string* out) {
  const uint64_t n = positions.size();
  const uint64_t elems = uint64_t{f.n_kv_heads} * f.head_dim;
  const uint32_t k_elem = DTypeBytes(f.k_dtype), v_elem = DTypeBytes(f.v_dtype);
  const int32_t k_type = GgmlTypeOfDType(f.k_dtype), v_type = GgmlTypeOfDType(f.v_dtype);
  if (k_type < 0 || v_type < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cache dtypes ", DTypeName(f.k_dtype), "/",
                                                   DTypeName(f.v_dtype),
                                                   ": only f16, bf16 and f32 are supported"));
  }
  const uint64_t k_row = elems * k_elem, v_row = elems * v_elem;
  if (n == 0 || payload.size() != f.n_layer * n * (k_row + v_row)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "payload: ", payload.size(), " bytes for ", n, " tokens x ", f.n_layer,
        " layers; the cache format needs ", f.n_layer * n * (k_row + v_row)));
  }
  Writer w(out, payload.size() + n * 12 + f.n_layer * 32 + 32);
  w.Put<uint32_t>(kSeqStateMagic);
  w.Put<int32_t>(seq_id);
  w.Put<uint32_t>(1);  // n_stream
  w.Put<uint32_t>(static_cast<uint32_t>(n));
  for (int32_t pos : positions) {
    w.Put<int32_t>(pos);
    w.Put<uint32_t>(1);
    w.Put<int32_t>(seq_id);
  }
  w.Put<uint32_t>(f.v_trans ? 1 : 0);
  w.Put<uint32_t>(f.n_layer);
  const uint64_t layer_bytes = n * (k_row + v_row);
  for (uint32_t l = 0; l < f.n_layer; ++l) {
    w.Put<int32_t>(k_type);
    w.Put<uint64_t>(k_row);
    w.Append(payload.data() + l * layer_bytes, n * k_row);
  }
  for (uint32_t l = 0; l < f.n_layer; ++l) {
    const char* v = payload.data() + l * layer_bytes + n * k_row;
    w.Put<int32_t>(v_type);
    if (!f.v_trans) {
      w.Put<uint64_t>(v_row);
      w.Append(v, n * v_row);
      continue;
    }
    w.Put<uint32_t>(v_elem);
    w.Put<uint32_t>(static_cast<uint32_t>(elems));
    char* transposed = w.Extend(n * v_row);
    for (uint64_t j = 0; j < elems; ++j) {
      for (uint64_t c = 0; c < n; ++c) {
        std::memcpy(transposed + (j * n + c) * v_elem, v + c * v_row + j * v_elem, v_elem);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace evoke::llama
