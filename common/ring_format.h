// The command ring: the binary layout shared by the client library and
// evoked, through which blocks are saved and loaded without an RPC each.
//
// A ring is one shared-memory region of a lease (a sealed memfd registered
// through the fd channel like any other), attached with the AttachRing RPC.
// gRPC stays the control plane (leases, regions, Recover, admin); the ring
// carries Save and Load of blocks whose payloads are region slices, and
// Acquire and Release (holds on blocks, between a lookup and a load).
//
//   offset 0               RingHeader (4096 bytes)
//   sq_offset()            sq_entries x RingSqe     submissions, client -> daemon
//   cq_offset()            cq_entries x RingCqe     completions, daemon -> client
//   msg_offset()           cq_entries x msg_bytes   completion i's message
//   arg_offset()           sq_entries x arg_bytes   submission i's arguments
//
// Both queues are single-producer single-consumer rings of free-running
// 32-bit indices (the slot is index & (entries - 1)). The client owns
// sq_tail and cq_head, the daemon sq_head and cq_tail; each side publishes
// its index with a release store after writing the slots it covers, and
// reads the other's with an acquire load.
//
// Submission slot i's argument area (arg_offset() + (i & mask) * arg_bytes)
// holds, for an entry with arg_len > 0: `meta_len` bytes of a serialized
// protobuf (Save: evoke.v1.BlockMeta; Load: evoke.v1.LayoutFingerprint),
// then, at the next multiple of 8, `n_slices` RingSlice (gather or scatter
// lists). The daemon copies an entry and its arguments into its own memory
// before it advances sq_head and before it looks at them, so the client may
// reuse the slot once sq_head has passed it and can never change what the
// daemon validated.
//
// Completion slot j's message area (msg_offset() + (j & mask) * msg_bytes)
// holds msg_len bytes: the error message when status != 0, or for a Load
// with kLoadWantMeta the serialized evoke.v1.BlockMeta (summaries cleared;
// kCqeMetaOmitted set instead when it does not fit).
//
// Wake-ups are futexes on the header's words (shared, not private: the
// mapping is MAP_SHARED). A side that is about to sleep stores 1 in its
// *_need_wake word, re-reads the other side's index, and sleeps only if
// there is still nothing; the other side, after publishing, exchanges the
// word with 0 and calls FUTEX_WAKE when it was 1. Both sides spin a little
// before they sleep, so that a busy ring costs no system call.
//
// Everything in the ring is written by an untrusted client. The daemon reads
// the geometry once, at AttachRing, and never again; an index found outside
// its window (sq_tail more than sq_entries past the daemon's sq_head, or
// behind it; cq_head more than cq_entries behind the daemon's cq_tail, or
// past it) breaks the ring (the daemon stops serving it, sets `broken`,
// counts it and logs; a small move backwards inside the window is not
// detected and harms only that client); a bad entry
// is answered with a completion carrying INVALID_ARGUMENT and a message that
// names the field, like any RPC input.
#ifndef EVOKE_COMMON_RING_FORMAT_H_
#define EVOKE_COMMON_RING_FORMAT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace evoke::ring {

inline constexpr uint64_t kMagic = 0x31474E524B4F5645ull;  // "EVOKRNG1"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint64_t kHeaderBytes = 4096;
inline constexpr uint32_t kMaxEntries = 4096;
inline constexpr uint32_t kMinArgBytes = 256;
inline constexpr uint32_t kMaxArgBytes = 1u << 20;
inline constexpr uint32_t kMinMsgBytes = 256;
inline constexpr uint32_t kMaxMsgBytes = 64u << 10;
// Most slices in one gather or scatter list (as RegionSlices allows).
inline constexpr uint32_t kMaxSlices = 4096;

enum Opcode : uint8_t {
  kOpNop = 0,   // Completes at once with status 0 (for tests and latency).
  kOpSave = 1,  // Stores one block.
  kOpLoad = 2,  // Loads one block into region slices.
  // Acquire (as the RPC): the argument area holds the ids, 16 bytes each
  // (meta_len = arg_len = 16 x n, n_slices 0). The completion's `checksum`
  // is the handle (0: nothing held), `payload_bytes` the number held, and
  // its message one byte per held block, its evoke.v1.Tier
  // (kCqeMetaOmitted when they do not fit in msg_bytes).
  kOpAcquire = 3,
  // Release (as the RPC): the handle in the first 8 bytes of `id` (little
  // endian). The completion's `payload_bytes` is the holds released.
  kOpRelease = 4,
};

// RingSqe::flags.
enum SqeFlags : uint8_t {
  kSavePin = 1u << 0,        // Save: pin for the lease, as SaveBlock.pin.
  kSaveDurable = 1u << 1,    // Save: acknowledged once fsync'd to tier 2.
  kLoadReanchor = 1u << 0,   // Load: re-anchor to first_position.
  kLoadWantMeta = 1u << 1,   // Load: return the block's meta in the message.
  kAcquireAll = 1u << 0,     // Acquire: every id or NOT_FOUND (ACQUIRE_MODE_ALL).
};

// RingCqe::flags.
enum CqeFlags : uint32_t {
  kCqeDeduplicated = 1u << 0,  // Save: the block was already stored.
  kCqeMetaOmitted = 1u << 1,   // Load with kLoadWantMeta: meta over msg_bytes.
};

// One slice of a registered region (as evoke.v1.RegionSlice).
struct RingSlice {
  uint64_t region_id;
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(RingSlice) == 24);

// A submission: one Save or Load of one block, or one Acquire or Release.
struct RingSqe {
  uint64_t user_data;   // Echoed in the completion.
  uint8_t opcode;       // Opcode.
  uint8_t flags;        // SqeFlags.
  uint16_t n_slices;    // 0: the payload is `slice`; else that many RingSlice
                        // in the argument area (gather / scatter).
  uint32_t arg_len;     // Bytes of the argument area used (protobuf + slices).
  uint32_t meta_len;    // Of which the serialized protobuf.
  int32_t first_position;  // Load with kLoadReanchor: the new first position.
  RingSlice slice;      // The payload's slice when n_slices == 0.
  uint8_t id[16];       // Load: the block id. Save: ignored (from the meta).
};
static_assert(sizeof(RingSqe) == 64);

// A completion.
struct RingCqe {
  uint64_t user_data;
  int32_t status;       // absl::StatusCode; 0 = OK.
  uint32_t flags;       // CqeFlags.
  uint64_t checksum;    // xxHash3-64 of the payload (Save and Load).
  uint64_t payload_bytes;
  uint32_t tier;        // evoke.v1.Tier stored in (Save) or served from (Load).
  uint32_t msg_len;     // Bytes in this completion's message area.
  uint64_t reserved[3];
};
static_assert(sizeof(RingCqe) == 64);

// Index words: each on its own cache line, so that the two sides do not
// share lines they write.
struct alignas(64) RingIndex {
  std::atomic<uint32_t> value;
};

struct RingHeader {
  // Written by the client before AttachRing; read once by the daemon.
  uint64_t magic;       // kMagic.
  uint32_t version;     // kVersion.
  uint32_t sq_entries;  // Power of two, 1..kMaxEntries.
  uint32_t cq_entries;  // Power of two, sq_entries..kMaxEntries.
  uint32_t arg_bytes;   // Multiple of 64, kMinArgBytes..kMaxArgBytes.
  uint32_t msg_bytes;   // Multiple of 64, kMinMsgBytes..kMaxMsgBytes.
  uint32_t pad0;
  RingIndex sq_tail;       // Client.
  RingIndex sq_head;       // Daemon.
  RingIndex cq_tail;       // Daemon.
  RingIndex cq_head;       // Client.
  RingIndex sq_need_wake;  // 1: the daemon sleeps on it (client wakes it).
  RingIndex cq_need_wake;  // 1: a client thread sleeps on it (daemon wakes).
  RingIndex broken;        // Daemon: non-zero once the ring is no longer served.
};
static_assert(sizeof(RingHeader) <= kHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Where each part of a ring lies, and its total size.
struct RingGeometry {
  uint32_t sq_entries = 0;
  uint32_t cq_entries = 0;
  uint32_t arg_bytes = 0;
  uint32_t msg_bytes = 0;

  uint64_t sq_offset() const { return kHeaderBytes; }
  uint64_t cq_offset() const { return sq_offset() + uint64_t{sq_entries} * sizeof(RingSqe); }
  uint64_t msg_offset() const { return cq_offset() + uint64_t{cq_entries} * sizeof(RingCqe); }
  uint64_t arg_offset() const { return msg_offset() + uint64_t{cq_entries} * msg_bytes; }
  uint64_t total_bytes() const { return arg_offset() + uint64_t{sq_entries} * arg_bytes; }
};

// RingHeader::broken values.
enum BrokenReason : uint32_t {
  kNotBroken = 0,
  kBrokenSqIndex = 1,  // sq_tail left its window.
  kBrokenCqIndex = 2,  // cq_head left its window.
  kBrokenClosed = 3,   // The lease ended or the region was unregistered.
};

}  // namespace evoke::ring

#endif  // EVOKE_COMMON_RING_FORMAT_H_
