// SegmentLog inside: the on-disk encodings of records and file headers,
// the staging buffer and SegmentLogImpl, whose members are defined in
// segment_log.cc (appends, seals, reads, removal) and segment_log_open.cc
// (opening a directory: the scan, salvage and quarantine of segment files).
// Private to storage/tier2/: include storage/tier2/segment_log.h.
#ifndef EVOKE_STORAGE_TIER2_SEGMENT_LOG_IMPL_H_
#define EVOKE_STORAGE_TIER2_SEGMENT_LOG_IMPL_H_
#include "storage/tier2/segment_log.h"


#include <sys/statvfs.h>

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <future>
#include <system_error>
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
namespace segment_internal {


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

// kIdentity: a block's serialized record, written just before its
// payload record (same block id; checksum field: XXH3-64 of the bytes).
// kTombstone: 24 bytes, the segment and seq of the record it removes and
// why (SegmentTombstone::Kind) (checksum field: XXH3-64 of them). Both arrived after the first segments
// were written: an evoked from before them reads sealed segments that hold
// them, and stops the restart scan of an unsealed one at the first.
enum RecordType : uint16_t {
  kPayload = 1,
  kSkip = 2,
  kSeal = 3,
  kIdentity = 4,
  kTombstone = 5,
};
constexpr uint64_t kTombstoneBytes = 24;

inline uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline uint64_t RoundDown(uint64_t v, uint64_t a) { return v / a * a; }

inline void Put16(char* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline void Put32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline void Put64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline uint16_t Get16(const char* p) {
  uint16_t v = 0;
  for (int i = 1; i >= 0; --i) v = static_cast<uint16_t>((v << 8) | static_cast<uint8_t>(p[i]));
  return v;
}
inline uint32_t Get32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline uint64_t Get64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
// Block ids are stored as BlockId::ToBytes() (16 bytes, big endian).
inline void PutId(char* p, const BlockId& id) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(id.hi() >> (56 - 8 * i));
  for (int i = 0; i < 8; ++i) p[8 + i] = static_cast<char>(id.lo() >> (56 - 8 * i));
}
inline BlockId GetId(const char* p) {
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

inline void EncodeRecord(const RecordHeader& h, char* out) {
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
inline bool DecodeRecord(const char* in, RecordHeader* h) {
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

inline void EncodeFileHeader(const FileHeader& h, char* out) {
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
inline std::string DecodeFileHeader(const char* in, FileHeader* h) {
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

inline std::string SegmentName(uint64_t id) { return absl::StrFormat("seg-%016x.evs", id); }

// ParseSegmentName: true for "seg-<16 lowercase hex digits>.evs".
inline bool ParseSegmentName(absl::string_view name, uint64_t* id) {
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
  std::atomic<bool> may_hold_tombstones{false};
  // The largest seq of any record in it, and of a payload record (0: none).
  std::atomic<uint64_t> max_seq{0};
  std::atomic<uint64_t> last_payload_seq{0};
  // Guarded by SegmentLogImpl::mu_.
  bool active = false;
  bool poisoned = false;
  // Writer only (SegmentLogImpl::write_mu_).
  uint64_t write_end = 0;
};

// Stager copies a batch into aligned staging buffers and writes it out in
// pieces of at most kMaxIoBytes at rising offsets. The batch starts on an
// aligned offset and its total is aligned, so every pwrite is aligned. A
// batch of several pieces keeps up to `in_flight` of them being written at
// once (each full buffer goes to a writer thread while the next one fills;
// the last piece is written by the caller), so that the device sees more
// than one request at a time: at queue depth 1 an O_DIRECT writer leaves
// most of an SSD's parallelism idle. Buffers beyond the first are taken from
// `spares` (allocated on first use, kept for the next batch).
class Stager {
 public:
  Stager(SegmentFile* file, AlignedBuffer* first, std::vector<AlignedBuffer>* spares,
         uint32_t align, int in_flight, uint64_t offset)
      : file_(file), first_(first), spares_(spares), align_(align),
        in_flight_(std::max(1, in_flight)), offset_(offset) {
    buf_ = first_;
    // Pending writes point at spares: the vector must never move them.
    spares_->reserve(static_cast<size_t>(in_flight_));
  }
  ~Stager() { WaitAll().IgnoreError(); }
  absl::Status Put(const char* data, uint64_t n) {
    while (n > 0) {
      const uint64_t take = std::min<uint64_t>(n, buf_->size() - fill_);
      memcpy(buf_->data() + fill_, data, take);
      fill_ += take;
      data += take;
      n -= take;
      if (fill_ == buf_->size()) EVOKE_RETURN_IF_ERROR(Submit());
    }
    return absl::OkStatus();
  }
  absl::Status Zero(uint64_t n) {
    while (n > 0) {
      const uint64_t take = std::min<uint64_t>(n, buf_->size() - fill_);
      memset(buf_->data() + fill_, 0, take);
      fill_ += take;
      n -= take;
      if (fill_ == buf_->size()) EVOKE_RETURN_IF_ERROR(Submit());
    }
    return absl::OkStatus();
  }
  // Flush writes what is staged and waits for every write in flight.
  absl::Status Flush() {
    absl::Status s = fill_ > 0 ? WriteNow() : absl::OkStatus();
    s.Update(WaitAll());
    return s;
  }
  uint64_t written() const { return written_; }

 private:
  struct Pending {
    AlignedBuffer* buffer = nullptr;
    uint64_t bytes = 0;
    std::future<absl::Status> done;
  };
  // WriteNow writes the staged bytes on this thread.
  absl::Status WriteNow() {
    EVOKE_RETURN_IF_ERROR(file_->Write(offset_, buf_->data(), fill_));
    written_ += fill_;
    offset_ += fill_;
    fill_ = 0;
    return absl::OkStatus();
  }
  // Submit hands the full buffer to a writer and moves to a free one.
  absl::Status Submit() {
    if (in_flight_ == 1) return WriteNow();
    Pending p;
    p.buffer = buf_;
    p.bytes = fill_;
    SegmentFile* file = file_;
    const uint64_t at = offset_;
    const char* data = buf_->data();
    const uint64_t n = fill_;
    try {
      p.done =
          std::async(std::launch::async, [file, at, data, n] { return file->Write(at, data, n); });
    } catch (const std::system_error&) {
      // No thread to be had (a process limit): this piece is written here.
      return WriteNow();
    }
    pending_.push_back(std::move(p));
    offset_ += fill_;
    fill_ = 0;
    // The next buffer: a spare not in flight, or the oldest one once written.
    if (static_cast<int>(pending_.size()) < in_flight_) {
      const size_t want = pending_.size();  // Spares in use so far + this one.
      while (spares_->size() < want) {
        EVOKE_ASSIGN_OR_RETURN(AlignedBuffer b, AlignedBuffer::Allocate(first_->size(), align_));
        spares_->push_back(std::move(b));
      }
      buf_ = FreeBuffer();
      return absl::OkStatus();
    }
    Pending oldest = std::move(pending_.front());
    pending_.erase(pending_.begin());
    const absl::Status s = oldest.done.get();
    if (s.ok()) written_ += oldest.bytes;
    buf_ = oldest.buffer;
    return s;
  }
  // A staging buffer that no write in flight uses.
  AlignedBuffer* FreeBuffer() {
    auto busy = [&](const AlignedBuffer* b) {
      for (const Pending& p : pending_) {
        if (p.buffer == b) return true;
      }
      return false;
    };
    if (!busy(first_)) return first_;
    for (AlignedBuffer& b : *spares_) {
      if (!busy(&b)) return &b;
    }
    return nullptr;  // Unreachable: fewer in flight than buffers.
  }
  absl::Status WaitAll() {
    absl::Status s;
    for (Pending& p : pending_) {
      const absl::Status w = p.done.get();
      if (w.ok()) written_ += p.bytes;
      s.Update(w);
    }
    pending_.clear();
    return s;
  }

  SegmentFile* const file_;
  AlignedBuffer* const first_;
  std::vector<AlignedBuffer>* const spares_;
  const uint32_t align_;
  const int in_flight_;
  AlignedBuffer* buf_ = nullptr;
  uint64_t offset_;
  uint64_t fill_ = 0;
  uint64_t written_ = 0;
  std::vector<Pending> pending_;
};

class SegmentLogImpl final : public SegmentLog {
 public:
  SegmentLogImpl(const SegmentLogOptions& options, std::shared_ptr<SegmentIo> io)
      : opts_(options), io_(std::move(io)) {}

  absl::Status Init(std::vector<std::string>* notes);

  absl::StatusOr<std::vector<PayloadLocation>> Append(
      absl::Span<const SegmentAppend> records, SegmentStream stream,
      absl::Span<const SegmentTombstone> tombstones, bool sync) override;
  absl::Status Read(const BlockId& id, const PayloadLocation& location,
                    const std::function<absl::Status(absl::string_view)>& consume) override;
  bool Contains(const PayloadLocation& location) const override;
  absl::Status ForEachRecord(
      uint64_t segment,
      const std::function<absl::Status(const SegmentRecord& record, bool checksum_ok)>& visit,
      bool payloads) override;
  void AddLive(const PayloadLocation& location) override;
  void RemoveLive(const PayloadLocation& location) override;
  absl::Status Seal(SegmentStream stream) override;
  absl::Status SyncActive(SegmentStream stream) override;
  void AdvanceSeq(uint64_t next) override;
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
    uint64_t last_payload_seq = 0;
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
  // One thing to append: a tombstone or a record (with its identity).
  struct Item {
    const SegmentAppend* record = nullptr;
    const SegmentTombstone* tombstone = nullptr;
    uint64_t Bytes() const;  // Segment bytes it takes.
  };
  absl::Status WriteBatch(Segment& seg, absl::Span<const Item> items,
                          std::vector<PayloadLocation>* out, bool sync)
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
  // More staging buffers, for pieces of a batch written while the next
  // fills (Stager).
  std::vector<AlignedBuffer> spare_staging_ ABSL_GUARDED_BY(write_mu_);

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
  std::atomic<uint64_t> identity_bytes_{0};
  std::atomic<uint64_t> tombstones_{0};
};

}  // namespace segment_internal
}  // namespace evoke

#endif  // EVOKE_STORAGE_TIER2_SEGMENT_LOG_IMPL_H_
