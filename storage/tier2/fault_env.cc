#include "storage/tier2/fault_env.h"

#include <string>
#include <utility>

#include "rocksdb/file_system.h"
#include "rocksdb/io_status.h"

namespace evoke {

bool DiskFaults::Take(uint64_t n) {
  int64_t left = budget_.load();
  for (;;) {
    if (left == kUnlimited) return true;
    if (left < static_cast<int64_t>(n)) {
      // A write that does not fit fails whole and spends the rest, as a
      // filesystem does at ENOSPC (later small writes fail too).
      budget_.store(0);
      return false;
    }
    if (budget_.compare_exchange_weak(left, left - static_cast<int64_t>(n))) return true;
  }
}

namespace {

rocksdb::IOStatus NoSpace(const std::string& what) {
  return rocksdb::IOStatus::NoSpace("injected: no space left on device", what);
}

class FaultWritableFile final : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  FaultWritableFile(std::unique_ptr<rocksdb::FSWritableFile> file, std::string name,
                    std::shared_ptr<DiskFaults> faults)
      : FSWritableFileOwnerWrapper(std::move(file)),
        name_(std::move(name)),
        faults_(std::move(faults)) {}

  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           rocksdb::IODebugContext* dbg) override {
    if (!faults_->Take(data.size())) return Fail();
    return FSWritableFileOwnerWrapper::Append(data, options, dbg);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& options,
                           const rocksdb::DataVerificationInfo& info,
                           rocksdb::IODebugContext* dbg) override {
    if (!faults_->Take(data.size())) return Fail();
    return FSWritableFileOwnerWrapper::Append(data, options, info, dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     rocksdb::IODebugContext* dbg) override {
    if (!faults_->Take(data.size())) return Fail();
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, dbg);
  }
  rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset,
                                     const rocksdb::IOOptions& options,
                                     const rocksdb::DataVerificationInfo& info,
                                     rocksdb::IODebugContext* dbg) override {
    if (!faults_->Take(data.size())) return Fail();
    return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, options, info, dbg);
  }

 private:
  rocksdb::IOStatus Fail() {
    faults_->CountFailure();
    return NoSpace(name_);
  }
  const std::string name_;
  const std::shared_ptr<DiskFaults> faults_;
};

class FaultFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  FaultFileSystem(std::shared_ptr<rocksdb::FileSystem> base, std::shared_ptr<DiskFaults> faults)
      : FileSystemWrapper(std::move(base)), faults_(std::move(faults)) {}

  const char* Name() const override { return "EvokeFaultFileSystem"; }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& opts,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    return Wrap(f, target()->NewWritableFile(f, opts, r, dbg), r);
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& opts,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override {
    return Wrap(f, target()->ReopenWritableFile(f, opts, r, dbg), r);
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& opts,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    return Wrap(f, target()->ReuseWritableFile(f, old, opts, r, dbg), r);
  }

 private:
  rocksdb::IOStatus Wrap(const std::string& f, rocksdb::IOStatus s,
                         std::unique_ptr<rocksdb::FSWritableFile>* r) {
    // Creating a file succeeds on a full disk (inodes remain); its
    // writes fail.
    if (!s.ok()) return s;
    *r = std::make_unique<FaultWritableFile>(std::move(*r), f, faults_);
    return s;
  }
  const std::shared_ptr<DiskFaults> faults_;
};

}  // namespace

std::shared_ptr<rocksdb::FileSystem> NewFaultFileSystem(
    std::shared_ptr<rocksdb::FileSystem> base, std::shared_ptr<DiskFaults> faults) {
  return std::make_shared<FaultFileSystem>(std::move(base), std::move(faults));
}

}  // namespace evoke
