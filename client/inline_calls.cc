#include "client/inline_calls.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include <grpcpp/impl/codegen/client_unary_call.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/strings/str_cat.h"
#include "common/proto_wire.h"
#include "absl/synchronization/mutex.h"

namespace evoke {
namespace {

constexpr char kSaveMethod[] = "/evoke.v1.KvTier/Save";
constexpr char kLoadMethod[] = "/evoke.v1.KvTier/Load";

using wire::AppendVarint;
using wire::SliceReader;
using wire::VarintSize;

// Fields this code does not know travel as protobuf would send them.
void CopyUnknownFields(const google::protobuf::Message& from, google::protobuf::Message* to) {
  to->GetReflection()->MutableUnknownFields(to)->MergeFrom(
      from.GetReflection()->GetUnknownFields(from));
}

// Counts the payload slices gRPC still holds; Save returns once none is.
struct SliceTracker {
  absl::Mutex mu;
  int live ABSL_GUARDED_BY(mu) = 0;
  static void Release(void* arg) {
    auto* t = static_cast<SliceTracker*>(arg);
    absl::MutexLock lock(&t->mu);
    --t->live;
  }
  void WaitForNone() {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* live) { return *live == 0; }, &live));
  }
};

bool DecodeLoadedBlock(SliceReader& r, size_t end, LoadedBlock* block) {
  std::string meta_bytes;
  while (r.position() < end) {
    uint64_t tag;
    if (!r.ReadTag(&tag)) return false;
    const uint32_t field = static_cast<uint32_t>(tag >> 3), wire_type = tag & 7;
    uint64_t v;
    if (field == 1 && wire_type == 2) {
      if (!r.ReadLength(&v) || v > end - r.position()) return false;
      meta_bytes.clear();
      // Repeated occurrences of a message field merge, as in protobuf.
      if (!r.Append(v, &meta_bytes) || !block->meta.MergeFromString(meta_bytes)) return false;
    } else if (field == 2 && wire_type == 2) {
      if (!r.ReadLength(&v) || v > end - r.position()) return false;
      block->payload.clear();  // The last occurrence wins.
      block->payload.reserve(v);
      if (!r.Append(v, &block->payload)) return false;
    } else if (field == 5 && wire_type == 0) {
      if (!r.ReadVarint(&v)) return false;
      block->served_from = static_cast<v1::Tier>(static_cast<int32_t>(v));
    } else if (!r.SkipValue(wire_type)) {
      return false;
    }
  }
  return r.position() == end;
}

}  // namespace

InlineCalls::InlineCalls(std::shared_ptr<grpc::ChannelInterface> channel)
    : channel_(std::move(channel)),
      save_(kSaveMethod, grpc::internal::RpcMethod::NORMAL_RPC, channel_),
      load_(kLoadMethod, grpc::internal::RpcMethod::NORMAL_RPC, channel_) {}

std::vector<grpc::Slice> InlineCalls::EncodeSaveRequest(
    const v1::SaveRequest& request, absl::Span<const absl::string_view> payloads,
    void (*release)(void*), void* release_arg) {
  // Protobuf's field order: blocks (1), durable (2), lease_id (3), unknown
  // fields; in a block: meta (1), inline_bytes (2), pin (5), unknown.
  std::vector<grpc::Slice> slices;
  std::string frame;
  std::string meta_bytes, rest_bytes;
  for (int i = 0; i < request.blocks_size(); ++i) {
    const v1::SaveBlock& block = request.blocks(i);
    if (block.payload_case() != v1::SaveBlock::PAYLOAD_NOT_SET) {
      frame.push_back(0x0a);
      AppendVarint(&frame, block.ByteSizeLong());
      block.AppendToString(&frame);
      continue;
    }
    const absl::string_view payload = payloads[i];
    meta_bytes.clear();
    rest_bytes.clear();
    size_t meta_field = 0;
    if (block.has_meta()) {
      block.meta().SerializeToString(&meta_bytes);
      meta_field = 1 + VarintSize(meta_bytes.size()) + meta_bytes.size();
    }
    {
      v1::SaveBlock rest;
      rest.set_pin(block.pin());
      CopyUnknownFields(block, &rest);
      rest.SerializeToString(&rest_bytes);
    }
    frame.push_back(0x0a);
    AppendVarint(&frame, meta_field + 1 + VarintSize(payload.size()) + payload.size() +
                             rest_bytes.size());
    if (block.has_meta()) {
      frame.push_back(0x0a);
      AppendVarint(&frame, meta_bytes.size());
      frame.append(meta_bytes);
    }
    frame.push_back(0x12);
    AppendVarint(&frame, payload.size());
    if (!payload.empty()) {
      slices.emplace_back(frame);
      frame.clear();
      // gRPC only reads send slices; the destroy callback tells us when it
      // is done with the caller's bytes.
      slices.emplace_back(const_cast<char*>(payload.data()), payload.size(), release,
                          release_arg);
    }
    frame.append(rest_bytes);
  }
  v1::SaveRequest tail;
  tail.set_durable(request.durable());
  tail.set_lease_id(request.lease_id());
  CopyUnknownFields(request, &tail);
  tail.AppendToString(&frame);
  if (!frame.empty()) slices.emplace_back(frame);
  return slices;
}

grpc::Status InlineCalls::Save(grpc::ClientContext* context, const v1::SaveRequest& request,
                               absl::Span<const absl::string_view> payloads,
                               v1::SaveResponse* response) {
  if (payloads.size() != static_cast<size_t>(request.blocks_size())) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("payloads: ", payloads.size(), " for ",
                                     request.blocks_size(), " blocks"));
  }
  SliceTracker tracker;
  grpc::Status status;
  grpc::ByteBuffer reply;
  {
    int referenced = 0;
    for (int i = 0; i < request.blocks_size(); ++i) {
      if (request.blocks(i).payload_case() == v1::SaveBlock::PAYLOAD_NOT_SET &&
          !payloads[i].empty()) {
        ++referenced;
      }
    }
    {
      absl::MutexLock lock(&tracker.mu);
      tracker.live = referenced;
    }
    std::vector<grpc::Slice> slices =
        EncodeSaveRequest(request, payloads, &SliceTracker::Release, &tracker);
    grpc::ByteBuffer send(slices.data(), slices.size());
    slices.clear();
    status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel_.get(), save_, context, send, &reply);
  }
  // The caller's bytes may go once gRPC holds none of them (at once,
  // normally; after the transport's write, when the call ended early).
  tracker.WaitForNone();
  if (!status.ok()) return status;
  grpc::ByteBuffer copy(reply);
  if (!grpc::SerializationTraits<v1::SaveResponse>::Deserialize(&copy, response).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "evoked sent a SaveResponse that does not parse");
  }
  return grpc::Status::OK;
}

bool InlineCalls::DecodeLoadResponse(const grpc::ByteBuffer& buffer,
                                     std::vector<LoadedBlock>* out) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  SliceReader r(slices);
  const size_t first = out->size();
  while (r.remaining() > 0) {
    uint64_t tag;
    bool ok = r.ReadTag(&tag);
    if (ok && tag == ((1u << 3) | 2)) {
      uint64_t len;
      ok = r.ReadLength(&len) && len <= r.remaining();
      if (ok) {
        out->emplace_back();
        ok = DecodeLoadedBlock(r, r.position() + len, &out->back());
      }
    } else if (ok) {
      ok = r.SkipValue(tag & 7);  // Unknown field.
    }
    if (!ok) {
      out->resize(first);
      return false;
    }
  }
  return true;
}

grpc::Status InlineCalls::Load(grpc::ClientContext* context, const v1::LoadRequest& request,
                               std::vector<LoadedBlock>* out) {
  grpc::ByteBuffer send;
  bool own_buffer;
  grpc::Status status =
      grpc::SerializationTraits<v1::LoadRequest>::Serialize(request, &send, &own_buffer);
  if (!status.ok()) return status;
  grpc::ByteBuffer reply;
  status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel_.get(), load_, context, send, &reply);
  if (!status.ok()) return status;
  if (!DecodeLoadResponse(reply, out)) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "evoked sent a LoadResponse that does not parse");
  }
  return grpc::Status::OK;
}

}  // namespace evoke
