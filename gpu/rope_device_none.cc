// gpu/rope_device.h without CUDA: re-anchoring in device memory is
// unavailable (the host path, common/rope.h, always is).
#include "gpu/rope_device.h"

namespace evoke {

absl::Status ReanchorCanonicalBlockOnDevice(const RopePlan& /*plan*/,
                                            const v1::BlockMeta& /*meta*/,
                                            void* /*device_payload*/,
                                            uint64_t /*payload_bytes*/,
                                            absl::Span<const int64_t> /*delta*/,
                                            int /*device*/) {
  return absl::UnavailableError("evoke was built without CUDA (nvcc not found)");
}

absl::Status ReanchorCanonicalBlocksOnDevice(absl::Span<const DeviceReanchorJob> /*jobs*/,
                                             int /*device*/) {
  return absl::UnavailableError("evoke was built without CUDA (nvcc not found)");
}

}  // namespace evoke
