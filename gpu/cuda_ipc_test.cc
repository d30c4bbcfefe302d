// GPU tests of gpu/cuda_ipc.h. They need a CUDA device and skip, with the
// reason, when there is none; gpu/device_check.sh runs them on a GPU machine.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "gpu/cuda_ipc.h"
#include "gmock/gmock.h"
#include "gpu/cuda_test_util.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;

TEST(DeviceCopierTest, BatchedRoundTripMatchesHost) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  ASSERT_OK_AND_ASSIGN(auto copier, DeviceCopier::Create(0));
  constexpr size_t kBlocks = 64, kBlock = 64 * 1024;
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, kBlocks * kBlock), cudaSuccess);
  std::vector<uint8_t> src(kBlocks * kBlock), back(kBlocks * kBlock, 0);
  std::mt19937 rng(1);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  std::vector<CopyOp> up, down;
  for (size_t i = 0; i < kBlocks; ++i) {
    up.push_back({static_cast<uint8_t*>(dev) + i * kBlock, src.data() + i * kBlock, kBlock});
    down.push_back({back.data() + i * kBlock, static_cast<uint8_t*>(dev) + i * kBlock, kBlock});
  }
  ASSERT_OK(copier->HostToDevice(up));
  ASSERT_OK(copier->DeviceToHost(down));
  EXPECT_EQ(src, back);
  cudaFree(dev);
}

TEST(CudaIpcMappingTest, OpensAnotherProcessAllocation) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  constexpr size_t kBytes = 8 << 20;
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    close(to_child[1]);
    close(from_child[0]);
    const char* env = std::getenv("EVOKE_IPC_EXPORTER");
    execl(env != nullptr ? env : EVOKE_IPC_EXPORTER_PATH, "ipc_exporter", "0",
          std::to_string(kBytes).c_str(), nullptr);
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  char line[256] = {0};
  ssize_t got = 0;
  while (got < 129) {
    const ssize_t r = read(from_child[0], line + got, sizeof(line) - 1 - got);
    if (r <= 0) break;
    got += r;
    if (std::memchr(line, '\n', got) != nullptr) break;
  }
  ASSERT_GE(got, 128) << "exporter printed no handle";
  const std::string handle = absl::HexStringToBytes(std::string(line, 128));

  // A size past the allocation is refused.
  EXPECT_THAT(CudaIpcMapping::Open(handle, 0, kBytes * 4),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(auto mapping, CudaIpcMapping::Open(handle, 0, kBytes));
  ASSERT_OK_AND_ASSIGN(auto copier, DeviceCopier::Create(0));
  std::vector<uint8_t> host(kBytes);
  const CopyOp down[] = {{host.data(), mapping->device_ptr(), kBytes}};
  ASSERT_OK(copier->DeviceToHost(down));
  for (size_t i = 0; i < kBytes; i += 4097) {
    ASSERT_EQ(host[i], static_cast<uint8_t>(i * 7 + 3)) << i;
  }
  for (size_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 11 + 5);
  const CopyOp up[] = {{mapping->device_ptr(), host.data(), kBytes}};
  ASSERT_OK(copier->HostToDevice(up));
  mapping.reset();
  ASSERT_EQ(write(to_child[1], "check\n", 6), 6);
  close(to_child[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  close(from_child[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "exporter saw other bytes than we wrote (status " << status << ")";
}

// CheckMappedRegionTest, the size decision of Open, runs without a device
// in gpu_test (mapped_region_test.cc).

TEST(CudaIpcMappingTest, RejectsBogusHandlesAndDevices) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  std::string bogus(kCudaIpcHandleBytes, '\0');
  std::mt19937 rng(3);
  for (char& c : bogus) c = static_cast<char>(rng());
  absl::StatusOr<std::unique_ptr<CudaIpcMapping>> m = CudaIpcMapping::Open(bogus, 0, 4096);
  EXPECT_FALSE(m.ok());
  EXPECT_NE(m.status().code(), absl::StatusCode::kInternal) << m.status();
  int count = 0;
  cudaGetDeviceCount(&count);
  EXPECT_THAT(CudaIpcMapping::Open(bogus, count + 3, 4096),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(CudaIpcMapping::Open("short", 0, 4096),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // The process still works after the failures.
  ASSERT_OK_AND_ASSIGN(auto copier, DeviceCopier::Create(0));
}

TEST(HostRegistrationTest, RegistersInTheBackground) {
  EVOKE_REQUIRE_CUDA_DEVICE();
  constexpr size_t kBytes = 256 << 20;
  void* p = aligned_alloc(4096, kBytes);
  ASSERT_NE(p, nullptr);
  {
    ASSERT_OK_AND_ASSIGN(auto reg, HostRegistration::Start(p, kBytes, 64 << 20));
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!reg->done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_TRUE(reg->done());
    EXPECT_OK(reg->status());
    EXPECT_EQ(reg->registered_bytes(), kBytes);
    unsigned int flags = 0;
    EXPECT_EQ(cudaHostGetFlags(&flags, p), cudaSuccess);
  }
  free(p);
}

}  // namespace
}  // namespace evoke
