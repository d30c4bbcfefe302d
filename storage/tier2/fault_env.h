// DiskFaults: a switch, for tests, that makes the files under a SpillStore
// fail as a full disk does. RocksDB's FaultInjectionTestFS is not in
// Debian's librocksdb-dev, so this is our own small FileSystemWrapper
// (storage/tier2/fault_env.cc); the store wraps its file system in it when
// SpillStoreOptions::faults is set.
#ifndef EVOKE_STORAGE_TIER2_FAULT_ENV_H_
#define EVOKE_STORAGE_TIER2_FAULT_ENV_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>

namespace rocksdb {
class Env;
class FileSystem;
}  // namespace rocksdb

namespace evoke {

// Thread-safe. Byte counts are of appended file data (WAL, SST, blob,
// MANIFEST writes); creating a file still succeeds, as on a full disk.
class DiskFaults {
 public:
  // NoSpaceAfter lets `bytes` more bytes be appended, then every append
  // fails with an ENOSPC IOError (RocksDB's IOError(NoSpace)), as a full
  // disk does, until Clear.
  void NoSpaceAfter(uint64_t bytes) { budget_.store(static_cast<int64_t>(bytes)); }
  // Clear gives the space back.
  void Clear() { budget_.store(kUnlimited); }
  bool full() const { return budget_.load() <= 0; }
  // Failed appends and creations so far.
  uint64_t failures() const { return failures_.load(); }

  // For the wrapper: takes `n` bytes of the budget; false when it is spent
  // (the write must then fail).
  bool Take(uint64_t n);
  void CountFailure() { failures_.fetch_add(1); }

 private:
  static constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();
  std::atomic<int64_t> budget_{kUnlimited};
  std::atomic<uint64_t> failures_{0};
};

// NewFaultFileSystem wraps `base` so that writes obey `faults`.
std::shared_ptr<rocksdb::FileSystem> NewFaultFileSystem(
    std::shared_ptr<rocksdb::FileSystem> base, std::shared_ptr<DiskFaults> faults);

}  // namespace evoke

#endif  // EVOKE_STORAGE_TIER2_FAULT_ENV_H_
