// fuzz_inline_save: the inline Save parser (daemon/inline_wire.h), which
// reads every principal's SaveRequest off the wire by hand, from arbitrary
// bytes cut into arbitrary slices (as gRPC hands them over).
//
// Input (FuzzedDataProvider): up to 8 slice lengths, then the request's
// bytes. The walker must never crash, and must either decline (leaving the
// request empty: the daemon then parses with protobuf) or produce exactly
// the message protobuf parses from the same bytes, never one that protobuf
// refuses; its pooled payloads must go back to the pool.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "daemon/inline_wire.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/stubs/logging.h"

namespace evoke {
namespace {

void Run(FuzzedDataProvider& in) {
  std::vector<size_t> cuts;
  const int n_cuts = in.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < n_cuts; ++i) cuts.push_back(in.ConsumeIntegralInRange<size_t>(0, 1 << 16));
  const std::string wire = in.ConsumeRemainingBytesAsString();
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t cut : cuts) {
    const size_t n = std::min(cut, wire.size() - at);
    if (n == 0) continue;
    slices.emplace_back(wire.data() + at, n);
    at += n;
  }
  if (at < wire.size()) slices.emplace_back(wire.data() + at, wire.size() - at);

  v1::SaveRequest got;
  std::vector<std::vector<absl::string_view>> views;
  const bool ok = inline_wire::internal::ParseSaveRequest(slices, &got, &views);
  v1::SaveRequest expected;
  const bool protobuf_ok = expected.ParseFromString(wire);
  if (ok) {
    FUZZ_CHECK(views.size() == static_cast<size_t>(got.blocks_size()));
    // A payload left in the slices: a large one, its block's bytes empty.
    for (size_t i = 0; i < views.size(); ++i) {
      if (views[i].empty()) continue;
      uint64_t total = 0;
      for (absl::string_view piece : views[i]) total += piece.size();
      const v1::SaveBlock& b = got.blocks(static_cast<int>(i));
      FUZZ_CHECK(total >= inline_wire::kPooledPayloadBytes);
      FUZZ_CHECK(b.payload_case() == v1::SaveBlock::kInlineBytes && b.inline_bytes().empty());
    }
    inline_wire::MaterializePayloads(views, &got);
    FUZZ_CHECK(protobuf_ok);
    FUZZ_CHECK(got.SerializeAsString() == expected.SerializeAsString());
  }
}

}  // namespace
}  // namespace evoke

// protobuf logs every string field with invalid UTF-8 it parses; thousands
// of lines a second would drown the fuzzer's own output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  evoke::Run(in);
  return 0;
}
