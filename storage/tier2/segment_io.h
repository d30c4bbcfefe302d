// SegmentIo: the file operations under the payload segment files
// (storage/tier2/segment_log.h), as a seam. RealSegmentIo (NewSegmentIo) does
// them with pwrite/pread/fdatasync/fallocate, O_DIRECT where the filesystem
// allows it; FaultSegmentIo models a device for tests: what was synced, what
// was not, torn sectors at a crash, and errors on demand.
//
// Every Write/Read offset, length and buffer address that the segment log
// hands down is a multiple of the file's alignment (SegmentFile::alignment),
// so the same calls work with and without O_DIRECT.
#ifndef EVOKE_STORAGE_TIER2_SEGMENT_IO_H_
#define EVOKE_STORAGE_TIER2_SEGMENT_IO_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace evoke {

class DiskFaults;  // storage/tier2/fault_env.h

// The smallest alignment used for segment I/O: 4096 even where the device
// would take 512, so that a page of the page cache is never shared between
// two batches.
inline constexpr uint32_t kMinSegmentAlign = 4096;

// AlignedBuffer: `size` bytes at an address aligned to `align` (for
// O_DIRECT), from posix_memalign. Move-only. Contents are not initialized.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Allocate returns RESOURCE_EXHAUSTED when memory is short.
  static absl::StatusOr<AlignedBuffer> Allocate(size_t size, size_t align = kMinSegmentAlign);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

// One open file. Thread-safe: Read may run concurrently with everything,
// Write/Allocate/Sync are called by one writer at a time. Closed when
// destroyed.
class SegmentFile {
 public:
  virtual ~SegmentFile() = default;
  virtual const std::string& path() const = 0;
  // Whether the file is open with O_DIRECT (false: buffered, the filesystem
  // refused O_DIRECT, or it was not asked for).
  virtual bool direct() const = 0;
  // The I/O alignment for this file: max(4096, what the kernel reports
  // through statx(STATX_DIOALIGN)); 4096 where it reports nothing.
  virtual uint32_t alignment() const = 0;
  // Allocate reserves [0, bytes) (fallocate mode 0): ENOSPC shows up here,
  // before anything is written. RESOURCE_EXHAUSTED when there is no space.
  virtual absl::Status Allocate(uint64_t bytes) = 0;
  // Write writes all `size` bytes at `offset` (EINTR and short writes are
  // retried; a write that makes no progress fails).
  virtual absl::Status Write(uint64_t offset, const void* data, size_t size) = 0;
  // Read reads up to `size` bytes at `offset`; fewer only at the end of the
  // file. Returns the bytes read.
  virtual absl::StatusOr<size_t> Read(uint64_t offset, void* data, size_t size) = 0;
  // Sync is fdatasync. After a failure the file's unsynced pages are in an
  // unknown state (they may read back new and still be lost): the caller
  // must never write or sync this file again and trust the result.
  virtual absl::Status Sync() = 0;
  virtual absl::StatusOr<uint64_t> Size() = 0;
};

// The file-system operations. Thread-safe.
//
// Errors are absl::Status naming the path and the errno text: ENOSPC and
// EDQUOT are RESOURCE_EXHAUSTED, ENOENT is NOT_FOUND, others UNAVAILABLE.
class SegmentIo {
 public:
  virtual ~SegmentIo() = default;
  // Open opens `path` read-write; with `create` it must not exist yet
  // (O_CREAT|O_EXCL; O_TRUNC|O_CREAT with `truncate`). With `direct` it
  // tries O_DIRECT first and falls back to buffered I/O where the
  // filesystem refuses it (EINVAL: tmpfs, some overlayfs), logged once.
  struct OpenFlags {
    bool create = false;
    bool truncate = false;
    bool direct = true;
  };
  virtual absl::StatusOr<std::unique_ptr<SegmentFile>> Open(const std::string& path,
                                                            OpenFlags flags) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // SyncDir fsyncs a directory (after creating, renaming or removing
  // entries in it).
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // CreateDir creates `dir` and its missing parents; OK when it exists.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  // List returns the names (not paths) of the entries in `dir`, without
  // "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> List(const std::string& dir) = 0;
};

// NewSegmentIo returns the real file operations. With `faults`, every
// Write and Allocate first takes its bytes from the budget (DiskFaults::
// Take) and fails as a full disk does (RESOURCE_EXHAUSTED) when it is spent,
// counting the failure: the store's disk-full tests cover segments too.
std::shared_ptr<SegmentIo> NewSegmentIo(std::shared_ptr<DiskFaults> faults = nullptr);

// FaultSegmentIo: an in-memory device for tests. Each file has a synced
// image (what survives a crash) and the current bytes (what reads see, like
// the page cache); writes dirty 512-byte sectors until Sync. Crash() makes
// every unsynced sector keep its new bytes, keep its old bytes, or become
// garbage (seeded), and the file's length the synced or the new one; then
// the image is all there is. Directory operations (create, rename, remove)
// are durable at once: the model tears data, not names.
//
// Errors on demand: ENOSPC at the next Allocate, a write that stops after
// some bytes with an errno (a short write when the errno is EIO, a full disk
// with ENOSPC), EIO at the next Sync (fsyncgate: the dirty sectors reach the
// image torn, reads still see the new bytes), and a device that dies after N
// more mutating operations (every later operation fails with EIO until
// Crash()). With `direct` it checks the O_DIRECT rules (offsets, lengths and
// addresses aligned) and fails EINVAL when they are broken.
class FaultSegmentIo final : public SegmentIo {
 public:
  explicit FaultSegmentIo(uint64_t seed, bool direct = true, uint32_t alignment = 4096);
  ~FaultSegmentIo() override;

  absl::StatusOr<std::unique_ptr<SegmentFile>> Open(const std::string& path,
                                                    OpenFlags flags) override;
  absl::Status Remove(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status CreateDir(const std::string& dir) override;
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override;

  // The next Allocate fails with ENOSPC.
  void FailNextAllocate();
  // The next Write writes its first `bytes` bytes (clamped to its size),
  // then fails with `err` (ENOSPC: RESOURCE_EXHAUSTED; EIO: UNAVAILABLE).
  void FailNextWrite(uint64_t bytes, int err);
  // The next Sync fails with EIO; the dirty sectors reach the image torn.
  void FailNextSync();
  // After `ops` more mutating operations (Allocate, Write, Sync, Remove,
  // Rename, create) succeed, the device dies: all operations fail with EIO.
  // A Write that is cut by the death lands partly.
  void DieAfter(uint64_t ops);
  // Crash tears every unsynced sector and length (see above), then revives
  // the device and clears pending faults. Files stay open but must not be
  // used again; reopen them.
  void Crash();

  // Test access to the current bytes (writes go to both current and image,
  // as an offline edit of the disk).
  absl::StatusOr<std::string> ReadAll(const std::string& path);
  absl::Status Overwrite(const std::string& path, uint64_t offset, absl::string_view bytes);
  absl::Status Truncate(const std::string& path, uint64_t size);
  bool Exists(const std::string& path);

  struct Inode;

 private:
  friend class FaultSegmentFile;
  absl::Status Step(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TearSectors(Inode& inode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool direct_;
  const uint32_t alignment_;
  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Inode>> files_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, bool> dirs_ ABSL_GUARDED_BY(mu_);
  bool fail_allocate_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_write_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t fail_write_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_write_errno_ ABSL_GUARDED_BY(mu_) = 0;
  bool fail_sync_ ABSL_GUARDED_BY(mu_) = false;
  // Operations left before the device dies; negative: never.
  int64_t ops_left_ ABSL_GUARDED_BY(mu_) = -1;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
};

// IoErrorStatus maps an errno to the status described above, naming what
// was done and the path.
absl::Status IoErrorStatus(int err, absl::string_view what, absl::string_view path);

}  // namespace evoke

#endif  // EVOKE_STORAGE_TIER2_SEGMENT_IO_H_
