// inline_path_micro: the daemon's per-request CPU for one 16 MiB inline
// payload, the protobuf way (what the generated handlers did) against
// daemon/inline_wire.h, with no socket in between, beside memcpy of the
// same bytes into a warm buffer. Prints min and median of N rounds (ms).
// Not a test: a measurement for issue #12 (see the inline notes).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "daemon/inline_wire.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "testing/blocks.h"

namespace evoke {
namespace {

void Time(const char* name, int rounds, const std::function<void()>& fn) {
  std::vector<double> ms;
  for (int i = 0; i < rounds; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%-34s min %7.2f ms  median %7.2f ms\n", name, ms.front(), ms[ms.size() / 2]);
}

int Run(int argc, char** argv) {
  const size_t n = (argc > 1 ? std::atoi(argv[1]) : 16) << 20;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  const std::string payload = testing::Payload(1, n);
  v1::BlockMeta meta = testing::SessionMeta(testing::OpaqueFingerprint("ns", "m"), "s", 1, 1, 0, 1, 0);
  // A received request: 16 KiB slices, as HTTP/2 DATA frames arrive.
  v1::SaveRequest request;
  *request.add_blocks()->mutable_meta() = meta;
  request.mutable_blocks(0)->set_inline_bytes(payload);
  const std::string wire = request.SerializeAsString();
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += 16384) {
    slices.emplace_back(wire.data() + at, std::min<size_t>(16384, wire.size() - at));
  }
  const grpc::ByteBuffer received(slices.data(), slices.size());
  std::string warm(n, '\1');
  Time("memcpy into a warm buffer", rounds, [&] { std::memcpy(warm.data(), payload.data(), n); });
  Time("save: protobuf parse (before)", rounds, [&] {
    grpc::ByteBuffer copy(received);
    v1::SaveRequest parsed;
    grpc::SerializationTraits<v1::SaveRequest>::Deserialize(&copy, &parsed);
  });
  inline_wire::StringPool pool;
  Time("save: inline_wire parse (after: payload left in the slices)", rounds, [&] {
    v1::SaveRequest parsed;
    inline_wire::SavePayloadViews views;
    inline_wire::ParseSaveRequest(received, &parsed, &views);
  });
  meta.set_payload_bytes(n);
  Time("load: resize+copy+serialize (before)", rounds, [&] {
    v1::LoadResponse response;
    std::string* bytes = response.add_blocks()->mutable_inline_bytes();
    bytes->resize(n);
    std::memcpy(bytes->data(), payload.data(), n);
    *response.mutable_blocks(0)->mutable_meta() = meta;
    response.mutable_blocks(0)->set_served_from(v1::TIER_PINNED_HOST);
    grpc::ByteBuffer out;
    bool own;
    grpc::SerializationTraits<v1::LoadResponse>::Serialize(response, &out, &own);
  });
  Time("load: InlineLoadSink (after)", rounds, [&] {
    inline_wire::InlineLoadSink sink(&pool, 1ull << 40);
    sink.Prepare({meta}).IgnoreError();
    std::memcpy(sink.HostDestination(0), payload.data(), n);
    grpc::ByteBuffer out;
    sink.Encode({v1::TIER_PINNED_HOST}, &out);
  });
  return 0;
}

}  // namespace
}  // namespace evoke

int main(int argc, char** argv) { return evoke::Run(argc, argv); }
