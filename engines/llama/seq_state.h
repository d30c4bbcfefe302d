// llama.cpp sequence-state blobs <-> evoke's canonical layout.
//
// llama_state_seq_get_data() writes one sequence of a (non-iSWA, attention)
// KV cache as, in this pinned llama.cpp release (src/llama-context.cpp,
// src/llama-kv-cache.cpp state_write*):
//
//   u32 magic 0xaf143cd8, i32 seq_id, u32 n_stream,
//   per stream: u32 cell_count; when > 0:
//     per cell:  i32 pos, u32 n_seq_id (1), i32 seq_id
//     u32 v_trans, u32 n_layer
//     per layer: i32 k_type, u64 k_row_bytes, cell_count K rows (post-RoPE)
//     v_trans 0: per layer: i32 v_type, u64 v_row_bytes, cell_count V rows
//     v_trans 1: per layer: i32 v_type, u32 v_elem_bytes, u32 n_embd_v,
//                n_embd_v runs of cell_count elements (V transposed)
//
// Cells come in cache-cell order, which is not always position order. The
// canonical layout (proto/evoke/v1/block.proto) is position-ordered and per
// layer: K rows, then V rows, a row being [n_kv_heads][head_dim].
//
// This module only reformats bytes: it never calls llama.cpp, so it is unit
// tested with synthetic blobs.
#ifndef EVOKE_CLIENT_LLAMA_SEQ_STATE_H_
#define EVOKE_CLIENT_LLAMA_SEQ_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "evoke/v1/block.pb.h"

namespace evoke::llama {

inline constexpr uint32_t kSeqStateMagic = 0xaf143cd8;

// ggml_type values of the cache types the adapter handles (ggml.h).
inline constexpr int32_t kGgmlTypeF32 = 0;
inline constexpr int32_t kGgmlTypeF16 = 1;
inline constexpr int32_t kGgmlTypeBF16 = 30;

// DTypeOfGgmlType maps a ggml_type to evoke's dtype: F32, F16, BF16, or
// FAILED_PRECONDITION naming `what` (e.g. "type_k") for quantized and other
// types, whose bytes cannot be re-anchored or summarised.
absl::StatusOr<v1::DType> DTypeOfGgmlType(int32_t ggml_type, absl::string_view what);
// GgmlTypeOfDType is the inverse for F32, F16 and BF16 (-1 otherwise).
int32_t GgmlTypeOfDType(v1::DType dtype);

// One sequence's cells as parsed from a blob; the views point into the blob.
struct SeqState {
  std::vector<int32_t> positions;  // One per cell, in cell order.
  uint32_t n_layer = 0;
  bool v_trans = false;
  int32_t k_type = -1;  // Same for every layer (checked).
  int32_t v_type = -1;
  uint64_t k_row_bytes = 0;  // Bytes of one cell's K row in one layer.
  uint64_t v_row_bytes = 0;  // Same for V (v_trans: element bytes x n_embd_v).
  uint32_t v_elem_bytes = 0;  // v_trans only: bytes of one V element.
  std::vector<absl::string_view> k;  // Per layer: cell_count K rows.
  std::vector<absl::string_view> v;  // Per layer: rows, or n_embd_v runs if v_trans.
};

// ParseSeqState parses a blob of llama_state_seq_get_data(). An empty
// sequence parses to zero positions. Errors: FAILED_PRECONDITION for a blob
// this adapter does not handle (other magic, several streams, i.e. a cache
// without kv_unified, cells shared by several sequences, per-layer type or
// row-size changes), DATA_LOSS for a truncated or overlong blob, or one whose
// counts (cells, layers, row sizes) claim more bytes than remain: every count
// is checked before anything is allocated from it, so a blob of n bytes
// never makes the parser allocate more than ~2n.
absl::StatusOr<SeqState> ParseSeqState(absl::string_view blob);

// A position-ordered block in canonical layout.
struct CanonicalRange {
  std::vector<int32_t> positions;  // Ascending.
  std::string payload;             // Canonical v1 bytes.
};

// ToCanonical converts `state` (which must have n_kv_heads * head_dim
// elements per K and V row) into canonical layout, sorting cells by position.
// Errors: INVALID_ARGUMENT when the row sizes do not match the shape,
// FAILED_PRECONDITION for duplicate positions.
absl::StatusOr<CanonicalRange> ToCanonical(const SeqState& state, uint32_t n_kv_heads,
                                           uint32_t head_dim);

// CanonicalBytes is the canonical payload length of `state`.
uint64_t CanonicalBytes(const SeqState& state);

// ToCanonicalInto is ToCanonical writing the payload to `dst` (at least
// CanonicalBytes(state) long, e.g. a shared-memory region) and returning the
// ascending positions.
absl::StatusOr<std::vector<int32_t>> ToCanonicalInto(const SeqState& state, uint32_t n_kv_heads,
                                                     uint32_t head_dim, absl::Span<char> dst);

// What a blob for llama_state_seq_set_data() must say about the cache.
struct CacheFormat {
  uint32_t n_layer = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  v1::DType k_dtype = v1::DTYPE_F16;
  v1::DType v_dtype = v1::DTYPE_F16;
  bool v_trans = false;
};

// ToSeqStateBlob builds a blob for llama_state_seq_set_data() holding
// `payload` (canonical, all n_layer layers, positions.size() tokens) at
// `positions`, cells in the given order, for sequence `seq_id`.
// INVALID_ARGUMENT when the payload length does not match.
absl::StatusOr<std::string> ToSeqStateBlob(absl::string_view payload,
                                           absl::Span<const int32_t> positions,
                                           const CacheFormat& format, int32_t seq_id);
// WriteSeqStateBlob is ToSeqStateBlob into `*out`, replacing its contents
// but keeping its capacity (no new pages for a buffer that is reused).
absl::Status WriteSeqStateBlob(absl::string_view payload, absl::Span<const int32_t> positions,
                               const CacheFormat& format, int32_t seq_id, std::string* out);

}  // namespace evoke::llama

#endif  // EVOKE_CLIENT_LLAMA_SEQ_STATE_H_
