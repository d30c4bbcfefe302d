#include "daemon/storage_mapping.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace evoke {

v1::Tier ToProto(BlockLocation location) {
  switch (location) {
    case BlockLocation::kHost:
      return v1::TIER_PINNED_HOST;
    case BlockLocation::kDisk:
      return v1::TIER_SPILL;
    case BlockLocation::kBreadcrumb:
      return v1::TIER_BREADCRUMB;
    case BlockLocation::kRemote:
      return v1::TIER_REMOTE;
  }
  return v1::TIER_UNSPECIFIED;
}

std::optional<BlockLocation> LocationFromProto(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_PINNED_HOST:
      return BlockLocation::kHost;
    case v1::TIER_SPILL:
      return BlockLocation::kDisk;
    case v1::TIER_BREADCRUMB:
      return BlockLocation::kBreadcrumb;
    case v1::TIER_REMOTE:
      return BlockLocation::kRemote;
    default:
      return std::nullopt;
  }
}

void ToProto(const BlockInfo& in, v1::BlockInfo* out) {
  *out->mutable_meta() = in.meta;
  out->set_tier(ToProto(in.location));
  out->set_bytes_available(in.bytes_available);
  out->set_on_disk(in.on_disk);
  out->set_pin_count(in.pin_count);
  out->set_last_access_unix_ms(in.last_access_unix_ms);
}

void ToProto(const SavedBlock& in, v1::SaveResult* out) {
  out->set_id(in.id.ToBytes());
  out->set_checksum(in.checksum);
  out->set_deduplicated(in.deduplicated);
  out->set_tier(ToProto(in.location));
}

namespace {

void ToProto(const TierOccupancy& in, v1::TierStat* out) {
  out->set_blocks(in.blocks);
  out->set_payload_bytes(in.payload_bytes);
  out->set_used_bytes(in.used_bytes);
  out->set_capacity_bytes(in.capacity_bytes);
}

}  // namespace

void ToProto(const TierStats& in, v1::StatResponse* out) {
  ToProto(in.host, out->mutable_pinned());
  ToProto(in.disk, out->mutable_spill());
  out->set_breadcrumb_blocks(in.breadcrumb_blocks);
  out->set_pinned_blocks(in.pinned_blocks);
  out->mutable_leases()->set_lease_pins(in.pins);
  const StorageCounters& c = in.counters;
  v1::Counters* o = out->mutable_counters();
  o->set_saves(c.saves);
  o->set_dedups(c.dedups);
  o->set_loads(c.loads);
  o->set_hits_tier1(c.hits_tier1);
  o->set_hits_tier2(c.hits_tier2);
  o->set_misses(c.misses);
  o->set_spills(c.spills);
  o->set_spilled_bytes(c.spilled_bytes);
  o->set_evictions(c.evictions);
  o->set_promotions(c.promotions);
  o->set_breadcrumbs(c.breadcrumbs);
  o->set_checksum_failures(c.checksum_failures);
  o->set_deletes(c.deletes);
  o->set_spill_errors(c.spill_errors);
  o->set_invalid_records(c.invalid_records);
  o->set_keep_overrides(c.keep_overrides);
  o->set_prefetched(c.prefetched);
  o->set_prefetch_hits(c.prefetch_hits);
  o->set_prefetch_unused(c.prefetch_unused);
  out->set_kept_sessions(in.kept_sessions);
  out->set_low_blocks(in.low_blocks);
  out->set_high_blocks(in.high_blocks);
  out->set_pinned_memory_locked(in.host_locked);
  out->set_pinned_memory_lock_error(in.host_lock_error);
  out->set_pinned_prefaulted_bytes(in.host_prefaulted_bytes);
  out->set_pinned_prefault_error(in.host_prefault_error);
  out->set_pinned_largest_free_bytes(in.host_largest_free_bytes);
  out->set_high_watermark(in.high_watermark);
  out->set_low_watermark(in.low_watermark);
  out->set_uptime_seconds(static_cast<uint64_t>(absl::ToInt64Seconds(in.uptime)));
  out->set_metadata_bytes(in.metadata_bytes);
  out->set_metadata_budget_bytes(in.metadata_budget_bytes);
  const TierHealth& h = in.disk_health;
  v1::DiskHealth* d = out->mutable_disk_health();
  d->set_writable(h.writable);
  d->set_reason(h.reason);
  d->set_opened_read_only(h.opened_read_only);
  d->set_write_failures(h.write_failures);
  d->set_refused_writes(h.refused_writes);
  d->set_resumes(h.resumes);
  d->set_last_outage_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(h.last_outage)));
  d->set_corrupt_files(h.corrupt_files);
  d->set_unreadable_records(h.unreadable_records);
  d->set_segments(h.segments);
  d->set_segment_file_bytes(h.segment_file_bytes);
  d->set_segment_live_bytes(h.segment_live_bytes);
  d->set_segment_syncs(h.segment_syncs);
  d->set_compacted_records(h.compacted_records);
  d->set_removed_segments(h.removed_segments);
  d->set_direct_io(h.direct_io);
  d->set_segment_bytes_written(h.segment_bytes_written);
  d->set_segment_payload_bytes(h.segment_payload_bytes);
  d->set_quarantined(h.quarantined);
  d->set_quarantined_segments(h.quarantined_segments);
  if (h.salvage.ran) {
    v1::DiskSalvage* s = d->mutable_salvage();
    s->set_ran(true);
    s->set_restored(h.salvage.restored);
    s->set_removed(h.salvage.removed);
    s->set_damaged(h.salvage.damaged);
    s->set_unidentified(h.salvage.unidentified);
    s->set_unreadable_segments(h.salvage.unreadable_segments);
  }
  for (const std::string& step : h.recovery) d->add_recovery(step);
  if (in.remote) {
    const RemoteStats& r = *in.remote;
    v1::RemoteStat* m = out->mutable_remote();
    m->set_enabled(true);
    m->set_connected(r.connected);
    m->set_state(r.state);
    m->set_last_error(r.last_error);
    m->set_store(r.store);
    m->set_objects_written(r.objects_written);
    m->set_bytes_written(r.bytes_written);
    m->set_dedups(r.dedups);
    m->set_fetches(r.fetches);
    m->set_fetched_bytes(r.fetched_bytes);
    m->set_misses(r.misses);
    m->set_checksum_failures(r.checksum_failures);
    m->set_refused_records(r.refused_records);
    m->set_errors(r.errors);
    m->set_timeouts(r.timeouts);
    m->set_breaker_opens(r.breaker_opens);
    m->set_probes(r.probes);
    m->set_unavailable(r.unavailable);
    m->set_pool_used_bytes(r.pool_used_bytes);
    m->set_pool_objects(r.pool_objects);
    m->set_queue_blocks(r.queue_blocks);
    m->set_queue_bytes(r.queue_bytes);
    m->set_dropped_blocks(r.dropped_blocks);
    m->set_inflight(r.inflight);
    m->set_expired_objects(r.expired_objects);
    m->set_removals_queued(r.removals_queued);
    m->set_removals_dropped(r.removals_dropped);
    m->set_paced(r.paced);
  }
}

void ToProto(absl::string_view ns, const NamespaceUsage& usage, const NamespaceQuota& quota,
             bool shared, v1::NamespaceStat* out) {
  out->set_name(std::string(ns));
  out->set_blocks(usage.blocks);
  out->set_tier1_bytes(usage.tier1_bytes);
  out->set_tier2_bytes(usage.tier2_bytes);
  out->set_metadata_bytes(usage.metadata_bytes);
  out->set_tier1_quota_bytes(quota.tier1_bytes);
  out->set_tier2_quota_bytes(quota.tier2_bytes);
  out->set_metadata_quota_bytes(quota.metadata_bytes);
  out->set_shared(shared);
}

void ToProto(const VerifyReport& in, v1::VerifyResponse* out) {
  out->set_blocks_checked(in.blocks_checked);
  out->set_copies_checked(in.copies_checked);
  out->set_copies_ok(in.copies_ok);
  out->set_missing(in.missing);
  for (const CorruptCopy& c : in.corrupt) {
    v1::CorruptCopy* bad = out->add_corrupt();
    bad->set_id(c.id.ToBytes());
    bad->set_tier(ToProto(c.tier));
    bad->set_detail(c.detail);
  }
}

void ToProto(const FlushResult& in, v1::FlushResponse* out) {
  out->set_blocks_written(in.blocks_written);
  out->set_bytes_written(in.bytes_written);
  out->set_blocks_evicted(in.blocks_evicted);
}

namespace {

std::string PathOf(const ItemRef& item, ItemsField field) {
  switch (field) {
    case ItemsField::kSaveBlocks: {
      const std::string block = absl::StrCat("blocks[", item.index, "]");
      switch (item.part) {
        case ItemPart::kId:
          return absl::StrCat(block, ".meta.id");
        case ItemPart::kChecksum:
          return absl::StrCat(block, ".meta.checksum");
        case ItemPart::kFingerprint:
          return absl::StrCat(block, ".meta.fingerprint");
        case ItemPart::kBlock:
          return block;
      }
      return block;
    }
    case ItemsField::kIds: {
      const std::string id = absl::StrCat("ids[", item.index, "]");
      return item.part == ItemPart::kFingerprint ? absl::StrCat("fingerprint (", id, ")")
                                                 : id;
    }
    case ItemsField::kId:
      return item.part == ItemPart::kFingerprint ? "fingerprint (id)" : "id";
  }
  return "";
}

}  // namespace

absl::Status WithFieldPath(const absl::Status& status, ItemsField field) {
  if (status.ok()) return status;
  const std::optional<ItemRef> item = ErrorItem(status);
  const std::optional<StorageLimit> limit = ErrorLimit(status);
  if (!item && !limit) return status;
  std::string message(status.message());
  if (item && item->part == ItemPart::kFingerprint && field == ItemsField::kIds &&
      absl::StartsWith(message, "block ")) {
    // "fingerprint: block <id> (ids[i]) was saved with another layout: ...":
    // the field at fault is the request's fingerprint; the block names it.
    const size_t id_end = message.find(' ', 6);
    message = absl::StrCat("fingerprint: ", message.substr(0, id_end), " (ids[", item->index,
                           "])", id_end == std::string::npos ? "" : message.substr(id_end));
  } else if (item) {
    message = absl::StrCat(PathOf(*item, field), ": ", message);
  }
  if (limit == StorageLimit::kTier1Capacity) {
    absl::StrAppend(&message, "; tier 1 is sized by --pinned-bytes");
  }
  return absl::Status(status.code(), message);
}

}  // namespace evoke
