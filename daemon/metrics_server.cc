#include "daemon/metrics_server.h"

#include <exception>
#include <utility>

#include <prometheus/exposer.h>

#include "absl/strings/str_cat.h"
#include "common/metric_families.h"

namespace evoke {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = MetricFamilies::Labels;
using Families = MetricFamilies;

Labels Tier(const char* tier) { return {{"tier", tier}}; }

void AddTiers(const v1::StatResponse& s, Families* f) {
  for (const auto& [tier, t] : {std::pair<const char*, const v1::TierStat*>{"1", &s.pinned()},
                                {"2", &s.spill()}}) {
    f->Gauge("evoke_tier_blocks", "Blocks whose bytes are in the tier.",
             static_cast<double>(t->blocks()), Tier(tier));
    f->Gauge("evoke_tier_payload_bytes", "Payload bytes of the blocks in the tier.",
             static_cast<double>(t->payload_bytes()), Tier(tier));
    f->Gauge("evoke_tier_used_bytes",
             "Bytes reserved for the tier's blocks (tier 1: allocator granules).",
             static_cast<double>(t->used_bytes()), Tier(tier));
    f->Gauge("evoke_tier_capacity_bytes",
             "The tier's budget (--pinned-bytes, --spill-bytes).",
             static_cast<double>(t->capacity_bytes()), Tier(tier));
  }
  f->Gauge("evoke_breadcrumb_blocks", "Blocks held as metadata only (no payload).",
           static_cast<double>(s.breadcrumb_blocks()));
  f->Gauge("evoke_pinned_blocks", "Blocks with at least one pin.",
           static_cast<double>(s.pinned_blocks()));
  f->Gauge("evoke_kept_sessions", "Sessions under a KeepSession.",
           static_cast<double>(s.kept_sessions()));
  f->Gauge("evoke_watchers", "WatchBlocks streams open.", static_cast<double>(s.watchers()));
  for (const auto& [cls, n] : {std::pair<const char*, uint64_t>{"low", s.low_blocks()},
                               {"high", s.high_blocks()}}) {
    f->Gauge("evoke_retained_blocks", "Blocks whose retention class is in force, by class.",
             static_cast<double>(n), {{"class", cls}});
  }
  f->Counter("evoke_watchers_dropped_total",
             "WatchBlocks streams dropped for falling behind the event backlog.",
             static_cast<double>(s.watchers_dropped()));
  f->Gauge("evoke_tier1_largest_free_bytes", "Largest contiguous free extent in tier 1.",
           static_cast<double>(s.pinned_largest_free_bytes()));
  f->Gauge("evoke_tier1_memory_locked", "1 when tier 1 is locked in RAM (mlock).",
           s.pinned_memory_locked() ? 1 : 0);
  f->Gauge("evoke_tier1_cuda_registered_bytes",
           "Bytes of tier 1 registered with CUDA (cudaHostRegister).",
           static_cast<double>(s.pinned_cuda_registered_bytes()));
  f->Gauge("evoke_metadata_bytes", "Accounted metadata bytes of every block.",
           static_cast<double>(s.metadata_bytes()));
  f->Gauge("evoke_metadata_budget_bytes", "Metadata budget (--metadata-bytes; 0: none).",
           static_cast<double>(s.metadata_budget_bytes()));
  f->Gauge("evoke_high_watermark_ratio", "Tier-1 fill at which spilling starts.",
           s.high_watermark());
  f->Gauge("evoke_low_watermark_ratio", "Tier-1 fill at which spilling stops.",
           s.low_watermark());
}

void AddCounters(const v1::Counters& c, Families* f) {
  auto n = [](uint64_t v) { return static_cast<double>(v); };
  f->Counter("evoke_saves_total", "Blocks stored (not counting deduplicated saves).",
             n(c.saves()));
  f->Counter("evoke_dedups_total", "Saves of blocks already stored.", n(c.dedups()));
  f->Counter("evoke_loads_total", "Blocks returned by Load.", n(c.loads()));
  f->Counter("evoke_hits_total", "Loaded blocks by the tier that served them.",
             n(c.hits_tier1()), Tier("1"));
  f->Counter("evoke_hits_total", "Loaded blocks by the tier that served them.",
             n(c.hits_tier2()), Tier("2"));
  f->Counter("evoke_misses_total", "Loads and Lookups of absent or breadcrumb blocks.",
             n(c.misses()));
  f->Counter("evoke_spills_total", "Blocks written to the spill store (tier 2).",
             n(c.spills()));
  f->Counter("evoke_spilled_bytes_total", "Payload bytes written to the spill store.",
             n(c.spilled_bytes()));
  f->Counter("evoke_evictions_total", "Blocks that left tier 1.", n(c.evictions()));
  f->Counter("evoke_promotions_total", "Spilled blocks copied back into tier 1.",
             n(c.promotions()));
  f->Counter("evoke_breadcrumbs_total",
             "Payloads dropped past the spill budget (the block's metadata stays).",
             n(c.breadcrumbs()));
  f->Counter("evoke_checksum_failures_total",
             "Copies that failed checksum verification; each is quarantined (never "
             "served again).",
             n(c.checksum_failures()));
  f->Counter("evoke_deletes_total", "Blocks deleted.", n(c.deletes()));
  f->Counter("evoke_spill_errors_total", "Failed spill-store writes.", n(c.spill_errors()));
  f->Gauge("evoke_invalid_records",
           "Records on disk that failed validation at start (kept out of the index).",
           n(c.invalid_records()));
  f->Counter("evoke_keep_overrides_total",
             "Blocks of kept sessions (KeepSession) evicted because nothing else could go.",
             n(c.keep_overrides()));
  f->Counter("evoke_prefetched_total", "Blocks Prefetch brought into tier 1.",
             n(c.prefetched()));
  f->Counter("evoke_prefetch_hits_total",
             "Prefetched blocks a Load then read from tier 1 (the first Load of each).",
             n(c.prefetch_hits()));
  f->Counter("evoke_prefetch_unused_total",
             "Prefetched blocks that left tier 1 before any Load read them.",
             n(c.prefetch_unused()));
}

void AddLeases(const v1::LeaseStat& l, Families* f) {
  auto n = [](uint64_t v) { return static_cast<double>(v); };
  f->Gauge("evoke_leases", "Open leases.", n(l.leases()));
  f->Gauge("evoke_regions", "Registered client regions, by kind.", n(l.shm_regions()),
           {{"kind", "shm"}});
  f->Gauge("evoke_regions", "Registered client regions, by kind.", n(l.cuda_regions()),
           {{"kind", "cuda"}});
  f->Gauge("evoke_mapped_bytes", "Bytes of registered client regions, by kind.",
           n(l.shm_bytes()), {{"kind", "shm"}});
  f->Gauge("evoke_mapped_bytes", "Bytes of registered client regions, by kind.",
           n(l.cuda_bytes()), {{"kind", "cuda"}});
  f->Gauge("evoke_lease_pins", "Pins held by open leases.", n(l.lease_pins()));
  f->Counter("evoke_leases_expired_total", "Leases ended since start.",
             n(l.leases_expired()));
  f->Counter("evoke_pins_released_on_expiry_total", "Pins released when their lease ended.",
             n(l.pins_released_on_expiry()));
  f->Gauge("evoke_rings", "Command rings attached.", n(l.rings()));
  f->Counter("evoke_ring_ops_total", "Command-ring entries completed.", n(l.ring_ops()));
  f->Counter("evoke_rings_broken_total", "Rings stopped for a corrupt header.",
             n(l.rings_broken()));
}

void AddDisk(const v1::DiskHealth& d, Families* f) {
  auto n = [](uint64_t v) { return static_cast<double>(v); };
  f->Gauge("evoke_disk_writable", "1 while the spill store accepts writes.",
           d.writable() ? 1 : 0);
  f->Counter("evoke_disk_write_failures_total", "Spill-store writes or flushes that failed.",
             n(d.write_failures()));
  f->Counter("evoke_disk_refused_writes_total", "Writes refused for lack of free space.",
             n(d.refused_writes()));
  f->Counter("evoke_disk_resumes_total", "Times writes resumed after a stop.",
             n(d.resumes()));
  f->Gauge("evoke_disk_corrupt_files", "Corrupt SST files found by the last open.",
           n(d.corrupt_files()));
  f->Gauge("evoke_disk_unreadable_records", "Records the last open could not read.",
           n(d.unreadable_records()));
  f->Gauge("evoke_disk_quarantined", "1 when the last open started the metadata anew.",
           d.quarantined() ? 1 : 0);
  f->Gauge("evoke_disk_quarantined_segments", "Segment files moved aside by the last open.",
           n(d.quarantined_segments()));
  f->Gauge("evoke_disk_salvage_restored", "Records the last open's salvage rebuilt.",
           n(d.salvage().restored()));
  f->Gauge("evoke_disk_salvage_lost_damaged",
           "Blocks the last open's salvage lost: payload failed its checksum.",
           n(d.salvage().damaged()));
  f->Gauge("evoke_disk_salvage_lost_unidentified",
           "Blocks the last open's salvage lost: no identity record.",
           n(d.salvage().unidentified()));
  f->Gauge("evoke_segments", "Payload segment files.", n(d.segments()));
  f->Gauge("evoke_segment_file_bytes", "Preallocated bytes of the segment files.",
           n(d.segment_file_bytes()));
  f->Gauge("evoke_segment_live_bytes", "Bytes of live records in the segment files.",
           n(d.segment_live_bytes()));
  f->Counter("evoke_segment_bytes_written_total",
             "Bytes written to segment files (headers, identity records, padding included).",
             n(d.segment_bytes_written()));
  f->Counter("evoke_segment_payload_bytes_total", "Payload bytes written to segment files.",
             n(d.segment_payload_bytes()));
  f->Counter("evoke_segment_syncs_total", "fdatasync calls on segment files.",
             n(d.segment_syncs()));
  f->Counter("evoke_compacted_records_total", "Records moved by segment compaction.",
             n(d.compacted_records()));
  f->Counter("evoke_removed_segments_total", "Segment files removed.",
             n(d.removed_segments()));
}

void AddNamespaces(const v1::StatResponse& s, Families* f) {
  auto n = [](uint64_t v) { return static_cast<double>(v); };
  f->Declare("evoke_namespace_blocks", "Blocks of the namespace.", MetricType::Gauge);
  f->Declare("evoke_namespace_bytes", "Payload bytes of the namespace, by tier.",
             MetricType::Gauge);
  f->Declare("evoke_namespace_metadata_bytes", "Metadata bytes of the namespace.",
             MetricType::Gauge);
  f->Declare("evoke_namespace_quota_bytes", "The namespace's quota (absent: none).",
             MetricType::Gauge);
  for (const v1::NamespaceStat& ns : s.namespaces()) {
    const ClientMetric::Label name{"namespace", ns.name()};
    f->Gauge("evoke_namespace_blocks", "Blocks of the namespace.", n(ns.blocks()), {name});
    f->Gauge("evoke_namespace_bytes", "Payload bytes of the namespace, by tier.",
             n(ns.tier1_bytes()), {name, {"tier", "1"}});
    f->Gauge("evoke_namespace_bytes", "Payload bytes of the namespace, by tier.",
             n(ns.tier2_bytes()), {name, {"tier", "2"}});
    f->Gauge("evoke_namespace_metadata_bytes", "Metadata bytes of the namespace.",
             n(ns.metadata_bytes()), {name});
    const std::pair<const char*, uint64_t> quotas[] = {{"tier1", ns.tier1_quota_bytes()},
                                                       {"tier2", ns.tier2_quota_bytes()},
                                                       {"metadata", ns.metadata_quota_bytes()}};
    for (const auto& [kind, quota] : quotas) {
      if (quota == 0) continue;
      f->Gauge("evoke_namespace_quota_bytes", "The namespace's quota (absent: none).",
               n(quota), {name, {"kind", kind}});
    }
  }
}

void AddRemote(const v1::RemoteStat& r, Families* f) {
  auto n = [](uint64_t v) { return static_cast<double>(v); };
  f->Gauge("evoke_remote_connected", "1 while tier 3 is connected and its breaker closed.",
           r.connected() ? 1 : 0);
  const std::pair<const char*, uint64_t> counters[] = {
      {"evoke_remote_objects_written_total", r.objects_written()},
      {"evoke_remote_written_bytes_total", r.bytes_written()},
      {"evoke_remote_dedups_total", r.dedups()},
      {"evoke_remote_fetches_total", r.fetches()},
      {"evoke_remote_fetched_bytes_total", r.fetched_bytes()},
      {"evoke_remote_misses_total", r.misses()},
      {"evoke_remote_checksum_failures_total", r.checksum_failures()},
      {"evoke_remote_refused_records_total", r.refused_records()},
      {"evoke_remote_errors_total", r.errors()},
      {"evoke_remote_timeouts_total", r.timeouts()},
      {"evoke_remote_breaker_opens_total", r.breaker_opens()},
      {"evoke_remote_probes_total", r.probes()},
      {"evoke_remote_unavailable_total", r.unavailable()},
      {"evoke_remote_dropped_blocks_total", r.dropped_blocks()},
      {"evoke_remote_expired_objects_total", r.expired_objects()},
      {"evoke_remote_removals_dropped_total", r.removals_dropped()},
      {"evoke_remote_paced_total", r.paced()},
  };
  for (const auto& [name, value] : counters) {
    f->Counter(name, "Tier 3 (remote object store); see docs/METRICS.md.", n(value));
  }
  const std::pair<const char*, uint64_t> gauges[] = {
      {"evoke_remote_pool_used_bytes", r.pool_used_bytes()},
      {"evoke_remote_pool_objects", r.pool_objects()},
      {"evoke_remote_queue_blocks", r.queue_blocks()},
      {"evoke_remote_queue_bytes", r.queue_bytes()},
      {"evoke_remote_inflight", r.inflight()},
      {"evoke_remote_removals_queued", r.removals_queued()},
  };
  for (const auto& [name, value] : gauges) {
    f->Gauge(name, "Tier 3 (remote object store); see docs/METRICS.md.", n(value));
  }
}

void AddRpcs(const RpcMetrics& rpcs, Families* f) {
  f->Declare("evoke_rpc_requests_total",
             "Completed calls by method (gRPC method or ring.Save / ring.Load) and status.",
             MetricType::Counter);
  const std::vector<RpcMetrics::MethodSnapshot> methods = rpcs.Read();
  for (const RpcMetrics::MethodSnapshot& m : methods) {
    for (int code = 0; code < RpcMetrics::kCodes; ++code) {
      // OK always (a rate of zero is a figure); other codes once seen.
      if (code != 0 && m.codes[code] == 0) continue;
      f->Counter("evoke_rpc_requests_total",
                 "Completed calls by method (gRPC method or ring.Save / ring.Load) and "
                 "status.",
                 static_cast<double>(m.codes[code]),
                 {{"method", m.name}, {"code", GrpcCodeName(code)}});
    }
  }
  for (const RpcMetrics::MethodSnapshot& m : methods) {
    f->AddHistogram("evoke_rpc_duration_seconds",
                    "Latency of completed calls by method, from the call's start to its "
                    "status (ring entries: their batch's run).",
                    m.latency, {{"method", m.name}});
  }
  f->AddHistogram("evoke_recover_candidates",
                  "Blocks in the scope of each successful Recover (the candidates scored).",
                  rpcs.RecoverCandidates());
  for (int p = 0; p < kPhaseCount; ++p) {
    const Phase phase = static_cast<Phase>(p);
    f->AddHistogram("evoke_phase_duration_seconds",
                    "Time spent in one phase of a request, per batch of blocks.",
                    PhaseHistogram(phase).Read(), {{"phase", PhaseName(phase)}});
  }
}

}  // namespace

std::vector<MetricFamily> BuildMetricFamilies(const v1::StatResponse& stat,
                                              const RpcMetrics& rpcs, bool per_namespace) {
  Families f;
  f.Gauge("evoke_build_info", "Always 1; the version as a label.", 1,
          {{"version", stat.version()}});
  f.Gauge("evoke_uptime_seconds", "Seconds since evoked started.",
          static_cast<double>(stat.uptime_seconds()));
  AddTiers(stat, &f);
  AddCounters(stat.counters(), &f);
  AddLeases(stat.leases(), &f);
  AddDisk(stat.disk_health(), &f);
  f.Gauge("evoke_namespaces", "Namespaces holding blocks or with a quota.",
          static_cast<double>(stat.namespaces_size()));
  if (per_namespace) AddNamespaces(stat, &f);
  if (stat.remote().enabled()) AddRemote(stat.remote(), &f);
  AddRpcs(rpcs, &f);
  return f.Take();
}

class MetricsServer::Collector final : public prometheus::Collectable {
 public:
  Collector(std::function<void(v1::StatResponse*)> stat, const RpcMetrics* rpcs,
            bool per_namespace)
      : stat_(std::move(stat)), rpcs_(rpcs), per_namespace_(per_namespace) {}
  std::vector<MetricFamily> Collect() const override {
    v1::StatResponse stat;
    stat_(&stat);
    return BuildMetricFamilies(stat, *rpcs_, per_namespace_);
  }

 private:
  const std::function<void(v1::StatResponse*)> stat_;
  const RpcMetrics* const rpcs_;
  const bool per_namespace_;
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Bind(const std::string& address) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  try {
    // One thread: scrapes are rare and each builds its answer under the
    // engine's locks; more threads would only contend there.
    server->exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "--metrics-address: cannot serve /metrics on ", address,
        " (address in use, or not an address of this host): ", e.what()));
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-address: cannot serve /metrics on ", address));
  }
  const size_t colon = address.rfind(':');
  server->address_ = absl::StrCat(address.substr(0, colon), ":", ports[0]);
  return server;
}

MetricsServer::~MetricsServer() {
  if (collector_ != nullptr) exposer_->RemoveCollectable(collector_);
}

void MetricsServer::Serve(std::function<void(v1::StatResponse*)> stat, const RpcMetrics* rpcs,
                          bool per_namespace) {
  collector_ = std::make_shared<Collector>(std::move(stat), rpcs, per_namespace);
  exposer_->RegisterCollectable(collector_);
}

}  // namespace evoke
