#include "storage/tier2/segment_log.h"

#include <sys/statvfs.h>

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "storage/tier2/fault_env.h"
#include "storage/tier2/segment_io.h"

namespace evoke {

namespace {

// On-disk format (little endian). See segment_log.h and the table in
// docs (issue #13 design, §3.3).
constexpr uint64_t kFileHeaderBytes = 4096;
constexpr uint64_t kFileHeaderUsed = 64;  // Fields + hash; the rest is zero.
constexpr uint64_t kRecordHeaderBytes = 64;
constexpr uint64_t kRecordHashedBytes = 56;
constexpr uint64_t kRecordAlign = 64;
constexpr uint64_t kMaxIoBytes = 4 << 20;        // One pwrite/pread at most.
constexpr uint64_t kSegmentGranule = 1 << 20;    // Segment sizes are multiples.
constexpr uint64_t kFirstSegmentBytes = 8 << 20;  // A stream's first segment.
constexpr uint64_t kMinSegmentBytes = 4 << 20;
constexpr size_t kKeepReadBuffer = 8 << 20;      // Per-thread read buffer kept up to this.
constexpr char kFileMagic[8] = {'E', 'V', 'K', 'S', 'E', 'G', '\0', '\2'};
constexpr char kRecordMagic[4] = {'E', 'V', 'R', '2'};
constexpr uint32_t kHeaderVersion = 1;

enum RecordType : uint16_t { kPayload = 1, kSkip = 2, kSeal = 3 };

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
uint64_t RoundDown(uint64_t v, uint64_t a) { return v / a * a; }

void Put16(char* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void Put32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void Put64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint16_t Get16(const char* p) {
  uint16_t v = 0;
  for (int i = 1; i >= 0; --i) v = static_cast<uint16_t>((v << 8) | static_cast<uint8_t>(p[i]));
  return v;
}
uint32_t Get32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t Get64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
// Block ids are stored as BlockId::ToBytes() (16 bytes, big endian).
void PutId(char* p, const BlockId& id) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(id.hi() >> (56 - 8 * i));
  for (int i = 0; i < 8; ++i) p[8 + i] = static_cast<char>(id.lo() >> (56 - 8 * i));
}
BlockId GetId(const char* p) {
  uint64_t hi = 0, lo = 0;
  for (int i = 0; i < 8; ++i) hi = (hi << 8) | static_cast<uint8_t>(p[i]);
  for (int i = 0; i < 8; ++i) lo = (lo << 8) | static_cast<uint8_t>(p[8 + i]);
  return BlockId(hi, lo);
}

// Record header: magic 'EVR2' @0, type u16 @4, flags u16 @6, block id @8,
// seq @24, payload_len @32, payload_xxh3 @40, batch_seq @48,
// header_xxh3 (of bytes 0..55) @56.
struct RecordHeader {
  uint16_t type = 0;
  uint16_t flags = 0;
  BlockId id;
  uint64_t seq = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;
  uint64_t batch_seq = 0;
};

void EncodeRecord(const RecordHeader& h, char* out) {
  memcpy(out, kRecordMagic, 4);
  Put16(out + 4, h.type);
  Put16(out + 6, h.flags);
  PutId(out + 8, h.id);
  Put64(out + 24, h.seq);
  Put64(out + 32, h.length);
  Put64(out + 40, h.checksum);
  Put64(out + 48, h.batch_seq);
  Put64(out + 56, XXH3_64bits(out, kRecordHashedBytes));
}

// DecodeRecord: false when the magic or the header hash does not verify.
bool DecodeRecord(const char* in, RecordHeader* h) {
  if (memcmp(in, kRecordMagic, 4) != 0) return false;
  if (Get64(in + 56) != XXH3_64bits(in, kRecordHashedBytes)) return false;
  h->type = Get16(in + 4);
  h->flags = Get16(in + 6);
  h->id = GetId(in + 8);
  h->seq = Get64(in + 24);
  h->length = Get64(in + 32);
  h->checksum = Get64(in + 40);
  h->batch_seq = Get64(in + 48);
  return true;
}

// File header: magic @0, header_version u32 @8, dio_align u32 @12,
// segment_id @16, instance @24 (16 bytes), created_unix_ms @40,
// segment_bytes @48, header_xxh3 (of bytes 0..55) @56.
struct FileHeader {
  uint32_t version = kHeaderVersion;
  uint32_t align = 0;
  uint64_t id = 0;
  std::array<uint8_t, 16> instance{};
  uint64_t created_ms = 0;
  uint64_t size = 0;
};

void EncodeFileHeader(const FileHeader& h, char* out) {
  memset(out, 0, kFileHeaderBytes);
  memcpy(out, kFileMagic, 8);
  Put32(out + 8, h.version);
  Put32(out + 12, h.align);
  Put64(out + 16, h.id);
  memcpy(out + 24, h.instance.data(), 16);
  Put64(out + 40, h.created_ms);
  Put64(out + 48, h.size);
  Put64(out + 56, XXH3_64bits(out, 56));
}

// DecodeFileHeader returns what is wrong with the header, or "" when it
// verifies.
std::string DecodeFileHeader(const char* in, FileHeader* h) {
  if (memcmp(in, kFileMagic, 8) != 0) return "not a segment file (magic)";
  if (Get64(in + 56) != XXH3_64bits(in, 56)) return "header checksum mismatch";
  h->version = Get32(in + 8);
  h->align = Get32(in + 12);
  h->id = Get64(in + 16);
  memcpy(h->instance.data(), in + 24, 16);
  h->created_ms = Get64(in + 40);
  h->size = Get64(in + 48);
  if (h->version != kHeaderVersion) return absl::StrCat("unknown header version ", h->version);
  if (h->align < kRecordAlign || h->align % kRecordAlign != 0 || h->align > (1u << 20)) {
    return absl::StrCat("implausible alignment ", h->align);
  }
  return "";
}

std::string SegmentName(uint64_t id) { return absl::StrFormat("seg-%016x.evs", id); }

// ParseSegmentName: true for "seg-<16 lowercase hex digits>.evs".
bool ParseSegmentName(absl::string_view name, uint64_t* id) {
  if (name.size() != 4 + 16 + 4 || !absl::StartsWith(name, "seg-") ||
      !absl::EndsWith(name, ".evs")) {
    return false;
  }
  const absl::string_view hex = name.substr(4, 16);
  for (char c : hex) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return absl::SimpleHexAtoi(hex, id);
}

struct Segment {
  uint64_t id = 0;
  std::string path;
  std::shared_ptr<SegmentFile> file;
  uint64_t size = 0;
  uint64_t data_start = kFileHeaderBytes;  // First record.
  uint64_t created_ms = 0;
  SegmentStream stream = SegmentStream::kHot;
  std::atomic<uint64_t> valid_end{0};
  std::atomic<int64_t> live{0};
  // Guarded by SegmentLogImpl::mu_.
  bool active = false;
  bool poisoned = false;
  // Writer only (SegmentLogImpl::write_mu_).
  uint64_t write_end = 0;
};

// A per-thread read buffer, so that reads of similar sizes do not allocate.
thread_local AlignedBuffer tls_read_buffer;

// Stager copies a batch into an aligned staging buffer and writes it out in
// pieces of at most kMaxIoBytes at rising offsets. The batch starts on an
// aligned offset and its total is aligned, so every pwrite is aligned.
class Stager {
 public:
  Stager(SegmentFile* file, AlignedBuffer* buffer, uint64_t offset)
      : file_(file), buf_(buffer), offset_(offset) {}
  absl::Status Put(const char* data, uint64_t n) {
    while (n > 0) {
      const uint64_t take = std::min<uint64_t>(n, buf_->size() - fill_);
      memcpy(buf_->data() + fill_, data, take);
      fill_ += take;
      data += take;
      n -= take;
      if (fill_ == buf_->size()) EVOKE_RETURN_IF_ERROR(Flush());
    }
    return absl::OkStatus();
  }
  absl::Status Zero(uint64_t n) {
    while (n > 0) {
      const uint64_t take = std::min<uint64_t>(n, buf_->size() - fill_);
      memset(buf_->data() + fill_, 0, take);
      fill_ += take;
      n -= take;
      if (fill_ == buf_->size()) EVOKE_RETURN_IF_ERROR(Flush());
    }
    return absl::OkStatus();
  }
  absl::Status Flush() {
    if (fill_ == 0) return absl::OkStatus();
    EVOKE_RETURN_IF_ERROR(file_->Write(offset_, buf_->data(), fill_));
    written_ += fill_;
    offset_ += fill_;
    fill_ = 0;
    return absl::OkStatus();
  }
  uint64_t written() const { return written_; }

 private:
  SegmentFile* const file_;
  AlignedBuffer* const buf_;
  uint64_t offset_;
  uint64_t fill_ = 0;
  uint64_t written_ = 0;
};

class SegmentLogImpl final : public SegmentLog {
 public:
  SegmentLogImpl(const SegmentLogOptions& options, std::shared_ptr<SegmentIo> io)
      : opts_(options), io_(std::move(io)) {}

  absl::Status Init(std::vector<std::string>* notes);

  absl::StatusOr<std::vector<PayloadLocation>> Append(absl::Span<const SegmentAppend> records,
                                                      SegmentStream stream) override;
  absl::Status Read(const BlockId& id, const PayloadLocation& location,
                    const std::function<absl::Status(absl::string_view)>& consume) override;
  bool Contains(const PayloadLocation& location) const override;
  absl::Status ForEachRecord(
      uint64_t segment,
      const std::function<absl::Status(const SegmentRecord& record, bool checksum_ok)>& visit)
      override;
  void AddLive(const PayloadLocation& location) override;
  void RemoveLive(const PayloadLocation& location) override;
  absl::Status Seal(SegmentStream stream) override;
  absl::Status RemoveSegment(uint64_t segment) override;
  std::vector<SegmentInfo> Segments() const override;
  SegmentLogStats Stats() const override;
  uint64_t FileBytes() const override;

 private:
  std::shared_ptr<Segment> Find(uint64_t id) const {
    absl::ReaderMutexLock lock(&mu_);
    auto it = segments_.find(id);
    return it == segments_.end() ? nullptr : it->second;
  }
  // Whether `l` lies in `seg`'s valid range and on a record boundary.
  static bool InRange(const Segment& seg, const PayloadLocation& l) {
    const uint64_t end = seg.valid_end.load(std::memory_order_acquire);
    return l.length > 0 && l.offset >= seg.data_start && l.offset % kRecordAlign == 0 &&
           l.offset <= end && end - l.offset >= kRecordHeaderBytes &&
           l.length <= end - l.offset - kRecordHeaderBytes;
  }
  std::string Path(uint64_t id) const { return opts_.dir + "/" + SegmentName(id); }

  // Reads [begin, begin + size) (aligned) into `buf` in pieces of at most
  // kMaxIoBytes. The file may end inside the last aligned block (a file cut
  // short after its valid end); DATA_LOSS when it ends before `need_end`.
  absl::Status ReadRange(Segment& seg, uint64_t begin, uint64_t size, uint64_t need_end,
                         char* buf);

  // Open-time: checks one segment file and adds it, or quarantines it.
  void LoadSegment(uint64_t id, const std::string& name, std::vector<std::string>* notes);
  void Quarantine(const std::string& name, const std::string& why,
                  std::vector<std::string>* notes);
  struct ScanResult {
    uint64_t valid_end = 0;
    uint64_t max_seq = 0;
    uint64_t torn_bytes = 0;
    bool sealed = false;
  };
  absl::StatusOr<ScanResult> Scan(SegmentFile& file, uint64_t data_start);
  // ReadFooter: a sealed segment's end from its footer and the seal record
  // it names (both must verify and agree); nullopt when there is none.
  absl::StatusOr<std::optional<ScanResult>> ReadFooter(SegmentFile& file, const FileHeader& h,
                                                       uint64_t data_start);

  absl::StatusOr<std::shared_ptr<Segment>> CreateSegment(SegmentStream stream,
                                                         uint64_t min_record_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status WriteBatch(Segment& seg, absl::Span<const SegmentAppend> records,
                          std::vector<PayloadLocation>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status WriteSeal(Segment& seg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status SyncFile(Segment& seg) {
    syncs_.fetch_add(1, std::memory_order_relaxed);
    return seg.file->Sync();
  }
  // Poison: the segment takes no more appends (a write or sync failed).
  void Poison(Segment& seg, SegmentStream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status EnsureStaging() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);

  const SegmentLogOptions opts_;
  const std::shared_ptr<SegmentIo> io_;
  std::string quarantine_dir_;
  uint32_t align_ = kMinSegmentAlign;
  bool direct_ = false;

  // Serializes Append, Seal and RemoveSegment (the caller already does;
  // this keeps the log safe on its own).
  absl::Mutex write_mu_;
  std::shared_ptr<Segment> active_[2] ABSL_GUARDED_BY(write_mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(write_mu_) = 1;
  uint64_t next_id_ ABSL_GUARDED_BY(write_mu_) = 1;
  // Size of the next segment of each stream: the first ones are small
  // (a small cache keeps small files, and a small filesystem is not filled
  // by one preallocation), each new one twice the last, up to
  // segment_bytes; never more than a sixteenth of the filesystem.
  uint64_t next_size_[2] ABSL_GUARDED_BY(write_mu_) = {0, 0};
  uint64_t max_size_ = 0;
  AlignedBuffer staging_ ABSL_GUARDED_BY(write_mu_);

  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  std::map<uint64_t, std::shared_ptr<Segment>> segments_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> payload_bytes_{0};
  std::atomic<uint64_t> syncs_{0};
  std::atomic<uint64_t> batches_{0};
  std::atomic<uint64_t> read_bytes_{0};
  std::atomic<uint64_t> header_mismatches_{0};
  std::atomic<uint64_t> torn_tail_bytes_{0};
  std::atomic<uint64_t> quarantined_{0};
};

// ------------------------------------------------------------ Open

absl::Status SegmentLogImpl::Init(std::vector<std::string>* notes) {
  if (opts_.dir.empty()) return absl::InvalidArgumentError("segment log: no directory");
  if (opts_.segment_bytes < kMinSegmentBytes || opts_.segment_bytes % kSegmentGranule != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment log: segment_bytes ", opts_.segment_bytes,
                     " is not a multiple of 1 MiB of at least 4 MiB"));
  }
  quarantine_dir_ = opts_.quarantine_dir;
  if (quarantine_dir_.empty()) {
    std::string parent = std::filesystem::path(opts_.dir).parent_path().string();
    if (parent.empty()) parent = ".";
    quarantine_dir_ =
        absl::StrCat(parent, "/quarantine-", absl::ToUnixSeconds(absl::Now()));
  }
  EVOKE_RETURN_IF_ERROR(io_->CreateDir(opts_.dir));
  max_size_ = opts_.segment_bytes;
  if (struct statvfs st {}; statvfs(opts_.dir.c_str(), &st) == 0) {
    const uint64_t total = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
    if (total > 0) {
      max_size_ = std::clamp<uint64_t>(total / 16 / kSegmentGranule * kSegmentGranule,
                                       kMinSegmentBytes, opts_.segment_bytes);
    }
  }
  {
    absl::MutexLock w(&write_mu_);
    next_size_[0] = next_size_[1] = std::min(kFirstSegmentBytes, max_size_);
  }

  // Probe what the filesystem allows: O_DIRECT or not, and the alignment.
  {
    const std::string probe = opts_.dir + "/.dio-probe";
    EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<SegmentFile> f,
                           io_->Open(probe, {.create = true, .truncate = true,
                                             .direct = opts_.direct_io}));
    direct_ = f->direct();
    align_ = std::max(kMinSegmentAlign, f->alignment());
    f.reset();
    (void)io_->Remove(probe);
  }

  EVOKE_ASSIGN_OR_RETURN(std::vector<std::string> names, io_->List(opts_.dir));
  uint64_t max_id = 0;
  for (const std::string& name : names) {
    uint64_t id = 0;
    if (ParseSegmentName(name, &id)) {
      max_id = std::max(max_id, id);
      LoadSegment(id, name, notes);
    } else if (absl::EndsWith(name, ".evs.tmp")) {
      // A segment whose creation did not finish: nothing was ever appended
      // to it (its header is synced and renamed before the first append).
      (void)io_->Remove(opts_.dir + "/" + name);
      notes->push_back(absl::StrCat("segments: removed ", name, " (creation interrupted)"));
    }
    // Other names are not ours: left alone.
  }
  absl::MutexLock w(&write_mu_);
  next_id_ = max_id + 1;
  return absl::OkStatus();
}

void SegmentLogImpl::Quarantine(const std::string& name, const std::string& why,
                                std::vector<std::string>* notes) {
  quarantined_.fetch_add(1, std::memory_order_relaxed);
  const std::string from = opts_.dir + "/" + name;
  absl::Status s = io_->CreateDir(quarantine_dir_);
  if (s.ok()) s = io_->Rename(from, quarantine_dir_ + "/" + name);
  if (s.ok()) s = io_->SyncDir(opts_.dir);
  if (s.ok()) {
    notes->push_back(absl::StrCat("segments: ", name, " moved to ", quarantine_dir_, " (", why,
                                  "); the payloads in it are not served"));
  } else {
    notes->push_back(absl::StrCat("segments: ", name, " is unreadable (", why,
                                  ") and could not be moved aside (", s.ToString(),
                                  "); it is ignored"));
  }
  EVOKE_LOG_WARNING("segment log: ", notes->back());
}

void SegmentLogImpl::LoadSegment(uint64_t id, const std::string& name,
                                 std::vector<std::string>* notes) {
  const std::string path = opts_.dir + "/" + name;
  absl::StatusOr<std::unique_ptr<SegmentFile>> file =
      io_->Open(path, {.create = false, .truncate = false, .direct = opts_.direct_io});
  if (!file.ok()) {
    notes->push_back(absl::StrCat("segments: cannot open ", name, " (", file.status().ToString(),
                                  "); its payloads are not served"));
    return;
  }
  absl::StatusOr<AlignedBuffer> buf = AlignedBuffer::Allocate(RoundUp(kFileHeaderBytes, align_),
                                                              align_);
  if (!buf.ok()) {
    notes->push_back(absl::StrCat("segments: ", name, ": ", buf.status().ToString()));
    return;
  }
  absl::StatusOr<size_t> n = (*file)->Read(0, buf->data(), buf->size());
  std::string why;
  FileHeader h;
  if (!n.ok()) {
    // An I/O error, not proof of corruption: leave the file where it is.
    notes->push_back(absl::StrCat("segments: reading the header of ", name, " failed (",
                                  n.status().ToString(), "); its payloads are not served"));
    return;
  }
  if (*n < kFileHeaderUsed) {
    why = absl::StrCat("file of ", *n, " bytes is shorter than a header");
  } else {
    why = DecodeFileHeader(buf->data(), &h);
    if (why.empty() && h.id != id) why = absl::StrCat("header names segment ", h.id);
    if (why.empty() && h.instance != opts_.instance) {
      why = "it belongs to another data directory (instance id differs)";
    }
    // A file cut inside its header block holds no record, and its header's
    // promises (size, footer) no longer hold.
    if (why.empty()) {
      const uint64_t data_start = RoundUp(kFileHeaderBytes, h.align);
      absl::StatusOr<uint64_t> size = (*file)->Size();
      if (size.ok() && *size < data_start) {
        why = absl::StrCat("file of ", *size, " bytes ends inside its ", data_start,
                           "-byte header");
      }
    }
  }
  if (!why.empty()) {
    file->reset();
    Quarantine(name, why, notes);
    return;
  }
  auto seg = std::make_shared<Segment>();
  seg->id = id;
  seg->path = path;
  seg->file = std::move(*file);
  seg->data_start = RoundUp(kFileHeaderBytes, h.align);
  seg->created_ms = h.created_ms;
  absl::StatusOr<uint64_t> size = seg->file->Size();
  seg->size = size.ok() ? *size : h.size;
  absl::StatusOr<std::optional<ScanResult>> footer = ReadFooter(*seg->file, h, seg->data_start);
  absl::StatusOr<ScanResult> scan = absl::InternalError("unset");
  if (!footer.ok()) {
    scan = footer.status();
  } else if (footer->has_value()) {
    scan = **footer;
  } else {
    scan = Scan(*seg->file, seg->data_start);
  }
  if (!scan.ok()) {
    notes->push_back(absl::StrCat("segments: scanning ", name, " failed (",
                                  scan.status().ToString(), "); its payloads are not served"));
    return;
  }
  seg->valid_end.store(scan->valid_end);
  seg->write_end = RoundUp(scan->valid_end, align_);
  if (scan->torn_bytes > 0) {
    torn_tail_bytes_.fetch_add(scan->torn_bytes, std::memory_order_relaxed);
    notes->push_back(absl::StrCat("segments: ", name, ": dropped a torn tail of ",
                                  scan->torn_bytes, " bytes at offset ", scan->valid_end,
                                  " (never acknowledged)"));
  }
  {
    absl::MutexLock w(&write_mu_);
    next_seq_ = std::max(next_seq_, scan->max_seq + 1);
    absl::MutexLock lock(&mu_);
    segments_[id] = std::move(seg);
  }
}

absl::StatusOr<std::optional<SegmentLogImpl::ScanResult>> SegmentLogImpl::ReadFooter(
    SegmentFile& file, const FileHeader& h, uint64_t data_start) {
  EVOKE_ASSIGN_OR_RETURN(const uint64_t file_size, file.Size());
  const uint64_t block = std::max<uint64_t>(align_, h.align);
  if (h.size < data_start + 2 * block || file_size < h.size || h.size % block != 0) {
    return std::nullopt;
  }
  EVOKE_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(block, align_));
  const uint64_t footer_at = h.size - h.align;
  const uint64_t footer_block = RoundDown(footer_at, align_);
  EVOKE_ASSIGN_OR_RETURN(size_t n, file.Read(footer_block, buf.data(), block));
  read_bytes_.fetch_add(n, std::memory_order_relaxed);
  if (n < footer_at - footer_block + kRecordHeaderBytes) return std::nullopt;
  char footer[kRecordHeaderBytes];
  memcpy(footer, buf.data() + (footer_at - footer_block), kRecordHeaderBytes);
  RecordHeader f;
  if (!DecodeRecord(footer, &f) || f.type != kSeal || f.flags != 0 || f.length != 0) {
    return std::nullopt;
  }
  const uint64_t seal_at = f.checksum;
  if (seal_at % kRecordAlign != 0 || seal_at < data_start || seal_at > footer_at) {
    return std::nullopt;
  }
  if (seal_at != footer_at) {
    const uint64_t seal_block = RoundDown(seal_at, align_);
    EVOKE_ASSIGN_OR_RETURN(n, file.Read(seal_block, buf.data(), block));
    read_bytes_.fetch_add(n, std::memory_order_relaxed);
    if (n < seal_at - seal_block + kRecordHeaderBytes ||
        memcmp(buf.data() + (seal_at - seal_block), footer, kRecordHeaderBytes) != 0) {
      return std::nullopt;
    }
  }
  ScanResult r;
  r.valid_end = seal_at + kRecordHeaderBytes;
  r.max_seq = f.seq;  // The seal's seq is the segment's last.
  r.sealed = true;
  return r;
}

absl::StatusOr<SegmentLogImpl::ScanResult> SegmentLogImpl::Scan(SegmentFile& file,
                                                                uint64_t data_start) {
  ScanResult r;
  r.valid_end = data_start;
  EVOKE_ASSIGN_OR_RETURN(const uint64_t file_size, file.Size());
  EVOKE_ASSIGN_OR_RETURN(AlignedBuffer window,
                         AlignedBuffer::Allocate(std::min<uint64_t>(kMaxIoBytes, 1 << 20), align_));
  uint64_t wbegin = 0, wend = 0;  // The bytes of the file in `window`.
  // Loads the aligned window holding [off, off + 64); false at the end.
  auto load = [&](uint64_t off) -> absl::StatusOr<bool> {
    if (off >= wbegin && off + kRecordHeaderBytes <= wend) return true;
    wbegin = RoundDown(off, align_);
    EVOKE_ASSIGN_OR_RETURN(size_t n, file.Read(wbegin, window.data(), window.size()));
    read_bytes_.fetch_add(n, std::memory_order_relaxed);
    wend = wbegin + n;
    return off + kRecordHeaderBytes <= wend;
  };
  uint64_t off = data_start;
  uint64_t prev_seq = 0;
  while (off + kRecordHeaderBytes <= file_size) {
    EVOKE_ASSIGN_OR_RETURN(bool have, load(off));
    if (!have) break;
    RecordHeader h;
    if (!DecodeRecord(window.data() + (off - wbegin), &h)) break;
    if (h.flags != 0 || h.seq <= prev_seq) break;
    if (h.type == kSeal) {
      if (h.length != 0) break;
    } else if (h.type == kPayload || h.type == kSkip) {
      if (h.type == kPayload && h.length == 0) break;
    } else {
      break;
    }
    const uint64_t room = file_size - off - kRecordHeaderBytes;
    if (h.length > room || RoundUp(h.length, kRecordAlign) > room) break;
    prev_seq = h.seq;
    r.max_seq = std::max(r.max_seq, h.seq);
    off += kRecordHeaderBytes + RoundUp(h.length, kRecordAlign);
    r.valid_end = off;
    if (h.type == kSeal) {
      r.sealed = true;
      break;
    }
  }
  if (r.sealed) return r;
  // Bytes past the valid end that are not zero were a batch that did not
  // finish (a torn tail). Count them up to the first all-zero block.
  uint64_t pos = r.valid_end;
  while (pos < file_size) {
    const uint64_t block_begin = RoundDown(pos, align_);
    if (!(pos >= wbegin && pos < wend)) {
      wbegin = block_begin;
      EVOKE_ASSIGN_OR_RETURN(size_t n, file.Read(wbegin, window.data(), window.size()));
      read_bytes_.fetch_add(n, std::memory_order_relaxed);
      wend = wbegin + n;
      if (n == 0) break;
    }
    const uint64_t block_end = std::min(wend, block_begin + align_);
    const char* p = window.data() + (pos - wbegin);
    const uint64_t len = block_end - pos;
    bool zero = true;
    for (uint64_t i = 0; i < len && zero; ++i) zero = p[i] == 0;
    if (zero) break;
    r.torn_bytes += len;
    pos = block_end;
  }
  return r;
}

// ------------------------------------------------------------ Append

absl::Status SegmentLogImpl::EnsureStaging() {
  if (!staging_.empty()) return absl::OkStatus();
  EVOKE_ASSIGN_OR_RETURN(staging_, AlignedBuffer::Allocate(kMaxIoBytes, align_));
  return absl::OkStatus();
}

void SegmentLogImpl::Poison(Segment& seg, SegmentStream stream) {
  absl::MutexLock lock(&mu_);
  seg.poisoned = true;
  seg.active = false;
  std::shared_ptr<Segment>& a = active_[static_cast<int>(stream)];
  if (a.get() == &seg) a.reset();
}

absl::StatusOr<std::shared_ptr<Segment>> SegmentLogImpl::CreateSegment(SegmentStream stream,
                                                                       uint64_t record_bytes) {
  const uint64_t id = next_id_++;
  const uint64_t data_start = RoundUp(kFileHeaderBytes, align_);
  uint64_t& next = next_size_[static_cast<int>(stream)];
  // Room for the record, its batch padding and the seal record.
  const uint64_t size = std::max<uint64_t>(
      next, RoundUp(data_start + RoundUp(record_bytes, align_) + align_, kSegmentGranule));
  next = std::min(next * 2, max_size_);
  const std::string path = Path(id);
  const std::string tmp = path + ".tmp";
  EVOKE_ASSIGN_OR_RETURN(std::unique_ptr<SegmentFile> file,
                         io_->Open(tmp, {.create = true, .truncate = true,
                                         .direct = opts_.direct_io}));
  auto fail = [&](absl::Status s) {
    file.reset();
    (void)io_->Remove(tmp);
    return s;
  };
  // fallocate first: no space shows up here, before anything is written,
  // and appends never change the file's size (fdatasync then has no size
  // to commit).
  if (absl::Status s = file->Allocate(size); !s.ok()) return fail(s);
  EVOKE_ASSIGN_OR_RETURN(AlignedBuffer header, AlignedBuffer::Allocate(data_start, align_));
  memset(header.data(), 0, data_start);
  FileHeader h;
  h.align = align_;
  h.id = id;
  h.instance = opts_.instance;
  h.created_ms = static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()));
  h.size = size;
  EncodeFileHeader(h, header.data());
  if (absl::Status s = file->Write(0, header.data(), data_start); !s.ok()) return fail(s);
  bytes_written_.fetch_add(data_start, std::memory_order_relaxed);
  syncs_.fetch_add(1, std::memory_order_relaxed);
  if (absl::Status s = file->Sync(); !s.ok()) return fail(s);
  // The name appears only once the header is durable: a seg-*.evs file
  // always has one.
  if (absl::Status s = io_->Rename(tmp, path); !s.ok()) return fail(s);
  file.reset();
  // Reopened under its final name, so that errors name the right file.
  absl::Status s = io_->SyncDir(opts_.dir);
  if (s.ok()) {
    absl::StatusOr<std::unique_ptr<SegmentFile>> f =
        io_->Open(path, {.create = false, .truncate = false, .direct = opts_.direct_io});
    if (f.ok()) {
      file = std::move(*f);
    } else {
      s = f.status();
    }
  }
  if (!s.ok()) {
    // The file may or may not survive a crash; either way it holds no
    // record. Use it no further.
    (void)io_->Remove(path);
    return s;
  }
  auto seg = std::make_shared<Segment>();
  seg->id = id;
  seg->path = path;
  seg->file = std::move(file);
  seg->size = size;
  seg->data_start = data_start;
  seg->created_ms = h.created_ms;
  seg->stream = stream;
  seg->valid_end.store(data_start);
  seg->write_end = data_start;
  seg->active = true;
  {
    absl::MutexLock lock(&mu_);
    segments_[id] = seg;
  }
  active_[static_cast<int>(stream)] = seg;
  return seg;
}

absl::Status SegmentLogImpl::WriteBatch(Segment& seg, absl::Span<const SegmentAppend> records,
                                        std::vector<PayloadLocation>* out) {
  EVOKE_RETURN_IF_ERROR(EnsureStaging());
  const uint64_t batch_seq = next_seq_;
  uint64_t seq = next_seq_;
  uint64_t off = seg.write_end;
  Stager st(seg.file.get(), &staging_, seg.write_end);
  std::vector<PayloadLocation> placed;
  placed.reserve(records.size());
  char header[kRecordHeaderBytes];
  uint64_t payload = 0;
  absl::Status s;
  for (const SegmentAppend& r : records) {
    RecordHeader h;
    h.type = kPayload;
    h.id = r.id;
    h.seq = seq;
    h.length = r.payload.size();
    h.checksum = r.checksum;
    h.batch_seq = batch_seq;
    EncodeRecord(h, header);
    s = st.Put(header, kRecordHeaderBytes);
    if (s.ok()) s = st.Put(r.payload.data(), r.payload.size());
    if (s.ok()) s = st.Zero(RoundUp(r.payload.size(), kRecordAlign) - r.payload.size());
    if (!s.ok()) break;
    placed.push_back(PayloadLocation{seg.id, off, r.payload.size(), seq});
    off += SegmentRecordBytes(r.payload.size());
    payload += r.payload.size();
    ++seq;
  }
  if (s.ok()) {
    // Pad to the alignment with a skip record, so that the next batch
    // starts on a fresh page and a synced page is never written again.
    const uint64_t gap = RoundUp(off, align_) - off;
    if (gap > 0) {
      RecordHeader h;
      h.type = kSkip;
      h.seq = seq++;
      h.length = gap - kRecordHeaderBytes;
      h.batch_seq = batch_seq;
      EncodeRecord(h, header);
      s = st.Put(header, kRecordHeaderBytes);
      if (s.ok()) s = st.Zero(gap - kRecordHeaderBytes);
      off += gap;
    }
  }
  if (s.ok()) s = st.Flush();
  bytes_written_.fetch_add(st.written(), std::memory_order_relaxed);
  // Sequence numbers stay unique even for a batch that failed (parts of it
  // may be on disk).
  next_seq_ = seq;
  if (s.ok()) s = SyncFile(seg);
  if (!s.ok()) return s;
  batches_.fetch_add(1, std::memory_order_relaxed);
  payload_bytes_.fetch_add(payload, std::memory_order_relaxed);
  seg.write_end = off;
  seg.valid_end.store(off, std::memory_order_release);
  out->insert(out->end(), placed.begin(), placed.end());
  return absl::OkStatus();
}

absl::Status SegmentLogImpl::WriteSeal(Segment& seg) {
  EVOKE_RETURN_IF_ERROR(EnsureStaging());
  memset(staging_.data(), 0, align_);
  RecordHeader h;
  h.type = kSeal;
  h.seq = next_seq_++;
  h.batch_seq = h.seq;
  // A seal has no payload; its checksum field holds its own offset, so that
  // the copy in the segment's last block (the footer) says where it is.
  h.checksum = seg.write_end;
  EncodeRecord(h, staging_.data());
  EVOKE_RETURN_IF_ERROR(seg.file->Write(seg.write_end, staging_.data(), align_));
  bytes_written_.fetch_add(align_, std::memory_order_relaxed);
  const uint64_t footer = seg.size - align_;
  if (footer != seg.write_end) {
    // The footer: Open finds a sealed segment's end by reading two blocks
    // instead of scanning every record header.
    EVOKE_RETURN_IF_ERROR(seg.file->Write(footer, staging_.data(), align_));
    bytes_written_.fetch_add(align_, std::memory_order_relaxed);
  }
  EVOKE_RETURN_IF_ERROR(SyncFile(seg));
  seg.valid_end.store(seg.write_end + kRecordHeaderBytes, std::memory_order_release);
  seg.write_end += align_;
  return absl::OkStatus();
}

// Append fails RESOURCE_EXHAUSTED (no space) or UNAVAILABLE (anything
// else the device said), as the interface promises.
absl::Status AppendError(const absl::Status& s) {
  if (s.code() == absl::StatusCode::kResourceExhausted) return s;
  return absl::UnavailableError(s.message());
}

absl::StatusOr<std::vector<PayloadLocation>> SegmentLogImpl::Append(
    absl::Span<const SegmentAppend> records, SegmentStream stream) {
  absl::MutexLock w(&write_mu_);
  std::vector<PayloadLocation> out;
  out.reserve(records.size());
  for (const SegmentAppend& r : records) {
    if (r.payload.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("segment log: empty payload for block ", r.id.ToHex()));
    }
  }
  const int k = static_cast<int>(stream);
  size_t i = 0;
  while (i < records.size()) {
    std::shared_ptr<Segment> seg = active_[k];
    if (seg == nullptr) {
      absl::StatusOr<std::shared_ptr<Segment>> created =
          CreateSegment(stream, SegmentRecordBytes(records[i].payload.size()));
      if (!created.ok()) return AppendError(created.status());
      seg = std::move(*created);
    }
    // As many records as fit, leaving one aligned block for the seal.
    const uint64_t limit = seg->size - align_;
    uint64_t bytes = 0;
    size_t j = i;
    while (j < records.size()) {
      const uint64_t b = SegmentRecordBytes(records[j].payload.size());
      if (seg->write_end + RoundUp(bytes + b, align_) > limit) break;
      bytes += b;
      ++j;
    }
    if (j == i) {
      if (seg->write_end == seg->data_start) {
        return absl::InternalError("segment log: a new segment has no room for the record");
      }
      // Roll: seal the full segment (a clean end for the restart scan) and
      // start a new one. A failed seal only poisons the old segment.
      if (absl::Status s = WriteSeal(*seg); !s.ok()) {
        EVOKE_LOG_WARNING("segment log: sealing ", seg->path, " failed: ", s.ToString());
        Poison(*seg, stream);
      } else {
        absl::MutexLock lock(&mu_);
        seg->active = false;
      }
      active_[k].reset();
      continue;
    }
    if (absl::Status s = WriteBatch(*seg, records.subspan(i, j - i), &out); !s.ok()) {
      Poison(*seg, stream);
      EVOKE_LOG_WARNING("segment log: append to ", seg->path,
                        " failed; the segment takes no more appends: ", s.ToString());
      return AppendError(s);
    }
    i = j;
  }
  return out;
}

absl::Status SegmentLogImpl::Seal(SegmentStream stream) {
  absl::MutexLock w(&write_mu_);
  const int k = static_cast<int>(stream);
  std::shared_ptr<Segment> seg = std::move(active_[k]);
  active_[k].reset();
  if (seg == nullptr) return absl::OkStatus();
  absl::Status s = WriteSeal(*seg);
  absl::MutexLock lock(&mu_);
  seg->active = false;
  if (!s.ok()) seg->poisoned = true;
  return s;
}

// ------------------------------------------------------------ Read

absl::Status SegmentLogImpl::ReadRange(Segment& seg, uint64_t begin, uint64_t size,
                                       uint64_t need_end, char* buf) {
  for (uint64_t done = 0; done < size;) {
    const uint64_t piece = std::min<uint64_t>(kMaxIoBytes, size - done);
    EVOKE_ASSIGN_OR_RETURN(size_t n, seg.file->Read(begin + done, buf + done, piece));
    read_bytes_.fetch_add(n, std::memory_order_relaxed);
    if (n < piece) {
      if (begin + done + n >= need_end) return absl::OkStatus();
      return absl::DataLossError(absl::StrCat("segment ", seg.id, " (", seg.path,
                                              ") ends at ", begin + done + n,
                                              ", inside its valid range"));
    }
    done += piece;
  }
  return absl::OkStatus();
}

absl::Status SegmentLogImpl::Read(const BlockId& id, const PayloadLocation& l,
                                  const std::function<absl::Status(absl::string_view)>& consume) {
  std::shared_ptr<Segment> seg = Find(l.segment);
  if (seg == nullptr) {
    return absl::NotFoundError(absl::StrCat("segment ", l.segment, " is gone (block ",
                                            id.ToHex(), ")"));
  }
  if (!InRange(*seg, l)) {
    if (l.offset % kRecordAlign != 0 || l.length == 0) {
      header_mismatches_.fetch_add(1, std::memory_order_relaxed);
      return absl::DataLossError(absl::StrCat("segment ", l.segment, " offset ", l.offset,
                                              " length ", l.length,
                                              " is not a record location (block ", id.ToHex(),
                                              ")"));
    }
    return absl::NotFoundError(absl::StrCat("segment ", l.segment, " offset ", l.offset,
                                            " length ", l.length, " lies past its valid end ",
                                            seg->valid_end.load(), " (block ", id.ToHex(), ")"));
  }
  const uint64_t begin = RoundDown(l.offset, align_);
  const uint64_t end = RoundUp(l.offset + kRecordHeaderBytes + l.length, align_);
  const uint64_t size = end - begin;
  AlignedBuffer buf = std::move(tls_read_buffer);
  if (buf.size() < size) {
    EVOKE_ASSIGN_OR_RETURN(buf, AlignedBuffer::Allocate(RoundUp(size, kSegmentGranule), align_));
  }
  absl::Status s =
      ReadRange(*seg, begin, size, l.offset + kRecordHeaderBytes + l.length, buf.data());
  if (s.ok()) {
    const char* rec = buf.data() + (l.offset - begin);
    RecordHeader h;
    std::string why;
    if (!DecodeRecord(rec, &h)) {
      why = "its header does not verify";
    } else if (h.type != kPayload) {
      why = absl::StrCat("it is a record of type ", h.type);
    } else if (h.id != id) {
      why = absl::StrCat("it holds block ", h.id.ToHex());
    } else if (h.seq != l.seq) {
      why = absl::StrCat("its seq is ", h.seq, ", not ", l.seq);
    } else if (h.length != l.length) {
      why = absl::StrCat("its length is ", h.length, ", not ", l.length);
    }
    if (!why.empty()) {
      header_mismatches_.fetch_add(1, std::memory_order_relaxed);
      s = absl::DataLossError(absl::StrCat("record at segment ", l.segment, " offset ", l.offset,
                                           " is not block ", id.ToHex(), ": ", why));
    } else {
      s = consume(absl::string_view(rec + kRecordHeaderBytes, l.length));
    }
  }
  if (buf.size() <= kKeepReadBuffer && buf.size() > tls_read_buffer.size()) {
    tls_read_buffer = std::move(buf);
  }
  return s;
}

bool SegmentLogImpl::Contains(const PayloadLocation& l) const {
  std::shared_ptr<Segment> seg = Find(l.segment);
  return seg != nullptr && InRange(*seg, l);
}

absl::Status SegmentLogImpl::ForEachRecord(
    uint64_t segment,
    const std::function<absl::Status(const SegmentRecord& record, bool checksum_ok)>& visit) {
  std::shared_ptr<Segment> seg = Find(segment);
  if (seg == nullptr) return absl::NotFoundError(absl::StrCat("segment ", segment, " is gone"));
  const uint64_t valid_end = seg->valid_end.load(std::memory_order_acquire);
  EVOKE_ASSIGN_OR_RETURN(AlignedBuffer window, AlignedBuffer::Allocate(kMaxIoBytes, align_));
  AlignedBuffer big;  // For records larger than the window.
  uint64_t wbegin = 0, wend = 0;
  const uint64_t file_end = RoundUp(valid_end, align_);
  uint64_t off = seg->data_start;
  while (off + kRecordHeaderBytes <= valid_end) {
    if (!(off >= wbegin && off + kRecordHeaderBytes <= wend)) {
      wbegin = RoundDown(off, align_);
      wend = std::min<uint64_t>(wbegin + window.size(), file_end);
      EVOKE_RETURN_IF_ERROR(
          ReadRange(*seg, wbegin, wend - wbegin, std::min(wend, valid_end), window.data()));
    }
    RecordHeader h;
    if (!DecodeRecord(window.data() + (off - wbegin), &h) ||
        h.length > valid_end - off - kRecordHeaderBytes) {
      header_mismatches_.fetch_add(1, std::memory_order_relaxed);
      return absl::DataLossError(absl::StrCat("segment ", segment, " offset ", off,
                                              ": a record header inside the valid range does "
                                              "not verify"));
    }
    if (h.type == kSeal) break;
    if (h.type == kPayload) {
      const uint64_t pbegin = off + kRecordHeaderBytes;
      const char* p = nullptr;
      if (pbegin + h.length <= wend) {
        p = window.data() + (pbegin - wbegin);
      } else {
        const uint64_t b = RoundDown(pbegin, align_);
        const uint64_t e = RoundUp(pbegin + h.length, align_);
        if (big.size() < e - b) {
          EVOKE_ASSIGN_OR_RETURN(big, AlignedBuffer::Allocate(RoundUp(e - b, kSegmentGranule),
                                                              align_));
        }
        EVOKE_RETURN_IF_ERROR(ReadRange(*seg, b, e - b, pbegin + h.length, big.data()));
        p = big.data() + (pbegin - b);
      }
      SegmentRecord record;
      record.id = h.id;
      record.location = PayloadLocation{segment, off, h.length, h.seq};
      record.checksum = h.checksum;
      record.payload = absl::string_view(p, h.length);
      // Off the hot path (compaction, verify): the payload is checked here
      // so that a corrupt copy is never moved as if it were good.
      const bool ok = PayloadChecksum(p, h.length) == h.checksum;
      EVOKE_RETURN_IF_ERROR(visit(record, ok));
    }
    off += kRecordHeaderBytes + RoundUp(h.length, kRecordAlign);
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ accounting

void SegmentLogImpl::AddLive(const PayloadLocation& l) {
  if (std::shared_ptr<Segment> seg = Find(l.segment)) {
    seg->live.fetch_add(static_cast<int64_t>(SegmentRecordBytes(l.length)),
                        std::memory_order_relaxed);
  }
}

void SegmentLogImpl::RemoveLive(const PayloadLocation& l) {
  if (std::shared_ptr<Segment> seg = Find(l.segment)) {
    seg->live.fetch_sub(static_cast<int64_t>(SegmentRecordBytes(l.length)),
                        std::memory_order_relaxed);
  }
}

absl::Status SegmentLogImpl::RemoveSegment(uint64_t segment) {
  absl::MutexLock w(&write_mu_);
  std::shared_ptr<Segment> seg;
  {
    absl::MutexLock lock(&mu_);
    auto it = segments_.find(segment);
    if (it == segments_.end()) {
      return absl::NotFoundError(absl::StrCat("segment ", segment, " is not in the log"));
    }
    if (it->second->active) {
      return absl::FailedPreconditionError(
          absl::StrCat("segment ", segment, " is active; seal it first"));
    }
    seg = it->second;
    segments_.erase(it);
  }
  // Readers holding `seg` keep its file open and finish their reads.
  absl::Status s = io_->Remove(seg->path);
  if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
    absl::MutexLock lock(&mu_);
    segments_[segment] = std::move(seg);
    return s;
  }
  return io_->SyncDir(opts_.dir);
}

std::vector<SegmentInfo> SegmentLogImpl::Segments() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<SegmentInfo> out;
  out.reserve(segments_.size());
  for (const auto& [id, seg] : segments_) {
    SegmentInfo i;
    i.id = id;
    i.size = seg->size;
    i.valid_end = seg->valid_end.load(std::memory_order_acquire);
    i.live_bytes = static_cast<uint64_t>(std::max<int64_t>(0, seg->live.load()));
    i.active = seg->active;
    i.poisoned = seg->poisoned;
    i.stream = seg->stream;
    i.created_unix_ms = seg->created_ms;
    out.push_back(i);
  }
  return out;
}

SegmentLogStats SegmentLogImpl::Stats() const {
  SegmentLogStats s;
  {
    absl::ReaderMutexLock lock(&mu_);
    s.segments = segments_.size();
  }
  s.bytes_written = bytes_written_.load();
  s.payload_bytes = payload_bytes_.load();
  s.syncs = syncs_.load();
  s.batches = batches_.load();
  s.read_bytes = read_bytes_.load();
  s.header_mismatches = header_mismatches_.load();
  s.torn_tail_bytes = torn_tail_bytes_.load();
  s.quarantined_segments = quarantined_.load();
  s.direct_io = direct_;
  s.io_align = align_;
  return s;
}

uint64_t SegmentLogImpl::FileBytes() const {
  absl::ReaderMutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [id, seg] : segments_) total += seg->size;
  return total;
}

}  // namespace

uint64_t SegmentRecordBytes(uint64_t payload_bytes) {
  return kRecordHeaderBytes + RoundUp(payload_bytes, kRecordAlign);
}

absl::StatusOr<std::unique_ptr<SegmentLog>> SegmentLog::Open(const SegmentLogOptions& options,
                                                             std::vector<std::string>* notes) {
  std::vector<std::string> scratch;
  if (notes == nullptr) notes = &scratch;
  std::shared_ptr<SegmentIo> io = options.io != nullptr ? options.io : NewSegmentIo(options.faults);
  auto log = std::make_unique<SegmentLogImpl>(options, std::move(io));
  absl::Status s = log->Init(notes);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("segment log ", options.dir, ": ", s.message()));
  }
  return std::unique_ptr<SegmentLog>(std::move(log));
}

}  // namespace evoke
