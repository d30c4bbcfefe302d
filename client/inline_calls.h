// Inline Save and Load without copies into fresh buffers (issue #12).
//
// The generated stub copies each inline payload into the SaveRequest, then
// serializes the request into a fresh buffer; a Load parses each payload
// into a fresh protobuf string. These calls speak the same wire format (a
// plain SaveRequest / LoadResponse, so any evoked understands them) through
// raw ByteBuffer calls:
//   Save  sends the caller's payload bytes as gRPC slices that reference
//         them: no copy in this process (the kernel copies them into the
//         socket, or TLS encrypts them);
//   Load  decodes the response straight from the received slices, copying
//         each payload once into its LoadedBlock (never zero-filled first).
// Deadlines, credentials and message limits are the ClientContext's and the
// channel's, exactly as with the stub.
#ifndef EVOKE_CLIENT_INLINE_CALLS_H_
#define EVOKE_CLIENT_INLINE_CALLS_H_

#include <memory>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/rpc_method.h>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "evoke/client.h"
#include "evoke/v1/kvtier.pb.h"

namespace evoke {

class InlineCalls {
 public:
  // `channel`: the channel of the evoke.v1.KvTier service.
  explicit InlineCalls(std::shared_ptr<grpc::ChannelInterface> channel);

  // Save runs one KvTier.Save. `request` is the request without inline
  // payloads: each block whose payload is not set gets payloads[i] as its
  // inline_bytes (even an empty one, which the daemon refuses as before);
  // blocks naming a region or a gather keep it, and payloads[i] is ignored.
  // payloads.size() must equal request.blocks_size() (INVALID_ARGUMENT
  // otherwise). The payload bytes must not change until Save returns, which
  // is after gRPC has let go of them.
  grpc::Status Save(grpc::ClientContext* context, const v1::SaveRequest& request,
                    absl::Span<const absl::string_view> payloads, v1::SaveResponse* response);

  // Load runs one KvTier.Load and appends one LoadedBlock per returned block
  // to `out` (on success only). Payloads written to destination slices come
  // back with an empty `payload`, as with the stub.
  grpc::Status Load(grpc::ClientContext* context, const v1::LoadRequest& request,
                    std::vector<LoadedBlock>* out);

  // EncodeSaveRequest is Save's encoding: slices that reference `payloads`
  // (which must outlive them) between small framing slices. Exposed for
  // tests; `request` and `payloads` as in Save.
  static std::vector<grpc::Slice> EncodeSaveRequest(
      const v1::SaveRequest& request, absl::Span<const absl::string_view> payloads,
      void (*release)(void*), void* release_arg);

  // DecodeLoadResponse is Load's decoding of a LoadResponse; false when the
  // bytes are not a LoadResponse. Exposed for tests.
  static bool DecodeLoadResponse(const grpc::ByteBuffer& buffer,
                                 std::vector<LoadedBlock>* out);

 private:
  std::shared_ptr<grpc::ChannelInterface> channel_;
  const grpc::internal::RpcMethod save_;
  const grpc::internal::RpcMethod load_;
};

}  // namespace evoke

#endif  // EVOKE_CLIENT_INLINE_CALLS_H_
