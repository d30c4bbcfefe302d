// ipc_exporter: a helper process for the CUDA IPC tests (cudaIpcOpenMemHandle
// refuses handles of its own process). It allocates `bytes` on `device`,
// fills byte i with (i * 7 + 3) & 0xff, prints the IPC handle as hex on one
// line, then waits for a line on stdin: "check" verifies that byte i is
// (i * 11 + 5) & 0xff (what the test wrote back) and exits 0 or 3; anything
// else (or EOF) exits 0.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: ipc_exporter DEVICE BYTES\n");
    return 2;
  }
  const int device = std::atoi(argv[1]);
  const size_t bytes = std::strtoull(argv[2], nullptr, 10);
  if (cudaSetDevice(device) != cudaSuccess) return 4;
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, bytes) != cudaSuccess) return 4;
  std::vector<unsigned char> host(bytes);
  for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>(i * 7 + 3);
  if (cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) return 4;
  cudaIpcMemHandle_t handle;
  if (cudaIpcGetMemHandle(&handle, ptr) != cudaSuccess) return 4;
  const auto* h = reinterpret_cast<const unsigned char*>(&handle);
  for (size_t i = 0; i < sizeof(handle); ++i) std::printf("%02x", h[i]);
  std::printf("\n");
  std::fflush(stdout);
  std::string line;
  if (!std::getline(std::cin, line) || line != "check") return 0;
  if (cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return 4;
  for (size_t i = 0; i < bytes; ++i) {
    if (host[i] != static_cast<unsigned char>(i * 11 + 5)) return 3;
  }
  return 0;
}
