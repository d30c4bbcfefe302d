// The inline data path of Save and Load without fresh buffers: the daemon
// reads SaveRequest and writes LoadResponse in the protobuf wire format by
// hand, so that inline payloads are copied once, into memory that is already
// mapped, instead of into freshly allocated (page-faulting, zero-filled)
// protobuf strings and then again into a serialization buffer.
//
//   Save: the request's ByteBuffer is walked field by field; every field but
//     a block's inline_bytes is parsed by protobuf as before. A large inline
//     payload is not copied at all: it stays in the slices gRPC received it
//     in, and the parse returns views of it (SavePayloadViews), which the
//     Save copies straight into tier 1, hashing the copy as it lands
//     (PayloadRef::inline_pieces, SaveSource::HostPieces).
//     Its block keeps an empty inline_bytes, so that validation sees the
//     message protobuf would have parsed but for the payload's bytes, whose
//     length the views carry. Anything the walker does not expect (groups,
//     a block naming two payloads, a truncated field) makes it decline: the
//     caller then parses with protobuf, as before, and gets the same answer
//     as before.
//   Load: InlineLoadSink is the TierManager's LoadSink for inline loads. It
//     lays out the whole LoadResponse at Prepare (every length is known from
//     the metadata), so the TierManager copies and verifies each tier-1
//     payload straight into its final place in the response: small payloads
//     inside one framing buffer with the metadata, large ones into pooled
//     strings handed to gRPC as slices that go back to the pool once gRPC
//     has written them.
//
// The encoding is protobuf's own (fields in number order), byte for byte:
// tests/inline_path_unit_test.cc compares it with SerializeAsString.
//
// Header-only so that it needs no build-file change in daemon/.
#ifndef EVOKE_DAEMON_INLINE_WIRE_H_
#define EVOKE_DAEMON_INLINE_WIRE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "google/protobuf/io/coded_stream.h"
#include "common/byte_size.h"
#include "common/proto_wire.h"
#include "daemon/payload_paths.h"
#include "evoke/v1/kvtier.pb.h"
#include "storage/tier_manager.h"

namespace evoke::inline_wire {

// Saved payloads at least this long stay in the received slices; loaded
// ones get a pooled buffer of their own. Shorter ones are cheap to allocate
// and copy.
inline constexpr size_t kPooledPayloadBytes = 64 << 10;

// ------------------------------------------------------------ StringPool

// StringPool keeps strings whose memory has been touched once, for reuse by
// later calls: taking one of the right size costs no page faults and no
// zero fill. Bounded in bytes and count; what does not fit is freed.
// Thread-safe; strings handed to gRPC keep the pool's state alive.
class StringPool {
 public:
  struct Options {
    uint64_t max_bytes = 160ull << 20;  // Capacity kept across calls.
    size_t max_strings = 16;
  };
  struct Counters {
    uint64_t takes = 0;
    uint64_t reused = 0;  // Takes served from the pool.
    uint64_t pooled_bytes = 0;
  };

  explicit StringPool(Options options) : state_(std::make_shared<State>(options)) {}
  StringPool() : StringPool(Options()) {}

  // Take returns a string of exactly `n` bytes with unspecified contents.
  std::unique_ptr<std::string> Take(size_t n) { return state_->Take(n); }
  // Give returns a string to the pool (or frees it).
  void Give(std::unique_ptr<std::string> s) { State::Give(state_, std::move(s)); }

  // ToSlice hands the first `n` bytes of `s` to gRPC without copying; the
  // string comes back to the pool when gRPC drops the last reference.
  grpc::Slice ToSlice(std::unique_ptr<std::string> s, size_t n) {
    auto* holder = new Holder{state_, std::move(s)};
    return grpc::Slice(holder->s->data(), n, &Holder::Destroy, holder);
  }

  Counters counters() const {
    absl::MutexLock lock(&state_->mu);
    return state_->counters;
  }

 private:
  struct State {
    explicit State(Options o) : options(o) {}
    const Options options;
    mutable absl::Mutex mu;
    std::vector<std::unique_ptr<std::string>> free ABSL_GUARDED_BY(mu);
    Counters counters ABSL_GUARDED_BY(mu);

    std::unique_ptr<std::string> Take(size_t n) {
      std::unique_ptr<std::string> s;
      {
        absl::MutexLock lock(&mu);
        ++counters.takes;
        // Best fit: the smallest capacity that holds n, preferring strings
        // already at least n long (shrinking writes nothing; growing within
        // the capacity fills the difference, without page faults since that
        // memory was touched when the string was made).
        size_t best = free.size();
        for (size_t i = 0; i < free.size(); ++i) {
          if (free[i]->capacity() < n) continue;
          if (best == free.size() || free[i]->capacity() < free[best]->capacity()) best = i;
        }
        if (best != free.size()) {
          s = std::move(free[best]);
          free[best] = std::move(free.back());
          free.pop_back();
          counters.pooled_bytes -= s->capacity();
          ++counters.reused;
        }
      }
      if (s == nullptr) {
        s = std::make_unique<std::string>();
        // Room to grow a little within the pages touched now.
        const size_t rounded = (n + (256 << 10) - 1) / (256 << 10) * (256 << 10);
        s->resize(rounded);
      }
      s->resize(n);
      return s;
    }

    static void Give(const std::shared_ptr<State>& state, std::unique_ptr<std::string> s) {
      if (s == nullptr) return;
      absl::MutexLock lock(&state->mu);
      if (state->free.size() >= state->options.max_strings ||
          state->counters.pooled_bytes + s->capacity() > state->options.max_bytes) {
        return;  // Freed.
      }
      state->counters.pooled_bytes += s->capacity();
      state->free.push_back(std::move(s));
    }
  };
  struct Holder {
    std::shared_ptr<State> state;
    std::unique_ptr<std::string> s;
    static void Destroy(void* p) {
      std::unique_ptr<Holder> h(static_cast<Holder*>(p));
      State::Give(h->state, std::move(h->s));
    }
  };
  std::shared_ptr<State> state_;
};

// Takes a pooled string for a payload of `n` bytes, or a plain one when
// `n` is small.
inline std::unique_ptr<std::string> TakePayloadString(StringPool& pool, size_t n) {
  if (n >= kPooledPayloadBytes) return pool.Take(n);
  return std::make_unique<std::string>(n, '\0');
}

// ------------------------------------------------------------ wire basics

using wire::AppendVarint;
using wire::PutVarint;
using wire::SliceReader;
using wire::VarintSize;


// CopyField appends one field (its tag already read and appended) to `out`:
// false for groups, unknown wire types and truncated fields.
inline bool CopyFieldValue(SliceReader& r, uint32_t wire_type, std::string* out) {
  switch (wire_type) {
    case 0: {
      uint64_t v;
      if (!r.ReadVarint(&v)) return false;
      AppendVarint(out, v);
      return true;
    }
    case 1:
      return r.Append(8, out);
    case 2: {
      uint64_t len;
      if (!r.ReadLength(&len) || len > r.remaining()) return false;
      AppendVarint(out, len);
      return r.Append(len, out);
    }
    case 5:
      return r.Append(4, out);
    default:
      return false;  // Groups (3, 4) and invalid types: protobuf decides.
  }
}

// ------------------------------------------------------------ Save

// The large inline payloads of a parsed SaveRequest, left in the slices
// they were received in.
struct SavePayloadViews {
  // The received bytes (references: the views stay valid while these live).
  std::vector<grpc::Slice> slices;
  // One entry per block of the request: the pieces of its payload when the
  // payload was left in `slices` (the block's inline_bytes is then empty,
  // its payload case set), else empty (the bytes are in the message).
  std::vector<std::vector<absl::string_view>> blocks;
};

// MaterializePayloads copies every payload left in views into its block's
// inline_bytes: the message protobuf would have parsed (for tests and
// fuzzing, which compare the two).
inline void MaterializePayloads(const std::vector<std::vector<absl::string_view>>& blocks,
                                v1::SaveRequest* request) {
  for (size_t i = 0; i < blocks.size() && i < static_cast<size_t>(request->blocks_size());
       ++i) {
    if (blocks[i].empty()) continue;
    std::string* bytes = request->mutable_blocks(static_cast<int>(i))->mutable_inline_bytes();
    bytes->clear();
    for (absl::string_view piece : blocks[i]) bytes->append(piece.data(), piece.size());
  }
}

namespace internal {


// `views` receives one entry per block (see SavePayloadViews::blocks).
inline bool ParseSaveRequest(absl::Span<const grpc::Slice> slices, v1::SaveRequest* request,
                             std::vector<std::vector<absl::string_view>>* views) {
  SliceReader r(slices);
  std::string top;       // Every top-level field but `blocks`.
  std::string skeleton;  // One block without its inline_bytes.
  while (r.remaining() > 0) {
    uint64_t tag;
    if (!r.ReadTag(&tag)) return false;
    const uint32_t field = static_cast<uint32_t>(tag >> 3), wire_type = tag & 7;
    if (field != 1 || wire_type != 2) {
      AppendVarint(&top, tag);
      if (!CopyFieldValue(r, wire_type, &top)) return false;
      continue;
    }
    uint64_t len;
    if (!r.ReadLength(&len) || len > r.remaining()) return false;
    const size_t end = r.position() + len;
    skeleton.clear();
    v1::SaveBlock* block = request->add_blocks();
    std::vector<absl::string_view>& pieces = views->emplace_back();
    bool other_payload = false;
    while (r.position() < end) {
      uint64_t t;
      if (!r.ReadTag(&t)) return false;
      const uint32_t f = static_cast<uint32_t>(t >> 3), wt = t & 7;
      if (f == 2 && wt == 2) {
        uint64_t n;
        // Twice (protobuf keeps the last) or beside another payload field
        // (the last one wins): rare enough to leave to protobuf.
        // The length's own varint may run past the block's end: checked
        // before the subtraction (it underflowed, and a 12-byte request
        // asked for an allocation of exabytes).
        if (block->payload_case() == v1::SaveBlock::kInlineBytes || !r.ReadLength(&n) ||
            r.position() > end || n > end - r.position()) {
          return false;
        }
        if (n >= kPooledPayloadBytes) {
          // Left where it is; the block says only that it has inline bytes.
          block->set_inline_bytes(std::string());
          if (!r.Views(n, &pieces)) return false;
          continue;
        }
        std::string* payload = block->mutable_inline_bytes();
        payload->resize(n);
        if (!r.Copy(n, payload->data())) return false;
        continue;
      }
      if (f == 3 || f == 6) other_payload = true;
      AppendVarint(&skeleton, t);
      if (!CopyFieldValue(r, wt, &skeleton)) return false;
    }
    if (r.position() != end) return false;
    const bool has_payload = block->payload_case() == v1::SaveBlock::kInlineBytes;
    if (has_payload && other_payload) return false;
    // The rest of the block, as protobuf parses it (merged: the payload
    // already set stays, since the skeleton names no other payload), one
    // level down protobuf's recursion limit as inside the whole request: a
    // block nested as deep as the limit allows on its own is refused there
    // (found by the unit test around the limit).
    google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(skeleton.data()),
                                              static_cast<int>(skeleton.size()));
    in.SetRecursionLimit(google::protobuf::io::CodedInputStream::GetDefaultRecursionLimit() - 1);
    if (!block->MergeFromCodedStream(&in) || !in.ConsumedEntireMessage()) return false;
  }
  // The other top-level fields (scalars and bytes: the last one wins, as
  // when they are interleaved with the blocks).
  return request->MergeFromString(top);
}

}  // namespace internal

// ParseSaveRequest parses a SaveRequest from `buffer` into `request` (which
// must be empty), leaving large inline payloads in the received slices:
// `views` holds references to those slices, so its views stay valid for as
// long as it lives, whatever becomes of `buffer`. Returns false, with `request` and `views` empty, when it declines:
// the caller then parses the buffer with protobuf (and answers exactly as
// before).
inline bool ParseSaveRequest(const grpc::ByteBuffer& buffer, v1::SaveRequest* request,
                             SavePayloadViews* views) {
  views->blocks.clear();
  if (!buffer.Dump(&views->slices).ok() ||
      !internal::ParseSaveRequest(views->slices, request, &views->blocks)) {
    request->Clear();
    views->blocks.clear();
    views->slices.clear();
    return false;
  }
  return true;
}

// ------------------------------------------------------------ Load

// InlineLoadSink receives an inline Load's verified payloads where they
// will be sent from, and then becomes the LoadResponse (Encode).
//
// Layout, per block (LoadedBlock, fields in number order):
//   0x0a len(block)  0x0a len(meta) meta  0x12 len(payload) payload  0x28 tier
// The framing of consecutive blocks and their small payloads share one
// buffer; a large payload is its own buffer (and slice) between two frames.
class InlineLoadSink final : public LoadSink {
 public:
  // `budget`: the most payload bytes one response may carry
  // (RESOURCE_EXHAUSTED past it, as LoadResponseSink).
  InlineLoadSink(StringPool* pool, uint64_t budget) : pool_(pool), budget_(budget) {}
  ~InlineLoadSink() override { Release(); }

  absl::Status Prepare(absl::Span<const v1::BlockMeta> metas) override {
    Release();
    if (absl::Status s = CheckInlineBudget(metas, budget_); !s.ok()) return s;
    // First pass: the framing bytes of each segment and where each payload
    // goes (segment, offset).
    blocks_.assign(metas.size(), Block());
    segments_.clear();
    segments_.push_back(Segment{});
    std::string meta_bytes;
    for (size_t i = 0; i < metas.size(); ++i) {
      v1::BlockMeta meta = metas[i];
      meta.clear_summaries();  // As DoLoad answers.
      meta_bytes.clear();
      meta.SerializeToString(&meta_bytes);
      const uint64_t n = metas[i].payload_bytes();
      const uint64_t body = 1 + VarintSize(meta_bytes.size()) + meta_bytes.size() + 1 +
                            VarintSize(n) + n + 2;
      Segment* seg = &segments_.back();
      std::string& frame = seg->frame;
      frame.push_back(0x0a);
      AppendVarint(&frame, body);
      frame.push_back(0x0a);
      AppendVarint(&frame, meta_bytes.size());
      frame.append(meta_bytes);
      frame.push_back(0x12);
      AppendVarint(&frame, n);
      Block& b = blocks_[i];
      b.bytes = n;
      if (n >= kPooledPayloadBytes) {
        b.segment = segments_.size();  // Its own buffer, after this frame.
        segments_.push_back(Segment{});
        segments_.back().payload_block = i;
        segments_.push_back(Segment{});
        seg = &segments_.back();
      } else {
        b.segment = segments_.size() - 1;
        b.offset = frame.size();
        frame.resize(frame.size() + n);  // Small: the zero fill is cheap.
      }
      // served_from, set in Encode.
      b.tier_segment = segments_.size() - 1;
      b.tier_offset = seg->frame.size();
      seg->frame.append("\x28\x00", 2);
    }
    // The frames into their final (pooled when large) buffers.
    for (Segment& seg : segments_) {
      if (seg.payload_block) {
        seg.buffer = TakePayloadString(*pool_, blocks_[*seg.payload_block].bytes);
      } else if (seg.frame.size() >= kPooledPayloadBytes) {
        seg.buffer = pool_->Take(seg.frame.size());
        std::memcpy(seg.buffer->data(), seg.frame.data(), seg.frame.size());
        seg.frame = std::string();
      } else {
        seg.buffer = std::make_unique<std::string>(std::move(seg.frame));
      }
    }
    return absl::OkStatus();
  }

  uint8_t* HostDestination(size_t i) override {
    const Block& b = blocks_[i];
    return reinterpret_cast<uint8_t*>(segments_[b.segment].buffer->data()) + b.offset;
  }

  // Encode turns the response into `out` (served_from[i] per block). The
  // sink is empty afterwards; its buffers travel with `out`.
  void Encode(absl::Span<const v1::Tier> served_from, grpc::ByteBuffer* out) {
    for (size_t i = 0; i < blocks_.size() && i < served_from.size(); ++i) {
      const Block& b = blocks_[i];
      // Tiers are small enumerators: one byte.
      (*segments_[b.tier_segment].buffer)[b.tier_offset + 1] =
          static_cast<char>(static_cast<uint8_t>(served_from[i]) & 0x7f);
    }
    std::vector<grpc::Slice> slices;
    slices.reserve(segments_.size());
    for (Segment& seg : segments_) {
      const size_t n = seg.buffer->size();
      if (n == 0) continue;
      if (seg.payload_block || n >= kPooledPayloadBytes) {
        slices.push_back(pool_->ToSlice(std::move(seg.buffer), n));
      } else {
        slices.emplace_back(seg.buffer->data(), n);  // Copies; small.
      }
    }
    segments_.clear();
    blocks_.clear();
    grpc::ByteBuffer encoded(slices.data(), slices.size());
    out->Swap(&encoded);
  }

 private:
  struct Block {
    uint64_t bytes = 0;
    size_t segment = 0;  // Where the payload goes.
    size_t offset = 0;
    size_t tier_segment = 0;  // Where the served_from value byte is.
    size_t tier_offset = 0;
  };
  struct Segment {
    std::string frame;                     // While laying out.
    std::optional<size_t> payload_block;   // A large payload's own buffer.
    std::unique_ptr<std::string> buffer;   // The bytes to send.
  };
  void Release() {
    for (Segment& seg : segments_) {
      if (seg.buffer != nullptr && seg.buffer->size() >= kPooledPayloadBytes) {
        pool_->Give(std::move(seg.buffer));
      }
    }
    segments_.clear();
    blocks_.clear();
  }

  StringPool* const pool_;
  const uint64_t budget_;
  std::vector<Block> blocks_;
  std::vector<Segment> segments_;
};

}  // namespace evoke::inline_wire

#endif  // EVOKE_DAEMON_INLINE_WIRE_H_
