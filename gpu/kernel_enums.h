// The proto enum values the CUDA kernels need, without the proto headers
// (kernels stay free of protobuf and Abseil). gpu/rope_device.cc checks them
// against evoke/v1/block.proto at compile time.
#ifndef EVOKE_GPU_KERNEL_ENUMS_H_
#define EVOKE_GPU_KERNEL_ENUMS_H_

namespace evoke::kernel {

// v1::DType
constexpr int kDTypeF16 = 1;
constexpr int kDTypeBf16 = 2;
constexpr int kDTypeF32 = 3;
// v1::RopeType
constexpr int kRopeNorm = 2;
constexpr int kRopeNeox = 3;

}  // namespace evoke::kernel

#endif  // EVOKE_GPU_KERNEL_ENUMS_H_
