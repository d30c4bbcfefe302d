#include "daemon/daemon_parts.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "common/log.h"
#include "common/summaries.h"

#ifndef EVOKE_VERSION
#define EVOKE_VERSION "dev"
#endif

namespace evoke {
namespace {

// NeedsMeanKeys: the daemon adds a MEAN_KEYS summary to canonical blocks
// saved without one (and with room for one more summary).
bool NeedsMeanKeys(const v1::BlockMeta& meta) {
  if (meta.fingerprint().layout() != v1::LAYOUT_CANONICAL_V1 || meta.summaries_size() >= 8) {
    return false;
  }
  for (const v1::Summary& s : meta.summaries()) {
    if (s.kind() == v1::SUMMARY_MEAN_KEYS) return false;
  }
  return true;
}

}  // namespace

PinnedArenaOptions ToArenaOptions(const DaemonOptions::Tier1& tier1) {
  PinnedArenaOptions arena;
  arena.capacity_bytes = tier1.pinned_bytes;
  arena.lock_memory = tier1.lock_memory;
  arena.prefault = tier1.prefault_memory;
  return arena;
}

SpillStoreOptions ToSpillStoreOptions(const DaemonOptions::Tier2& tier2) {
  SpillStoreOptions spill;
  spill.path = std::filesystem::absolute(tier2.data_dir).string();
  spill.sync = tier2.spill_sync;
  return spill;
}

TierManagerOptions ToTierManagerOptions(const DaemonOptions& options) {
  TierManagerOptions tiers;
  // MEAN_KEYS for canonical blocks saved without one, so Recover can find
  // every block an engine evicts.
  tiers.summarize = [layer_option = options.tiers.summary_layer](
                        const v1::BlockMeta& meta, const uint8_t* payload,
                        uint64_t size) -> std::optional<v1::Summary> {
    if (!NeedsMeanKeys(meta)) return std::nullopt;
    uint32_t layer = DefaultSummaryLayer(meta);
    if (layer_option >= 0 && static_cast<uint32_t>(layer_option) >= meta.layer_begin() &&
        static_cast<uint32_t>(layer_option) < meta.layer_end()) {
      layer = static_cast<uint32_t>(layer_option);
    }
    absl::StatusOr<v1::Summary> s = MeanKeysSummary(meta, payload, size, layer);
    if (!s.ok()) {
      EVOKE_LOG_DEBUG("no mean_keys summary: ", s.status().ToString());
      return std::nullopt;
    }
    return std::move(s).value();
  };
  // Charged at the quota check: a float per KV head and dimension, and the
  // summary's own fields and framing.
  tiers.summary_bound = [](const v1::BlockMeta& meta) -> uint64_t {
    if (!NeedsMeanKeys(meta)) return 0;
    return 4ull * meta.fingerprint().n_kv_heads() * meta.fingerprint().head_dim() + 64;
  };
  tiers.limits.max_block_bytes = options.tiers.max_block_bytes;
  tiers.staging_bytes = options.tiers.staging_bytes;
  tiers.metadata_bytes = options.tiers.metadata_bytes;
  tiers.high_watermark = options.tier1.high_watermark;
  tiers.low_watermark = options.tier1.low_watermark;
  tiers.spill_bytes = options.tier2.spill_bytes;
  tiers.spill_batch_bytes = options.tier2.spill_batch_bytes;
  tiers.max_wait_for_room = absl::Milliseconds(options.tiers.save_wait_ms);
  tiers.copy_threads = static_cast<int>(options.tiers.copy_threads);
  tiers.disk_reads_in_flight = static_cast<int>(options.tiers.disk_reads_in_flight);
  tiers.remote_sessions = options.remote.sessions;
  tiers.remote_queue_bytes = options.remote.queue_bytes;
  tiers.remote_write_bytes_per_s = options.remote.write_bytes_per_s;
  tiers.remote_write_burst_bytes = options.remote.write_burst_bytes;
  tiers.remote_batch_blocks = static_cast<int>(options.remote.inflight);
  return tiers;
}

RemoteTierOptions ToRemoteTierOptions(const DaemonOptions::Remote& remote) {
  RemoteTierOptions tier;
  tier.retry = absl::Milliseconds(remote.retry_ms);
  tier.retry_max = absl::Milliseconds(remote.retry_max_ms);
  tier.budget_bytes = remote.bytes;
  if (remote.expiry_s > 0) {
    // Capped (about 35,000 years) so that the cast to int64 cannot turn a
    // huge value negative.
    tier.expire_after = absl::Seconds(
        static_cast<int64_t>(std::min<uint64_t>(remote.expiry_s, uint64_t{1} << 40)));
    tier.sweep_every = std::clamp(tier.expire_after / 4, absl::Seconds(1), absl::Hours(1));
  }
  return tier;
}

#ifdef EVOKE_HAVE_RADOS
RadosOptions ToRadosOptions(const DaemonOptions::Remote& remote) {
  RadosOptions rados;
  rados.conf_path = remote.conf;
  rados.pool = remote.pool;
  rados.user = remote.user;
  rados.keyring = remote.keyring;
  rados.op_timeout = absl::Milliseconds(remote.op_timeout_ms);
  rados.inflight = static_cast<int>(remote.inflight);
  return rados;
}
#endif

LeaseManagerOptions ToLeaseManagerOptions(const DaemonOptions::Leases& leases) {
  LeaseManagerOptions lease;
  lease.max_leases = leases.max_leases;
  lease.max_leases_per_uid = leases.max_leases_per_uid;
  lease.max_regions_per_lease = leases.max_regions_per_lease;
  lease.max_region_bytes = leases.max_region_bytes;
  lease.max_mapped_bytes = leases.max_mapped_bytes;
  lease.max_mapped_bytes_per_uid = leases.ResolvedMaxMappedBytesPerUid();
  lease.max_mappings = leases.max_mappings;
  if (leases.idle_ms > 0) lease.idle_timeout = absl::Milliseconds(leases.idle_ms);
  return lease;
}

absl::Duration LeaseReaperInterval(const DaemonOptions::Leases& leases) {
  return std::clamp(absl::Milliseconds(leases.idle_ms) / 4, absl::Milliseconds(50),
                    absl::Seconds(5));
}

FdChannelOptions ToFdChannelOptions(const DaemonOptions::Fd& fd) {
  FdChannelOptions channel;
  channel.connection_timeout = absl::Milliseconds(fd.connection_deadline_ms);
  return channel;
}

RingOptions ToRingOptions(const DaemonOptions::Rings& rings) {
  RingOptions ring;
  ring.spin_max = absl::Microseconds(rings.poll_max_us);
  return ring;
}

KvTierServiceOptions ToServiceOptions(const DaemonOptions& options) {
  KvTierServiceOptions service;
  service.limits.block.max_block_bytes = options.tiers.max_block_bytes;
  service.max_message_bytes = options.server.max_message_bytes;
  service.rings = ToRingOptions(options.rings);
  service.max_calls_per_uid = options.server.ResolvedMaxCallsPerUid();
  service.data_dir = std::filesystem::absolute(options.tier2.data_dir).string();
  service.version = EVOKE_VERSION;
  service.fd_socket = std::filesystem::absolute(options.ResolvedFdSocket()).string();
  return service;
}

}  // namespace evoke
