// SegmentLog: tier 2's payload bytes, out of the LSM tree. Append-only
// segment files of preallocated size, written in batches with one pwrite
// stream and one fdatasync per batch, read back by location with the record
// header checked. Metadata (which block is where) stays in RocksDB: the
// SpillStore commits a batch's locations only after Append returned, so a
// location in metadata always names synced bytes.
//
// Files: <dir>/seg-<16 hex digits>.evs. Each starts with a 4096-byte header
// (magic "EVKSEG\0\2", the header version, the alignment it was written
// with, its id, the store's instance id, its preallocated size, XXH3-64 of
// those fields). Records follow, each on a 64-byte boundary: a 64-byte
// header (magic 'EVR2', type, block id, seq, payload length, the payload's
// XXH3 block checksum as the engine computed it, the seq of its batch, and
// XXH3-64 of the header's first 56 bytes), then the payload. A batch ends
// with a skip record that pads it to the I/O alignment, so a page that was
// synced is never written again. Closing a segment appends a seal record,
// and a copy of it into the file's last block (a footer that names where the
// seal is), so that Open finds a sealed segment's end without a scan.
//
// Crash consistency: Append returns after the batch is written and
// fdatasync'd; bytes past the last synced batch (a torn tail) are found at
// Open by scanning the unsealed segments' record headers forward, and
// nothing after the first header that does not verify is valid. A segment
// whose file header does not verify (or that belongs to another instance) is
// moved into a quarantine directory and its locations are never valid.
//
// The payload bytes are never hashed here: the engine verifies the block
// checksum of every copy it reads (Tier's contract). The header checks make
// a stale or misdirected location fail as DATA_LOSS, never serve another
// block's bytes.
//
// Thread-safety: Append, Seal, RemoveSegment and Open-time work are
// serialized by the caller (the SpillStore's write lock); Read, Contains,
// ForEachRecord and the accounting calls are safe concurrently with them
// and with each other. A Read that races RemoveSegment of its segment
// either completes (the file stays open while read) or fails NOT_FOUND.
#ifndef EVOKE_STORAGE_TIER2_SEGMENT_LOG_H_
#define EVOKE_STORAGE_TIER2_SEGMENT_LOG_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash128.h"

namespace evoke {

class DiskFaults;  // storage/tier2/fault_env.h
class SegmentIo;   // storage/tier2/segment_io.h

// Where a payload lives: mirrors storage.PayloadLocation in
// spill_record.proto. `offset` is the record header's offset in the file;
// the payload follows it (offset + 64).
struct PayloadLocation {
  uint64_t segment = 0;
  uint64_t offset = 0;
  uint64_t length = 0;  // Payload bytes.
  uint64_t seq = 0;     // The record's sequence number (store-wide, rising).
  bool operator==(const PayloadLocation&) const = default;
};

// Bytes a record with `payload_bytes` of payload takes in a segment (the
// 64-byte header and the payload, rounded up to 64).
uint64_t SegmentRecordBytes(uint64_t payload_bytes);

// Which stream of segments a batch goes to: new spills, or records that
// compaction moves (cold data stays apart from hot).
enum class SegmentStream : uint8_t { kHot = 0, kCompaction = 1 };

struct SegmentAppend {
  BlockId id;
  absl::string_view payload;  // Not empty.
  uint64_t checksum = 0;      // The block's checksum (BlockMeta.checksum).
  // The block's identity (its serialized storage.SpillRecord, without a
  // location), written as an identity record just before the payload so
  // that a store whose metadata is lost can rebuild it from the segments
  // (salvage). Empty: none.
  absl::string_view identity;
};

// A tombstone: the record at `kills` (of block `id`) is no longer wanted,
// and neither is any earlier record of that block. Salvage never brings
// such a record back. Compaction carries a tombstone forward while the
// segment it names exists.
struct SegmentTombstone {
  // Why: the block was deleted (salvage brings back none of it), or its
  // payload was dropped (salvage keeps the metadata as a breadcrumb).
  enum Kind : uint8_t { kDeleted = 1, kDropped = 2 };
  BlockId id;
  PayloadLocation kills;
  Kind kind = kDeleted;
};

// One record found in a segment (ForEachRecord): a payload, or a tombstone.
struct SegmentRecord {
  BlockId id;
  PayloadLocation location;
  uint64_t checksum = 0;
  absl::string_view payload;  // Valid during the callback only.
  // The identity record written just before the payload (its bytes verified
  // against the hash in its header), or empty when there is none (records
  // written before identity records existed, or a damaged one).
  absl::string_view identity;
  // Set for a tombstone (payload and identity empty): `kills` names the
  // record it removes (segment and seq), `kind` why.
  bool tombstone = false;
  PayloadLocation kills;
  SegmentTombstone::Kind kind = SegmentTombstone::kDeleted;
};

struct SegmentInfo {
  uint64_t id = 0;
  uint64_t size = 0;       // Preallocated bytes.
  uint64_t valid_end = 0;  // End of the last valid record.
  uint64_t live_bytes = 0; // SegmentRecordBytes of live locations (AddLive).
  bool active = false;     // Appends go here (one per stream).
  // It may hold tombstones (unknown for segments found at Open: true).
  bool may_hold_tombstones = false;
  // The largest seq of any record in it, and of a payload record (0: none,
  // or not known: a segment sealed by an evoked from before identity
  // records).
  uint64_t max_seq = 0;
  uint64_t last_payload_seq = 0;
  bool poisoned = false;   // A write or sync failed: never appended again.
  SegmentStream stream = SegmentStream::kHot;
  uint64_t created_unix_ms = 0;
};

struct SegmentLogStats {
  uint64_t segments = 0;
  uint64_t bytes_written = 0;   // Bytes handed to pwrite (headers, padding).
  uint64_t payload_bytes = 0;   // Payload bytes appended.
  uint64_t syncs = 0;           // fdatasync calls.
  uint64_t batches = 0;
  uint64_t read_bytes = 0;      // Bytes read by pread.
  uint64_t header_mismatches = 0;  // Reads refused as DATA_LOSS.
  uint64_t torn_tail_bytes = 0;    // Dropped at Open.
  uint64_t quarantined_segments = 0;
  uint64_t identity_bytes = 0;  // Identity record bytes appended (headers included).
  uint64_t tombstones = 0;      // Tombstones appended (carried ones included).
  bool direct_io = false;       // O_DIRECT in use (false: buffered + fdatasync).
  uint32_t io_align = 0;
};

struct SegmentLogOptions {
  // Directory of the segment files; created when missing.
  std::string dir;
  // Where unreadable segments are moved ("<dir>/../quarantine-<time>" when
  // empty).
  std::string quarantine_dir;
  // Largest preallocated size of a segment; a multiple of 1 MiB, at least
  // 4 MiB. A stream's first segment is 8 MiB (or this, if smaller), each new
  // one twice the last up to this, and never more than a sixteenth of the
  // filesystem: a small cache keeps small files.
  uint64_t segment_bytes = 256ull << 20;
  // The data dir's instance id; a segment that names another is refused.
  std::array<uint8_t, 16> instance{};
  // Try O_DIRECT (falls back to buffered I/O with fdatasync where the
  // filesystem refuses it, e.g. tmpfs). Tests may turn it off.
  bool direct_io = true;
  // Pieces (4 MiB) of one batch written at once: a batch of several keeps
  // this many requests in flight. 1: one after the other.
  int writes_in_flight = 4;
  // The file operations (tests: a fault-injecting device); null: the real
  // ones.
  std::shared_ptr<SegmentIo> io;
  // Tests: fail writes as a full disk does (shared with RocksDB's files).
  std::shared_ptr<DiskFaults> faults;
};

// ReadSegmentInstance: the instance id that most of the segment files in
// `dir` whose headers verify name (nullopt when there is none). A store
// that lost its metadata takes it back so that its segments stay its own.
std::optional<std::array<uint8_t, 16>> ReadSegmentInstance(const std::string& dir);

class SegmentLog {
 public:
  // Open lists the segment files, checks each header, finds each unsealed
  // segment's valid end (a torn tail is dropped), quarantines unreadable
  // files, and starts sequence numbers after the largest seen. What it had to
  // do is appended to `notes` (for Health().recovery). Appends go to new
  // segments: the segments found are never appended to again.
  static absl::StatusOr<std::unique_ptr<SegmentLog>> Open(const SegmentLogOptions& options,
                                                          std::vector<std::string>* notes);
  virtual ~SegmentLog() = default;

  // Append writes `tombstones`, then `records` (each after its identity
  // record, when it has one), to the active segment of `stream` (rolling to
  // a new one when full), then fdatasyncs (unless `sync` is false: then the
  // bytes are written, not yet durable). On success the locations, one
  // per record in order (none for tombstones), name durable bytes. On
  // failure nothing of the batch is valid, the segment written to is
  // poisoned (never appended again, its space garbage) and the error is
  // RESOURCE_EXHAUSTED (no space) or UNAVAILABLE (I/O error). After a
  // failed fdatasync the batch is never retried on the same file (its
  // pages' state is unknown).
  virtual absl::StatusOr<std::vector<PayloadLocation>> Append(
      absl::Span<const SegmentAppend> records, SegmentStream stream = SegmentStream::kHot,
      absl::Span<const SegmentTombstone> tombstones = {}, bool sync = true) = 0;

  // Read reads the record at `location`, checks that its header verifies
  // and names `id`, `location.seq` and `location.length`, and hands the
  // payload to `consume` (valid during the call). NOT_FOUND when the segment
  // is gone or the location lies past its valid end; DATA_LOSS when the
  // header does not match; UNAVAILABLE on an I/O error.
  virtual absl::Status Read(const BlockId& id, const PayloadLocation& location,
                            const std::function<absl::Status(absl::string_view)>& consume) = 0;

  // Contains: whether `location` lies inside the valid range of a present,
  // readable segment (Open-time check of metadata).
  virtual bool Contains(const PayloadLocation& location) const = 0;

  // ForEachRecord reads a segment sequentially and calls `visit` for every
  // valid payload record in it (compaction, verify, salvage), and for every
  // tombstone (record.tombstone). Payloads that do not match their checksum
  // are passed with `checksum_ok` false. With `payloads` false only the
  // record headers are read: tombstones are visited, payload records are
  // not.
  virtual absl::Status ForEachRecord(
      uint64_t segment,
      const std::function<absl::Status(const SegmentRecord& record, bool checksum_ok)>& visit,
      bool payloads = true) = 0;

  // Live accounting, kept by the caller from metadata (rebuilt at every
  // Open): AddLive when metadata points at a location, RemoveLive when it
  // stops pointing there.
  virtual void AddLive(const PayloadLocation& location) = 0;
  virtual void RemoveLive(const PayloadLocation& location) = 0;

  // Seal closes the active segment of `stream` (appends the seal record);
  // the next Append starts a new one. Used before compacting and at close.
  virtual absl::Status Seal(SegmentStream stream) = 0;

  // SyncActive fdatasyncs the active segment of `stream` (what Append wrote
  // with sync false becomes durable). OK when there is none.
  virtual absl::Status SyncActive(SegmentStream stream) = 0;

  // AdvanceSeq makes every later record's seq at least `next`: seqs stay
  // unique and rising across restarts even when the segments that held the
  // highest ones are gone.
  virtual void AdvanceSeq(uint64_t next) = 0;

  // RemoveSegment unlinks a segment that is not active and syncs the
  // directory. Its locations become invalid.
  virtual absl::Status RemoveSegment(uint64_t segment) = 0;

  virtual std::vector<SegmentInfo> Segments() const = 0;
  virtual SegmentLogStats Stats() const = 0;
  // Bytes of segment files on disk (their preallocated sizes).
  virtual uint64_t FileBytes() const = 0;
};

}  // namespace evoke

#endif  // EVOKE_STORAGE_TIER2_SEGMENT_LOG_H_
