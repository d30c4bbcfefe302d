// Regions: client memory registered with the daemon, that Save reads payloads
// from and Load writes them to. A region belongs to a lease; it stays mapped
// while any copy holds a reference, even after the lease ends.
#ifndef EVOKE_DAEMON_REGION_H_
#define EVOKE_DAEMON_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/cuda_ipc.h"

namespace evoke {

class Region {
 public:
  enum class Kind { kSharedMemory, kCuda };
  virtual ~Region() = default;
  virtual Kind kind() const = 0;
  virtual uint64_t size() const = 0;
  // Host regions: the daemon's mapping of the region.
  virtual uint8_t* host_data() const { return nullptr; }
  // CUDA regions: the device pointer and ordinal.
  virtual void* device_ptr() const { return nullptr; }
  virtual int device() const { return -1; }
  // CheckSlice returns INVALID_ARGUMENT naming `field` unless [offset,
  // offset + length) lies inside the region (overflow-safe) and length > 0.
  absl::Status CheckSlice(uint64_t offset, uint64_t length,
                          const std::string& field) const;
};

// ShmRegion maps a memfd the client handed over. Map requires: a regular
// file (memfd), sealed against shrinking (F_SEAL_SHRINK: the client can then
// never make the daemon fault with SIGBUS by truncating it), of exactly
// `size` bytes, 0 < size <= max_bytes, mappable read-write and shared.
// Errors: INVALID_ARGUMENT naming what is wrong. Takes ownership of `fd`
// (closed once mapped, or on failure). The mapping is unmapped on destruction.
class ShmRegion final : public Region {
 public:
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Map(int fd, uint64_t size,
                                                        uint64_t max_bytes);
  ~ShmRegion() override;
  Kind kind() const override { return Kind::kSharedMemory; }
  uint64_t size() const override { return size_; }
  uint8_t* host_data() const override { return data_; }

 private:
  ShmRegion(uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint8_t* data_;
  uint64_t size_;
};

// CudaRegion: `size` bytes of a device allocation of the client, opened by
// IPC handle. Regions of the same allocation share one mapping.
class CudaRegion final : public Region {
 public:
  CudaRegion(std::shared_ptr<CudaIpcMapping> mapping, uint64_t size)
      : mapping_(std::move(mapping)), size_(size) {}
  Kind kind() const override { return Kind::kCuda; }
  uint64_t size() const override { return size_; }
  void* device_ptr() const override { return mapping_->device_ptr(); }
  int device() const override { return mapping_->device(); }

 private:
  std::shared_ptr<CudaIpcMapping> mapping_;
  uint64_t size_;
};

// CudaMappings opens each (device, IPC handle) once and shares the mapping
// among the regions that use it; the mapping closes when the last of them
// goes. Thread-safe.
class CudaMappings {
 public:
  // Get returns the mapping of `handle` on `device`, covering at least
  // `size` bytes. Errors as CudaIpcMapping::Open.
  absl::StatusOr<std::shared_ptr<CudaIpcMapping>> Get(const std::string& handle,
                                                      int device, uint64_t size);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<CudaIpcMapping>> open_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_REGION_H_
