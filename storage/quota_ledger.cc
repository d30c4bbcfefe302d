#include "storage/quota_ledger.h"

#include <cassert>

namespace evoke {

QuotaNeed QuotaLedger::Pending(absl::string_view ns) const {
  auto it = pending_.find(ns);
  return it == pending_.end() ? QuotaNeed() : it->second;
}

QuotaLedger::Hold QuotaLedger::Charge(const absl::flat_hash_map<std::string, QuotaNeed>& needs) {
  Hold hold;
  for (const auto& [ns, need] : needs) {
    QuotaNeed& p = pending_[ns];
    p.tier1 += need.tier1;
    p.tier2 += need.tier2;
    p.metadata += need.metadata;
    pending_metadata_ += need.metadata;
    hold.parts_.emplace_back(ns, need);
  }
  return hold;
}

void QuotaLedger::Subtract(const std::string& ns, const QuotaNeed& need) {
  if (need.tier1 == 0 && need.tier2 == 0 && need.metadata == 0) return;
  auto it = pending_.find(ns);
  assert(it != pending_.end());
  QuotaNeed& p = it->second;
  assert(p.tier1 >= need.tier1 && p.tier2 >= need.tier2 && p.metadata >= need.metadata);
  p.tier1 -= need.tier1;
  p.tier2 -= need.tier2;
  p.metadata -= need.metadata;
  pending_metadata_ -= need.metadata;
  if (p.tier1 == 0 && p.tier2 == 0 && p.metadata == 0) pending_.erase(it);
}

void QuotaLedger::SettleCommitted(Hold* hold) {
  for (auto& [ns, need] : hold->parts_) {
    Subtract(ns, QuotaNeed{need.tier1, 0, need.metadata});
    need.tier1 = 0;
    need.metadata = 0;
  }
}

void QuotaLedger::Settle(Hold* hold) {
  for (const auto& [ns, need] : hold->parts_) Subtract(ns, need);
  hold->parts_.clear();
}

}  // namespace evoke
