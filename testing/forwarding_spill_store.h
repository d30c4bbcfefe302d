// ForwardingSpillStore: a SpillStore that passes its data operations (Put,
// DropPayloads, Delete, Read, ForEachRecord, UsedBytes, Persist) to a real
// one. The tests of one module derive from it and override the calls they
// fake at the disk boundary (failing writes, counting or corrupting reads).
// Health, Sync and Close keep SpillStore's defaults: a healthy store,
// Persist, nothing (the real store closes when the wrapper is destroyed).
#ifndef EVOKE_TESTING_FORWARDING_SPILL_STORE_H_
#define EVOKE_TESTING_FORWARDING_SPILL_STORE_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "storage/tier2/spill_store.h"

namespace evoke::testing {

class ForwardingSpillStore : public SpillStore {
 public:
  explicit ForwardingSpillStore(std::unique_ptr<SpillStore> real) : real_(std::move(real)) {}

  absl::Status Put(absl::Span<const SpillWrite> writes, bool sync) override {
    return real_->Put(writes, sync);
  }
  absl::Status DropPayloads(absl::Span<const SpillWrite> breadcrumbs) override {
    return real_->DropPayloads(breadcrumbs);
  }
  absl::Status Delete(absl::Span<const BlockId> ids) override { return real_->Delete(ids); }
  absl::Status Read(const BlockId& id,
                    const std::function<absl::Status(const storage::SpillRecord&,
                                                     absl::string_view)>& consume) override {
    return real_->Read(id, consume);
  }
  absl::Status ForEachRecord(const RecordVisitor& visit,
                             std::vector<std::string>* skipped) override {
    return real_->ForEachRecord(visit, skipped);
  }
  uint64_t UsedBytes() override { return real_->UsedBytes(); }
  absl::Status Persist() override { return real_->Persist(); }

 private:
  std::unique_ptr<SpillStore> real_;
};

}  // namespace evoke::testing

#endif  // EVOKE_TESTING_FORWARDING_SPILL_STORE_H_
