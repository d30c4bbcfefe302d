#include "testing/memory_tier.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace evoke::testing {

absl::string_view TierOpName(TierOp op) {
  switch (op) {
    case TierOp::kPut:
      return "Put";
    case TierOp::kDropPayloads:
      return "DropPayloads";
    case TierOp::kDelete:
      return "Delete";
    case TierOp::kRead:
      return "Read";
    case TierOp::kForEachRecord:
      return "ForEachRecord";
    case TierOp::kPersist:
      return "Persist";
  }
  return "?";
}

namespace {

struct Entry {
  std::string record;                  // Serialized storage::SpillRecord.
  std::optional<std::string> payload;  // Absent for a breadcrumb.
  uint64_t bytes() const { return record.size() + (payload ? payload->size() : 0); }
};

struct Fault {
  int remaining = 0;  // -1: every call.
  absl::Status status;
};

int Index(TierOp op) { return static_cast<int>(op); }

}  // namespace

struct MemoryTier::State {
  explicit State(MemoryTierOptions o) : options(std::move(o)) {}
  const MemoryTierOptions options;

  mutable absl::Mutex mu;
  std::map<BlockId, Entry> blocks ABSL_GUARDED_BY(mu);  // Id order == key order.
  uint64_t used ABSL_GUARDED_BY(mu) = 0;
  uint64_t capacity ABSL_GUARDED_BY(mu) = options.capacity_bytes;
  std::array<Fault, kTierOpCount> faults ABSL_GUARDED_BY(mu);
  std::array<absl::Duration, kTierOpCount> delays ABSL_GUARDED_BY(mu){};
  std::optional<std::pair<size_t, absl::Status>> torn ABSL_GUARDED_BY(mu);
  Counters counters ABSL_GUARDED_BY(mu);

  // Enter counts a call of `op`, sleeps its delay and returns its injected
  // failure, if any. Takes mu itself.
  absl::Status Enter(TierOp op) {
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu);
      ++counters.calls[Index(op)];
      delay = delays[Index(op)];
    }
    if (delay > absl::ZeroDuration()) absl::SleepFor(delay);
    absl::MutexLock lock(&mu);
    Fault& f = faults[Index(op)];
    if (f.remaining == 0) return absl::OkStatus();
    if (f.remaining > 0) --f.remaining;
    ++counters.failed[Index(op)];
    return f.status;
  }

  void Store(const BlockId& id, Entry entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = blocks.find(id);
    if (it != blocks.end()) used -= it->second.bytes();
    used += entry.bytes();
    blocks[id] = std::move(entry);
  }
};

MemoryTier::MemoryTier(MemoryTierOptions options)
    : state_(std::make_shared<State>(std::move(options))) {}
MemoryTier::MemoryTier(std::shared_ptr<State> state) : state_(std::move(state)) {}
MemoryTier::~MemoryTier() = default;

std::unique_ptr<MemoryTier> MemoryTier::Share() const {
  return std::unique_ptr<MemoryTier>(new MemoryTier(state_));
}

absl::string_view MemoryTier::name() const { return state_->options.name; }
TierLevel MemoryTier::level() const { return state_->options.level; }

absl::Status MemoryTier::Put(absl::Span<const TierWrite> writes, bool sync) {
  if (absl::Status s = state_->Enter(TierOp::kPut); !s.ok()) return s;
  // Serialize outside the lock; later writes of one id win, as in a batch.
  std::vector<std::pair<BlockId, Entry>> staged;
  staged.reserve(writes.size());
  for (size_t i = 0; i < writes.size(); ++i) {
    const TierWrite& w = writes[i];
    if (w.record == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("writes[", i, "].record: is null"));
    }
    storage::SpillRecord record = *w.record;
    record.set_payload_present(!w.payload.empty());
    Entry e;
    record.SerializeToString(&e.record);
    if (!w.payload.empty()) e.payload = std::string(w.payload);
    staged.emplace_back(w.id, std::move(e));
  }
  absl::MutexLock lock(&state_->mu);
  size_t apply = staged.size();
  absl::Status torn_status;
  if (state_->torn) {
    apply = std::min(apply, state_->torn->first);
    torn_status = std::move(state_->torn->second);
    state_->torn.reset();
  }
  // Room for what would be applied, counted as the store would end up.
  std::map<BlockId, uint64_t> final_bytes;
  for (size_t i = 0; i < apply; ++i) final_bytes[staged[i].first] = staged[i].second.bytes();
  uint64_t after = state_->used;
  for (const auto& [id, bytes] : final_bytes) {
    auto it = state_->blocks.find(id);
    if (it != state_->blocks.end()) after -= it->second.bytes();
    after += bytes;
  }
  if (after > state_->capacity) {
    ++state_->counters.failed[Index(TierOp::kPut)];
    return absl::ResourceExhaustedError(absl::StrCat(
        state_->options.name, ": no space (", after, " bytes needed, capacity ",
        state_->capacity, ")"));
  }
  for (size_t i = 0; i < apply; ++i) {
    state_->Store(staged[i].first, std::move(staged[i].second));
    ++state_->counters.blocks_written;
  }
  if (!torn_status.ok()) {
    ++state_->counters.failed[Index(TierOp::kPut)];
    return torn_status;
  }
  if (sync) ++state_->counters.synced_puts;
  return absl::OkStatus();
}

absl::Status MemoryTier::DropPayloads(absl::Span<const TierWrite> breadcrumbs) {
  if (absl::Status s = state_->Enter(TierOp::kDropPayloads); !s.ok()) return s;
  std::vector<std::pair<BlockId, Entry>> staged;
  staged.reserve(breadcrumbs.size());
  for (size_t i = 0; i < breadcrumbs.size(); ++i) {
    const TierWrite& w = breadcrumbs[i];
    if (w.record == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("breadcrumbs[", i, "].record: is null"));
    }
    storage::SpillRecord record = *w.record;
    record.set_payload_present(false);
    Entry e;
    record.SerializeToString(&e.record);
    staged.emplace_back(w.id, std::move(e));
  }
  absl::MutexLock lock(&state_->mu);
  for (auto& [id, e] : staged) {
    state_->Store(id, std::move(e));
    ++state_->counters.payloads_dropped;
  }
  return absl::OkStatus();
}

absl::Status MemoryTier::Delete(absl::Span<const BlockId> ids) {
  if (absl::Status s = state_->Enter(TierOp::kDelete); !s.ok()) return s;
  absl::MutexLock lock(&state_->mu);
  for (const BlockId& id : ids) {
    auto it = state_->blocks.find(id);
    if (it == state_->blocks.end()) continue;
    state_->used -= it->second.bytes();
    state_->blocks.erase(it);
  }
  return absl::OkStatus();
}

absl::Status MemoryTier::Read(
    const BlockId& id,
    const std::function<absl::Status(const storage::SpillRecord& record,
                                     absl::string_view payload)>& consume) {
  if (absl::Status s = state_->Enter(TierOp::kRead); !s.ok()) return s;
  std::string record_bytes;
  std::string payload;
  {
    // One consistent copy; `consume` runs without the lock.
    absl::MutexLock lock(&state_->mu);
    auto it = state_->blocks.find(id);
    if (it == state_->blocks.end() || !it->second.payload) {
      return absl::NotFoundError(absl::StrCat("block ", id.ToHex(), " has no payload in ",
                                              state_->options.name));
    }
    record_bytes = it->second.record;
    payload = *it->second.payload;
  }
  storage::SpillRecord record;
  if (!record.ParseFromString(record_bytes)) {
    return absl::DataLossError(absl::StrCat(state_->options.name, ": record of ",
                                            id.ToHex(), " is unreadable"));
  }
  return consume(record, payload);
}

absl::Status MemoryTier::ForEachRecord(const RecordVisitor& visit,
                                       std::vector<std::string>* skipped) {
  if (absl::Status s = state_->Enter(TierOp::kForEachRecord); !s.ok()) return s;
  std::vector<std::pair<BlockId, std::string>> records;
  {
    absl::MutexLock lock(&state_->mu);
    records.reserve(state_->blocks.size());
    for (const auto& [id, e] : state_->blocks) records.emplace_back(id, e.record);
  }
  for (const auto& [id, bytes] : records) {
    storage::SpillRecord record;
    if (!record.ParseFromString(bytes)) {
      if (skipped != nullptr) {
        skipped->push_back(absl::StrCat("unreadable record of ", id.ToHex()));
      }
      continue;
    }
    if (absl::Status s = visit(id, record); !s.ok()) return s;
  }
  return absl::OkStatus();
}

uint64_t MemoryTier::UsedBytes() {
  absl::MutexLock lock(&state_->mu);
  return state_->used;
}

absl::Status MemoryTier::Persist() { return state_->Enter(TierOp::kPersist); }

void MemoryTier::FailNext(TierOp op, int n, absl::Status status) {
  absl::MutexLock lock(&state_->mu);
  state_->faults[Index(op)] = Fault{n < 0 ? 0 : n, std::move(status)};
}

void MemoryTier::FailAlways(TierOp op, absl::Status status) {
  absl::MutexLock lock(&state_->mu);
  state_->faults[Index(op)] = Fault{-1, std::move(status)};
}

void MemoryTier::TearNextPut(size_t applied, absl::Status status) {
  absl::MutexLock lock(&state_->mu);
  if (status.ok()) status = absl::UnavailableError("injected: torn write");
  state_->torn.emplace(applied, std::move(status));
}

void MemoryTier::SetDelay(TierOp op, absl::Duration delay) {
  absl::MutexLock lock(&state_->mu);
  state_->delays[Index(op)] = delay;
}

void MemoryTier::ClearFaults() {
  absl::MutexLock lock(&state_->mu);
  state_->faults = {};
  state_->delays = {};
  state_->torn.reset();
}

void MemoryTier::SetCapacity(uint64_t bytes) {
  absl::MutexLock lock(&state_->mu);
  state_->capacity = bytes;
}

absl::Status MemoryTier::CorruptPayload(const BlockId& id, uint64_t offset, int bit) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->blocks.find(id);
  if (it == state_->blocks.end() || !it->second.payload) {
    return absl::NotFoundError(absl::StrCat("block ", id.ToHex(), " has no payload"));
  }
  std::string& p = *it->second.payload;
  if (offset >= p.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("offset: ", offset, " is past the payload (", p.size(), " bytes)"));
  }
  p[offset] = static_cast<char>(static_cast<uint8_t>(p[offset]) ^ (1u << (bit & 7)));
  return absl::OkStatus();
}

absl::Status MemoryTier::CorruptRecord(const BlockId& id) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->blocks.find(id);
  if (it == state_->blocks.end()) {
    return absl::NotFoundError(absl::StrCat("block ", id.ToHex(), " has no record"));
  }
  Entry e = it->second;
  // A truncated length-delimited field: the parser runs out of input.
  e.record = std::string("\x0a\x7f", 2);
  state_->Store(id, std::move(e));
  return absl::OkStatus();
}

MemoryTier::Counters MemoryTier::counters() const {
  absl::MutexLock lock(&state_->mu);
  return state_->counters;
}

void MemoryTier::ResetCounters() {
  absl::MutexLock lock(&state_->mu);
  state_->counters = {};
}

std::vector<BlockId> MemoryTier::Ids() const {
  absl::MutexLock lock(&state_->mu);
  std::vector<BlockId> ids;
  ids.reserve(state_->blocks.size());
  for (const auto& [id, e] : state_->blocks) ids.push_back(id);
  return ids;
}

bool MemoryTier::HasRecord(const BlockId& id) const {
  absl::MutexLock lock(&state_->mu);
  return state_->blocks.contains(id);
}

bool MemoryTier::HasPayload(const BlockId& id) const {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->blocks.find(id);
  return it != state_->blocks.end() && it->second.payload.has_value();
}

std::optional<storage::SpillRecord> MemoryTier::Record(const BlockId& id) const {
  std::string bytes;
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->blocks.find(id);
    if (it == state_->blocks.end()) return std::nullopt;
    bytes = it->second.record;
  }
  storage::SpillRecord record;
  if (!record.ParseFromString(bytes)) return std::nullopt;
  return record;
}

std::optional<std::string> MemoryTier::Payload(const BlockId& id) const {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->blocks.find(id);
  if (it == state_->blocks.end()) return std::nullopt;
  return it->second.payload;
}

}  // namespace evoke::testing
