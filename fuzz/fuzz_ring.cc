// fuzz_ring: the daemon's side of the command ring (common/ring_format.h,
// daemon/ring_server.cc) against a hostile client. Everything in a ring is
// written by the client; whatever the bytes and whenever they change, the
// ring's thread must not crash, hang, touch memory outside the region, or
// disturb another client's ring, and what it posts must follow the rules a
// well-behaved client relies on.
//
// One input is one client session, in process (no socket, no gRPC):
//
//   1. The ring: a sealed memfd of 1 byte .. 4 MiB mapped by the client and,
//      through ShmRegion::Map, by the "daemon"; its header from the input: a
//      valid geometry, a valid one with one field spoiled, or raw words.
//      RingSet::Attach must refuse exactly the headers the format's rules
//      refuse (INVALID_ARGUMENT, naming the field) and never crash. A second,
//      well-behaved ring (the sibling) may run beside it.
//   2. The session: the rest of the input, as client actions (kActions):
//      entries written into free slots or over in-flight ones, sq_tail moved
//      forward, far, backwards, cq_head moved (after reading completions, or
//      anywhere), the wake words flipped, the futex woken, the owner gone,
//      daemon-owned words scribbled over, the header rewritten, the region
//      attached again. RingOptions spin a microsecond and check liveness
//      every millisecond, so that a session takes milliseconds.
//   3. The end: the owner goes (Alive() false); with kUnwokenEnd every ring
//      must stop by itself within seconds; then RingSet::StopAll (which
//      must end every ring at once), and the checks below.
//
// The fake RingHandler (FakeHandler) checks what it is given (opcode Save,
// Load, Acquire or Release, meta of meta_len bytes, slices inside the copied arguments at the
// next multiple of 8) and, while the client has done nothing that lets the
// daemon read a slot as it changes, that the entry and its arguments are the
// ones the client wrote. It answers each entry as the input planned (Plan):
// any status code, messages and meta from empty to 64 KiB (so longer than
// msg_bytes), any flags and numbers.
//
// What a client can rely on, and is checked (each only while what it needs
// holds: a hostile move or a scribble turns the checks that depend on it off,
// never the memory checks of the sanitizers):
//   - cq_tail is never more than cq_entries past a value the client stored in
//     cq_head, sq_head never past (nor more than sq_entries behind) a value
//     it stored in sq_tail; completions never outrun submissions taken;
//   - completion j answers submission j: its user_data, status and message
//     are those of the entry the client published at index j (the daemon's
//     own check's INVALID_ARGUMENT naming the field, a NOP's zeros, or the
//     handler's answer with its message cut at msg_bytes and meta over
//     msg_bytes replaced by kCqeMetaOmitted);
//   - a client that only moves its indices the way the format says sees its
//     submissions taken (within a second) and its ring end kBrokenClosed; a
//     ring ends kBrokenSqIndex or kBrokenCqIndex only after such a move;
//   - broken is a BrokenReason; counters agree with the rings;
//   - the sibling ring still answers at the end.
//
// Seeds: EVOKE_FUZZ_RING_SEEDS=<dir> fuzz_ring writes the seed corpus (a few
// valid rings with valid entries, back-pressure, bad entries, hostile
// indices, bad headers) with the encoder below (Seed), and exits:
//
//   EVOKE_FUZZ_RING_SEEDS=fuzz/corpus/fuzz_ring build-fuzz/fuzz/fuzz_ring
//   EVOKE_FUZZ_RING_REGRESSIONS=fuzz/regressions/fuzz_ring build-fuzz/fuzz/fuzz_ring
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/futex.h"
#include "common/log.h"
#include "common/ring_format.h"
#include "daemon/region.h"
#include "daemon/ring_server.h"
#include "fuzz/fuzz_check.h"

namespace evoke {
namespace {

using ring::RingCqe;
using ring::RingGeometry;
using ring::RingHeader;
using ring::RingSlice;
using ring::RingSqe;

constexpr uint64_t kMaxRegion = 4u << 20;
constexpr uint32_t kMaxArgsWritten = 2048;  // Argument bytes one action writes.
constexpr uint32_t kPlanArgsKept = 4096;    // Argument bytes a plan remembers.
constexpr int kMaxExtraRings = 3;           // Attaches past the first two.
constexpr int kMaxClientSleeps = 8;         // Futex sleeps of the client.
constexpr uid_t kUid = 1000;

// EVOKE_FUZZ_STRICT=1: known bugs, reported and not fixed yet, are no longer
// stepped around (see Session::Reattach).
bool strict = false;
// EVOKE_FUZZ_RING_VERBOSE=1: one line per input on how its session ended.
bool verbose = false;

uint64_t AlignUp8(uint64_t v) { return (v + 7) & ~uint64_t{7}; }
bool PowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// ---- Input encoding: little-endian fields read from the front; past the end
// every field reads as zero. Seed (below) writes the same fields.

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  uint8_t u8() { return static_cast<uint8_t>(Take(1)); }
  uint16_t u16() { return static_cast<uint16_t>(Take(2)); }
  uint32_t u32() { return static_cast<uint32_t>(Take(4)); }
  uint64_t u64() { return Take(8); }
  std::string bytes(size_t n) {
    n = std::min(n, n_);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    n_ -= n;
    return s;
  }

 private:
  uint64_t Take(size_t k) {
    uint64_t v = 0;
    for (size_t i = 0; i < k && n_ > 0; ++i, ++p_, --n_) v |= uint64_t{*p_} << (8 * i);
    return v;
  }
  const uint8_t* p_;
  size_t n_;
};

// Header modes (first byte, bits 0-1).
enum HeaderMode : uint8_t { kValid = 0, kSpoiled = 1, kRaw = 2 };
// First byte, other bits.
constexpr uint8_t kWithSibling = 1u << 2;
constexpr uint8_t kTightLimits = 1u << 3;  // max_rings_per_uid 2, max_rings 3.
constexpr uint8_t kUnwokenEnd = 1u << 4;   // At the end, rings find out alone.

// Actions (one byte each, modulo kActions, then their fields).
enum Action : uint8_t {
  kPrepare = 0,       // SqeSpec into a free slot (index sq_tail + k).
  kAdvance = 1,       // u8 m, u8 wake: sq_tail += m within the queue.
  kHostileTail = 2,   // u8 mode, u32 v: sq_tail anywhere.
  kConsume = 3,       // u8 n, u8 read: take n completions, cq_head += n.
  kHostileHead = 4,   // u8 mode, u32 v: cq_head anywhere.
  kWakeWord = 5,      // u8 which, u32 v: sq_need_wake or cq_need_wake = v.
  kWake = 6,          // FUTEX_WAKE on sq_need_wake.
  kWait = 7,          // u8 t: until the daemon caught up (bounded).
  kHostileSqe = 8,    // u32 index, SqeSpec: over a slot, in flight or not.
  kScribble = 9,      // u8 which, u32 v: over sq_head, cq_tail or broken.
  kOwnerGone = 10,    // Alive() turns false.
  kClientSleep = 11,  // Sleep on cq_need_wake as a client waiting would.
  kReattach = 12,     // u8 which: Attach the region again (key A, B or new).
  kRewrite = 13,      // u8 which, u32 v: a header geometry word = v.
  kActions = 14,
};

// SqeSpec shape bits.
constexpr uint8_t kConsistent = 1u << 0;  // arg_len, meta_len, n_slices agree.
constexpr uint8_t kKnownOp = 1u << 1;     // opcode % 5 (NOP to RELEASE).
constexpr uint8_t kNearMiss = 1u << 2;    // Then arg_len, meta_len, n_slices
                                          // moved by a few (u8 x3 more).

// How the handler answers one entry.
struct Plan {
  RingSqe sqe{};
  std::string args;  // The slot's first min(arg_len, arg_bytes, 4096) bytes.
  uint8_t code = 0;  // absl::StatusCode when < 17 and not 0; else OK.
  uint8_t len_mode = 0;
  uint16_t len = 0;
  uint32_t flags = 0;
  uint64_t checksum = 0;
  uint64_t payload_bytes = 0;
  uint32_t tier = 0;
};

struct SqeSpec {
  RingSqe sqe{};
  std::string args;
  Plan plan;
};

SqeSpec ParseSqeSpec(Reader& r) {
  SqeSpec s;
  const uint8_t shape = r.u8();
  RingSqe& e = s.sqe;
  e.opcode = r.u8();
  e.flags = r.u8();
  e.n_slices = r.u16();
  e.arg_len = r.u32();
  e.meta_len = r.u32();
  e.first_position = static_cast<int32_t>(r.u32());
  e.slice.region_id = r.u64();
  e.slice.offset = r.u64();
  e.slice.length = r.u64();
  const std::string id = r.bytes(16);
  std::memcpy(e.id, id.data(), id.size());
  s.args = r.bytes(r.u16() % (kMaxArgsWritten + 1));
  if (shape & kKnownOp) e.opcode %= ring::kOpRelease + 1;
  if (shape & kConsistent) {
    e.n_slices %= 9;
    e.meta_len %= 256;
    e.arg_len = e.n_slices > 0 ? static_cast<uint32_t>(AlignUp8(e.meta_len) +
                                                       uint64_t{e.n_slices} * sizeof(RingSlice))
                               : e.meta_len;
  }
  if (shape & kNearMiss) {
    // Just inside or just outside each of the check's bounds.
    e.arg_len += static_cast<int8_t>(r.u8()) % 9;
    e.meta_len += static_cast<int8_t>(r.u8()) % 9;
    e.n_slices = static_cast<uint16_t>(e.n_slices + static_cast<int8_t>(r.u8()) % 2);
  }
  Plan& p = s.plan;
  p.code = r.u8();
  p.len_mode = r.u8();
  p.len = r.u16();
  p.flags = r.u32();
  p.checksum = r.u64();
  p.payload_bytes = r.u64();
  p.tier = r.u32();
  return s;
}

// The text of a plan's message or meta: `len` bytes derived from user_data.
std::string Text(uint64_t user_data, size_t len) {
  std::string s(len, '\0');
  for (size_t i = 0; i < len; ++i) s[i] = static_cast<char>('a' + (user_data * 7 + i) % 26);
  return s;
}

size_t PlanTextLen(const Plan& p, uint32_t msg_bytes) {
  switch (p.len_mode & 3) {
    case 0: return p.len % 300;
    case 1: return p.len;
    case 2: return msg_bytes - 1 + p.len % 3;  // Around the message area.
    default: return 0;
  }
}

absl::StatusCode PlanCode(const Plan& p) {
  return p.code < 17 ? static_cast<absl::StatusCode>(p.code) : absl::StatusCode::kOk;
}

RingResult PlanResult(const Plan& p, uint32_t msg_bytes) {
  RingResult r;
  const std::string text = Text(p.sqe.user_data, PlanTextLen(p, msg_bytes));
  r.status = absl::Status(PlanCode(p), text);
  if (r.status.ok() && (p.len_mode & 4)) r.meta = text;
  r.flags = p.flags;
  r.checksum = p.checksum;
  r.payload_bytes = p.payload_bytes;
  r.tier = p.tier;
  return r;
}

// The field ring_format.h's rules name for a bad entry, or "" when valid.
const char* BadField(const RingSqe& e, const RingGeometry& g) {
  if (e.opcode > ring::kOpRelease) return "sqe.opcode";
  if (e.arg_len > g.arg_bytes) return "sqe.arg_len";
  if (e.meta_len > e.arg_len) return "sqe.meta_len";
  if (e.n_slices > ring::kMaxSlices) return "sqe.n_slices";
  // An ACQUIRE carries whole 16-byte ids and no slices.
  if (e.opcode == ring::kOpAcquire &&
      (e.meta_len == 0 || e.meta_len % 16 != 0 || e.n_slices != 0)) {
    return "sqe.meta_len";
  }
  if (e.n_slices > 0 && AlignUp8(e.meta_len) + uint64_t{e.n_slices} * sizeof(RingSlice) >
                            e.arg_len) {
    return "sqe.n_slices";
  }
  return "";
}

// Whether the format's rules accept `h` for a region of `size` bytes.
bool GeometryValid(const RingHeader& h, uint64_t size) {
  if (size < ring::kHeaderBytes || h.magic != ring::kMagic || h.version != ring::kVersion) {
    return false;
  }
  if (!PowerOfTwo(h.sq_entries) || h.sq_entries > ring::kMaxEntries) return false;
  if (!PowerOfTwo(h.cq_entries) || h.cq_entries < h.sq_entries ||
      h.cq_entries > ring::kMaxEntries) {
    return false;
  }
  if (h.arg_bytes % 64 != 0 || h.arg_bytes < ring::kMinArgBytes ||
      h.arg_bytes > ring::kMaxArgBytes) {
    return false;
  }
  if (h.msg_bytes % 64 != 0 || h.msg_bytes < ring::kMinMsgBytes ||
      h.msg_bytes > ring::kMaxMsgBytes) {
    return false;
  }
  RingGeometry g{h.sq_entries, h.cq_entries, h.arg_bytes, h.msg_bytes};
  if (g.total_bytes() > size) return false;
  return h.sq_tail.value.load() == 0 && h.sq_head.value.load() == 0 &&
         h.cq_tail.value.load() == 0 && h.cq_head.value.load() == 0;
}

RingGeometry GeometryOf(const RingHeader& h) {
  return RingGeometry{h.sq_entries, h.cq_entries, h.arg_bytes, h.msg_bytes};
}

// ---- What the client and the handlers share.
struct Shared {
  absl::Mutex mu;
  absl::flat_hash_map<uint64_t, Plan> plans ABSL_GUARDED_BY(mu);
  // Set (before the act) when the client does something after which the
  // daemon may read an entry or its arguments while they change, or read
  // them through another ring: exact checks of entries stop.
  std::atomic<bool> sq_tainted{false};
  std::atomic<uint64_t> executed{0};
};

class FakeHandler final : public RingHandler {
 public:
  FakeHandler(Shared* shared, RingGeometry g, uint32_t max_batch,
              std::shared_ptr<std::atomic<bool>> alive)
      : shared_(shared), g_(g), max_batch_(max_batch), alive_(std::move(alive)) {}

  void Execute(absl::Span<const RingRequest> requests, absl::Span<RingResult> results) override {
    FUZZ_CHECK(!requests.empty() && requests.size() == results.size());
    FUZZ_CHECK(requests.size() <= max_batch_);
    const bool exact = !shared_->sq_tainted.load(std::memory_order_seq_cst);
    for (size_t i = 0; i < requests.size(); ++i) {
      const RingRequest& r = requests[i];
      const RingSqe& e = r.sqe;
      // What the daemon's check promises, on its own copy.
      FUZZ_CHECK(e.opcode >= ring::kOpSave && e.opcode <= ring::kOpRelease);
      FUZZ_CHECK(*BadField(e, g_) == '\0');
      FUZZ_CHECK(r.meta.size() == e.meta_len);
      uint64_t sum = 0;
      for (char c : r.meta) sum += static_cast<uint8_t>(c);
      if (e.n_slices == 0) {
        FUZZ_CHECK(r.slices.empty());
      } else {
        FUZZ_CHECK(r.slices.size() == e.n_slices);
        FUZZ_CHECK(reinterpret_cast<uintptr_t>(r.slices.data()) % alignof(RingSlice) == 0);
        // The slices follow the meta at the next multiple of 8, inside arg_len.
        const char* start = reinterpret_cast<const char*>(r.slices.data());
        FUZZ_CHECK(start == r.meta.data() + AlignUp8(e.meta_len));
        FUZZ_CHECK(AlignUp8(e.meta_len) + r.slices.size() * sizeof(RingSlice) <= e.arg_len);
        for (const RingSlice& s : r.slices) sum += s.region_id ^ s.offset ^ s.length;
      }
      sink_ += sum;
      Plan plan;
      bool known = false;
      {
        absl::MutexLock lock(&shared_->mu);
        auto it = shared_->plans.find(e.user_data);
        if (it != shared_->plans.end()) {
          plan = it->second;
          known = true;
        }
      }
      if (exact) {
        // The entry and its arguments are the ones the client published.
        FUZZ_CHECK(known);
        FUZZ_CHECK(std::memcmp(&plan.sqe, &e, sizeof(e)) == 0);
        const size_t kept = plan.args.size();
        FUZZ_CHECK(r.meta.substr(0, kept) == absl::string_view(plan.args).substr(0, r.meta.size()));
        if (e.n_slices > 0 && AlignUp8(e.meta_len) < kept) {
          const size_t off = AlignUp8(e.meta_len);
          const size_t n = std::min<size_t>(kept - off, r.slices.size() * sizeof(RingSlice));
          FUZZ_CHECK(std::memcmp(r.slices.data(), plan.args.data() + off, n) == 0);
        }
      }
      if (known) {
        results[i] = PlanResult(plan, g_.msg_bytes);
      } else {
        results[i] = RingResult{};
      }
    }
    shared_->executed.fetch_add(requests.size(), std::memory_order_relaxed);
  }

  bool Alive() override { return alive_->load(std::memory_order_acquire); }

 private:
  Shared* const shared_;
  const RingGeometry g_;
  const uint32_t max_batch_;
  const std::shared_ptr<std::atomic<bool>> alive_;
  uint64_t sink_ = 0;
};

// A memfd sealed against shrinking and growing, mapped by the client.
struct Memfd {
  int fd = -1;
  uint8_t* base = nullptr;
  uint64_t size = 0;

  bool Create(uint64_t bytes) {
    fd = memfd_create("fuzz-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return false;
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
      return false;
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return false;
    base = static_cast<uint8_t*>(p);
    size = bytes;
    return true;
  }
  // The daemon's own mapping (ShmRegion takes a duplicate of the fd).
  std::shared_ptr<Region> Map() const {
    absl::StatusOr<std::unique_ptr<ShmRegion>> r = ShmRegion::Map(dup(fd), size, kMaxRegion);
    FUZZ_CHECK(r.ok());
    return std::shared_ptr<Region>(std::move(r).value());
  }
  RingHeader* header() const { return reinterpret_cast<RingHeader*>(base); }
  ~Memfd() {
    if (base != nullptr) munmap(base, size);
    if (fd >= 0) close(fd);
  }
};

// ---- The header.

RingGeometry Shrink(RingGeometry g) {
  while (g.total_bytes() > kMaxRegion) {
    if (g.arg_bytes > ring::kMinArgBytes) {
      g.arg_bytes = std::max<uint32_t>(ring::kMinArgBytes, g.arg_bytes / 2 / 64 * 64);
    } else if (g.msg_bytes > ring::kMinMsgBytes) {
      g.msg_bytes = std::max<uint32_t>(ring::kMinMsgBytes, g.msg_bytes / 2 / 64 * 64);
    } else if (g.cq_entries > g.sq_entries) {
      g.cq_entries /= 2;
    } else {
      g.sq_entries /= 2;
      g.cq_entries /= 2;
    }
  }
  return g;
}

// AreaBytes: a multiple of 64 in min..max; up to 4 KiB unless the selector's
// top bit is set (large areas cost every copy the daemon makes, and slow the
// fuzzer down without reaching other code).
uint32_t AreaBytes(uint16_t sel, uint32_t min, uint32_t max) {
  const uint32_t steps = (sel & 0x8000) ? (max - min) / 64 + 1 : (4096 - min) / 64 + 1;
  return min + 64 * ((sel & 0x7fff) % steps);
}

struct HeaderSpec {
  uint64_t size = 0;
  // Only the words up to broken matter (atomics: not copyable, so held).
  std::unique_ptr<RingHeader> header = std::make_unique<RingHeader>();
  bool sibling = false;
  bool tight = false;
  bool unwoken_end = false;
  uint32_t max_batch = 64;
};

void WriteGeometry(RingHeader* h, const RingGeometry& g) {
  h->magic = ring::kMagic;
  h->version = ring::kVersion;
  h->sq_entries = g.sq_entries;
  h->cq_entries = g.cq_entries;
  h->arg_bytes = g.arg_bytes;
  h->msg_bytes = g.msg_bytes;
}

HeaderSpec ParseHeader(Reader& r) {
  HeaderSpec s;
  const uint8_t b = r.u8();
  s.sibling = (b & kWithSibling) != 0;
  s.tight = (b & kTightLimits) != 0;
  s.unwoken_end = (b & kUnwokenEnd) != 0;
  s.max_batch = 1 + r.u8() % 64;
  RingHeader& h = *s.header;
  if ((b & 3) != kRaw) {
    const uint32_t sq_log = r.u8() % 13;
    RingGeometry g;
    g.sq_entries = 1u << sq_log;
    g.cq_entries = g.sq_entries << (r.u8() % (13 - sq_log));
    g.arg_bytes = AreaBytes(r.u16(), ring::kMinArgBytes, ring::kMaxArgBytes);
    g.msg_bytes = AreaBytes(r.u16(), ring::kMinMsgBytes, ring::kMaxMsgBytes);
    g = Shrink(g);
    s.size = std::min<uint64_t>(kMaxRegion, g.total_bytes() + r.u16() % 8192);
    WriteGeometry(&h, g);
    if ((b & 3) == kSpoiled) {
      const uint8_t which = r.u8();
      const uint32_t v = r.u32();
      switch (which % 10) {
        case 0: h.magic ^= uint64_t{v} | 1; break;
        case 1: h.version = v == ring::kVersion ? 0 : v; break;
        case 2: h.sq_entries = v; break;
        case 3: h.cq_entries = v; break;
        case 4: h.arg_bytes = v; break;
        case 5: h.msg_bytes = v; break;
        case 6: s.size = 1 + v % g.total_bytes(); break;
        case 7: s.size = 1 + v % kMaxRegion; break;
        case 8: (&h.sq_tail)[v % 4].value.store(v | 1); break;
        default: h.sq_entries = v % 2 ? h.sq_entries * 2 : h.sq_entries; break;
      }
    }
  } else {
    s.size = 1 + r.u32() % kMaxRegion;
    const uint8_t magic_ok = r.u8();
    h.magic = r.u64();
    if (magic_ok & 1) h.magic = ring::kMagic;
    h.version = r.u32();
    if (magic_ok & 2) h.version = ring::kVersion;
    h.sq_entries = r.u32();
    h.cq_entries = r.u32();
    h.arg_bytes = r.u32();
    h.msg_bytes = r.u32();
    const uint8_t nonzero = r.u8();
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = r.u32();
      if (nonzero & (1u << i)) (&h.sq_tail)[i].value.store(v);
    }
  }
  return s;
}

// ---- The session.

struct RingRun {
  std::string key;
  std::shared_ptr<std::atomic<bool>> alive = std::make_shared<std::atomic<bool>>(true);
};

class Session {
 public:
  Session(Shared* shared, RingSet* set, Memfd* mem, RingGeometry g, uint32_t max_batch)
      : shared_(shared), set_(set), mem_(mem), g_(g), max_batch_(max_batch), h_(mem->header()) {
    cq_heads_.insert(0);
    sq_tails_.insert(0);
    slots_.assign(g_.sq_entries, 0);
  }

  void Play(Reader& r);
  void Finish(uint64_t sibling_ops);
  std::shared_ptr<std::atomic<bool>> alive() const { return run_.alive; }
  void set_run(RingRun run) { run_ = std::move(run); }
  bool multi() const { return multi_; }
  bool scribbled() const { return scribbled_; }

 private:
  uint32_t pub_sq_head() const { return h_->sq_head.value.load(std::memory_order_acquire); }
  uint32_t pub_cq_tail() const { return h_->cq_tail.value.load(std::memory_order_acquire); }
  uint8_t* sq_slot(uint32_t index) const {
    return mem_->base + g_.sq_offset() + uint64_t{index & (g_.sq_entries - 1)} * sizeof(RingSqe);
  }
  uint8_t* arg_slot(uint32_t index) const {
    return mem_->base + g_.arg_offset() + uint64_t{index & (g_.sq_entries - 1)} * g_.arg_bytes;
  }
  RingCqe ReadCqe(uint32_t j) const {
    RingCqe c;
    std::memcpy(&c, mem_->base + g_.cq_offset() + uint64_t{j & (g_.cq_entries - 1)} * sizeof(c),
                sizeof(c));
    return c;
  }
  absl::string_view Msg(uint32_t j, uint32_t len) const {
    return absl::string_view(reinterpret_cast<const char*>(mem_->base) + g_.msg_offset() +
                                 uint64_t{j & (g_.cq_entries - 1)} * g_.msg_bytes,
                             std::min(len, g_.msg_bytes));
  }
  void TaintSq() {
    shared_->sq_tainted.store(true, std::memory_order_seq_cst);
    expected_.clear();
  }
  void TaintCq() {
    cq_tainted_ = true;
    expected_.clear();
  }
  void Write(uint32_t index, SqeSpec& s);
  void Verify(uint32_t j, const RingCqe& c, absl::string_view msg);
  void CheckIndices();
  bool broken() const { return h_->broken.value.load(std::memory_order_acquire) != 0; }
  void Reattach(uint8_t which);

  Shared* const shared_;
  RingSet* const set_;
  Memfd* const mem_;
  const RingGeometry g_;
  const uint32_t max_batch_;
  RingHeader* const h_;
  RingRun run_;

  uint32_t tail_ = 0;  // What the client last stored in sq_tail.
  uint32_t head_ = 0;  // What the client last stored in cq_head.
  uint64_t next_user_data_ = 1;
  std::vector<uint64_t> slots_;         // user_data last written to each slot.
  std::deque<uint64_t> expected_;       // user_data published at exp_base_ + i.
  uint32_t exp_base_ = 0;
  absl::flat_hash_set<uint32_t> cq_heads_;  // Every value stored in cq_head.
  absl::flat_hash_set<uint32_t> sq_tails_;  // Every value stored in sq_tail.
  absl::flat_hash_set<uint64_t> user_data_;  // Every user_data written.
  bool tail_hostile_ = false;  // sq_tail moved outside the rules.
  bool head_hostile_ = false;  // cq_head moved outside the rules.
  bool cq_tainted_ = false;    // Completions may be overwritten before read.
  bool scribbled_ = false;     // Daemon-owned words written by the client.
  bool multi_ = false;         // Another ring serves this memory too.
  bool owner_gone_ = false;
  int extra_rings_ = 0;
  int sleeps_ = 0;
  std::vector<std::unique_ptr<Memfd>> keep_;
};

void Session::Write(uint32_t index, SqeSpec& s) {
  s.sqe.user_data = next_user_data_++;
  uint8_t* args = arg_slot(index);
  const size_t n = std::min<size_t>(s.args.size(), g_.arg_bytes);
  if (n > 0) std::memcpy(args, s.args.data(), n);
  s.plan.sqe = s.sqe;
  const size_t kept = std::min<size_t>({s.sqe.arg_len, g_.arg_bytes, kPlanArgsKept});
  s.plan.args.assign(reinterpret_cast<const char*>(args), kept);
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->plans[s.sqe.user_data] = s.plan;
  }
  user_data_.insert(s.sqe.user_data);
  std::memcpy(sq_slot(index), &s.sqe, sizeof(s.sqe));
  slots_[index & (g_.sq_entries - 1)] = s.sqe.user_data;
}

// Verify checks completion j against the entry published at index j.
void Session::Verify(uint32_t j, const RingCqe& c, absl::string_view msg) {
  FUZZ_CHECK(c.msg_len <= g_.msg_bytes);
  if (shared_->sq_tainted.load() || cq_tainted_ || scribbled_ || multi_) {
    if (!shared_->sq_tainted.load() && !multi_ && !scribbled_) {
      FUZZ_CHECK(c.user_data == 0 || user_data_.contains(c.user_data));
    }
    return;
  }
  FUZZ_CHECK(j - exp_base_ < expected_.size());
  const uint64_t u = expected_[j - exp_base_];
  FUZZ_CHECK(c.user_data == u);
  RingSqe e{};
  Plan plan;
  if (u != 0) {
    absl::MutexLock lock(&shared_->mu);
    auto it = shared_->plans.find(u);
    FUZZ_CHECK(it != shared_->plans.end());
    plan = it->second;
    e = plan.sqe;
  }
  const char* bad = BadField(e, g_);
  if (*bad != '\0') {
    FUZZ_CHECK(c.status == static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
    FUZZ_CHECK(c.flags == 0 && c.checksum == 0 && c.payload_bytes == 0 && c.tier == 0);
    FUZZ_CHECK(c.msg_len > 0);
    FUZZ_CHECK(absl::StartsWith(msg, absl::StrCat(bad, ": ")));
    return;
  }
  if (e.opcode == ring::kOpNop) {
    FUZZ_CHECK(c.status == 0 && c.flags == 0 && c.checksum == 0 && c.payload_bytes == 0 &&
               c.tier == 0 && c.msg_len == 0);
    return;
  }
  const RingResult want = PlanResult(plan, g_.msg_bytes);
  FUZZ_CHECK(c.status == static_cast<int32_t>(want.status.code()));
  FUZZ_CHECK(c.checksum == want.checksum && c.payload_bytes == want.payload_bytes &&
             c.tier == want.tier);
  absl::string_view text = want.status.ok() ? want.meta : want.status.message();
  uint32_t flags = want.flags;
  if (want.status.ok() && text.size() > g_.msg_bytes) {
    flags |= ring::kCqeMetaOmitted;
    text = {};
  }
  text = text.substr(0, g_.msg_bytes);
  FUZZ_CHECK(c.flags == flags);
  FUZZ_CHECK(c.msg_len == text.size());
  FUZZ_CHECK(msg == text);
}

// CheckIndices: what the published indices promise (skipped once the client
// wrote over them).
void Session::CheckIndices() {
  if (scribbled_ || multi_) return;
  // cq_tail first: the daemon publishes sq_head before the completions.
  const uint32_t cq_tail = pub_cq_tail();
  const uint32_t sq_head = pub_sq_head();
  bool cq_ok = false;
  for (uint32_t h : cq_heads_) cq_ok |= cq_tail - h <= g_.cq_entries;
  FUZZ_CHECK(cq_ok);
  bool sq_ok = false;
  for (uint32_t t : sq_tails_) sq_ok |= t - sq_head <= g_.sq_entries;
  FUZZ_CHECK(sq_ok);
  if (!tail_hostile_) {
    // Completions never outrun submissions, which never outrun sq_tail.
    FUZZ_CHECK(sq_head - cq_tail <= tail_ - cq_tail);
    FUZZ_CHECK(tail_ - sq_head <= g_.sq_entries);
  }
  if (!head_hostile_) FUZZ_CHECK(cq_tail - head_ <= g_.cq_entries);
}

void Session::Reattach(uint8_t which) {
  if (extra_rings_ >= kMaxExtraRings) return;
  // Known bug (fuzz/regressions/fuzz_ring/attach-refused-after-ring-ended):
  // an Attach refused (FAILED_PRECONDITION, RESOURCE_EXHAUSTED) while a ring
  // that ended is still unjoined destroys its joinable std::thread, and
  // evoked terminates. Skipped unless EVOKE_FUZZ_STRICT=1 until fixed.
  // Stepped around: any attach once a ring may have ended (after a hostile
  // index move, the owner's end, or another attach of this memory).
  if (!strict && (tail_hostile_ || head_hostile_ || owner_gone_ || multi_)) return;
  ++extra_rings_;
  std::string key;
  switch (which % 3) {
    case 0: key = "A"; break;
    case 1: key = "B"; break;
    default: key = absl::StrCat("C", extra_rings_); break;
  }
  // The ring's memory mapped again, as the same or another region.
  const RingHeader& h = *h_;
  const RingGeometry g = GeometryOf(h);
  // A second ring may serve this memory from now on.
  TaintSq();
  multi_ = true;
  absl::StatusOr<RingGeometry> got = set_->Attach(
      key, kUid, mem_->Map(),
      std::make_unique<FakeHandler>(shared_, g, max_batch_, run_.alive));
  const absl::StatusCode code = got.status().code();
  FUZZ_CHECK(code == absl::StatusCode::kOk || code == absl::StatusCode::kInvalidArgument ||
             code == absl::StatusCode::kFailedPrecondition ||
             code == absl::StatusCode::kResourceExhausted);
}

void Session::Play(Reader& r) {
  while (!r.empty()) {
    const uint8_t op = r.u8() % kActions;
    switch (op) {
      case kPrepare: {
        const uint8_t k = r.u8();
        SqeSpec s = ParseSqeSpec(r);
        if (scribbled_ || tail_hostile_ || multi_) {
          // No free slot is known any more: this is an in-flight write.
          TaintSq();
          Write(tail_ + k, s);
          break;
        }
        // Free: indices tail .. sq_head + sq_entries - 1.
        const uint32_t in_flight = tail_ - pub_sq_head();
        FUZZ_CHECK(in_flight <= g_.sq_entries);
        const uint32_t free = g_.sq_entries - in_flight;
        if (free == 0) break;
        Write(tail_ + k % free, s);
        break;
      }
      case kAdvance: {
        const uint8_t m_sel = r.u8();
        const uint8_t wake = r.u8();
        uint32_t m = m_sel;
        if (!scribbled_ && !tail_hostile_ && !multi_) {
          const uint32_t room = pub_sq_head() + g_.sq_entries - tail_;
          FUZZ_CHECK(room <= g_.sq_entries);
          m = room == 0 ? 0 : m_sel % (room + 1);
          if (!shared_->sq_tainted.load() && !cq_tainted_) {
            for (uint32_t i = 0; i < m; ++i) {
              expected_.push_back(slots_[(tail_ + i) & (g_.sq_entries - 1)]);
            }
          }
        } else {
          tail_hostile_ = true;
        }
        tail_ += m;
        sq_tails_.insert(tail_);
        h_->sq_tail.value.store(tail_, std::memory_order_seq_cst);
        if ((wake & 3) == 0) {
          // As the client library: wake the daemon only when it sleeps.
          if (h_->sq_need_wake.value.exchange(0, std::memory_order_seq_cst) != 0) {
            FutexWake(&h_->sq_need_wake.value);
          }
        } else if ((wake & 3) == 1) {
          FutexWake(&h_->sq_need_wake.value);
        }
        break;
      }
      case kHostileTail: {
        const uint8_t mode = r.u8();
        const uint32_t v = r.u32();
        tail_hostile_ = true;
        TaintSq();
        switch (mode % 4) {
          case 0: tail_ += v; break;
          case 1: tail_ -= 1 + v % 8; break;
          case 2: tail_ = v; break;
          default: tail_ += g_.sq_entries + 1 + v % 4; break;
        }
        sq_tails_.insert(tail_);
        h_->sq_tail.value.store(tail_, std::memory_order_seq_cst);
        if (mode & 4) FutexWake(&h_->sq_need_wake.value);
        break;
      }
      case kConsume: {
        const uint8_t n_sel = r.u8();
        const uint8_t read = r.u8();
        CheckIndices();
        const uint32_t tail = pub_cq_tail();
        uint32_t ready = tail - head_;
        if (scribbled_ || head_hostile_ || multi_ || ready > g_.cq_entries) {
          ready = std::min<uint32_t>(ready, g_.cq_entries);
        }
        const uint32_t n = std::min<uint32_t>(ready, n_sel);
        for (uint32_t i = 0; i < n; ++i) {
          const uint32_t j = head_ + i;
          if ((read & 1) == 0) {
            const RingCqe c = ReadCqe(j);
            Verify(j, c, Msg(j, c.msg_len));
          }
          if (!expected_.empty() && exp_base_ == j) {
            expected_.pop_front();
            ++exp_base_;
          }
        }
        head_ += n;
        if (expected_.empty()) exp_base_ = head_;
        cq_heads_.insert(head_);
        h_->cq_head.value.store(head_, std::memory_order_seq_cst);
        break;
      }
      case kHostileHead: {
        const uint8_t mode = r.u8();
        const uint32_t v = r.u32();
        head_hostile_ = true;
        TaintCq();
        switch (mode % 4) {
          case 0: head_ += v; break;
          case 1: head_ -= 1 + v % 8; break;
          case 2: head_ = v; break;
          default: head_ = pub_cq_tail() + 1 + v % 4; break;
        }
        cq_heads_.insert(head_);
        h_->cq_head.value.store(head_, std::memory_order_seq_cst);
        break;
      }
      case kWakeWord: {
        const uint8_t which = r.u8();
        const uint32_t v = r.u32();
        const uint32_t value = (which & 2) ? v : (which >> 2) & 1;
        ((which & 1) ? h_->cq_need_wake : h_->sq_need_wake).value.store(value);
        break;
      }
      case kWake:
        FutexWake(&h_->sq_need_wake.value);
        break;
      case kWait: {
        const uint8_t t = r.u8();
        if (scribbled_ || multi_ || tail_hostile_ || head_hostile_ || owner_gone_) {
          absl::SleepFor(absl::Microseconds(10 * (t % 16)));
          if (t & 16) {
            // Until the ring has ended (bounded), and its thread with it.
            const absl::Time deadline = absl::Now() + absl::Milliseconds(20);
            while (!broken() && absl::Now() < deadline) absl::SleepFor(absl::Microseconds(10));
            absl::SleepFor(absl::Microseconds(200));
          }
          break;
        }
        // The daemon takes what the client published, as far as there is
        // room for the completions; a client that follows the rules must
        // see that within a second, woken or not.
        const uint32_t target = tail_ - head_ <= g_.cq_entries ? tail_ : head_ + g_.cq_entries;
        const absl::Time deadline = absl::Now() + absl::Seconds(1);
        while (pub_cq_tail() != target && !broken()) {
          FUZZ_CHECK(absl::Now() < deadline);
          // As a client waits: the daemon wakes it after posting.
          h_->cq_need_wake.value.store(1, std::memory_order_seq_cst);
          if (pub_cq_tail() != target && !broken()) {
            FutexWait(&h_->cq_need_wake.value, 1, absl::Milliseconds(1));
          }
          h_->cq_need_wake.value.store(0, std::memory_order_relaxed);
        }
        FUZZ_CHECK(!broken());
        CheckIndices();
        break;
      }
      case kHostileSqe: {
        const uint32_t index = r.u32();
        SqeSpec s = ParseSqeSpec(r);
        TaintSq();
        Write(index, s);
        break;
      }
      case kScribble: {
        const uint8_t which = r.u8();
        const uint32_t v = r.u32();
        scribbled_ = true;
        TaintSq();
        TaintCq();
        switch (which % 3) {
          case 0: h_->sq_head.value.store(v); break;
          case 1: h_->cq_tail.value.store(v); break;
          default: h_->broken.value.store(v); break;
        }
        break;
      }
      case kOwnerGone:
        owner_gone_ = true;
        run_.alive->store(false, std::memory_order_release);
        break;
      case kClientSleep: {
        if (sleeps_++ >= kMaxClientSleeps) break;
        h_->cq_need_wake.value.store(1, std::memory_order_seq_cst);
        if (pub_cq_tail() == head_ && !broken()) {
          FutexWait(&h_->cq_need_wake.value, 1, absl::Microseconds(300));
        }
        h_->cq_need_wake.value.store(0, std::memory_order_relaxed);
        break;
      }
      case kReattach:
        Reattach(r.u8());
        break;
      case kRewrite: {
        // The daemon read the geometry at attach and must never read it again.
        const uint8_t which = r.u8();
        const uint32_t v = r.u32();
        switch (which % 6) {
          case 0: h_->magic = v; break;
          case 1: h_->version = v; break;
          case 2: h_->sq_entries = v; break;
          case 3: h_->cq_entries = v; break;
          case 4: h_->arg_bytes = v; break;
          default: h_->msg_bytes = v; break;
        }
        break;
      }
      default:
        break;
    }
  }
}

void Session::Finish(uint64_t sibling_ops) {
  // Everything has stopped: the header and the slots are the daemon's last.
  const uint32_t broken = h_->broken.value.load();
  const uint32_t cq_tail = pub_cq_tail();
  const uint32_t sq_head = pub_sq_head();
  const RingSet::Counters counters = set_->counters();
  if (verbose) {
    fprintf(stderr,
            "fuzz_ring: %ux%u arg %u msg %u: sq_tail %u sq_head %u cq_tail %u cq_head %u "
            "broken %u ops %lu executed %lu%s%s%s%s%s\n",
            g_.sq_entries, g_.cq_entries, g_.arg_bytes, g_.msg_bytes, tail_, sq_head, cq_tail,
            head_, broken, static_cast<unsigned long>(counters.ops),
            static_cast<unsigned long>(shared_->executed.load()),
            shared_->sq_tainted.load() ? " sq-tainted" : "", cq_tainted_ ? " cq-tainted" : "",
            scribbled_ ? " scribbled" : "", multi_ ? " multi" : "",
            owner_gone_ ? " owner-gone" : "");
  }
  FUZZ_CHECK(counters.rings == 0);
  if (scribbled_ || multi_) return;
  FUZZ_CHECK(broken == ring::kBrokenSqIndex || broken == ring::kBrokenCqIndex ||
             broken == ring::kBrokenClosed);
  if (broken == ring::kBrokenSqIndex) FUZZ_CHECK(tail_hostile_);
  if (broken == ring::kBrokenCqIndex) FUZZ_CHECK(head_hostile_);
  FUZZ_CHECK(counters.broken == (broken == ring::kBrokenClosed ? 0u : 1u));
  // One completion per submission taken, each counted once.
  FUZZ_CHECK(sq_head == cq_tail);
  FUZZ_CHECK(counters.ops == uint64_t{cq_tail} + sibling_ops);
  CheckIndices();
  // Completions not read yet are intact while cq_head moved by the rules.
  if (!head_hostile_) {
    for (uint32_t j = head_; j != cq_tail; ++j) {
      const RingCqe c = ReadCqe(j);
      Verify(j, c, Msg(j, c.msg_len));
    }
  } else {
    const uint32_t n = std::min(cq_tail, g_.cq_entries);
    for (uint32_t j = cq_tail - n; j != cq_tail; ++j) {
      const RingCqe c = ReadCqe(j);
      FUZZ_CHECK(c.msg_len <= g_.msg_bytes);
      if (!shared_->sq_tainted.load()) {
        FUZZ_CHECK(c.user_data == 0 || user_data_.contains(c.user_data));
      }
    }
  }
}

// The sibling: a well-behaved client's ring beside the hostile one.
struct Sibling {
  Memfd mem;
  RingGeometry g{4, 4, 256, 256};
  RingRun run;
  bool attached = false;
};

// WaitBroken waits, as a client waiting for completions does, until the
// ring's thread has ended by itself (it sets `broken` and wakes cq_need_wake
// as it ends). False after `limit`.
bool WaitBroken(RingHeader* h, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (h->broken.value.load(std::memory_order_acquire) == 0) {
    if (absl::Now() >= deadline) return false;
    h->cq_need_wake.value.store(1, std::memory_order_seq_cst);
    if (h->broken.value.load(std::memory_order_seq_cst) == 0) {
      FutexWait(&h->cq_need_wake.value, 1, absl::Milliseconds(1));
    }
  }
  return true;
}

// WaitStopped: until no ring is served (for rings whose `broken` word the
// client overwrote, or that share memory).
bool WaitStopped(RingSet& set, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (set.counters().rings != 0) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Microseconds(50));
  }
  return true;
}

int RunOne(const uint8_t* data, size_t size) {
  Reader r(data, size);
  const HeaderSpec spec = ParseHeader(r);
  Memfd mem;
  FUZZ_CHECK(mem.Create(spec.size));
  // The header as written, up to the region's end.
  std::memcpy(mem.base, spec.header.get(), std::min<uint64_t>(sizeof(RingHeader), spec.size));
  RingOptions options;
  options.spin = absl::Microseconds(1);
  options.liveness_interval = absl::Milliseconds(1);
  options.max_batch = spec.max_batch;
  if (spec.tight) {
    options.max_rings = 3;
    options.max_rings_per_uid = 2;
  }
  Shared shared;
  RingSet set(options);

  Sibling sibling;
  if (spec.sibling) {
    FUZZ_CHECK(sibling.mem.Create(sibling.g.total_bytes()));
    WriteGeometry(sibling.mem.header(), sibling.g);
    absl::StatusOr<RingGeometry> got =
        set.Attach("B", kUid, sibling.mem.Map(),
                   std::make_unique<FakeHandler>(&shared, sibling.g, spec.max_batch,
                                                 sibling.run.alive));
    FUZZ_CHECK(got.ok());
    sibling.attached = true;
  }

  const bool valid = spec.size >= sizeof(RingHeader) && GeometryValid(*spec.header, spec.size);
  const RingGeometry g = GeometryOf(*spec.header);
  RingRun run;
  run.key = "A";
  absl::StatusOr<RingGeometry> attached =
      set.Attach(run.key, kUid, mem.Map(),
                 std::make_unique<FakeHandler>(&shared, g, spec.max_batch, run.alive));
  if (!valid) {
    // Refused, naming what is wrong.
    FUZZ_CHECK(attached.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(absl::StartsWith(attached.status().message(), "ring header") ||
               absl::StartsWith(attached.status().message(), "region_id"));
    return 0;
  }
  FUZZ_CHECK(attached.ok());
  FUZZ_CHECK(attached->sq_entries == g.sq_entries && attached->cq_entries == g.cq_entries &&
             attached->arg_bytes == g.arg_bytes && attached->msg_bytes == g.msg_bytes);
  FUZZ_CHECK(g.total_bytes() <= spec.size);

  Session session(&shared, &set, &mem, g, spec.max_batch);
  session.set_run(run);
  session.Play(r);

  // The other client's ring still answers, however this one behaved.
  uint64_t sibling_ops = 0;
  if (sibling.attached) {
    RingHeader* h = sibling.mem.header();
    RingSqe nop{};
    nop.user_data = 0xB0B;
    std::memcpy(sibling.mem.base + sibling.g.sq_offset(), &nop, sizeof(nop));
    h->sq_tail.value.store(1, std::memory_order_seq_cst);
    if (h->sq_need_wake.value.exchange(0) != 0) FutexWake(&h->sq_need_wake.value);
    const absl::Time deadline = absl::Now() + absl::Seconds(2);
    while (h->cq_tail.value.load(std::memory_order_acquire) != 1) {
      FUZZ_CHECK(absl::Now() < deadline);
      h->cq_need_wake.value.store(1, std::memory_order_seq_cst);
      if (h->cq_tail.value.load(std::memory_order_seq_cst) != 1) {
        FutexWait(&h->cq_need_wake.value, 1, absl::Milliseconds(1));
      }
      h->cq_need_wake.value.store(0, std::memory_order_relaxed);
    }
    RingCqe c;
    std::memcpy(&c, sibling.mem.base + sibling.g.cq_offset(), sizeof(c));
    FUZZ_CHECK(c.user_data == 0xB0B && c.status == 0 && c.msg_len == 0);
    FUZZ_CHECK(h->broken.value.load() == 0);
    sibling_ops = 1;
    sibling.run.alive->store(false);
  }
  // The owner goes. With kUnwokenEnd every ring must find out by itself
  // (Alive() at its next liveness check) and stop within seconds; else the
  // daemon shuts down at once (StopAll), which must end every ring however
  // it is busy (a ring thread that ignored it would time the input out).
  session.alive()->store(false, std::memory_order_release);
  if (spec.unwoken_end) {
    if (!session.scribbled() && !session.multi()) {
      FUZZ_CHECK(WaitBroken(mem.header(), absl::Seconds(5)));
    }
    if (sibling.attached) FUZZ_CHECK(WaitBroken(sibling.mem.header(), absl::Seconds(5)));
    FUZZ_CHECK(WaitStopped(set, absl::Seconds(5)));
  }
  set.StopAll();
  if (sibling.attached) {
    FUZZ_CHECK(sibling.mem.header()->broken.value.load() == ring::kBrokenClosed);
  }
  session.Finish(sibling_ops);
  return 0;
}

// ---- Seeds.

class Seed {
 public:
  Seed& u8(uint8_t v) { return Put(v, 1); }
  Seed& u16(uint16_t v) { return Put(v, 2); }
  Seed& u32(uint32_t v) { return Put(v, 4); }
  Seed& u64(uint64_t v) { return Put(v, 8); }
  Seed& bytes(const std::string& s) {
    out_ += s;
    return *this;
  }
  // A valid geometry: 2^sq_log entries, cq 2^cq_shift times more, arg and
  // msg bytes (multiples of 64, >= 256).
  Seed& Valid(uint8_t flags, uint8_t max_batch, uint8_t sq_log, uint8_t cq_shift,
              uint32_t arg_bytes, uint32_t msg_bytes) {
    return u8(flags).u8(max_batch - 1).u8(sq_log).u8(cq_shift)
        .u16(static_cast<uint16_t>((arg_bytes - 256) / 64))
        .u16(static_cast<uint16_t>((msg_bytes - 256) / 64))
        .u16(0);
  }
  Seed& Spoil(uint8_t which, uint32_t v) { return u8(which).u32(v); }
  // An entry: consistent arguments (meta then n slices), answered with
  // `code` and a text of `len` bytes (meta when OK and want_meta).
  Seed& Sqe(uint8_t op, uint8_t flags, const std::string& meta, uint16_t n_slices,
            uint8_t code, uint16_t len, bool want_meta, uint8_t len_mode = 0) {
    if (len_mode == 0 && len >= 300) len_mode = 1;  // Mode 0 takes len % 300.
    std::string args = meta;
    args.resize(AlignUp8(meta.size()), '\0');
    for (uint16_t i = 0; i < n_slices; ++i) {
      RingSlice s{7, uint64_t{i} * 4096, 4096};
      args.append(reinterpret_cast<const char*>(&s), sizeof(s));
    }
    u8(kConsistent | kKnownOp).u8(op).u8(flags).u16(n_slices).u32(0)
        .u32(static_cast<uint32_t>(meta.size())).u32(0).u64(7).u64(0).u64(4096);
    bytes(std::string(16, '\x11')).u16(static_cast<uint16_t>(args.size())).bytes(args);
    return u8(code).u8(static_cast<uint8_t>(len_mode | (want_meta ? 4 : 0))).u16(len)
        .u32(0).u64(0x1234).u64(4096).u32(1);
  }
  // A raw entry: every field as given, no arguments.
  Seed& RawSqe(uint8_t op, uint16_t n_slices, uint32_t arg_len, uint32_t meta_len) {
    u8(0).u8(op).u8(0).u16(n_slices).u32(arg_len).u32(meta_len).u32(0).u64(0).u64(0).u64(0);
    return bytes(std::string(16, '\0')).u16(0).u8(0).u8(0).u16(0).u32(0).u64(0).u64(0).u32(0);
  }
  // Prepare(k): the entry goes to index sq_tail + k (k-th of a batch).
  Seed& Prepare(uint8_t k) { return u8(kPrepare).u8(k); }
  Seed& Advance(uint8_t m) { return u8(kAdvance).u8(m).u8(0); }
  Seed& Wait() { return u8(kWait).u8(0); }
  Seed& Consume(uint8_t n) { return u8(kConsume).u8(n).u8(0); }
  Seed& Op(Action a) { return u8(a); }
  const std::string& str() const { return out_; }

 private:
  Seed& Put(uint64_t v, int k) {
    for (int i = 0; i < k; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  std::string out_;
};

void WriteSeeds(const std::string& dir) {
  auto write = [&](const std::string& name, const Seed& s) {
    std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
    out.write(s.str().data(), static_cast<std::streamsize>(s.str().size()));
    FUZZ_CHECK(out.good());
  };
  const std::string meta(40, '\x0a');  // Bytes of a protobuf; the fake does not parse.
  {
    // Saves and loads on a small ring, read back, with the sibling.
    Seed s;
    s.Valid(kValid | kWithSibling, 64, 2, 0, 1024, 256);
    s.Prepare(0).Sqe(ring::kOpSave, ring::kSavePin, meta, 0, 0, 0, false);
    s.Prepare(1).Sqe(ring::kOpLoad, ring::kLoadWantMeta, meta, 0, 0, 100, true);
    s.Prepare(2).Sqe(ring::kOpLoad, 0, meta, 3, 0, 0, false);
    s.Prepare(3).Sqe(ring::kOpNop, 0, "", 0, 0, 0, false);
    s.Advance(4).Wait().Consume(4);
    s.Prepare(0).Sqe(ring::kOpSave, 0, meta, 2, 5, 40, false);
    s.Advance(1).Wait().Consume(1);
    write("small_save_load", s);
  }
  {
    // Acquire (two ids, then ids that are not whole), Release.
    Seed s;
    s.Valid(kValid, 64, 2, 0, 1024, 256);
    s.Prepare(0).Sqe(ring::kOpAcquire, ring::kAcquireAll, std::string(32, '\x22'), 0, 0, 2, true);
    s.Prepare(1).Sqe(ring::kOpAcquire, 0, std::string(20, '\x22'), 0, 0, 0, false);
    s.Prepare(2).Sqe(ring::kOpRelease, 0, "", 0, 5, 40, false);
    s.Advance(3).Wait().Consume(3);
    write("acquire_release", s);
  }
  {
    // A batch on a larger ring: errors with long messages, meta over msg_bytes.
    Seed s;
    s.Valid(kValid, 16, 6, 1, 4096, 1024);
    for (int i = 0; i < 8; ++i) {
      s.Prepare(static_cast<uint8_t>(i)).Sqe(i % 2 ? ring::kOpLoad : ring::kOpSave, ring::kLoadWantMeta, meta,
                       static_cast<uint16_t>(i % 3), static_cast<uint8_t>(i % 3 == 0 ? 13 : 0),
                       static_cast<uint16_t>(900 + 100 * i), i % 2 == 1);
    }
    s.Prepare(8).Sqe(ring::kOpLoad, ring::kLoadWantMeta, meta, 0, 0, 0, true, 2);
    s.Advance(9).Op(kClientSleep).Wait().Consume(9);
    write("batch_errors_long", s);
  }
  {
    // Back-pressure: more submitted than the completion queue holds.
    Seed s;
    s.Valid(kValid, 64, 2, 0, 256, 256);
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < 4; ++i) {
        s.Prepare(static_cast<uint8_t>(i)).Sqe(ring::kOpSave, 0, meta, 0, 0, 0, false);
      }
      s.Advance(4).Wait();
    }
    s.Consume(2).Wait().Consume(4);
    write("back_pressure", s);
  }
  {
    // Entries the daemon's check refuses.
    Seed s;
    s.Valid(kValid, 64, 3, 0, 512, 256);
    s.Prepare(0).RawSqe(9, 0, 0, 0);
    s.Prepare(1).RawSqe(ring::kOpSave, 0, 1024, 0);
    s.Prepare(2).RawSqe(ring::kOpLoad, 0, 10, 20);
    s.Prepare(3).RawSqe(ring::kOpLoad, 5000, 512, 0);
    s.Prepare(4).RawSqe(ring::kOpSave, 20, 512, 40);
    s.Advance(5).Wait().Consume(5);
    // Near misses: meta_len one past arg_len; one slice too many.
    s.Prepare(0).u8(kConsistent | kKnownOp | kNearMiss).u8(ring::kOpSave).u8(0).u16(0).u32(0)
        .u32(16).u32(0).u64(0).u64(0).u64(0).bytes(std::string(16, '\0')).u16(0).u8(0)
        .u8(1).u8(0).u8(0).u8(0).u16(0).u32(0).u64(0).u64(0).u32(0);
    s.Prepare(1).u8(kConsistent | kKnownOp | kNearMiss).u8(ring::kOpLoad).u8(0).u16(0).u32(0)
        .u32(24).u32(0).u64(0).u64(0).u64(0).bytes(std::string(16, '\0')).u16(0).u8(0)
        .u8(0).u8(1).u8(0).u8(0).u16(0).u32(0).u64(0).u64(0).u32(0);
    s.Advance(2).Wait().Consume(2);
    write("bad_entries", s);
  }
  {
    // A client that moves sq_tail far ahead, with the sibling.
    Seed s;
    s.Valid(kValid | kWithSibling, 64, 2, 0, 1024, 256);
    s.Prepare(0).Sqe(ring::kOpSave, 0, meta, 0, 0, 0, false);
    s.Advance(1).Wait();
    s.u8(kHostileTail).u8(3).u32(0);
    s.Op(kWake).u8(kWait).u8(5).Consume(2);
    write("hostile_tail", s);
  }
  {
    // A client that moves cq_head past cq_tail.
    Seed s;
    s.Valid(kValid, 64, 2, 1, 1024, 256);
    s.Prepare(0).Sqe(ring::kOpLoad, 0, meta, 0, 0, 0, false);
    s.Advance(1).Wait();
    s.u8(kHostileHead).u8(3).u32(0);
    s.Prepare(0).Sqe(ring::kOpLoad, 0, meta, 0, 0, 0, false);
    s.Advance(1).u8(kWait).u8(5);
    write("hostile_head", s);
  }
  {
    // Attach again while the first ring runs and after another ended.
    Seed s;
    s.Valid(kValid | kWithSibling | kTightLimits, 64, 2, 0, 1024, 256);
    s.Prepare(0).Sqe(ring::kOpSave, 0, meta, 0, 0, 0, false);
    s.Advance(1).Wait().u8(kReattach).u8(0).u8(kReattach).u8(2);
    write("reattach", s);
  }
  {
    // The header changed after attach; wake words flipped.
    Seed s;
    s.Valid(kValid, 8, 1, 0, 256, 256);
    s.u8(kRewrite).u8(2).u32(0).u8(kWakeWord).u8(0).u32(0);
    s.Prepare(0).Sqe(ring::kOpSave, 0, meta, 1, 0, 0, false);
    s.Advance(1).Wait().Consume(1);
    write("rewrite_header", s);
  }
  // Headers with one field spoiled, and raw.
  const char* names[] = {"magic", "version", "sq",   "cq",     "arg",
                         "msg",   "short",   "size", "indices", "sq_double"};
  for (uint8_t which = 0; which < 10; ++which) {
    Seed s;
    s.Valid(kSpoiled, 64, 2, 0, 1024, 256).Spoil(which, which == 9 ? 1 : 3);
    write(absl::StrCat("spoiled_", names[which]), s);
  }
  {
    Seed s;
    s.u8(kRaw).u8(0).u32(1 << 20).u8(3).u64(0).u32(0).u32(8).u32(8).u32(512).u32(512).u8(0);
    s.u32(0).u32(0).u32(0).u32(0);
    s.Prepare(0).Sqe(ring::kOpSave, 0, meta, 0, 0, 0, false).Advance(1).Wait();
    write("raw_valid", s);
  }
}

// The inputs of bugs found, one each, as fuzz/regressions/fuzz_ring/ keeps
// them (EVOKE_FUZZ_RING_REGRESSIONS=<dir>).
void WriteRegressions(const std::string& dir) {
  auto write = [&](const std::string& name, const Seed& s) {
    std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
    out.write(s.str().data(), static_cast<std::streamsize>(s.str().size()));
    FUZZ_CHECK(out.good());
  };
  {
    // Ring A's owner goes and its thread ends, unjoined; then an Attach of
    // the sibling's key (a header that validates) is refused
    // (FAILED_PRECONDITION) and destroys A's joinable std::thread:
    // std::terminate. Needs EVOKE_FUZZ_STRICT=1 until RingSet::Attach joins
    // on every path.
    Seed s;
    s.Valid(kValid | kWithSibling, 64, 2, 0, 1024, 256);
    s.Op(kOwnerGone).u8(kWait).u8(16 | 15).u8(kWait).u8(16 | 15);
    s.u8(kReattach).u8(1);
    write("attach-refused-after-ring-ended", s);
  }
}

}  // namespace
}  // namespace evoke

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // A broken ring logs a warning; thousands a second would drown the output.
  evoke::SetLogLevel(evoke::LogLevel::kError);
  // The client's short sleeps and the ring threads' futex timeouts (which
  // inherit this) would otherwise each last 50 us more.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  const char* strict = getenv("EVOKE_FUZZ_STRICT");
  evoke::strict = strict != nullptr && std::string(strict) == "1";
  evoke::verbose = getenv("EVOKE_FUZZ_RING_VERBOSE") != nullptr;
  if (const char* dir = getenv("EVOKE_FUZZ_RING_SEEDS")) {
    evoke::WriteSeeds(dir);
    exit(0);
  }
  if (const char* dir = getenv("EVOKE_FUZZ_RING_REGRESSIONS")) {
    evoke::WriteRegressions(dir);
    exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (64u << 10)) return 0;
  return evoke::RunOne(data, size);
}
