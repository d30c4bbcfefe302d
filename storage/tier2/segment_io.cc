#include "storage/tier2/segment_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "storage/tier2/fault_env.h"

namespace evoke {

absl::Status IoErrorStatus(int err, absl::string_view what, absl::string_view path) {
  const char* text = strerrordesc_np(err);
  std::string message =
      absl::StrCat(what, " ", path, ": ", text != nullptr ? text : "unknown error", " (errno ",
                   err, ")");
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(std::move(message));
    case ENOENT:
      return absl::NotFoundError(std::move(message));
    default:
      return absl::UnavailableError(std::move(message));
  }
}

// ------------------------------------------------------------ AlignedBuffer

absl::StatusOr<AlignedBuffer> AlignedBuffer::Allocate(size_t size, size_t align) {
  AlignedBuffer b;
  if (size == 0) return b;
  void* p = nullptr;
  if (posix_memalign(&p, std::max<size_t>(align, sizeof(void*)), size) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating an aligned I/O buffer of ", size, " bytes failed"));
  }
  b.data_ = static_cast<char*>(p);
  b.size_ = size;
  return b;
}

AlignedBuffer::~AlignedBuffer() { free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// ------------------------------------------------------------ real files

namespace {

absl::Status NoSpace(absl::string_view what, const std::string& path, DiskFaults* faults) {
  faults->CountFailure();
  return absl::ResourceExhaustedError(
      absl::StrCat(what, " ", path, ": injected: no space left on device"));
}

// ProbeAlignment asks the kernel for the file's O_DIRECT alignment
// (statx STATX_DIOALIGN, Linux 6.1+). Older kernels and filesystems that do
// not say get 4096, which every block device we run on accepts (sectors are
// 512 or 4096 bytes).
uint32_t ProbeAlignment(int fd) {
  uint32_t align = kMinSegmentAlign;
#ifdef STATX_DIOALIGN
  struct statx sx;
  memset(&sx, 0, sizeof(sx));
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    align = std::max({align, sx.stx_dio_offset_align, sx.stx_dio_mem_align});
  }
#else
  (void)fd;
#endif
  return align;
}

class RealSegmentFile final : public SegmentFile {
 public:
  RealSegmentFile(int fd, std::string path, bool direct, std::shared_ptr<DiskFaults> faults)
      : fd_(fd),
        path_(std::move(path)),
        direct_(direct),
        alignment_(ProbeAlignment(fd)),
        faults_(std::move(faults)) {}
  ~RealSegmentFile() override { close(fd_); }

  const std::string& path() const override { return path_; }
  bool direct() const override { return direct_; }
  uint32_t alignment() const override { return alignment_; }

  absl::Status Allocate(uint64_t bytes) override {
    if (faults_ != nullptr && !faults_->Take(bytes)) {
      return NoSpace("fallocate", path_, faults_.get());
    }
    for (;;) {
      // posix_fallocate would emulate by writing zeros where fallocate is
      // unsupported; plain fallocate fails instead, and we then fall back
      // to ftruncate (space is then found at write time, not here).
      if (fallocate(fd_, 0, 0, static_cast<off_t>(bytes)) == 0) return absl::OkStatus();
      if (errno == EINTR) continue;
      if (errno == EOPNOTSUPP) {
        if (ftruncate(fd_, static_cast<off_t>(bytes)) == 0) return absl::OkStatus();
      }
      return IoErrorStatus(errno, "fallocate", path_);
    }
  }

  absl::Status Write(uint64_t offset, const void* data, size_t size) override {
    if (faults_ != nullptr && !faults_->Take(size)) return NoSpace("pwrite", path_, faults_.get());
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = pwrite(fd_, p, size, static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoErrorStatus(errno, absl::StrCat("pwrite at ", offset, " of"), path_);
      }
      if (n == 0) return IoErrorStatus(EIO, absl::StrCat("pwrite (no progress) at ", offset, " of"), path_);
      // A short write (a signal, a full disk on the way): write the rest; a
      // persistent condition then shows up as an error.
      p += n;
      size -= static_cast<size_t>(n);
      offset += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Read(uint64_t offset, void* data, size_t size) override {
    char* p = static_cast<char*>(data);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = pread(fd_, p + done, size - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return IoErrorStatus(errno, absl::StrCat("pread at ", offset + done, " of"), path_);
      }
      if (n == 0) break;  // End of file.
      done += static_cast<size_t>(n);
    }
    return done;
  }

  absl::Status Sync() override {
    for (;;) {
      if (fdatasync(fd_) == 0) return absl::OkStatus();
      if (errno == EINTR) continue;
      return IoErrorStatus(errno, "fdatasync", path_);
    }
  }

  absl::StatusOr<uint64_t> Size() override {
    struct stat st;
    if (fstat(fd_, &st) != 0) return IoErrorStatus(errno, "fstat", path_);
    return static_cast<uint64_t>(st.st_size);
  }

 private:
  const int fd_;
  const std::string path_;
  const bool direct_;
  const uint32_t alignment_;
  const std::shared_ptr<DiskFaults> faults_;
};

class RealSegmentIo final : public SegmentIo {
 public:
  explicit RealSegmentIo(std::shared_ptr<DiskFaults> faults) : faults_(std::move(faults)) {}

  absl::StatusOr<std::unique_ptr<SegmentFile>> Open(const std::string& path,
                                                    OpenFlags flags) override {
    int base = O_RDWR | O_CLOEXEC;
    if (flags.create) base |= O_CREAT | (flags.truncate ? O_TRUNC : O_EXCL);
    int fd = -1;
    bool direct = false;
    if (flags.direct) {
      fd = OpenRetry(path, base | O_DIRECT);
      if (fd >= 0) {
        direct = true;
      } else if (errno == EINVAL) {
        // tmpfs and some overlayfs refuse O_DIRECT: buffered I/O with
        // fdatasync gives the same durability, only through the page cache.
        static std::atomic<bool> logged{false};
        if (!logged.exchange(true)) {
          EVOKE_LOG_INFO("segment files: O_DIRECT refused for ", path,
                         " (EINVAL); using buffered I/O with fdatasync");
        }
      } else {
        return IoErrorStatus(errno, "open", path);
      }
    }
    if (fd < 0) {
      fd = OpenRetry(path, base);
      if (fd < 0) return IoErrorStatus(errno, "open", path);
    }
    return std::make_unique<RealSegmentFile>(fd, path, direct, faults_);
  }

  absl::Status Remove(const std::string& path) override {
    if (unlink(path.c_str()) != 0) return IoErrorStatus(errno, "unlink", path);
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) {
      return IoErrorStatus(errno, absl::StrCat("rename to ", to, " of"), from);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = OpenRetry(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return IoErrorStatus(errno, "open directory", dir);
    absl::Status s;
    while (fsync(fd) != 0) {
      if (errno == EINTR) continue;
      s = IoErrorStatus(errno, "fsync directory", dir);
      break;
    }
    close(fd);
    return s;
  }

  absl::Status CreateDir(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return IoErrorStatus(ec.value(), "mkdir", dir);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return IoErrorStatus(errno, "opendir", dir);
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* e = readdir(d)) {
      const absl::string_view name = e->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    const int err = errno;
    closedir(d);
    if (err != 0) return IoErrorStatus(err, "readdir", dir);
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  static int OpenRetry(const std::string& path, int flags) {
    for (;;) {
      const int fd = open(path.c_str(), flags, 0644);
      if (fd >= 0 || errno != EINTR) return fd;
    }
  }
  const std::shared_ptr<DiskFaults> faults_;
};

}  // namespace

std::shared_ptr<SegmentIo> NewSegmentIo(std::shared_ptr<DiskFaults> faults) {
  return std::make_shared<RealSegmentIo>(std::move(faults));
}

// ------------------------------------------------------------ the fault device

namespace {
constexpr uint64_t kSector = 512;
}  // namespace

struct FaultSegmentIo::Inode {
  std::string data;             // What reads see.
  std::string image;            // What a crash leaves (synced).
  std::vector<bool> dirty;      // Per sector of `data`: written since the last sync.
  bool size_dirty = false;      // data.size() != image.size() not yet synced.
};

class FaultSegmentFile final : public SegmentFile {
 public:
  FaultSegmentFile(FaultSegmentIo* io, std::shared_ptr<FaultSegmentIo::Inode> inode,
                   std::string path, bool direct, uint32_t alignment)
      : io_(io), inode_(std::move(inode)), path_(std::move(path)), direct_(direct),
        alignment_(alignment) {}

  const std::string& path() const override { return path_; }
  bool direct() const override { return direct_; }
  uint32_t alignment() const override { return alignment_; }

  absl::Status Allocate(uint64_t bytes) override {
    absl::MutexLock lock(&io_->mu_);
    if (io_->fail_allocate_) {
      io_->fail_allocate_ = false;
      return IoErrorStatus(ENOSPC, "fallocate (injected)", path_);
    }
    EVOKE_RETURN_IF_ERROR(io_->Step(path_));
    FaultSegmentIo::Inode& in = *inode_;
    if (bytes > in.data.size()) {
      in.data.resize(bytes, '\0');
      in.dirty.resize((bytes + kSector - 1) / kSector, false);
      in.size_dirty = true;
    }
    return absl::OkStatus();
  }

  absl::Status Write(uint64_t offset, const void* data, size_t size) override {
    absl::MutexLock lock(&io_->mu_);
    if (absl::Status s = CheckDirect(offset, data, size); !s.ok()) return s;
    size_t n = size;
    absl::Status fail;
    if (io_->fail_write_) {
      io_->fail_write_ = false;
      n = std::min<uint64_t>(size, io_->fail_write_bytes_);
      fail = IoErrorStatus(io_->fail_write_errno_, "pwrite (injected)", path_);
    } else if (io_->ops_left_ == 0 && !io_->dead_) {
      // The device dies in the middle of this write: part of it lands.
      std::uniform_int_distribution<size_t> d(0, size);
      n = d(io_->rng_);
      io_->dead_ = true;
      fail = IoErrorStatus(EIO, "pwrite (device died)", path_);
    } else if (absl::Status s = io_->Step(path_); !s.ok()) {
      return s;
    }
    FaultSegmentIo::Inode& in = *inode_;
    if (offset + n > in.data.size()) {
      in.data.resize(offset + n, '\0');
      in.size_dirty = true;
    }
    in.dirty.resize((in.data.size() + kSector - 1) / kSector, false);
    memcpy(in.data.data() + offset, data, n);
    for (uint64_t s = offset / kSector; n > 0 && s <= (offset + n - 1) / kSector; ++s) {
      in.dirty[s] = true;
    }
    return fail;
  }

  absl::StatusOr<size_t> Read(uint64_t offset, void* data, size_t size) override {
    absl::MutexLock lock(&io_->mu_);
    if (absl::Status s = CheckDirect(offset, data, size); !s.ok()) return s;
    if (io_->dead_) return IoErrorStatus(EIO, "pread (device dead)", path_);
    const FaultSegmentIo::Inode& in = *inode_;
    if (offset >= in.data.size()) return size_t{0};
    const size_t n = std::min<uint64_t>(size, in.data.size() - offset);
    memcpy(data, in.data.data() + offset, n);
    return n;
  }

  absl::Status Sync() override {
    absl::MutexLock lock(&io_->mu_);
    FaultSegmentIo::Inode& in = *inode_;
    if (io_->fail_sync_) {
      io_->fail_sync_ = false;
      // fsyncgate: the pages are marked clean although the device may not
      // have them; reads keep seeing the new bytes.
      io_->TearSectors(in);
      return IoErrorStatus(EIO, "fdatasync (injected)", path_);
    }
    EVOKE_RETURN_IF_ERROR(io_->Step(path_));
    in.image.resize(in.data.size(), '\0');
    for (size_t s = 0; s < in.dirty.size(); ++s) {
      if (!in.dirty[s]) continue;
      const uint64_t begin = s * kSector;
      const uint64_t end = std::min<uint64_t>(begin + kSector, in.data.size());
      memcpy(in.image.data() + begin, in.data.data() + begin, end - begin);
      in.dirty[s] = false;
    }
    in.size_dirty = false;
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> Size() override {
    absl::MutexLock lock(&io_->mu_);
    return static_cast<uint64_t>(inode_->data.size());
  }

 private:
  absl::Status CheckDirect(uint64_t offset, const void* data, size_t size) const {
    if (!direct_) return absl::OkStatus();
    if (offset % alignment_ != 0 || size % alignment_ != 0 ||
        reinterpret_cast<uintptr_t>(data) % alignment_ != 0) {
      return IoErrorStatus(EINVAL,
                           absl::StrCat("unaligned O_DIRECT I/O (offset ", offset, ", size ",
                                        size, ") on"),
                           path_);
    }
    return absl::OkStatus();
  }

  FaultSegmentIo* const io_;
  const std::shared_ptr<FaultSegmentIo::Inode> inode_;
  const std::string path_;
  const bool direct_;
  const uint32_t alignment_;
};

FaultSegmentIo::FaultSegmentIo(uint64_t seed, bool direct, uint32_t alignment)
    : direct_(direct), alignment_(alignment), rng_(seed) {}

FaultSegmentIo::~FaultSegmentIo() = default;

absl::Status FaultSegmentIo::Step(const std::string& path) {
  if (dead_) return IoErrorStatus(EIO, "I/O (device dead) on", path);
  if (ops_left_ == 0) {
    dead_ = true;
    return IoErrorStatus(EIO, "I/O (device died) on", path);
  }
  if (ops_left_ > 0) --ops_left_;
  return absl::OkStatus();
}

void FaultSegmentIo::TearSectors(Inode& in) {
  in.image.resize(in.data.size(), '\0');
  std::uniform_int_distribution<int> pick(0, 2);
  for (size_t s = 0; s < in.dirty.size(); ++s) {
    if (!in.dirty[s]) continue;
    in.dirty[s] = false;
    const uint64_t begin = s * kSector;
    const uint64_t end = std::min<uint64_t>(begin + kSector, in.data.size());
    switch (pick(rng_)) {
      case 0:  // The new bytes reached the device.
        memcpy(in.image.data() + begin, in.data.data() + begin, end - begin);
        break;
      case 1:  // The old bytes stay.
        break;
      default:  // Half-written: garbage.
        for (uint64_t i = begin; i < end; ++i) in.image[i] = static_cast<char>(rng_());
        break;
    }
  }
}

void FaultSegmentIo::FailNextAllocate() {
  absl::MutexLock lock(&mu_);
  fail_allocate_ = true;
}

void FaultSegmentIo::FailNextWrite(uint64_t bytes, int err) {
  absl::MutexLock lock(&mu_);
  fail_write_ = true;
  fail_write_bytes_ = bytes;
  fail_write_errno_ = err;
}

void FaultSegmentIo::FailNextSync() {
  absl::MutexLock lock(&mu_);
  fail_sync_ = true;
}

void FaultSegmentIo::DieAfter(uint64_t ops) {
  absl::MutexLock lock(&mu_);
  ops_left_ = static_cast<int64_t>(ops);
}

void FaultSegmentIo::Crash() {
  absl::MutexLock lock(&mu_);
  for (auto& [path, inode] : files_) {
    Inode& in = *inode;
    const uint64_t old_size = in.image.size();
    TearSectors(in);  // in.image now data-sized with torn sectors.
    if (in.size_dirty && (rng_() & 1)) in.image.resize(old_size);
    in.size_dirty = false;
    in.data = in.image;
    in.dirty.assign((in.data.size() + kSector - 1) / kSector, false);
  }
  fail_allocate_ = fail_write_ = fail_sync_ = false;
  ops_left_ = -1;
  dead_ = false;
}

absl::StatusOr<std::unique_ptr<SegmentFile>> FaultSegmentIo::Open(const std::string& path,
                                                                  OpenFlags flags) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (flags.create) {
    if (it != files_.end() && !flags.truncate) return IoErrorStatus(EEXIST, "open", path);
    EVOKE_RETURN_IF_ERROR(Step(path));
    auto inode = std::make_shared<Inode>();
    files_[path] = inode;
    return std::make_unique<FaultSegmentFile>(this, inode, path, direct_ && flags.direct,
                                              alignment_);
  }
  if (dead_) return IoErrorStatus(EIO, "open (device dead)", path);
  if (it == files_.end()) return IoErrorStatus(ENOENT, "open", path);
  return std::make_unique<FaultSegmentFile>(this, it->second, path, direct_ && flags.direct,
                                            alignment_);
}

absl::Status FaultSegmentIo::Remove(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (files_.find(path) == files_.end()) return IoErrorStatus(ENOENT, "unlink", path);
  EVOKE_RETURN_IF_ERROR(Step(path));
  files_.erase(path);
  return absl::OkStatus();
}

absl::Status FaultSegmentIo::Rename(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(from);
  if (it == files_.end()) return IoErrorStatus(ENOENT, "rename", from);
  EVOKE_RETURN_IF_ERROR(Step(from));
  std::shared_ptr<Inode> inode = it->second;
  files_.erase(it);
  files_[to] = std::move(inode);
  return absl::OkStatus();
}

absl::Status FaultSegmentIo::SyncDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  if (dead_) return IoErrorStatus(EIO, "fsync directory (device dead)", dir);
  return absl::OkStatus();
}

absl::Status FaultSegmentIo::CreateDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  dirs_[dir] = true;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FaultSegmentIo::List(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  if (dead_) return IoErrorStatus(EIO, "opendir (device dead)", dir);
  const std::string prefix = dir + "/";
  std::vector<std::string> names;
  for (const auto& [path, inode] : files_) {
    if (!absl::StartsWith(path, prefix)) continue;
    const std::string name = path.substr(prefix.size());
    if (name.find('/') == std::string::npos) names.push_back(name);
  }
  return names;
}

absl::StatusOr<std::string> FaultSegmentIo::ReadAll(const std::string& path) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return IoErrorStatus(ENOENT, "read", path);
  return it->second->data;
}

absl::Status FaultSegmentIo::Overwrite(const std::string& path, uint64_t offset,
                                       absl::string_view bytes) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return IoErrorStatus(ENOENT, "overwrite", path);
  Inode& in = *it->second;
  if (offset + bytes.size() > in.data.size()) return absl::OutOfRangeError("past the end");
  memcpy(in.data.data() + offset, bytes.data(), bytes.size());
  in.image.resize(in.data.size(), '\0');
  memcpy(in.image.data() + offset, bytes.data(), bytes.size());
  return absl::OkStatus();
}

absl::Status FaultSegmentIo::Truncate(const std::string& path, uint64_t size) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) return IoErrorStatus(ENOENT, "truncate", path);
  Inode& in = *it->second;
  in.data.resize(size, '\0');
  in.image.resize(size, '\0');
  in.dirty.resize((size + kSector - 1) / kSector, false);
  return absl::OkStatus();
}

bool FaultSegmentIo::Exists(const std::string& path) {
  absl::MutexLock lock(&mu_);
  return files_.count(path) > 0;
}

}  // namespace evoke
