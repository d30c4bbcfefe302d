// gpu/transfer_plan.h: plan builders, the ordering check and the simulator.
// Host code only; shared by the CUDA and the CPU builds.
#include "gpu/transfer_plan.h"

#include <algorithm>
#include <deque>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"

namespace evoke {
namespace {

using Plan = TransferPlan;

// StepBuilder appends steps and keeps the plan's counts in step.
struct StepBuilder {
  Plan& plan;

  void Copy(int stream, size_t begin, size_t end) {
    if (begin < end) plan.steps.push_back({StepKind::kCopy, stream, begin, end, -1});
  }
  void Checksum(int stream, size_t begin, size_t end) {
    if (begin < end) plan.steps.push_back({StepKind::kChecksum, stream, begin, end, -1});
  }
  void Reanchor(int stream, size_t begin, size_t end) {
    if (begin < end) plan.steps.push_back({StepKind::kReanchor, stream, begin, end, -1});
  }
  int Record(int stream) {
    const int e = plan.events++;
    plan.steps.push_back({StepKind::kRecord, stream, 0, 0, e});
    return e;
  }
  void Wait(int stream, int event) {
    plan.steps.push_back({StepKind::kWait, stream, 0, 0, event});
  }
};

int CopyStream(const PipelineOptions& options, size_t k) {
  return Plan::kFirstCopyStream + static_cast<int>(k % static_cast<size_t>(options.copy_streams));
}

// Groups plan.copies[first, end) into copy steps of about `group_bytes` (at
// most max_batch_ops pieces each), on the copy streams in turn from
// `*next_stream`.
void GroupCopies(Plan& plan, size_t first, uint64_t group_bytes, const PipelineOptions& options,
                 size_t* next_stream) {
  StepBuilder b{plan};
  const size_t end = plan.copies.size();
  size_t begin = first;
  uint64_t bytes = 0;
  for (size_t i = first; i < end; ++i) {
    bytes += plan.copies[i].bytes;
    if (bytes >= group_bytes || i + 1 - begin >= static_cast<size_t>(options.max_batch_ops) ||
        i + 1 == end) {
      b.Copy(CopyStream(options, (*next_stream)++), begin, i + 1);
      begin = i + 1;
      bytes = 0;
    }
  }
}

// Appends the pieces of one copy, cut at multiples of `piece` from its start.
void Cut(Plan& plan, const CopyOp& op, uint64_t piece) {
  for (uint64_t off = 0; off < op.bytes; off += piece) {
    plan.copies.push_back(CopyOp{static_cast<char*>(op.dst) + off,
                                 static_cast<const char*>(op.src) + off,
                                 std::min(piece, op.bytes - off)});
  }
}

// Appends the device checksum ranges of chunks [first_chunk, last_chunk) of
// a block at `device` (total `bytes`), and records them in `index`.
void AddRanges(Plan& plan, const void* device, uint64_t bytes, uint64_t first_chunk,
               uint64_t last_chunk, std::vector<int64_t>& index) {
  for (uint64_t j = first_chunk; j < last_chunk; ++j) {
    const uint64_t off = j * kChecksumChunkBytes;
    const uint64_t n = std::min<uint64_t>(kChecksumChunkBytes, bytes - off);
    if (n < kDeviceChecksumMinBytes) continue;  // Hashed on the host.
    index[j] = static_cast<int64_t>(plan.ranges.size());
    plan.ranges.push_back(DeviceRange{static_cast<const uint8_t*>(device) + off, n});
  }
}

uint64_t ChunksOf(uint64_t bytes) {
  return (bytes + kChecksumChunkBytes - 1) / kChecksumChunkBytes;
}

}  // namespace

absl::Status CheckPipelineOptions(const PipelineOptions& o) {
  if (o.chunk_bytes == 0 || o.chunk_bytes % kChecksumChunkBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_bytes: ", o.chunk_bytes, " is not a positive multiple of ", kChecksumChunkBytes));
  }
  if (o.split_bytes == 0) return absl::InvalidArgumentError("split_bytes: must be > 0");
  if (o.copy_streams < 1 || o.copy_streams > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy_streams: ", o.copy_streams, " is outside [1, 8]"));
  }
  if (o.max_batch_ops < 1) return absl::InvalidArgumentError("max_batch_ops: must be >= 1");
  return absl::OkStatus();
}

size_t TransferPlan::copy_steps() const { return steps_of(StepKind::kCopy); }

size_t TransferPlan::steps_of(StepKind kind) const {
  return static_cast<size_t>(
      std::count_if(steps.begin(), steps.end(), [&](const PlanStep& s) { return s.kind == kind; }));
}

TransferPlan PlanCopies(absl::Span<const CopyOp> ops, CopyDirection direction,
                        const PipelineOptions& options) {
  Plan plan;
  plan.direction = direction;
  plan.streams = Plan::kFirstCopyStream + options.copy_streams;
  for (const CopyOp& op : CoalesceCopies(ops)) Cut(plan, op, options.split_bytes);
  size_t next_stream = 0;
  GroupCopies(plan, 0, options.split_bytes, options, &next_stream);
  return plan;
}

TransferPlan PlanFetch(absl::Span<const FetchBlock> blocks, const PipelineOptions& options) {
  std::vector<CopyOp> ops;
  ops.reserve(blocks.size());
  for (const FetchBlock& b : blocks) ops.push_back(CopyOp{b.host_dst, b.device_src, b.bytes});
  Plan plan = PlanCopies(ops, CopyDirection::kToHost, options);
  plan.chunk_index.resize(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const FetchBlock& b = blocks[i];
    if (!b.checksum || b.bytes == 0) continue;
    plan.chunk_index[i].assign(ChunksOf(b.bytes), -1);
    AddRanges(plan, b.device_src, b.bytes, 0, ChunksOf(b.bytes), plan.chunk_index[i]);
  }
  // The checksum launch is issued first: it runs on the SMs while the copy
  // engines move the bytes, and reads only what the copies read.
  if (!plan.ranges.empty()) {
    plan.steps.insert(plan.steps.begin(), PlanStep{StepKind::kChecksum, Plan::kChecksumStream, 0,
                                                   plan.ranges.size(), -1});
  }
  return plan;
}

absl::StatusOr<TransferPlan> PlanLanding(absl::Span<const LandingBlock> blocks,
                                         const PipelineOptions& options) {
  if (absl::Status s = CheckPipelineOptions(options); !s.ok()) return s;
  Plan plan;
  plan.direction = CopyDirection::kToDevice;
  plan.streams = Plan::kFirstCopyStream + options.copy_streams;
  plan.chunk_index.resize(blocks.size());
  bool device_work = false;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const LandingBlock& b = blocks[i];
    if (b.reanchor != nullptr) {
      if (b.reanchor->device_payload != b.device_dst || b.reanchor->payload_bytes > b.bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "blocks[", i, "].reanchor: must re-anchor the block's own destination (",
            b.reanchor->payload_bytes, " of ", b.bytes, " bytes)"));
      }
      device_work = true;
    }
    if (b.verify && b.bytes > 0) {
      plan.chunk_index[i].assign(ChunksOf(b.bytes), -1);
      device_work = true;
    }
  }
  // Pieces: each block cut at multiples of chunk_bytes from its own start,
  // so that its checksum chunks never straddle two pieces. Grouped in order.
  struct Piece {
    size_t block;
    uint64_t offset;
    uint64_t bytes;
  };
  std::vector<Piece> pieces;
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (uint64_t off = 0; off < blocks[i].bytes; off += options.chunk_bytes) {
      pieces.push_back(Piece{i, off, std::min(options.chunk_bytes, blocks[i].bytes - off)});
    }
  }
  StepBuilder b{plan};
  size_t group = 0;
  for (size_t first = 0; first < pieces.size(); ++group) {
    size_t last = first;
    uint64_t bytes = 0;
    while (last < pieces.size() && bytes < options.chunk_bytes &&
           last - first < static_cast<size_t>(options.max_batch_ops)) {
      bytes += pieces[last++].bytes;
    }
    // The group's copy: one batched copy step on the next copy stream.
    const size_t copy_begin = plan.copies.size();
    for (size_t k = first; k < last; ++k) {
      const Piece& p = pieces[k];
      const LandingBlock& lb = blocks[p.block];
      plan.copies.push_back(CopyOp{static_cast<uint8_t*>(lb.device_dst) + p.offset,
                                   static_cast<const uint8_t*>(lb.host_src) + p.offset, p.bytes});
    }
    const int copy_stream = CopyStream(options, group);
    b.Copy(copy_stream, copy_begin, plan.copies.size());
    if (device_work) {
      // Verification: the checksum stream hashes the group's chunks once
      // they have landed. It waits for every group, so that it is ordered
      // behind all the copies so far (re-anchoring relies on it).
      const int landed = b.Record(copy_stream);
      b.Wait(Plan::kChecksumStream, landed);
      const size_t range_begin = plan.ranges.size();
      std::vector<size_t> finished;  // Blocks whose last piece is in this group.
      for (size_t k = first; k < last; ++k) {
        const Piece& p = pieces[k];
        const LandingBlock& lb = blocks[p.block];
        if (lb.verify) {
          const uint64_t c0 = p.offset / kChecksumChunkBytes;
          AddRanges(plan, lb.device_dst, lb.bytes, c0, c0 + ChunksOf(p.bytes),
                    plan.chunk_index[p.block]);
        }
        if (p.offset + p.bytes == lb.bytes && lb.reanchor != nullptr) finished.push_back(p.block);
      }
      b.Checksum(Plan::kChecksumStream, range_begin, plan.ranges.size());
      if (!finished.empty()) {
        // Re-anchoring rotates K in place: only after every chunk of the
        // block has been hashed (verification sees the stored bytes), on its
        // own stream so that the next group's hashing is not held up.
        const int hashed = b.Record(Plan::kChecksumStream);
        b.Wait(Plan::kReanchorStream, hashed);
        const size_t job_begin = plan.jobs.size();
        for (size_t i : finished) plan.jobs.push_back(*blocks[i].reanchor);
        b.Reanchor(Plan::kReanchorStream, job_begin, plan.jobs.size());
      }
    }
    first = last;
  }
  return plan;
}

std::vector<uint64_t> FinishChecksums(const TransferPlan& plan, absl::Span<const uint64_t> sums,
                                      absl::Span<const uint8_t* const> host_bytes,
                                      absl::Span<const uint64_t> sizes) {
  std::vector<uint64_t> out(plan.chunk_index.size(), 0);
  std::vector<uint64_t> chunks;
  for (size_t i = 0; i < plan.chunk_index.size(); ++i) {
    const std::vector<int64_t>& index = plan.chunk_index[i];
    if (index.empty()) continue;
    chunks.assign(index.size(), 0);
    for (size_t j = 0; j < index.size(); ++j) {
      if (index[j] >= 0) {
        chunks[j] = sums[static_cast<size_t>(index[j])];
      } else {
        const uint64_t off = j * kChecksumChunkBytes;
        chunks[j] = ChunkChecksum(host_bytes[i] + off,
                                  std::min<uint64_t>(kChecksumChunkBytes, sizes[i] - off));
      }
    }
    out[i] = CombineChunkChecksums(chunks, sizes[i]);
  }
  return out;
}

std::vector<uint64_t> BlockChecksums(const TransferPlan& plan, absl::Span<const uint64_t> sums,
                                     absl::Span<const FetchBlock> blocks) {
  std::vector<const uint8_t*> host(blocks.size());
  std::vector<uint64_t> sizes(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    host[i] = static_cast<const uint8_t*>(blocks[i].host_dst);
    sizes[i] = blocks[i].bytes;
  }
  return FinishChecksums(plan, sums, host, sizes);
}

std::vector<uint64_t> BlockChecksums(const TransferPlan& plan, absl::Span<const uint64_t> sums,
                                     absl::Span<const LandingBlock> blocks) {
  std::vector<const uint8_t*> host(blocks.size());
  std::vector<uint64_t> sizes(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    host[i] = static_cast<const uint8_t*>(blocks[i].host_src);
    sizes[i] = blocks[i].bytes;
  }
  return FinishChecksums(plan, sums, host, sizes);
}

namespace {

// One memory access of a step.
struct Access {
  uintptr_t begin;
  uintptr_t end;
  bool write;
  size_t step;
};

void AccessesOf(const TransferPlan& plan, size_t s, std::vector<Access>* out) {
  const PlanStep& step = plan.steps[s];
  auto add = [&](const void* p, uint64_t n, bool write) {
    if (n == 0) return;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    out->push_back(Access{a, a + n, write, s});
  };
  switch (step.kind) {
    case StepKind::kCopy:
      for (size_t k = step.begin; k < step.end; ++k) {
        add(plan.copies[k].dst, plan.copies[k].bytes, true);
        add(plan.copies[k].src, plan.copies[k].bytes, false);
      }
      break;
    case StepKind::kChecksum:
      for (size_t k = step.begin; k < step.end; ++k) {
        add(plan.ranges[k].ptr, plan.ranges[k].bytes, false);
      }
      break;
    case StepKind::kReanchor:
      for (size_t k = step.begin; k < step.end; ++k) {
        add(plan.jobs[k].device_payload, plan.jobs[k].payload_bytes, true);
      }
      break;
    case StepKind::kRecord:
    case StepKind::kWait:
      break;
  }
}

const char* KindName(StepKind k) {
  switch (k) {
    case StepKind::kCopy: return "copy";
    case StepKind::kChecksum: return "checksum";
    case StepKind::kReanchor: return "reanchor";
    case StepKind::kRecord: return "record";
    case StepKind::kWait: return "wait";
  }
  return "?";
}

}  // namespace

absl::Status CheckPlanOrdering(const TransferPlan& plan) {
  const size_t n_streams = static_cast<size_t>(plan.streams);
  // Vector clocks: clock[s] is what stream s has seen of every stream; a
  // step's stamp is its stream's clock once it is issued.
  std::vector<std::vector<uint64_t>> clock(n_streams, std::vector<uint64_t>(n_streams, 0));
  std::vector<std::vector<uint64_t>> recorded(static_cast<size_t>(plan.events));
  std::vector<std::vector<uint64_t>> stamp(plan.steps.size());
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const PlanStep& step = plan.steps[s];
    if (step.stream < 0 || static_cast<size_t>(step.stream) >= n_streams) {
      return absl::InternalError(absl::StrCat("steps[", s, "]: stream ", step.stream,
                                              " outside the plan's ", n_streams));
    }
    std::vector<uint64_t>& c = clock[static_cast<size_t>(step.stream)];
    if (step.kind == StepKind::kRecord || step.kind == StepKind::kWait) {
      if (step.event < 0 || step.event >= plan.events) {
        return absl::InternalError(absl::StrCat("steps[", s, "]: event ", step.event,
                                                " outside the plan's ", plan.events));
      }
    }
    if (step.kind == StepKind::kWait) {
      const std::vector<uint64_t>& r = recorded[static_cast<size_t>(step.event)];
      if (r.empty()) {
        return absl::InternalError(absl::StrCat("steps[", s, "]: waits for event ", step.event,
                                                ", which no earlier step records"));
      }
      for (size_t k = 0; k < n_streams; ++k) c[k] = std::max(c[k], r[k]);
    }
    ++c[static_cast<size_t>(step.stream)];
    stamp[s] = c;
    if (step.kind == StepKind::kRecord) {
      if (!recorded[static_cast<size_t>(step.event)].empty()) {
        return absl::InternalError(
            absl::StrCat("steps[", s, "]: records event ", step.event, " a second time"));
      }
      recorded[static_cast<size_t>(step.event)] = c;
    }
  }
  auto before = [&](size_t a, size_t b) {  // a happens before b (a issued first)
    const size_t sa = static_cast<size_t>(plan.steps[a].stream);
    return stamp[a][sa] <= stamp[b][sa];
  };
  std::vector<Access> accesses;
  for (size_t s = 0; s < plan.steps.size(); ++s) AccessesOf(plan, s, &accesses);
  std::sort(accesses.begin(), accesses.end(),
            [](const Access& x, const Access& y) { return x.begin < y.begin; });
  for (size_t i = 0; i < accesses.size(); ++i) {
    for (size_t j = i + 1; j < accesses.size() && accesses[j].begin < accesses[i].end; ++j) {
      const Access& x = accesses[i];
      const Access& y = accesses[j];
      if (x.step == y.step || (!x.write && !y.write)) continue;
      const size_t a = std::min(x.step, y.step), b = std::max(x.step, y.step);
      if (before(a, b)) continue;
      return absl::InternalError(absl::StrCat(
          "steps[", a, "] (", KindName(plan.steps[a].kind), ", stream ", plan.steps[a].stream,
          ") and steps[", b, "] (", KindName(plan.steps[b].kind), ", stream ",
          plan.steps[b].stream, ") touch [0x", absl::Hex(std::max(x.begin, y.begin)), ", 0x",
          absl::Hex(std::min(x.end, y.end)), ") unordered, one of them writing"));
    }
  }
  return absl::OkStatus();
}

absl::Status SimulatePlan(const TransferPlan& plan, uint64_t seed,
                          const std::function<absl::Status(const PlanStep&)>& run) {
  std::vector<std::deque<size_t>> queues(static_cast<size_t>(std::max(plan.streams, 1)));
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const int stream = plan.steps[s].stream;
    if (stream < 0 || stream >= plan.streams) {
      return absl::InternalError(absl::StrCat("steps[", s, "]: stream ", stream, " out of range"));
    }
    queues[static_cast<size_t>(stream)].push_back(s);
  }
  // Events: recorded[e] once the step recording it has run. A wait binds to
  // the record issued before it (CUDA's semantics); a plan whose wait comes
  // before its record would wait for nothing on a real device, so it is an
  // error here.
  std::vector<size_t> record_step(static_cast<size_t>(plan.events), plan.steps.size());
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const PlanStep& step = plan.steps[s];
    if (step.kind == StepKind::kRecord && step.event >= 0 && step.event < plan.events) {
      record_step[static_cast<size_t>(step.event)] = s;
    }
    if (step.kind == StepKind::kWait &&
        (step.event < 0 || step.event >= plan.events ||
         record_step[static_cast<size_t>(step.event)] > s)) {
      return absl::InternalError(
          absl::StrCat("steps[", s, "]: waits for event ", step.event, " not recorded before"));
    }
  }
  std::vector<bool> recorded(static_cast<size_t>(plan.events), false);
  std::mt19937_64 rng(seed);
  std::vector<size_t> ready;
  while (true) {
    ready.clear();
    bool left = false;
    for (size_t q = 0; q < queues.size(); ++q) {
      if (queues[q].empty()) continue;
      left = true;
      const PlanStep& head = plan.steps[queues[q].front()];
      if (head.kind == StepKind::kWait && !recorded[static_cast<size_t>(head.event)]) continue;
      ready.push_back(q);
    }
    if (!left) return absl::OkStatus();
    if (ready.empty()) return absl::InternalError("the plan deadlocks: every stream waits");
    const size_t q = ready[rng() % ready.size()];
    const PlanStep& step = plan.steps[queues[q].front()];
    queues[q].pop_front();
    if (step.kind == StepKind::kRecord) {
      recorded[static_cast<size_t>(step.event)] = true;
    } else if (step.kind != StepKind::kWait) {
      if (absl::Status s = run(step); !s.ok()) return s;
    }
  }
}

}  // namespace evoke
