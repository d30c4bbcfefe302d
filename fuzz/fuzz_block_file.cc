// fuzz_block_file: block files (`evokectl export` writes them, `evokectl
// import` reads them; include/evoke/block_file.h) from anywhere.
//
// Input: one mode byte, then the file.
//   mode even: the file as given.
//   mode odd:  the trailing file checksum (xxHash3-64 of every byte before
//              it) is recomputed first, as anyone crafting a file would, so
//              that the fuzzer reaches the metadata and payload checks
//              behind it.
// A file DecodeBlockFile accepts must carry a payload matching its checksum,
// encode back to the same bytes, and go through the client's Save-side
// check (ValidateBlockForSave, as import's Save meets it) without harm.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "common/block_validation.h"
#include "common/checksum.h"
#include "evoke/block_file.h"
#include "evoke/hash128.h"
#include "google/protobuf/stubs/logging.h"
#include "fuzz/fuzz_check.h"

// protobuf logs every string field with invalid UTF-8 it parses; thousands
// of lines a second would drown the fuzzer's own output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace evoke;
  if (size < 1) return 0;
  const bool fix_checksum = (data[0] & 1) != 0;
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (fix_checksum && file.size() >= 8) {
    const uint64_t sum = PayloadChecksum(file.data(), file.size() - 8);
    for (int i = 0; i < 8; ++i) file[file.size() - 8 + i] = static_cast<char>(sum >> (8 * i));
  }
  absl::StatusOr<BlockFile> decoded = DecodeBlockFile(file);
  if (!decoded.ok()) return 0;
  FUZZ_CHECK(decoded->meta.has_checksum());
  FUZZ_CHECK(decoded->meta.checksum() ==
             PayloadChecksum(decoded->payload.data(), decoded->payload.size()));
  // Export of what was imported writes a file that reads back the same.
  absl::StatusOr<std::string> again = EncodeBlockFile(decoded->meta, decoded->payload);
  FUZZ_CHECK(again.ok());
  absl::StatusOr<BlockFile> redecoded = DecodeBlockFile(*again);
  FUZZ_CHECK(redecoded.ok());
  FUZZ_CHECK(redecoded->payload == decoded->payload);
  FUZZ_CHECK(redecoded->meta.SerializeAsString() == decoded->meta.SerializeAsString());
  // What import does next: name the block and have the daemon check it.
  if (absl::StatusOr<BlockId> id = BlockId::FromBytes(decoded->meta.id()); id.ok()) {
    (void)id->ToHex();
  }
  (void)ValidateBlockForSave(decoded->meta, decoded->payload.size(), BlockLimits(), "block");
  return 0;
}
