// Key summaries of canonical blocks, for Recover: computed by the daemon
// (MEAN_KEYS for blocks saved without one) and by the client library
// (REPR_KEYS, from the attention mass the engine observed).
#ifndef EVOKE_COMMON_SUMMARIES_H_
#define EVOKE_COMMON_SUMMARIES_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/rope.h"
#include "evoke/summaries.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// Where one layer's keys sit in a canonical-v1 payload, and how to un-rotate
// them: what UnrotatedKeys reads, for other implementations (the GPU's).
struct KeysOfLayer {
  RopePlan plan;
  v1::DType k_dtype = v1::DTYPE_UNSPECIFIED;
  uint32_t n_tokens = 0;
  uint32_t n_heads = 0;
  uint32_t head_dim = 0;
  uint64_t offset = 0;             // Of the layer's K section in the payload.
  std::vector<int64_t> positions;  // Each token's original position.
};

// LocateKeys checks a block as UnrotatedKeys does (same errors) and says where
// layer `layer`'s keys are.
absl::StatusOr<KeysOfLayer> LocateKeys(const v1::BlockMeta& meta, uint64_t payload_bytes,
                                       uint32_t layer);

// MeanKeysSummary and ReprKeysSummary also return INVALID_ARGUMENT
// ("payload: the keys of layer L are not all finite ...") when the summary
// would hold a NaN or an infinity (NaN or infinite keys): such a summary
// could not be ranked (issue #11), so there is none.
//
// UnrotatedKeys, DefaultSummaryLayer, MeanKeysSummary, ReprKeysSummary and
// TopTokensPerHead are declared, with their contracts, in the client's public
// header <evoke/summaries.h> (included above); they are defined in
// common/summaries.cc. TopTokensPerHead is the CPU reference of the GPU
// kernel in gpu/repr_keys.h.

}  // namespace evoke

#endif  // EVOKE_COMMON_SUMMARIES_H_
