#include "daemon/region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Map(int fd, uint64_t size,
                                                          uint64_t max_bytes) {
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
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("fd: fstat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError("fd: not a memfd (not a regular file)");
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError(
        "fd: must be a memfd sealed with F_SEAL_SHRINK (memfd_create with "
        "MFD_ALLOW_SEALING, then fcntl F_ADD_SEALS), so that it can never shrink "
        "under the daemon");
  }
  if (static_cast<uint64_t>(st.st_size) != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "size: ", size, " does not match the memfd's size ", st.st_size));
  }
  // MAP_POPULATE: fault every page in now, at registration, rather than on
  // the first copy into or out of each page (a region is registered once and
  // copied through many times).
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd: cannot map read-write and shared: ", std::strerror(errno),
        (seals & F_SEAL_WRITE) != 0 ? " (F_SEAL_WRITE is set; it must not be)" : ""));
  }
  return std::unique_ptr<ShmRegion>(new ShmRegion(static_cast<uint8_t*>(p), size));
}

ShmRegion::~ShmRegion() { munmap(data_, size_); }

absl::StatusOr<std::shared_ptr<CudaIpcMapping>> CudaMappings::Get(
    const std::string& handle, int device, uint64_t size) {
  const std::string key = absl::StrCat(device, "/", handle);
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
