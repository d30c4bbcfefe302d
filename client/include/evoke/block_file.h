// Block files: a self-describing file holding one block (metadata, payload
// and checksums), for backing blocks up or moving them between hosts
// (`evokectl export` / `evokectl import`).
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

}  // namespace evoke

#endif  // EVOKE_CLIENT_BLOCK_FILE_H_
