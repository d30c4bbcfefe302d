// Protobuf wire-format basics over gRPC slices: varints, and a reader of a
// ByteBuffer's bytes in order across its slices. Shared by the client's and
// the daemon's hand-written encodings of Save and Load (client/inline_calls,
// daemon/inline_wire). Header-only; include it only from targets that link
// gRPC.
#ifndef EVOKE_COMMON_PROTO_WIRE_H_
#define EVOKE_COMMON_PROTO_WIRE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <grpcpp/support/slice.h>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace evoke::wire {

inline size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

inline char* PutVarint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

inline void AppendVarint(std::string* out, uint64_t v) {
  char buf[10];
  out->append(buf, PutVarint(buf, v) - buf);
}

// SliceReader reads a ByteBuffer's bytes in order across its slices.
class SliceReader {
 public:
  explicit SliceReader(absl::Span<const grpc::Slice> slices) : slices_(slices) {
    for (const grpc::Slice& s : slices_) size_ += s.size();
    Settle();
  }

  size_t position() const { return pos_; }
  size_t size() const { return size_; }
  size_t remaining() const { return size_ - pos_; }

  bool ReadByte(uint8_t* b) {
    if (pos_ >= size_) return false;
    *b = slices_[slice_].begin()[offset_];
    Advance(1);
    return true;
  }
  // A varint of at most 10 bytes (protobuf's rule).
  bool ReadVarint(uint64_t* v) {
    uint64_t result = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      uint8_t b;
      if (!ReadByte(&b)) return false;
      if (shift == 63 && b > 1) return false;
      result |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    return false;
  }
  // ReadTag reads a field tag as protobuf does: a varint of at most 5 bytes
  // (a longer one, even of a small value, is refused there) naming a field
  // number of at least 1 that fits 32 bits.
  bool ReadTag(uint64_t* tag) {
    const size_t start = pos_;
    return ReadVarint(tag) && pos_ - start <= 5 && *tag <= UINT32_MAX && (*tag >> 3) != 0;
  }
  // ReadLength reads a length-delimited field's length as protobuf does: a
  // varint of at most 5 bytes whose value is under 2 GiB less protobuf's
  // 16 slop bytes. protobuf refuses a longer encoding even of a small value;
  // accepting it (and re-encoding it canonically) would take messages that
  // protobuf refuses (found by fuzz_inline_save).
  bool ReadLength(uint64_t* len) {
    const size_t start = pos_;
    return ReadVarint(len) && pos_ - start <= 5 && *len <= kMaxLength;
  }
  static constexpr uint64_t kMaxLength = 0x7fffffff - 16;
  // Copy copies the next n bytes to `dst` (null: skips them).
  bool Copy(size_t n, char* dst) {
    if (n > remaining()) return false;
    while (n > 0) {
      const grpc::Slice& s = slices_[slice_];
      const size_t take = std::min(n, s.size() - offset_);
      if (dst != nullptr) {
        std::memcpy(dst, s.begin() + offset_, take);
        dst += take;
      }
      Advance(take);
      n -= take;
    }
    return true;
  }
  // Append appends the next n bytes to `out` (no zero fill first).
  bool Append(size_t n, std::string* out) {
    if (n > remaining()) return false;
    while (n > 0) {
      const grpc::Slice& s = slices_[slice_];
      const size_t take = std::min(n, s.size() - offset_);
      out->append(reinterpret_cast<const char*>(s.begin()) + offset_, take);
      Advance(take);
      n -= take;
    }
    return true;
  }
  // Views appends views of the next n bytes to `out`, one per slice they
  // span, without copying them (they live as long as the slices).
  bool Views(size_t n, std::vector<absl::string_view>* out) {
    if (n > remaining()) return false;
    while (n > 0) {
      const grpc::Slice& s = slices_[slice_];
      const size_t take = std::min(n, s.size() - offset_);
      out->emplace_back(reinterpret_cast<const char*>(s.begin()) + offset_, take);
      Advance(take);
      n -= take;
    }
    return true;
  }
  // SkipValue skips a field's value of `wire_type`; false for groups and
  // bad types.
  bool SkipValue(uint32_t wire_type) {
    uint64_t v;
    switch (wire_type) {
      case 0:
        return ReadVarint(&v);
      case 1:
        return Copy(8, nullptr);
      case 2:
        return ReadLength(&v) && Copy(v, nullptr);
      case 5:
        return Copy(4, nullptr);
      default:
        return false;
    }
  }

 private:
  void Advance(size_t n) {
    pos_ += n;
    offset_ += n;
    Settle();
  }
  // Moves past exhausted (and empty) slices.
  void Settle() {
    while (slice_ < slices_.size() && offset_ >= slices_[slice_].size()) {
      offset_ -= slices_[slice_].size();
      ++slice_;
    }
  }

  absl::Span<const grpc::Slice> slices_;
  size_t size_ = 0;
  size_t pos_ = 0;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

}  // namespace evoke::wire

#endif  // EVOKE_COMMON_PROTO_WIRE_H_
