// fuzz_seq_state: llama.cpp sequence-state blobs (engines/llama/seq_state.h),
// which the adapter reads from llama_state_seq_get_data() and from blobs
// evoked hands back. The parser reformats bytes only, so it builds and runs
// without llama.cpp.
//
// Input: two bytes of shape (n_kv_heads - 1, and a divisor choice), then the
// blob. A blob ParseSeqState accepts is converted with ToCanonical for an
// n_kv_heads x head_dim that fits its K rows; a conversion that succeeds must
// write back (ToSeqStateBlob) to a blob that parses and converts to the same
// canonical bytes and positions.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "engines/llama/seq_state.h"
#include "common/block_validation.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace evoke;
  using namespace evoke::llama;
  if (size < 2 || size > (1u << 20)) return 0;
  const uint32_t n_kv_heads = 1u + data[0] % 16;
  const absl::string_view blob(reinterpret_cast<const char*>(data) + 2, size - 2);
  absl::StatusOr<SeqState> state = ParseSeqState(blob);
  if (!state.ok()) return 0;
  // Views point into the blob and cover cell_count rows per layer.
  FUZZ_CHECK(state->k.size() == state->n_layer && state->v.size() == state->n_layer);
  for (uint32_t l = 0; l < state->n_layer; ++l) {
    FUZZ_CHECK(state->k[l].size() == state->positions.size() * state->k_row_bytes);
    FUZZ_CHECK(state->v[l].size() == state->positions.size() * state->v_row_bytes);
  }
  (void)CanonicalBytes(*state);
  absl::StatusOr<v1::DType> k_dtype = DTypeOfGgmlType(state->k_type, "type_k");
  absl::StatusOr<v1::DType> v_dtype = DTypeOfGgmlType(state->v_type, "type_v");
  if (!k_dtype.ok() || !v_dtype.ok()) return 0;
  // head_dim from the K row size; data[1] picks another divisor sometimes so
  // that mismatched shapes are tried too.
  const uint64_t k_elems = state->k_row_bytes / DTypeBytes(*k_dtype);
  uint32_t head_dim = static_cast<uint32_t>(k_elems / n_kv_heads);
  if (data[1] & 1) head_dim += data[1] >> 1;
  absl::StatusOr<CanonicalRange> canonical = ToCanonical(*state, n_kv_heads, head_dim);
  if (!canonical.ok()) return 0;
  FUZZ_CHECK(canonical->payload.size() == CanonicalBytes(*state));
  FUZZ_CHECK(canonical->positions.size() == state->positions.size());
  for (size_t i = 1; i < canonical->positions.size(); ++i) {
    FUZZ_CHECK(canonical->positions[i - 1] < canonical->positions[i]);
  }
  if (canonical->positions.empty() || state->n_layer == 0) return 0;

  CacheFormat format;
  format.n_layer = state->n_layer;
  format.n_kv_heads = n_kv_heads;
  format.head_dim = head_dim;
  format.k_dtype = *k_dtype;
  format.v_dtype = *v_dtype;
  format.v_trans = state->v_trans;
  absl::StatusOr<std::string> written =
      ToSeqStateBlob(canonical->payload, canonical->positions, format, 0);
  FUZZ_CHECK(written.ok());
  absl::StatusOr<SeqState> reparsed = ParseSeqState(*written);
  FUZZ_CHECK(reparsed.ok());
  absl::StatusOr<CanonicalRange> again = ToCanonical(*reparsed, n_kv_heads, head_dim);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->positions == canonical->positions);
  FUZZ_CHECK(again->payload == canonical->payload);
  return 0;
}
