// CopyOp: one copy between host and device memory, and CoalesceCopies.
// Plain data shared by the copier (gpu/cuda_ipc.h) and the transfer plans
// (gpu/transfer_plan.h).
#ifndef EVOKE_GPU_COPY_OP_H_
#define EVOKE_GPU_COPY_OP_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace evoke {

// One copy between host and device memory.
struct CopyOp {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t bytes = 0;
};

// CoalesceCopies merges consecutive ops whose sources and destinations are
// both contiguous, so a batch of small blocks becomes a few large copies.
// Exposed for tests; the copier applies it.
std::vector<CopyOp> CoalesceCopies(absl::Span<const CopyOp> ops);

}  // namespace evoke

#endif  // EVOKE_GPU_COPY_OP_H_
