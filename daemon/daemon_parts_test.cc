// Each part's options carry its group of DaemonOptions: a flag that stopped
// reaching its part (a field left out of a conversion) is caught here rather
// than by a slow end-to-end test, or not at all.
#include "daemon/daemon_parts.h"

#include <filesystem>

#include "daemon/daemon_options.h"
#include "gtest/gtest.h"

namespace evoke {
namespace {

// Options with no field at its default, so that a conversion that forgot a
// field, or read the wrong one, shows.
DaemonOptions Unusual() {
  DaemonOptions o;
  o.server.socket = "/tmp/evoke-parts.sock";
  o.server.max_message_bytes = 40ull << 20;
  o.server.worker_threads = 6;
  o.server.max_calls_per_uid = 0;  // Resolved: 4 x 6.
  o.tier1.pinned_bytes = 96ull << 20;
  o.tier1.high_watermark = 0.9;
  o.tier1.low_watermark = 0.6;
  o.tier1.lock_memory = false;
  o.tier1.prefault_memory = false;
  o.tier2.data_dir = "relative-data";
  o.tier2.spill_bytes = 3ull << 30;
  o.tier2.spill_sync = true;
  o.tier2.spill_batch_bytes = 8ull << 20;
  o.tiers.max_block_bytes = 12ull << 20;
  o.tiers.staging_bytes = 40ull << 20;
  o.tiers.metadata_bytes = 7ull << 20;
  o.tiers.save_wait_ms = 1234;
  o.tiers.copy_threads = 5;
  o.tiers.disk_reads_in_flight = 3;
  o.remote.conf = "/etc/ceph/ceph.conf";
  o.remote.pool = "p";
  o.remote.user = "client.evoke";
  o.remote.keyring = "/k";
  o.remote.op_timeout_ms = 2500;
  o.remote.sessions = true;
  o.remote.queue_bytes = 9ull << 20;
  o.remote.write_bytes_per_s = 11ull << 20;
  o.remote.write_burst_bytes = 13ull << 20;
  o.remote.inflight = 7;
  o.remote.retry_ms = 300;
  o.remote.retry_max_ms = 4000;
  o.remote.bytes = 11ull << 30;
  o.remote.expiry_s = 86400;
  o.leases.max_leases = 40;
  o.leases.max_leases_per_uid = 10;
  o.leases.max_regions_per_lease = 3;
  o.leases.max_region_bytes = 2ull << 30;
  o.leases.max_mapped_bytes = 8ull << 30;
  o.leases.max_mappings = 99;
  o.leases.max_mapped_bytes_per_uid = 0;  // Resolved: a quarter.
  o.leases.idle_ms = 60000;
  o.fd.socket = "";  // Resolved: next to the API socket.
  o.fd.connection_deadline_ms = 700;
  o.rings.poll_max_us = 250;
  return o;
}

TEST(DaemonPartsTest, StorageTakesTheTierGroups) {
  const DaemonOptions o = Unusual();
  const PinnedArenaOptions arena = ToArenaOptions(o.tier1);
  EXPECT_EQ(arena.capacity_bytes, 96ull << 20);
  EXPECT_FALSE(arena.lock_memory);
  EXPECT_FALSE(arena.prefault);

  const SpillStoreOptions spill = ToSpillStoreOptions(o.tier2);
  EXPECT_EQ(spill.path, std::filesystem::absolute("relative-data").string());
  EXPECT_TRUE(spill.sync);

  const TierManagerOptions tiers = ToTierManagerOptions(o);
  EXPECT_DOUBLE_EQ(tiers.high_watermark, 0.9);
  EXPECT_DOUBLE_EQ(tiers.low_watermark, 0.6);
  EXPECT_EQ(tiers.spill_bytes, 3ull << 30);
  EXPECT_EQ(tiers.spill_batch_bytes, 8ull << 20);
  EXPECT_EQ(tiers.limits.max_block_bytes, 12ull << 20);
  EXPECT_EQ(tiers.staging_bytes, 40ull << 20);
  EXPECT_EQ(tiers.metadata_bytes, 7ull << 20);
  EXPECT_EQ(tiers.max_wait_for_room, absl::Milliseconds(1234));
  EXPECT_EQ(tiers.copy_threads, 5);
  EXPECT_EQ(tiers.disk_reads_in_flight, 3);
  EXPECT_TRUE(tiers.remote_sessions);
  EXPECT_EQ(tiers.remote_queue_bytes, 9ull << 20);
  EXPECT_EQ(tiers.remote_write_bytes_per_s, 11ull << 20);
  EXPECT_EQ(tiers.remote_write_burst_bytes, 13ull << 20);
  EXPECT_EQ(tiers.remote_batch_blocks, 7);
  EXPECT_TRUE(tiers.summarize);
  EXPECT_TRUE(tiers.summary_bound);
  // The links to other parts are Start's.
  EXPECT_EQ(tiers.observer, nullptr);
  EXPECT_EQ(tiers.remote, nullptr);
  EXPECT_FALSE(tiers.quota);
}

TEST(DaemonPartsTest, RemoteTierTakesTheRemoteGroup) {
  const DaemonOptions o = Unusual();
  const RemoteTierOptions tier = ToRemoteTierOptions(o.remote);
  EXPECT_EQ(tier.retry, absl::Milliseconds(300));
  EXPECT_EQ(tier.retry_max, absl::Milliseconds(4000));
  EXPECT_EQ(tier.budget_bytes, 11ull << 30);
  EXPECT_EQ(tier.expire_after, absl::Hours(24));
  EXPECT_EQ(tier.sweep_every, absl::Hours(1));  // A quarter of a day, capped.
  DaemonOptions::Remote soon = o.remote;
  soon.expiry_s = 2;
  EXPECT_EQ(ToRemoteTierOptions(soon).sweep_every, absl::Seconds(1));
  DaemonOptions::Remote never = o.remote;
  never.expiry_s = 0;
  EXPECT_EQ(ToRemoteTierOptions(never).expire_after, absl::ZeroDuration());
#ifdef EVOKE_HAVE_RADOS
  const RadosOptions rados = ToRadosOptions(o.remote);
  EXPECT_EQ(rados.conf_path, "/etc/ceph/ceph.conf");
  EXPECT_EQ(rados.pool, "p");
  EXPECT_EQ(rados.user, "client.evoke");
  EXPECT_EQ(rados.keyring, "/k");
  EXPECT_EQ(rados.op_timeout, absl::Milliseconds(2500));
  EXPECT_EQ(rados.inflight, 7);
#endif
}

TEST(DaemonPartsTest, LeasesAndFdSocketTakeTheirGroups) {
  const DaemonOptions o = Unusual();
  const LeaseManagerOptions leases = ToLeaseManagerOptions(o.leases);
  EXPECT_EQ(leases.max_leases, 40u);
  EXPECT_EQ(leases.max_leases_per_uid, 10u);
  EXPECT_EQ(leases.max_regions_per_lease, 3u);
  EXPECT_EQ(leases.max_region_bytes, 2ull << 30);
  EXPECT_EQ(leases.max_mapped_bytes, 8ull << 30);
  EXPECT_EQ(leases.max_mapped_bytes_per_uid, 2ull << 30);
  EXPECT_EQ(leases.max_mappings, 99u);
  EXPECT_EQ(leases.idle_timeout, absl::Minutes(1));
  EXPECT_EQ(LeaseReaperInterval(o.leases), absl::Seconds(5));
  DaemonOptions::Leases brief = o.leases;
  brief.idle_ms = 100;
  EXPECT_EQ(LeaseReaperInterval(brief), absl::Milliseconds(50));
  brief.idle_ms = 0;  // Never.
  EXPECT_EQ(ToLeaseManagerOptions(brief).idle_timeout, absl::InfiniteDuration());

  EXPECT_EQ(ToFdChannelOptions(o.fd).connection_timeout, absl::Milliseconds(700));
}

TEST(DaemonPartsTest, ServiceTakesServerRingsAndBlockLimit) {
  const DaemonOptions o = Unusual();
  EXPECT_EQ(ToRingOptions(o.rings).spin_max, absl::Microseconds(250));
  const KvTierServiceOptions service = ToServiceOptions(o);
  EXPECT_EQ(service.limits.block.max_block_bytes, 12ull << 20);
  EXPECT_EQ(service.max_message_bytes, 40ull << 20);
  EXPECT_EQ(service.rings.spin_max, absl::Microseconds(250));
  EXPECT_EQ(service.max_calls_per_uid, 24u);
  EXPECT_EQ(service.data_dir, std::filesystem::absolute("relative-data").string());
  EXPECT_EQ(service.fd_socket, "/tmp/evoke-parts.sock.fd");
  EXPECT_FALSE(service.version.empty());
  EXPECT_FALSE(service.identify);
  EXPECT_EQ(service.policy, nullptr);
}

}  // namespace
}  // namespace evoke
