#include "tests/chaos/crash_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace evoke::chaos {

bool Allowed::Allows(std::optional<uint32_t> observed) const {
  if (!observed) return absent_ok;
  return std::find(versions.begin(), versions.end(), *observed) != versions.end();
}

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kOk: return "ok";
    case Verdict::kLostDurable: return "durable block lost";
    case Verdict::kLostLive: return "stored block missing while evoked lived";
    case Verdict::kResurrected: return "deleted or superseded version served";
    case Verdict::kPhantom: return "block served that was never saved";
  }
  return "?";
}

ExpectedState::ExpectedState(size_t slots) : slots_(slots) {}

uint32_t ExpectedState::BeginSave(size_t slot, bool durable) {
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  const uint32_t version = s.presence != Presence::kAbsent ? s.version : ++s.max_version;
  s.op_open = true;
  s.pending_version = version;
  s.pending_durable = durable;
  return version;
}

void ExpectedState::AckSave(size_t slot) {
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  const bool durable = s.pending_durable || s.presence == Presence::kDurable;
  s.presence = durable ? Presence::kDurable : Presence::kVolatile;
  s.version = *s.pending_version;
  ++s.epoch;
  s.op_open = false;
  s.pending_version.reset();
  s.pending_durable = false;
}

void ExpectedState::FailSave(size_t slot) {
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  s.op_open = false;
  s.frozen = true;  // pending_version stays: it may have been stored.
}

void ExpectedState::BeginDelete(size_t slot) {
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  s.op_open = true;
  s.pending_absent = true;
}

void ExpectedState::AckDelete(size_t slot) {
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  s.presence = Presence::kAbsent;
  ++s.epoch;
  s.op_open = false;
  s.pending_absent = false;
}

void ExpectedState::FailDelete(size_t slot) {
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  s.op_open = false;
  s.frozen = true;
}

ExpectedState::FlushTicket ExpectedState::BeginFlush() {
  absl::MutexLock lock(&mu_);
  FlushTicket ticket;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].presence == Presence::kVolatile) {
      ticket.volatile_slots.emplace_back(i, slots_[i].epoch);
    }
  }
  return ticket;
}

size_t ExpectedState::AckFlush(const FlushTicket& ticket) {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [slot, epoch] : ticket.volatile_slots) {
    Slot& s = slots_[slot];
    // Changed since the Flush was sent (deleted, saved again): the Flush
    // promises nothing about the new state.
    if (s.epoch != epoch || s.presence != Presence::kVolatile) continue;
    s.presence = Presence::kDurable;
    ++n;
  }
  return n;
}

bool ExpectedState::Busy(size_t slot) const {
  absl::MutexLock lock(&mu_);
  return slots_[slot].op_open || slots_[slot].frozen;
}

Presence ExpectedState::presence(size_t slot) const {
  absl::MutexLock lock(&mu_);
  return slots_[slot].presence;
}

uint32_t ExpectedState::max_version(size_t slot) const {
  absl::MutexLock lock(&mu_);
  return slots_[slot].max_version;
}

Allowed ExpectedState::AllowedLocked(const Slot& s, bool crashed) const {
  Allowed a;
  switch (s.presence) {
    case Presence::kAbsent:
      a.absent_ok = true;
      break;
    case Presence::kVolatile:
      a.versions.push_back(s.version);
      a.absent_ok = crashed;
      break;
    case Presence::kDurable:
      a.versions.push_back(s.version);
      a.durable = true;
      break;
  }
  if (s.pending_absent) a.absent_ok = true;
  if (s.pending_version && !a.Allows(*s.pending_version)) {
    a.versions.push_back(*s.pending_version);
  }
  if (a.absent_ok) a.durable = false;
  return a;
}

Allowed ExpectedState::AllowedLive(size_t slot) const {
  absl::MutexLock lock(&mu_);
  return AllowedLocked(slots_[slot], /*crashed=*/false);
}

Allowed ExpectedState::AllowedAfterCrash(size_t slot) const {
  absl::MutexLock lock(&mu_);
  return AllowedLocked(slots_[slot], /*crashed=*/true);
}

Verdict ExpectedState::Classify(size_t slot, const Allowed& allowed,
                                std::optional<uint32_t> observed) const {
  if (allowed.Allows(observed)) return Verdict::kOk;
  if (!observed) return allowed.durable ? Verdict::kLostDurable : Verdict::kLostLive;
  const uint32_t max = max_version(slot);
  return *observed >= 1 && *observed <= max ? Verdict::kResurrected : Verdict::kPhantom;
}

void ExpectedState::Resolve(size_t slot, std::optional<uint32_t> observed) {
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  s.presence = observed ? Presence::kDurable : Presence::kAbsent;
  if (observed) s.version = *observed;
  ++s.epoch;
  s.op_open = false;
  s.frozen = false;
  s.pending_absent = false;
  s.pending_version.reset();
  s.pending_durable = false;
}

std::string ExpectedState::Describe(size_t slot) const {
  absl::MutexLock lock(&mu_);
  const Slot& s = slots_[slot];
  std::string out = absl::StrCat("slot ", slot, ": ");
  switch (s.presence) {
    case Presence::kAbsent: absl::StrAppend(&out, "absent"); break;
    case Presence::kVolatile: absl::StrAppend(&out, "volatile v", s.version); break;
    case Presence::kDurable: absl::StrAppend(&out, "durable v", s.version); break;
  }
  if (s.pending_version) {
    absl::StrAppend(&out, ", pending save v", *s.pending_version,
                    s.pending_durable ? " (durable)" : "");
  }
  if (s.pending_absent) absl::StrAppend(&out, ", pending delete");
  if (s.frozen) absl::StrAppend(&out, ", unacknowledged");
  absl::StrAppend(&out, ", max v", s.max_version);
  return out;
}

}  // namespace evoke::chaos
