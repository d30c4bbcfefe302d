// gpu/repr_keys.h without CUDA: the CPU path (common/summaries.h) always is.
#include "gpu/repr_keys.h"

namespace evoke {

absl::StatusOr<v1::Summary> ReprKeysSummaryOnDevice(const v1::BlockMeta& /*meta*/,
                                                    const void* /*device_payload*/,
                                                    uint64_t /*payload_bytes*/,
                                                    uint32_t /*layer*/,
                                                    const float* /*device_attention*/,
                                                    uint32_t /*r*/, int /*device*/,
                                                    std::vector<uint32_t>* /*top_tokens*/) {
  return absl::UnavailableError("evoke was built without CUDA (nvcc not found)");
}

}  // namespace evoke
