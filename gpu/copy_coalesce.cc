// CoalesceCopies: shared by the CUDA and the CPU builds.
#include <vector>

#include "gpu/cuda_ipc.h"

namespace evoke {

std::vector<CopyOp> CoalesceCopies(absl::Span<const CopyOp> ops) {
  std::vector<CopyOp> out;
  out.reserve(ops.size());
  for (const CopyOp& op : ops) {
    if (op.bytes == 0) continue;
    if (!out.empty()) {
      CopyOp& last = out.back();
      if (static_cast<const char*>(last.src) + last.bytes == op.src &&
          static_cast<char*>(last.dst) + last.bytes == op.dst) {
        last.bytes += op.bytes;
        continue;
      }
    }
    out.push_back(op);
  }
  return out;
}

}  // namespace evoke
