// Block files: a self-describing file holding one block (metadata, payload
// and checksums), for backing blocks up or moving them between hosts
// (`evokectl export` / `evokectl import`). Block streams (below) carry many
// blocks, a block file per record, in one file or pipe.
//
// Format v1, little endian:
//   "EVOKEBLK"                 8 bytes magic
//   u32 version (1)
//   u32 meta_length
//   meta                       serialized evoke.v1.BlockMeta (payload_bytes
//                              and checksum set)
//   u64 payload_length
//   payload
//   u64 file checksum          xxHash3-64 of every byte before it
#ifndef EVOKE_CLIENT_BLOCK_FILE_H_
#define EVOKE_CLIENT_BLOCK_FILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

// Limits of what a block file may declare, checked from its header before
// anything is allocated: metadata (far above what a Save accepts: summaries,
// tokens and positions are capped at 512 KiB, 1 MiB and 1 MiB per block) and
// payload (gRPC messages, hence blocks, stay under 2 GiB).
inline constexpr uint64_t kMaxBlockFileMetaBytes = 64ull << 20;
inline constexpr uint64_t kMaxBlockFilePayloadBytes = 2ull << 30;

struct BlockFile {
  v1::BlockMeta meta;
  std::string payload;
};

// EncodeBlockFile returns the file bytes. INVALID_ARGUMENT when meta lacks a
// checksum or it does not match the payload, or when the metadata or the
// payload exceeds the limits above.
absl::StatusOr<std::string> EncodeBlockFile(const v1::BlockMeta& meta,
                                            absl::string_view payload);

// DecodeBlockFile parses and verifies file bytes: INVALID_ARGUMENT for a
// wrong magic, version, truncated file or lengths past the limits above,
// DATA_LOSS when the file checksum or the payload checksum does not match.
absl::StatusOr<BlockFile> DecodeBlockFile(absl::string_view bytes);

// WriteBlockFile / ReadBlockFile do the same through a path. Writing goes
// through a temporary file and rename, so a crash never leaves half a file.
// ReadBlockFile streams: it reads the header first and refuses a wrong magic,
// a length past the limits or (for a regular file) a size that does not match
// the header before reading on, so that it never holds more than one valid
// block file's bytes whatever the path is (/dev/zero, a pipe, a huge file):
// INVALID_ARGUMENT naming the problem, NOT_FOUND / UNAVAILABLE when the path
// cannot be opened / read.
absl::Status WriteBlockFile(const std::string& path, const v1::BlockMeta& meta,
                            absl::string_view payload);
absl::StatusOr<BlockFile> ReadBlockFile(const std::string& path);

// ---------------------------------------------------------------------------
// Block streams: every block of a namespace or session in one file, written
// and read as a stream (neither side holds more than one block), with the
// count unknown until the end (`evokectl export --namespace` / `import`).
//
// Format v1, little endian:
//   "EVOKESTR"                 8 bytes magic
//   u32 version (1)
//   u32 flags (0; a reader refuses any other value)
//   records, each:
//     u8  kind 'B'             a block
//     u64 length               at most kMaxBlockStreamRecordBytes
//     length bytes             the block's block file (format above: it
//                              carries its own checksums)
//   trailer:
//     u8  kind 'E'
//     u64 record count
//     u64 stream checksum      chain over the records: h = 0, then for each
//                              record h = XXH3_64(le64 h || le64 length ||
//                              le64 the block file's own file checksum)
//     u64 trailer checksum     XXH3_64 of the 17 trailer bytes before it
//   nothing after the trailer.
//
// A truncated stream (no trailer), a damaged record, records dropped,
// reordered or repeated, and bytes after the trailer are all detected; the
// error names the record (1-based) and its byte offset.

inline constexpr char kBlockStreamMagic[8] = {'E', 'V', 'O', 'K', 'E', 'S', 'T', 'R'};
inline constexpr uint64_t kMaxBlockStreamRecordBytes =
    16 + kMaxBlockFileMetaBytes + 8 + kMaxBlockFilePayloadBytes + 8;

// BlockStreamWriter writes a block stream to a path, or to standard output
// for "-". A path is written as PATH.tmp and renamed by Finish, so that an
// export that fails (or is killed) never leaves a half stream at PATH; the
// destructor of an unfinished writer removes the temporary file.
class BlockStreamWriter {
 public:
  // Create opens the destination and writes the header. UNAVAILABLE when it
  // cannot be created or written, PERMISSION_DENIED when access is refused.
  static absl::StatusOr<std::unique_ptr<BlockStreamWriter>> Create(const std::string& path);
  ~BlockStreamWriter();
  BlockStreamWriter(const BlockStreamWriter&) = delete;
  BlockStreamWriter& operator=(const BlockStreamWriter&) = delete;

  // Append writes one block (the checks of EncodeBlockFile apply).
  absl::Status Append(const v1::BlockMeta& meta, absl::string_view payload);
  // Finish writes the trailer, flushes, syncs and (for a path) renames.
  absl::Status Finish();

  uint64_t records() const { return records_; }
  uint64_t bytes() const { return bytes_; }  // Written so far, header included.

 private:
  BlockStreamWriter(int fd, std::string path, std::string tmp_path);
  absl::Status Write(absl::string_view bytes);

  int fd_;
  std::string path_;
  std::string tmp_path_;  // Empty for standard output.
  uint64_t records_ = 0;
  uint64_t bytes_ = 0;
  uint64_t chain_ = 0;
  bool finished_ = false;
};

// BlockStreamReader reads a block stream, or a single block file (then it
// yields that one block), from a path or from standard input ("-").
class BlockStreamReader {
 public:
  // Open opens `path` and reads its header: NOT_FOUND / PERMISSION_DENIED /
  // UNAVAILABLE when it cannot be opened or read, INVALID_ARGUMENT when it
  // is neither a block stream nor a block file (or a version this reader
  // does not know).
  static absl::StatusOr<std::unique_ptr<BlockStreamReader>> Open(const std::string& path);
  ~BlockStreamReader();
  BlockStreamReader(const BlockStreamReader&) = delete;
  BlockStreamReader& operator=(const BlockStreamReader&) = delete;

  // Next reads and verifies the next block into *block and returns true; it
  // returns false once the trailer has been read and checked and nothing
  // follows it. DATA_LOSS, naming the record and its offset, for a damaged
  // or truncated stream; the block returned before an error is intact.
  absl::StatusOr<bool> Next(BlockFile* block);

  bool is_stream() const { return stream_; }  // False: a single block file.
  uint64_t records() const { return records_; }  // Blocks returned so far.
  uint64_t offset() const { return offset_; }    // Bytes consumed so far.
  // The size of a regular file; nullopt for a pipe or a device.
  std::optional<uint64_t> size() const { return size_; }

 private:
  BlockStreamReader(int fd, std::string path, std::optional<uint64_t> size);
  // Reads exactly n bytes (appended to *out); false at end of input.
  absl::StatusOr<bool> Read(size_t n, std::string* out);
  absl::Status Corrupt(absl::string_view what) const;

  int fd_;
  bool close_fd_;
  std::string path_;
  std::optional<uint64_t> size_;
  bool stream_ = true;
  bool done_ = false;
  uint64_t records_ = 0;
  uint64_t offset_ = 0;
  uint64_t record_offset_ = 0;
  uint64_t chain_ = 0;
};

}  // namespace evoke

#endif  // EVOKE_CLIENT_BLOCK_FILE_H_
