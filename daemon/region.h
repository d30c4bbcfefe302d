// Regions: client memory registered with the daemon, that Save reads payloads
// from and Load writes them to. A region belongs to a lease; it stays mapped
// while any copy holds a reference, even after the lease ends.
#ifndef EVOKE_DAEMON_REGION_H_
#define EVOKE_DAEMON_REGION_H_

#include <sys/types.h>

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

// MappingLimits caps what client memory the daemon maps, over all leases
// and per peer uid. Every mapping is a VMA of the daemon: past
// vm.max_map_count the kernel refuses any further mmap, including the
// allocator's and thread stacks', and the daemon aborts; so the count cap
// must stay well under it (see DefaultMaxMappings).
struct MappingLimits {
  uint64_t max_bytes = UINT64_MAX;
  uint64_t max_mappings = UINT64_MAX;
  uint64_t max_bytes_per_uid = UINT64_MAX;
  uint64_t max_mappings_per_uid = UINT64_MAX;
};

// DefaultMaxMappings returns min(16384, vm.max_map_count / 4), reading
// /proc/sys/vm/max_map_count (65530 assumed when unreadable).
uint64_t DefaultMaxMappings();

// MappingBudget counts the mappings of client memory and their bytes, in
// all and per uid, against MappingLimits. Reserve takes a Charge that is
// returned when the Charge is destroyed, which may be after the budget
// itself is gone (a region outlives its lease while copies use it).
// Thread-safe.
class MappingBudget {
 public:
  struct Usage {
    uint64_t bytes = 0;
    uint64_t mappings = 0;
  };

 private:
  struct State;

 public:
  // Charge: one mapping of `bytes` for `uid`, counted until destroyed.
  // Move-only; a default-constructed Charge counts nothing.
  class Charge {
   public:
    Charge() = default;
    Charge(Charge&& o) noexcept = default;
    Charge& operator=(Charge&& o) noexcept;
    Charge(const Charge&) = delete;
    Charge& operator=(const Charge&) = delete;
    ~Charge() { Return(); }

   private:
    friend class MappingBudget;
    Charge(std::shared_ptr<State> state, uid_t uid, uint64_t bytes)
        : state_(std::move(state)), uid_(uid), bytes_(bytes) {}
    void Return();
    std::shared_ptr<State> state_;
    uid_t uid_ = 0;
    uint64_t bytes_ = 0;
  };

  explicit MappingBudget(const MappingLimits& limits);
  // Reserve counts one more mapping of `bytes` for `uid`. RESOURCE_EXHAUSTED
  // naming the cap when it would pass any of the four.
  // `max_bytes_for_uid`: the uid's cap from the policy (0: the limits').
  absl::StatusOr<Charge> Reserve(uid_t uid, uint64_t bytes, uint64_t max_bytes_for_uid = 0);
  Usage Total() const;
  Usage OfUid(uid_t uid) const;
  const MappingLimits& limits() const;

 private:
  std::shared_ptr<State> state_;
};

// ShmRegion maps a memfd the client handed over. Map requires, checked in
// this order and without calling into the fd's filesystem (a FUSE or NFS
// file must not be able to stall the daemon): 0 < size <= max_bytes; a
// regular file; a memfd sealed with F_SEAL_SHRINK (the client can then never
// make the daemon fault with SIGBUS by truncating it) of exactly `size`
// bytes; neither F_SEAL_WRITE nor F_SEAL_FUTURE_WRITE (Load writes into it);
// F_SEAL_GROW; room in `budget` (when not null) for one more mapping of
// `size` bytes for `uid`; and a read-write shared mapping. Pages are not
// populated: the client's memory costs the daemon nothing until a copy
// touches it. Errors: INVALID_ARGUMENT naming what is wrong;
// RESOURCE_EXHAUSTED past the budget or when the kernel refuses the mapping
// (ENOMEM: address space or vm.max_map_count). Takes ownership of `fd`
// (closed once mapped, or on failure). The mapping is unmapped, and its
// charge returned, on destruction.
class ShmRegion final : public Region {
 public:
  // `max_bytes_for_uid`: the uid's mapped-bytes cap from the policy (0: the
  // budget's).
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Map(int fd, uint64_t size,
                                                        uint64_t max_bytes,
                                                        MappingBudget* budget = nullptr,
                                                        uid_t uid = 0,
                                                        uint64_t max_bytes_for_uid = 0);
  ~ShmRegion() override;
  Kind kind() const override { return Kind::kSharedMemory; }
  uint64_t size() const override { return size_; }
  uint8_t* host_data() const override { return data_; }

 private:
  ShmRegion(uint8_t* data, uint64_t size, MappingBudget::Charge charge)
      : data_(data), size_(size), charge_(std::move(charge)) {}
  uint8_t* data_;
  uint64_t size_;
  MappingBudget::Charge charge_;  // Returned after the unmap.
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

// CudaMappings opens each (uid, device, IPC handle) once and shares the mapping
// among the regions that use it; the mapping closes when the last of them
// goes. Thread-safe.
class CudaMappings {
 public:
  // Get returns the mapping of `handle` on `device`, covering at least
  // `size` bytes, for leases of `owner` (the lease owner's uid): mappings
  // are shared only between leases of one uid, so presenting another
  // uid's handle never reaches its open mapping (CUDA refuses to open a
  // handle twice in one process: the second uid gets that error). Errors
  // as CudaIpcMapping::Open.
  absl::StatusOr<std::shared_ptr<CudaIpcMapping>> Get(uid_t owner, const std::string& handle,
                                                      int device, uint64_t size);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<CudaIpcMapping>> open_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace evoke

#endif  // EVOKE_DAEMON_REGION_H_
