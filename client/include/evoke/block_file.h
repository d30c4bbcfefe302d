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

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "evoke/v1/block.pb.h"

namespace evoke {

struct BlockFile {
  v1::BlockMeta meta;
  std::string payload;
};

// EncodeBlockFile returns the file bytes. INVALID_ARGUMENT when meta lacks a
// checksum or it does not match the payload.
absl::StatusOr<std::string> EncodeBlockFile(const v1::BlockMeta& meta,
                                            absl::string_view payload);

// DecodeBlockFile parses and verifies file bytes: INVALID_ARGUMENT for a
// wrong magic, version or truncated file, DATA_LOSS when the file checksum or
// the payload checksum does not match.
absl::StatusOr<BlockFile> DecodeBlockFile(absl::string_view bytes);

// WriteBlockFile / ReadBlockFile do the same through a path. Writing goes
// through a temporary file and rename, so a crash never leaves half a file.
absl::Status WriteBlockFile(const std::string& path, const v1::BlockMeta& meta,
                            absl::string_view payload);
absl::StatusOr<BlockFile> ReadBlockFile(const std::string& path);

}  // namespace evoke

#endif  // EVOKE_CLIENT_BLOCK_FILE_H_
