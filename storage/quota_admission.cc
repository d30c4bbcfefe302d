// TierManagerImpl's quota admission (the first phase of a Save): the
// metadata budget and each namespace's quotas, checked and charged in one
// critical section (QuotaLedger), and the room a tier-1 quota makes from the
// namespace's own blocks. The rest of Save is in tier_manager.cc.
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/tier_manager_impl.h"

namespace evoke {

// Phase 1 (locked): check the metadata budget and the namespaces' quotas,
// counting what other Saves have reserved and not yet committed, and
// reserve this Save's share in the same critical section (`hold`).
absl::Status TierManagerImpl::EnforceQuotas(absl::Span<const SaveItem> items,
                                            absl::Span<const SavePlan> plans, bool durable,
                                            absl::Time deadline, QuotaLedger::Hold* hold) {
  if (core_.options().metadata_bytes == 0 && !core_.options().quota) return absl::OkStatus();
  // Outside the lock: sizes of the metadata as it will be stored.
  std::vector<uint64_t> item_meta(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    // The writer replaces the client's (field tag, length, bytes).
    item_meta[i] =
        MetadataBytes(*items[i].meta) + 2 + items[i].writer.size() +
        (core_.options().summary_bound ? core_.options().summary_bound(*items[i].meta) : 0);
  }
  for (int attempt = 0;;) {
    std::vector<std::pair<std::string, uint64_t>> write_back;  // ns, bytes.
    {
      absl::MutexLock lock(core_.mu());
      bool wait_for_commits = false;
      absl::flat_hash_map<std::string, QuotaNeed> needs;
      absl::flat_hash_map<std::string, size_t> first_of;  // For the error.
      uint64_t meta_total = 0;
      std::optional<size_t> first_fresh;
      for (size_t i = 0; i < items.size(); ++i) {
        const IndexEntry* e = core_.Find(plans[i].id);
        if (e != nullptr && e->bytes_available()) continue;  // Deduplicated.
        if (!first_fresh) first_fresh = i;
        const std::string& ns = items[i].meta->fingerprint().namespace_();
        first_of.try_emplace(ns, i);
        QuotaNeed& need = needs[ns];
        need.tier1 += items[i].size;
        if (durable) need.tier2 += items[i].size;
        need.metadata += item_meta[i];
        meta_total += item_meta[i];
      }
      if (!first_fresh) return absl::OkStatus();
      const uint64_t budget = core_.options().metadata_bytes;
      const uint64_t meta_used = core_.MetadataInUse();
      if (budget > 0 && meta_used + meta_total > budget) {
        return ItemError(absl::StatusCode::kResourceExhausted, *first_fresh, ItemPart::kBlock,
                         absl::StrCat("the metadata budget is full (", meta_used, " of ", budget,
                                      " bytes in use or reserved, ", meta_total,
                                      " more asked): delete blocks or sessions, or raise "
                                      "--metadata-bytes"));
      }
      if (core_.options().quota) {
        // Not a structured binding: clang 14 cannot capture one in a lambda.
        for (const auto& entry : needs) {
          const std::string& ns = entry.first;
          const QuotaNeed& need = entry.second;
          const NamespaceQuota q = core_.options().quota(ns);
          const NamespaceUsage u = core_.Usage(ns);
          const QuotaNeed pending = core_.PendingQuota(ns);
          auto over = [&](absl::string_view what, uint64_t used, uint64_t more, uint64_t quota) {
            return ItemError(absl::StatusCode::kResourceExhausted, first_of[ns], ItemPart::kBlock,
                             absl::StrCat("namespace \"", ns, "\" is over its ", what,
                                          " quota (", used, " of ", quota,
                                          " bytes in use or reserved, ", more, " more asked)"));
          };
          const uint64_t meta_ns = u.metadata_bytes + pending.metadata;
          if (q.metadata_bytes > 0 && meta_ns + need.metadata > q.metadata_bytes) {
            return over("metadata", meta_ns, need.metadata, q.metadata_bytes);
          }
          const uint64_t tier2_ns = u.tier2_bytes + pending.tier2;
          if (q.tier2_bytes > 0 && need.tier2 > 0 && tier2_ns + need.tier2 > q.tier2_bytes) {
            return over("tier-2", tier2_ns, need.tier2, q.tier2_bytes);
          }
          const uint64_t tier1_ns = u.tier1_bytes + pending.tier1;
          if (q.tier1_bytes == 0 || tier1_ns + need.tier1 <= q.tier1_bytes) continue;
          if (need.tier1 > q.tier1_bytes) {
            return over("tier-1", tier1_ns, need.tier1, q.tier1_bytes);
          }
          const uint64_t excess = tier1_ns + need.tier1 - q.tier1_bytes;
          const uint64_t freed = core_.EvictCleanOf(ns, excess);
          if (freed >= excess) continue;
          if (pending.tier1 > 0 && absl::Now() < deadline) {
            // Saves in flight hold the room; once committed, their blocks
            // can leave tier 1 like any other.
            wait_for_commits = true;
            continue;
          }
          if (attempt >= 3 || absl::Now() >= deadline) {
            return over("tier-1", core_.Usage(ns).tier1_bytes + pending.tier1, need.tier1,
                        q.tier1_bytes);
          }
          write_back.emplace_back(ns, excess - freed);
        }
      }
      if (wait_for_commits) {
        core_.AwaitWrites(deadline);
        continue;
      }
      if (write_back.empty()) {
        *hold = core_.ChargeQuotas(needs);
        return absl::OkStatus();
      }
    }
    for (const auto& [ns, want] : write_back) EVOKE_RETURN_IF_ERROR(WriteBackOf(ns, want));
    ++attempt;
  }
}

absl::Status TierManagerImpl::WriteBackOf(const std::string& ns, uint64_t want) {
  absl::MutexLock disk(core_.disk_mu());  // Entries stay in the index.
  const std::vector<IndexEntry*> victims = core_.DirtyOf(ns, want);
  if (victims.empty()) return absl::OkStatus();
  uint64_t blocks = 0, bytes = 0;
  EVOKE_RETURN_IF_ERROR(spiller_.WriteBack(victims, /*sync=*/false, &blocks, &bytes));
  core_.EvictWritten(victims);
  core_.NotifyRoom();
  return absl::OkStatus();
}

}  // namespace evoke
