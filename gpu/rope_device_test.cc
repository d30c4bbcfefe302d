// GPU tests of gpu/rope_device.h against the CPU reference (common/rope.h).
// They need a CUDA device and skip, with the reason, when there is none
// (argument checks and the no-device answer run everywhere).
//
// Bound (device vs CPU, per rotated element): the CPU and the kernel compute
// the same float operations (double angle, double cos/sin cast to float,
// unfused f32 multiply and add, round-to-nearest-even to the dtype); they can
// only differ where the device's double sincos and glibc's cos/sin round to
// different floats. Each element may then differ by at most
//   f16 / bf16: 1 ulp of the dtype at r,   f32: 4 ulp of f32 at r,
// where r = hypot(x0, x1) is the magnitude of the element's rotated pair
// (preserved by the rotation, so >= |element|). Everything the rotation must
// not write (V, dims >= rotary_dim, tokens with delta 0) must be
// byte-identical.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/rope.h"
#include "gmock/gmock.h"
#include "gpu/cuda_test_util.h"
#include "gpu/rope_device.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::CanonicalFingerprint;
using ::evoke::testing::DeviceBuffer;
using ::evoke::testing::DTypeSize;
using ::evoke::testing::HaveCudaDevice;
using ::evoke::testing::LoadAs;
using ::evoke::testing::StatusIs;
using ::evoke::testing::StoreAs;
using ::testing::HasSubstr;

// One unit in the last place of `dtype` at magnitude r (subnormal spacing
// below the smallest normal).
double UlpAt(v1::DType dtype, double r) {
  const int mantissa_bits = dtype == v1::DTYPE_F16 ? 10 : dtype == v1::DTYPE_BF16 ? 7 : 23;
  const int min_exp = dtype == v1::DTYPE_F16 ? -14 : -126;
  int e = 0;
  std::frexp(r, &e);  // r = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0, std::max(e - 1, min_exp) - mantissa_bits);
}

double UlpsAllowed(v1::DType dtype) { return dtype == v1::DTYPE_F32 ? 4 : 1; }

TEST(RopeDeviceTest, MatchesCpuForRandomBlocks) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  std::mt19937_64 rng(42);
  auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  const v1::DType kDTypes[] = {v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F32};
  const uint32_t kHeadDims[] = {2, 6, 8, 64, 80, 128, 256};
  std::normal_distribution<float> normal(0.0f, 2.0f);
  uint64_t compared = 0, identical = 0;
  double worst_ulps[3] = {0, 0, 0};
  for (int iter = 0; iter < 96; ++iter) {
    const v1::DType kd = kDTypes[iter % 3];
    const v1::RopeType type = (iter / 3) % 2 == 0 ? v1::ROPE_NORM : v1::ROPE_NEOX;
    const uint32_t head_dim = kHeadDims[pick(std::size(kHeadDims))];
    v1::LayoutFingerprint fp =
        CanonicalFingerprint(type, kd, kDTypes[pick(3)], 1 + pick(4), 1 + pick(8), head_dim);
    v1::RopeParams* r = fp.mutable_rope();
    r->set_rotary_dim(pick(2) == 0 ? 0 : 2 * (1 + pick(head_dim / 2)));
    r->set_freq_base(pick(2) == 0 ? 10000 : 500000);
    if (pick(3) == 0) {
      r->set_scaling(v1::ROPE_SCALING_YARN);
      r->set_freq_scale(0.25);
      r->set_yarn_ext_factor(1);
      r->set_yarn_beta_fast(32);
      r->set_yarn_beta_slow(1);
      r->set_n_ctx_orig(4096);
    }
    auto plan_or = MakeRopePlan(fp);
    ASSERT_OK(plan_or);
    const RopePlan& plan = *plan_or;
    const uint32_t n_tokens = 1 + pick(40);
    const uint32_t layer_begin = pick(fp.n_layers());
    const uint32_t layer_end = layer_begin + 1 + pick(fp.n_layers() - layer_begin);
    v1::BlockMeta meta;
    *meta.mutable_fingerprint() = fp;
    meta.set_n_tokens(n_tokens);
    meta.set_layer_begin(layer_begin);
    meta.set_layer_end(layer_end);
    meta.set_first_position(static_cast<int32_t>(pick(100000)));
    const uint32_t n_layers = layer_end - layer_begin;
    const uint32_t n_heads = fp.n_kv_heads();
    const uint64_t k_bytes = uint64_t{n_tokens} * n_heads * head_dim * DTypeSize(kd);
    const uint64_t stride = uint64_t{n_tokens} * n_heads * head_dim *
                            (DTypeSize(kd) + DTypeSize(fp.v_dtype()));
    std::vector<uint8_t> payload(n_layers * stride);
    for (uint8_t& c : payload) c = static_cast<uint8_t>(rng());  // V: random bytes
    for (uint32_t l = 0; l < n_layers; ++l) {
      for (uint64_t e = 0; e < k_bytes / DTypeSize(kd); ++e) {
        StoreAs(kd, payload.data() + l * stride + e * DTypeSize(kd), normal(rng));
      }
    }
    std::vector<int64_t> delta(n_tokens);
    for (int64_t& d : delta) {
      d = pick(5) == 0 ? 0 : static_cast<int64_t>(pick(1 << 21)) - (1 << 20);
    }
    const size_t offset = pick(4) == 0 ? 1 + pick(3) : 0;
    SCOPED_TRACE(absl::StrCat("case ", iter, ": k=", kd, " v=", fp.v_dtype(), " type=",
                              type, " head_dim=", head_dim, " rotary_dim=",
                              plan.rotary_dim, " tokens=", n_tokens, " layers=", n_layers,
                              " heads=", n_heads, " offset=", offset));

    std::vector<uint8_t> cpu = payload;
    ASSERT_OK(ReanchorCanonicalBlock(plan, meta, cpu.data(), cpu.size(), delta));
    DeviceBuffer dev(payload, offset);
    ASSERT_OK(ReanchorCanonicalBlockOnDevice(plan, meta, dev.get(), payload.size(),
                                             delta, 0));
    const std::vector<uint8_t> gpu = dev.Read();

    const uint32_t kb = DTypeSize(kd);
    const uint32_t n_pairs = plan.rotary_dim / 2;
    for (uint32_t l = 0; l < n_layers; ++l) {
      ASSERT_EQ(std::memcmp(gpu.data() + l * stride + k_bytes,
                            payload.data() + l * stride + k_bytes, stride - k_bytes),
                0)
          << "V of layer " << l << " changed on the device";
      for (uint32_t t = 0; t < n_tokens; ++t) {
        for (uint32_t h = 0; h < n_heads; ++h) {
          const uint64_t head = l * stride + (uint64_t{t} * n_heads + h) * head_dim * kb;
          if (delta[t] == 0) {
            ASSERT_EQ(std::memcmp(gpu.data() + head, payload.data() + head,
                                  head_dim * kb),
                      0)
                << "token " << t << " with delta 0 changed on the device";
            continue;
          }
          const uint64_t tail = head + uint64_t{plan.rotary_dim} * kb;
          ASSERT_EQ(std::memcmp(gpu.data() + tail, payload.data() + tail,
                                (head_dim - plan.rotary_dim) * kb),
                    0)
              << "dims past rotary_dim changed on the device";
          for (uint32_t i = 0; i < n_pairs; ++i) {
            const uint32_t j0 = type == v1::ROPE_NEOX ? i : 2 * i;
            const uint32_t j1 = type == v1::ROPE_NEOX ? i + n_pairs : 2 * i + 1;
            const double r = std::hypot(LoadAs(kd, payload.data() + head + j0 * kb),
                                        LoadAs(kd, payload.data() + head + j1 * kb));
            const double ulp = UlpAt(kd, r);
            for (uint32_t j : {j0, j1}) {
              const double a = LoadAs(kd, gpu.data() + head + j * kb);
              const double b = LoadAs(kd, cpu.data() + head + j * kb);
              ++compared;
              if (std::memcmp(gpu.data() + head + j * kb, cpu.data() + head + j * kb,
                              kb) == 0) {
                ++identical;
              }
              const double ulps = std::fabs(a - b) / ulp;
              worst_ulps[iter % 3] = std::max(worst_ulps[iter % 3], ulps);
              ASSERT_LE(ulps, UlpsAllowed(kd))
                  << "layer " << l << " token " << t << " head " << h << " dim " << j
                  << ": device " << a << ", cpu " << b << ", pair magnitude " << r;
            }
          }
        }
      }
    }
  }
  std::printf("device vs cpu: %llu rotated elements, %llu bit-identical; worst "
              "difference in ulps at the pair magnitude: f16 %.3g, bf16 %.3g, f32 "
              "%.3g\n",
              static_cast<unsigned long long>(compared),
              static_cast<unsigned long long>(identical), worst_ulps[0], worst_ulps[1],
              worst_ulps[2]);
}

TEST(RopeDeviceTest, LeavesVAndZeroDeltaTokensUntouched) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  for (v1::DType kd : {v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_F32}) {
    const v1::LayoutFingerprint fp = CanonicalFingerprint(v1::ROPE_NEOX, kd, kd, 2, 2, 8);
    ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
    v1::BlockMeta meta;
    *meta.mutable_fingerprint() = fp;
    meta.set_n_tokens(4);
    meta.set_layer_begin(0);
    meta.set_layer_end(2);
    // Signaling NaNs everywhere (a float round trip would quiet them), then
    // finite values in token 1's K.
    const uint32_t kb = DTypeSize(kd);
    std::vector<uint8_t> payload(2 * 2 * 4 * 2 * 8 * kb);
    for (size_t i = 0; i < payload.size(); i += kb) {
      const uint32_t snan = kd == v1::DTYPE_F16 ? 0x7c01 : kd == v1::DTYPE_BF16 ? 0xff81
                                                                              : 0x7f800001;
      std::memcpy(&payload[i], &snan, kb);
    }
    const uint64_t stride = payload.size() / 2;
    for (uint32_t l = 0; l < 2; ++l) {
      for (uint32_t e = 0; e < 2 * 8; ++e) {
        StoreAs(kd, payload.data() + l * stride + (1 * 2 * 8 + e) * kb, 1.0f + e);
      }
    }
    const std::vector<int64_t> delta = {0, 17, 0, 0};
    DeviceBuffer dev(payload, 0);
    ASSERT_OK(ReanchorCanonicalBlockOnDevice(plan, meta, dev.get(), payload.size(),
                                             delta, 0));
    const std::vector<uint8_t> gpu = dev.Read();
    std::vector<uint8_t> cpu = payload;
    ASSERT_OK(ReanchorCanonicalBlock(plan, meta, cpu.data(), cpu.size(), delta));
    for (uint32_t l = 0; l < 2; ++l) {
      const uint64_t k_bytes = stride / 2;
      EXPECT_EQ(std::memcmp(gpu.data() + l * stride + k_bytes,
                            payload.data() + l * stride + k_bytes, k_bytes),
                0)
          << "V changed, dtype " << kd;
      for (uint32_t t : {0u, 2u, 3u}) {
        EXPECT_EQ(std::memcmp(gpu.data() + l * stride + t * 2 * 8 * kb,
                              payload.data() + l * stride + t * 2 * 8 * kb, 2 * 8 * kb),
                  0)
            << "token " << t << " changed, dtype " << kd;
      }
      // Token 1 did rotate.
      EXPECT_NE(std::memcmp(gpu.data() + l * stride + 2 * 8 * kb,
                            payload.data() + l * stride + 2 * 8 * kb, 2 * 8 * kb),
                0);
    }
    // All-zero delta: nothing is written at all.
    DeviceBuffer again(payload, 0);
    ASSERT_OK(ReanchorCanonicalBlockOnDevice(plan, meta, again.get(), payload.size(),
                                             {0, 0, 0, 0}, 0));
    EXPECT_EQ(again.Read(), payload);
  }
}

TEST(RopeDeviceTest, RefusesHostMemory) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  const v1::LayoutFingerprint fp =
      CanonicalFingerprint(v1::ROPE_NORM, v1::DTYPE_F16, v1::DTYPE_F16, 1, 1, 8);
  ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = fp;
  meta.set_n_tokens(1);
  meta.set_layer_begin(0);
  meta.set_layer_end(1);
  std::vector<uint8_t> host(2 * 8 * 2);
  EXPECT_THAT(ReanchorCanonicalBlockOnDevice(plan, meta, host.data(), host.size(), {3}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("device_payload")));
  // A payload that runs past its allocation.
  void* small = nullptr;
  ASSERT_EQ(cudaMalloc(&small, 16), cudaSuccess);
  EXPECT_THAT(ReanchorCanonicalBlockOnDevice(plan, meta, static_cast<uint8_t*>(small) + 8,
                                             host.size(), {3}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("allocation")));
  cudaFree(small);
}

// Runs everywhere: arguments are checked before any CUDA call.
TEST(RopeDeviceTest, BadArgumentsAreInvalidArgument) {
  const v1::LayoutFingerprint fp =
      CanonicalFingerprint(v1::ROPE_NORM, v1::DTYPE_F16, v1::DTYPE_F16, 1, 1, 8);
  ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = fp;
  meta.set_n_tokens(2);
  meta.set_layer_begin(0);
  meta.set_layer_end(1);
  int dummy = 0;
  EXPECT_THAT(ReanchorCanonicalBlockOnDevice(plan, meta, &dummy, 63, {1, 2}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("payload")));
  EXPECT_THAT(ReanchorCanonicalBlockOnDevice(plan, meta, &dummy, 64, {1}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("delta")));
  EXPECT_THAT(ReanchorCanonicalBlockOnDevice(plan, meta, nullptr, 64, {1, 2}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
}

// Without a device the call is UNAVAILABLE (the daemon falls back to the CPU).
TEST(RopeDeviceTest, WithoutDeviceIsUnavailable) {
  std::string why;
  if (HaveCudaDevice(&why)) GTEST_SKIP() << "a CUDA device is present";
  const v1::LayoutFingerprint fp =
      CanonicalFingerprint(v1::ROPE_NEOX, v1::DTYPE_BF16, v1::DTYPE_BF16, 1, 1, 8);
  ASSERT_OK_AND_ASSIGN(const RopePlan plan, MakeRopePlan(fp));
  v1::BlockMeta meta;
  *meta.mutable_fingerprint() = fp;
  meta.set_n_tokens(1);
  meta.set_layer_begin(0);
  meta.set_layer_end(1);
  int dummy[8] = {};
  EXPECT_THAT(ReanchorCanonicalBlockOnDevice(plan, meta, dummy, 32, {5}, 0),
              StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace evoke
