#include "daemon/region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace evoke {

absl::Status Region::CheckSlice(uint64_t offset, uint64_t length,
                                const std::string& field) const {
  if (length == 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".length: must be > 0"));
  }
  if (offset > size() || length > size() - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": [", offset, ", ", offset, " + ", length,
        ") is outside the region (", size(), " bytes)"));
  }
  return absl::OkStatus();
}

uint64_t DefaultMaxMappings() {
  uint64_t kernel = 65530;  // The kernel's default.
  std::ifstream in("/proc/sys/vm/max_map_count");
  uint64_t read = 0;
  if (in >> read && read > 0) kernel = read;
  return std::min<uint64_t>(16384, kernel / 4);
}

struct MappingBudget::State {
  explicit State(const MappingLimits& l) : limits(l) {}
  const MappingLimits limits;
  absl::Mutex mu;
  Usage total ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uid_t, Usage> per_uid ABSL_GUARDED_BY(mu);
};

MappingBudget::Charge& MappingBudget::Charge::operator=(Charge&& o) noexcept {
  if (this != &o) {
    Return();
    state_ = std::move(o.state_);
    uid_ = o.uid_;
    bytes_ = o.bytes_;
  }
  return *this;
}

void MappingBudget::Charge::Return() {
  if (state_ == nullptr) return;
  {
    absl::MutexLock lock(&state_->mu);
    state_->total.bytes -= bytes_;
    --state_->total.mappings;
    auto it = state_->per_uid.find(uid_);
    if (it != state_->per_uid.end()) {
      it->second.bytes -= bytes_;
      if (--it->second.mappings == 0) state_->per_uid.erase(it);
    }
  }
  state_.reset();
}

MappingBudget::MappingBudget(const MappingLimits& limits)
    : state_(std::make_shared<State>(limits)) {}

absl::StatusOr<MappingBudget::Charge> MappingBudget::Reserve(uid_t uid, uint64_t bytes,
                                                            uint64_t max_bytes_for_uid) {
  const MappingLimits& l = state_->limits;
  const uint64_t per_uid = max_bytes_for_uid != 0 ? max_bytes_for_uid : l.max_bytes_per_uid;
  absl::MutexLock lock(&state_->mu);
  const Usage total = state_->total;
  auto it = state_->per_uid.find(uid);
  const Usage mine = it == state_->per_uid.end() ? Usage() : it->second;
  // Each test is written so that it cannot overflow: usage <= limit always.
  if (total.mappings >= l.max_mappings) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon maps ", total.mappings, " client regions, its limit "
        "(--max-mappings); unregister some first"));
  }
  if (mine.mappings >= l.max_mappings_per_uid) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", uid, " has ", mine.mappings, " regions mapped, its limit "
        "(--max-mappings-per-uid); unregister some first"));
  }
  if (bytes > l.max_bytes - std::min(l.max_bytes, total.bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "mapping ", FormatByteSize(bytes), " more would pass the limit of ",
        FormatByteSize(l.max_bytes), " of mapped client memory (--max-mapped-bytes; ",
        FormatByteSize(total.bytes), " mapped)"));
  }
  if (bytes > per_uid - std::min(per_uid, mine.bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "mapping ", FormatByteSize(bytes), " more would pass uid ", uid, "'s limit of ",
        FormatByteSize(per_uid), " of mapped memory (",
        max_bytes_for_uid != 0 ? "max_mapped_bytes in the policy"
                               : "--max-mapped-bytes-per-uid",
        "; ", FormatByteSize(mine.bytes), " mapped)"));
  }
  state_->total.bytes += bytes;
  ++state_->total.mappings;
  Usage& u = state_->per_uid[uid];
  u.bytes += bytes;
  ++u.mappings;
  return Charge(state_, uid, bytes);
}

MappingBudget::Usage MappingBudget::Total() const {
  absl::MutexLock lock(&state_->mu);
  return state_->total;
}

MappingBudget::Usage MappingBudget::OfUid(uid_t uid) const {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->per_uid.find(uid);
  return it == state_->per_uid.end() ? Usage() : it->second;
}

const MappingLimits& MappingBudget::limits() const { return state_->limits; }

namespace {

// What a descriptor that is not a regular file is, for error messages.
const char* FileTypeName(uint16_t mode) {
  switch (mode & S_IFMT) {
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a pipe or FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFLNK: return "a symbolic link";
    default: return "not a file (an anonymous inode: eventfd, epoll, ...)";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Map(int fd, uint64_t size,
                                                          uint64_t max_bytes,
                                                          MappingBudget* budget, uid_t uid,
                                                          uint64_t max_bytes_for_uid) {
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) close(fd);
    }
  } closer{fd};
  if (size == 0 || size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size: ", size, " must be in [1, ", max_bytes, "] (", FormatByteSize(max_bytes),
        ", --max-region-bytes)"));
  }
  // statx with AT_STATX_DONT_SYNC rather than fstat: a file on FUSE or NFS
  // answers from its cache instead of asking a server the client may run.
  struct statx st {};
  if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_SIZE, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("fd: statx: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.stx_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd: not a memfd: ", (st.stx_mask & STATX_TYPE) != 0 ? FileTypeName(st.stx_mode)
                                                             : "of unknown type"));
  }
  // F_GET_SEALS answers only for shmem and hugetlbfs files (EINVAL for any
  // other, EBADF for an O_PATH descriptor): it never reaches another
  // filesystem.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd: must be a memfd sealed with F_SEAL_SHRINK and F_SEAL_GROW (memfd_create "
        "with MFD_ALLOW_SEALING, then fcntl F_ADD_SEALS), so that it can never shrink "
        "under the daemon",
        seals < 0 ? absl::StrCat(" (F_GET_SEALS: ", std::strerror(errno), ")")
                  : " (F_SEAL_SHRINK is missing)"));
  }
  if (st.stx_size != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size: ", size, " does not match the memfd's size ", st.stx_size));
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return absl::InvalidArgumentError(
        "fd: F_SEAL_WRITE or F_SEAL_FUTURE_WRITE is set; it must not be (the daemon "
        "writes loaded blocks into the region)");
  }
  if ((seals & F_SEAL_GROW) == 0) {
    return absl::InvalidArgumentError(
        "fd: must be a memfd sealed with F_SEAL_SHRINK and F_SEAL_GROW; F_SEAL_GROW is "
        "missing (its size must be fixed while registered)");
  }
  MappingBudget::Charge charge;
  if (budget != nullptr) {
    absl::StatusOr<MappingBudget::Charge> reserved =
        budget->Reserve(uid, size, max_bytes_for_uid);
    if (!reserved.ok()) return reserved.status();
    charge = std::move(reserved).value();
  }
  // No MAP_POPULATE: populating would make the daemon allocate every page a
  // (sparse) memfd claims, at the client's choice of size. Pages fault in
  // on the first copy through them instead.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM || err == EAGAIN || err == ENFILE || err == EMFILE) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "fd: the kernel refused to map ", FormatByteSize(size), ": ",
          std::strerror(err), " (address space or vm.max_map_count)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("fd: cannot map read-write and shared: ", std::strerror(err)));
  }
  return std::unique_ptr<ShmRegion>(
      new ShmRegion(static_cast<uint8_t*>(p), size, std::move(charge)));
}

ShmRegion::~ShmRegion() { munmap(data_, size_); }

absl::StatusOr<std::shared_ptr<CudaIpcMapping>> CudaMappings::Get(
    uid_t owner, const std::string& handle, int device, uint64_t size) {
  const std::string key = absl::StrCat(owner, "/", device, "/", handle);
  absl::MutexLock lock(&mu_);
  auto it = open_.find(key);
  if (it != open_.end()) {
    if (std::shared_ptr<CudaIpcMapping> m = it->second.lock()) {
      if (size > m->available()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "size: ", size, " bytes exceed the exported allocation (", m->available(),
            " bytes)"));
      }
      return m;
    }
    open_.erase(it);
  }
  absl::StatusOr<std::unique_ptr<CudaIpcMapping>> opened =
      CudaIpcMapping::Open(handle, device, size);
  if (!opened.ok()) return opened.status();
  std::shared_ptr<CudaIpcMapping> m = std::move(opened).value();
  open_[key] = m;
  // Forget closed mappings now and then.
  if (open_.size() > 1024) {
    for (auto i = open_.begin(); i != open_.end();) {
      i = i->second.expired() ? (open_.erase(i), open_.begin()) : std::next(i);
    }
  }
  return m;
}

}  // namespace evoke
