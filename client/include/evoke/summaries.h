// Key summaries an engine attaches to the blocks it saves, so that Recover
// can find them (kvtier.proto's Summary; DESIGN.md "Summaries").
//
// The daemon computes SUMMARY_MEAN_KEYS itself for canonical blocks saved
// without one. SUMMARY_REPR_KEYS (InfLLM's representative keys: per KV head,
// the mean un-rotated key of the r tokens that received the most attention)
// needs the attention mass only the engine sees, so the engine computes it
// here, on the CPU or, while the block is still on the GPU, with a CUDA
// kernel, and adds it to the block's metadata before Save:
//
//   evoke::BlockToSave block(meta, payload);
//   absl::StatusOr<evoke::v1::Summary> s = evoke::ReprKeysSummary(
//       block.meta, payload_ptr, payload_bytes, layer, attention, /*r=*/4);
//   if (s.ok()) *block.meta.add_summaries() = *std::move(s);
//
// Both functions give the same tokens and, to within one f32 rounding of a
// sin/cos, the same values (gpu/repr_keys_test.cc). See common/summaries.h
// and gpu/repr_keys.h for the exact contracts and errors.
#ifndef EVOKE_CLIENT_SUMMARIES_H_
#define EVOKE_CLIENT_SUMMARIES_H_

#include "common/summaries.h"  // ReprKeysSummary, MeanKeysSummary (CPU)
#include "gpu/repr_keys.h"     // ReprKeysSummaryOnDevice (CUDA; UNAVAILABLE without)

#endif  // EVOKE_CLIENT_SUMMARIES_H_
