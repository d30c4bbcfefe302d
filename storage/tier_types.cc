#include "storage/tier_types.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace evoke {
namespace {

constexpr char kItemUrl[] = "type.evoke.dev/storage.Item";
constexpr char kLimitUrl[] = "type.evoke.dev/storage.Limit";

}  // namespace

uint64_t MetadataBytes(const v1::BlockMeta& meta) {
  // The entry, its list and index nodes, and the recovery index's entry.
  constexpr uint64_t kEntryOverhead = 512;
  return meta.ByteSizeLong() + kEntryOverhead;
}

absl::Status ItemError(absl::StatusCode code, size_t index, ItemPart part,
                       absl::string_view message) {
  return WithItem(absl::Status(code, message), index, part);
}

absl::Status WithItem(absl::Status status, size_t index, ItemPart part) {
  if (status.ok()) return status;
  status.SetPayload(kItemUrl,
                    absl::Cord(absl::StrCat(index, ":", static_cast<int>(part))));
  return status;
}

std::optional<ItemRef> ErrorItem(const absl::Status& status) {
  const auto payload = status.GetPayload(kItemUrl);
  if (!payload) return std::nullopt;
  const std::pair<std::string, std::string> parts =
      absl::StrSplit(std::string(*payload), absl::MaxSplits(':', 1));
  uint64_t index = 0;
  int part = 0;
  if (!absl::SimpleAtoi(parts.first, &index) || !absl::SimpleAtoi(parts.second, &part) ||
      part < 0 || part > static_cast<int>(ItemPart::kFingerprint)) {
    return std::nullopt;
  }
  return ItemRef{static_cast<size_t>(index), static_cast<ItemPart>(part)};
}

absl::Status WithLimit(absl::Status status, StorageLimit limit) {
  if (status.ok()) return status;
  status.SetPayload(kLimitUrl, absl::Cord(absl::StrCat(static_cast<int>(limit))));
  return status;
}

std::optional<StorageLimit> ErrorLimit(const absl::Status& status) {
  const auto payload = status.GetPayload(kLimitUrl);
  int limit = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &limit) ||
      limit != static_cast<int>(StorageLimit::kTier1Capacity)) {
    return std::nullopt;
  }
  return static_cast<StorageLimit>(limit);
}

}  // namespace evoke
