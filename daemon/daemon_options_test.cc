#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "daemon/daemon_flags.h"
#include "daemon/daemon_options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke {
namespace {

using ::evoke::testing::StatusIs;
using ::testing::HasSubstr;

absl::Status Parse(std::vector<std::string> args, DaemonOptions* options,
                   std::string* output = nullptr) {
  args.insert(args.begin(), "evoked");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::string out;
  bool exit_now = false;
  absl::Status s = ParseDaemonFlags(static_cast<int>(argv.size()), argv.data(),
                                    options, &out, &exit_now);
  if (output != nullptr) *output = out;
  return s;
}

TEST(DaemonOptionsTest, DefaultsAreValid) {
  DaemonOptions o;
  EXPECT_OK(o.Validate());
  EXPECT_EQ(o.tier1.pinned_bytes, 1ull << 30);
  EXPECT_EQ(o.server.socket, "evoked.sock");
  EXPECT_EQ(o.tier2.data_dir, "evoke-data");
  EXPECT_GE(o.server.max_message_bytes, o.tiers.max_block_bytes + (1u << 20));
}

TEST(DaemonOptionsTest, ValidateNamesTheFlag) {
  struct Case {
    void (*mutate)(DaemonOptions*);
    const char* message;
  } cases[] = {
      {[](DaemonOptions* o) { o->server.socket = ""; }, "--socket: is required"},
      {[](DaemonOptions* o) { o->server.socket = std::string(200, 's'); }, "--socket: path"},
      {[](DaemonOptions* o) { o->tier2.data_dir = ""; }, "--data-dir: is required"},
      {[](DaemonOptions* o) { o->tier1.pinned_bytes = 1000; }, "--pinned-bytes"},
      {[](DaemonOptions* o) { o->tier1.low_watermark = 0.99; }, "--low-watermark: 0.99"},
      {[](DaemonOptions* o) { o->tier1.high_watermark = 1.5; }, "--high-watermark: 1.5"},
      {[](DaemonOptions* o) { o->tiers.max_block_bytes = 0; }, "--max-block-bytes"},
      {[](DaemonOptions* o) { o->server.max_message_bytes = 64ull << 20; },
       "--max-message-bytes"},
      {[](DaemonOptions* o) { o->server.worker_threads = 1000; }, "--worker-threads"},
      {[](DaemonOptions* o) { o->log_level = "loud"; }, "--log-level: 'loud'"},
      {[](DaemonOptions* o) { o->tcp.listen = "nonsense"; }, "--tcp-listen: 'nonsense'"},
      {[](DaemonOptions* o) { o->tcp.listen = "host:0"; }, "--tcp-listen"},
      {[](DaemonOptions* o) { o->tcp.listen = "host:65536"; }, "--tcp-listen"},
      {[](DaemonOptions* o) { o->tcp.listen = "::1:7070"; }, "--tcp-listen"},
      {[](DaemonOptions* o) { o->tcp.listen = "0.0.0.0:7070"; },
       "--tcp-listen: requires --tls-cert"},
      {[](DaemonOptions* o) {
         o->tcp.listen = "0.0.0.0:7070";
         o->tcp.tls_cert = "c.pem";
         o->tcp.tls_key = "k.pem";
       },
       "--tcp-listen: requires --policy"},
      {[](DaemonOptions* o) { o->tcp.tls_cert = "c.pem"; }, "--tls-cert: is used only"},
      {[](DaemonOptions* o) { o->tcp.tls_key = "k.pem"; }, "--tls-key: is used only"},
      {[](DaemonOptions* o) { o->leases.max_mapped_bytes = 0; }, "--max-mapped-bytes: must be"},
      {[](DaemonOptions* o) { o->leases.max_mappings = 0; }, "--max-mappings"},
      {[](DaemonOptions* o) { o->leases.max_mapped_bytes_per_uid = 65ull << 30; },
       "--max-mapped-bytes-per-uid: 65 GiB exceeds"},
      {[](DaemonOptions* o) { o->fd.connection_deadline_ms = 0; },
       "--fd-connection-deadline-ms"},
      {[](DaemonOptions* o) { o->tiers.metadata_bytes = 4096; }, "--metadata-bytes"},
      {[](DaemonOptions* o) { o->metrics.address = "9464"; },
       "--metrics-address: '9464' is not HOST:PORT"},
      {[](DaemonOptions* o) { o->metrics.address = ":9464"; }, "--metrics-address"},
      {[](DaemonOptions* o) { o->metrics.address = "127.0.0.1:65536"; }, "--metrics-address"},
      {[](DaemonOptions* o) { o->metrics.address = "127.0.0.1:x"; }, "--metrics-address"},
      {[](DaemonOptions* o) { o->metrics.address = "a b:80"; }, "--metrics-address"},
      {[](DaemonOptions* o) { o->metrics.address = "127.0.0.1:1,127.0.0.1:2"; },
       "--metrics-address"},
  };
  for (const Case& c : cases) {
    DaemonOptions o;
    c.mutate(&o);
    EXPECT_THAT(o.Validate(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
}

TEST(DaemonOptionsTest, HardeningDefaults) {
  DaemonOptions o;
  EXPECT_EQ(o.server.policy, "");
  EXPECT_EQ(o.tcp.listen, "");
  EXPECT_EQ(o.tcp.tls_cert, "");
  EXPECT_EQ(o.tcp.tls_key, "");
  EXPECT_EQ(o.leases.max_mapped_bytes, 64ull << 30);
  EXPECT_EQ(o.leases.max_mappings, 16384u);
  EXPECT_EQ(o.leases.max_mapped_bytes_per_uid, 0u);
  // No uid may map it all by default: a quarter each.
  EXPECT_EQ(o.leases.ResolvedMaxMappedBytesPerUid(), 16ull << 30);
  o.leases.max_mapped_bytes = 8ull << 30;
  EXPECT_EQ(o.leases.ResolvedMaxMappedBytesPerUid(), 2ull << 30);
  o.leases.max_mapped_bytes_per_uid = 1ull << 30;
  EXPECT_EQ(o.leases.ResolvedMaxMappedBytesPerUid(), 1ull << 30);
  EXPECT_EQ(o.fd.connection_deadline_ms, 2000u);
  EXPECT_EQ(o.leases.idle_ms, 0u);
  EXPECT_EQ(o.tiers.metadata_bytes, 1ull << 30);
}

TEST(DaemonOptionsTest, SplitHostPort) {
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(SplitHostPort("0.0.0.0:7070", &host, &port));
  EXPECT_EQ(host, "0.0.0.0");
  EXPECT_EQ(port, 7070);
  ASSERT_TRUE(SplitHostPort("[::1]:1", &host, &port));
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 1);
  ASSERT_TRUE(SplitHostPort("evoke.internal:65535", &host, &port));
  EXPECT_EQ(host, "evoke.internal");
  for (const char* bad : {"", ":7070", "host", "host:", "host:-1", "host:+80", "host:0",
                          "host:65536", "host:7070x", "::1:7070", "[::1:7070", "[]:80",
                          "a b:80", "host:123456"}) {
    EXPECT_FALSE(SplitHostPort(bad, &host, &port)) << bad;
  }
}

TEST(DaemonFlagsTest, MetricsAddressDefaultsToLoopbackAndKnowsWhenGiven) {
  DaemonOptions o;
  ASSERT_OK(Parse({}, &o));
  EXPECT_EQ(o.metrics.address, "127.0.0.1:9464");
  EXPECT_FALSE(o.metrics.address_given);
  EXPECT_FALSE(o.metrics.namespaces);
  DaemonOptions per_namespace;
  ASSERT_OK(Parse({"--metrics-namespaces"}, &per_namespace));
  EXPECT_TRUE(per_namespace.metrics.namespaces);
  DaemonOptions port0;
  ASSERT_OK(Parse({"--metrics-address", "127.0.0.1:0"}, &port0));
  EXPECT_EQ(port0.metrics.address, "127.0.0.1:0");
  EXPECT_TRUE(port0.metrics.address_given);
  DaemonOptions off;
  ASSERT_OK(Parse({"--metrics-address="}, &off));
  EXPECT_EQ(off.metrics.address, "");
  EXPECT_TRUE(off.metrics.address_given);
  // From a config file it counts as given too.
  evoke::testing::TempDir dir;
  const std::string path = dir.Join("evoked.toml");
  std::ofstream(path) << "metrics-address = \"0.0.0.0:9100\"\n";
  DaemonOptions config;
  ASSERT_OK(Parse({"--config", path}, &config));
  EXPECT_EQ(config.metrics.address, "0.0.0.0:9100");
  EXPECT_TRUE(config.metrics.address_given);
}

TEST(DaemonFlagsTest, HardeningFlagsMapOntoOptions) {
  DaemonOptions o;
  ASSERT_OK(Parse({"--policy", "/etc/evoke/policy", "--tcp-listen", "[::]:7070",
                   "--tls-cert", "/etc/evoke/c.pem", "--tls-key", "/etc/evoke/k.pem",
                   "--max-mapped-bytes", "8GiB", "--max-mappings", "100",
                   "--max-mapped-bytes-per-uid", "1GiB", "--fd-connection-deadline-ms",
                   "500", "--lease-idle-ms", "60000", "--metadata-bytes", "256MiB"},
                  &o));
  EXPECT_EQ(o.server.policy, "/etc/evoke/policy");
  EXPECT_EQ(o.tcp.listen, "[::]:7070");
  EXPECT_EQ(o.tcp.tls_cert, "/etc/evoke/c.pem");
  EXPECT_EQ(o.tcp.tls_key, "/etc/evoke/k.pem");
  EXPECT_EQ(o.leases.max_mapped_bytes, 8ull << 30);
  EXPECT_EQ(o.leases.max_mappings, 100u);
  EXPECT_EQ(o.leases.max_mapped_bytes_per_uid, 1ull << 30);
  EXPECT_EQ(o.fd.connection_deadline_ms, 500u);
  EXPECT_EQ(o.leases.idle_ms, 60000u);
  EXPECT_EQ(o.tiers.metadata_bytes, 256ull << 20);
}

TEST(DaemonFlagsTest, FlagsMapOntoOptions) {
  DaemonOptions o;
  ASSERT_OK(Parse({"--socket", "/tmp/x.sock", "--data-dir=/tmp/d", "--pinned-bytes",
                   "64MiB", "--spill-bytes=2GiB", "--high-watermark", "0.9",
                   "--low-watermark", "0.5", "--max-block-bytes", "16MiB",
                   "--max-message-bytes", "32MiB", "--worker-threads", "3",
                   "--lock-memory=false", "--prefault-memory=false", "--ring-poll-max-us", "250",
                   "--spill-sync=true",
                   "--save-wait-ms",
                   "250", "--log-level", "debug"},
                  &o));
  EXPECT_EQ(o.server.socket, "/tmp/x.sock");
  EXPECT_EQ(o.tier2.data_dir, "/tmp/d");
  EXPECT_EQ(o.tier1.pinned_bytes, 64ull << 20);
  EXPECT_EQ(o.tier2.spill_bytes, 2ull << 30);
  EXPECT_DOUBLE_EQ(o.tier1.high_watermark, 0.9);
  EXPECT_DOUBLE_EQ(o.tier1.low_watermark, 0.5);
  EXPECT_EQ(o.tiers.max_block_bytes, 16ull << 20);
  EXPECT_EQ(o.server.max_message_bytes, 32ull << 20);
  EXPECT_EQ(o.server.worker_threads, 3u);
  EXPECT_FALSE(o.tier1.lock_memory);
  EXPECT_FALSE(o.tier1.prefault_memory);
  EXPECT_EQ(o.rings.poll_max_us, 250u);
  EXPECT_TRUE(o.tier2.spill_sync);
  EXPECT_EQ(o.tiers.save_wait_ms, 250u);
  EXPECT_EQ(o.log_level, "debug");
}

// The tier-3 switches are bare (--remote-required), or take =true/=false.
TEST(DaemonFlagsTest, RemoteSwitchesNeedNoValue) {
  DaemonOptions o;
  ASSERT_OK(Parse({"--remote-conf", "/etc/ceph/ceph.conf", "--remote-required",
                   "--remote-sessions", "--remote-expiry-s", "86400"},
                  &o));
  EXPECT_TRUE(o.remote.required);
  EXPECT_TRUE(o.remote.sessions);
  EXPECT_EQ(o.remote.expiry_s, 86400u);
  DaemonOptions p;
  ASSERT_OK(Parse({"--remote-required=false", "--remote-sessions=true"}, &p));
  EXPECT_FALSE(p.remote.required);
  EXPECT_TRUE(p.remote.sessions);
  DaemonOptions q;
  EXPECT_THAT(Parse({"--remote-expiry-s", "-5"}, &q),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--remote-expiry-s")));
}

TEST(DaemonFlagsTest, BadValuesAreRejectedWithTheFlagName) {
  DaemonOptions o;
  EXPECT_THAT(Parse({"--pinned-bytes", "lots"}, &o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--pinned-bytes")));
  EXPECT_THAT(Parse({"--no-such-flag"}, &o),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // CLI11 alone wraps a negative count round to a huge unsigned one.
  for (const char* flag : {"--worker-threads", "--max-leases", "--lease-idle-ms",
                           "--remote-inflight", "--remote-expiry-s"}) {
    DaemonOptions n;
    EXPECT_THAT(Parse({flag, "-1"}, &n),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(flag)));
  }
  DaemonOptions p;
  EXPECT_THAT(Parse({"--low-watermark", "0.97"}, &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--low-watermark")));
  // A block must fit the staging budget, or a Load of it from disk could
  // never be staged.
  DaemonOptions s;
  EXPECT_THAT(Parse({"--staging-bytes", "32MiB"}, &s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--staging-bytes: 32 MiB is below --max-block-bytes (64 MiB)")));
}

TEST(DaemonFlagsTest, ConfigFileRoundTripsAndFlagsOverride) {
  evoke::testing::TempDir dir;
  DaemonOptions custom;
  custom.server.socket = dir.Join("d.sock");
  custom.tier2.data_dir = dir.Join("data");
  custom.tier1.pinned_bytes = 96ull << 20;
  custom.tier2.spill_bytes = 3ull << 30;
  custom.tier1.high_watermark = 0.9;
  custom.tier1.low_watermark = 0.7;
  custom.tiers.max_block_bytes = 8ull << 20;
  custom.server.max_message_bytes = (16ull << 20) + 12345;  // Not a round unit.
  custom.tiers.staging_bytes = 48ull << 20;
  custom.server.worker_threads = 5;
  custom.tiers.copy_threads = 3;
  custom.tiers.disk_reads_in_flight = 6;
  custom.tier1.lock_memory = false;
  custom.tier1.prefault_memory = false;
  custom.rings.poll_max_us = 200;
  custom.tier2.spill_sync = true;
  custom.tier2.spill_batch_bytes = 32ull << 20;
  custom.tiers.save_wait_ms = 777;
  custom.server.shutdown_grace_ms = 999;
  custom.log_level = "warning";
  custom.fd.socket = dir.Join("d.fd");
  custom.leases.max_leases = 9;
  custom.leases.max_regions_per_lease = 7;
  custom.leases.max_region_bytes = 5ull << 30;
  custom.tier1.cuda_register_chunk_bytes = 0;
  custom.tiers.summary_layer = 7;
  custom.server.policy = dir.Join("policy");
  custom.tcp.listen = "127.0.0.1:7070";
  custom.metrics.address = "[::1]:9100";
  custom.tcp.tls_cert = dir.Join("c.pem");
  custom.tcp.tls_key = dir.Join("k.pem");
  custom.leases.max_mapped_bytes = 9ull << 30;
  custom.leases.max_mappings = 77;
  custom.leases.max_mapped_bytes_per_uid = 3ull << 30;
  custom.fd.connection_deadline_ms = 1234;
  custom.leases.idle_ms = 4321;
  custom.tiers.metadata_bytes = 300ull << 20;
  const std::string path = dir.Join("evoked.toml");
  std::ofstream(path) << OptionsToConfig(custom);

  DaemonOptions read;
  ASSERT_OK(Parse({"--config", path}, &read));
  EXPECT_EQ(OptionsToConfig(read), OptionsToConfig(custom));

  DaemonOptions overridden;
  ASSERT_OK(Parse({"--config", path, "--pinned-bytes", "128MiB"}, &overridden));
  EXPECT_EQ(overridden.tier1.pinned_bytes, 128ull << 20);
  EXPECT_EQ(overridden.tier2.spill_bytes, 3ull << 30);
}

TEST(DaemonFlagsTest, ShippedProductionConfigIsValid) {
  DaemonOptions o;
  ASSERT_OK(Parse({"--config", std::string(EVOKE_SOURCE_DIR) + "/deploy/evoked.toml"}, &o));
  EXPECT_EQ(o.server.socket, "/run/evoke/evoked.sock");
  EXPECT_EQ(o.tier2.data_dir, "/var/lib/evoke");
  EXPECT_EQ(o.tier1.pinned_bytes, 32ull << 30);
  EXPECT_EQ(o.tier2.spill_bytes, 512ull << 30);
}

TEST(DaemonFlagsTest, PrintConfigPrintsEveryOption) {
  DaemonOptions o;
  std::string out;
  ASSERT_OK(Parse({"--print-config", "--pinned-bytes", "2GiB"}, &o, &out));
  EXPECT_THAT(out, HasSubstr("pinned-bytes = \"2 GiB\""));
  for (const char* key : {"socket", "data-dir", "spill-bytes", "high-watermark",
                          "low-watermark", "max-block-bytes", "max-message-bytes",
                          "worker-threads", "copy-threads", "disk-reads-in-flight", "lock-memory",
                          "prefault-memory",
                          "ring-poll-max-us", "spill-sync",
                          "spill-batch-bytes", "save-wait-ms", "shutdown-grace-ms",
                          "fd-socket", "max-leases", "max-leases-per-uid",
                          "max-calls-per-uid", "watch-backlog-events", "max-watchers",
                          "max-regions-per-lease",
                          "max-region-bytes", "cuda-register-chunk-bytes", "summary-layer",
                          "log-level", "policy", "tcp-listen", "metrics-address",
                          "metrics-namespaces", "tls-cert", "tls-key",
                          "max-mapped-bytes", "max-mappings", "max-mapped-bytes-per-uid",
                          "fd-connection-deadline-ms", "lease-idle-ms", "metadata-bytes",
                          "remote-conf", "remote-pool", "remote-user", "remote-keyring",
                          "remote-op-timeout-ms", "remote-required", "remote-sessions",
                          "remote-queue-bytes", "remote-write-bytes-per-s",
                          "remote-write-burst-bytes", "remote-inflight", "remote-retry-ms",
                          "remote-retry-max-ms", "remote-bytes", "remote-expiry-s"}) {
    EXPECT_THAT(out, HasSubstr(std::string("\n") + key + " = ")) << key;
  }
}

// Every field, compared one by one (OptionsToConfig equality alone would
// trust the printer it tests).
void ExpectSameOptions(const DaemonOptions& a, const DaemonOptions& b) {
  EXPECT_EQ(a.server.socket, b.server.socket);
  EXPECT_EQ(a.tier2.data_dir, b.tier2.data_dir);
  EXPECT_EQ(a.tier1.pinned_bytes, b.tier1.pinned_bytes);
  EXPECT_EQ(a.tier2.spill_bytes, b.tier2.spill_bytes);
  EXPECT_EQ(a.tier1.high_watermark, b.tier1.high_watermark);
  EXPECT_EQ(a.tier1.low_watermark, b.tier1.low_watermark);
  EXPECT_EQ(a.tiers.max_block_bytes, b.tiers.max_block_bytes);
  EXPECT_EQ(a.tiers.staging_bytes, b.tiers.staging_bytes);
  EXPECT_EQ(a.server.max_message_bytes, b.server.max_message_bytes);
  EXPECT_EQ(a.server.worker_threads, b.server.worker_threads);
  EXPECT_EQ(a.tier1.lock_memory, b.tier1.lock_memory);
  EXPECT_EQ(a.tier1.prefault_memory, b.tier1.prefault_memory);
  EXPECT_EQ(a.rings.poll_max_us, b.rings.poll_max_us);
  EXPECT_EQ(a.tier2.spill_sync, b.tier2.spill_sync);
  EXPECT_EQ(a.tiers.copy_threads, b.tiers.copy_threads);
  EXPECT_EQ(a.tiers.disk_reads_in_flight, b.tiers.disk_reads_in_flight);
  EXPECT_EQ(a.tier2.spill_batch_bytes, b.tier2.spill_batch_bytes);
  EXPECT_EQ(a.tiers.save_wait_ms, b.tiers.save_wait_ms);
  EXPECT_EQ(a.server.shutdown_grace_ms, b.server.shutdown_grace_ms);
  EXPECT_EQ(a.fd.socket, b.fd.socket);
  EXPECT_EQ(a.leases.max_leases, b.leases.max_leases);
  EXPECT_EQ(a.leases.max_leases_per_uid, b.leases.max_leases_per_uid);
  EXPECT_EQ(a.server.max_calls_per_uid, b.server.max_calls_per_uid);
  EXPECT_EQ(a.server.watch_backlog_events, b.server.watch_backlog_events);
  EXPECT_EQ(a.server.max_watchers, b.server.max_watchers);
  EXPECT_EQ(a.leases.max_regions_per_lease, b.leases.max_regions_per_lease);
  EXPECT_EQ(a.leases.max_region_bytes, b.leases.max_region_bytes);
  EXPECT_EQ(a.tier1.cuda_register_chunk_bytes, b.tier1.cuda_register_chunk_bytes);
  EXPECT_EQ(a.tiers.summary_layer, b.tiers.summary_layer);
  EXPECT_EQ(a.log_level, b.log_level);
  EXPECT_EQ(a.server.policy, b.server.policy);
  EXPECT_EQ(a.tcp.listen, b.tcp.listen);
  EXPECT_EQ(a.metrics.address, b.metrics.address);
  EXPECT_EQ(a.tcp.tls_cert, b.tcp.tls_cert);
  EXPECT_EQ(a.tcp.tls_key, b.tcp.tls_key);
  EXPECT_EQ(a.leases.max_mapped_bytes, b.leases.max_mapped_bytes);
  EXPECT_EQ(a.leases.max_mappings, b.leases.max_mappings);
  EXPECT_EQ(a.leases.max_mapped_bytes_per_uid, b.leases.max_mapped_bytes_per_uid);
  EXPECT_EQ(a.fd.connection_deadline_ms, b.fd.connection_deadline_ms);
  EXPECT_EQ(a.leases.idle_ms, b.leases.idle_ms);
  EXPECT_EQ(a.tiers.metadata_bytes, b.tiers.metadata_bytes);
  EXPECT_EQ(a.remote.conf, b.remote.conf);
  EXPECT_EQ(a.remote.pool, b.remote.pool);
  EXPECT_EQ(a.remote.user, b.remote.user);
  EXPECT_EQ(a.remote.keyring, b.remote.keyring);
  EXPECT_EQ(a.remote.op_timeout_ms, b.remote.op_timeout_ms);
  EXPECT_EQ(a.remote.required, b.remote.required);
  EXPECT_EQ(a.remote.sessions, b.remote.sessions);
  EXPECT_EQ(a.metrics.namespaces, b.metrics.namespaces);
  EXPECT_EQ(a.remote.queue_bytes, b.remote.queue_bytes);
  EXPECT_EQ(a.remote.write_bytes_per_s, b.remote.write_bytes_per_s);
  EXPECT_EQ(a.remote.write_burst_bytes, b.remote.write_burst_bytes);
  EXPECT_EQ(a.remote.inflight, b.remote.inflight);
  EXPECT_EQ(a.remote.retry_ms, b.remote.retry_ms);
  EXPECT_EQ(a.remote.retry_max_ms, b.remote.retry_max_ms);
  EXPECT_EQ(a.remote.bytes, b.remote.bytes);
  EXPECT_EQ(a.remote.expiry_s, b.remote.expiry_s);
}

// RoundTrip prints `o` as a config file and reads it back.
void ExpectRoundTrip(const DaemonOptions& o, const std::string& path) {
  ASSERT_OK(o.Validate());
  const std::string config = OptionsToConfig(o);
  std::ofstream(path, std::ios::trunc | std::ios::binary) << config;
  DaemonOptions read;
  ASSERT_OK(Parse({"--config", path}, &read)) << config;
  ExpectSameOptions(read, o);
}

// Issue #11: sizes of 1 PiB and more printed as "1 PiB", which the size
// parser refuses; `#` in a path cut it (a comment), quotes were taken apart.
TEST(DaemonFlagsTest, PrintConfigReadsBackAwkwardValues) {
  evoke::testing::TempDir dir;
  DaemonOptions o;
  o.tier2.spill_bytes = 1ull << 50;  // 1 PiB.
  o.tier1.pinned_bytes = UINT64_MAX;
  o.leases.max_region_bytes = (3ull << 50) + 1;
  o.tier1.cuda_register_chunk_bytes = (1ull << 30) + (1ull << 29);  // "1.50 GiB".
  o.leases.max_mapped_bytes = 5ull << 60;
  o.tiers.metadata_bytes = UINT64_MAX - 1;
  o.tier2.data_dir = "/tmp/a #b/\"quoted\"/c\\d/'e'/f,g h=i\tj\nk[l];m";
  o.server.socket = "/tmp/#s \"x\".sock";
  o.fd.socket = "/tmp/\\\\ #\x01\x7f\xc3\xa9.fd";
  o.server.policy = "  leading and trailing spaces  ";
  o.log_level = "error";
  ExpectRoundTrip(o, dir.Join("awkward.toml"));
}

TEST(DaemonFlagsTest, PrintConfigRoundTripsRandomOptions) {
  evoke::testing::TempDir dir;
  const std::string path = dir.Join("random.toml");
  std::mt19937_64 rng(20240611);
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  // Sizes: round units, units plus a remainder, powers of two near the top,
  // anything at all.
  auto size = [&](uint64_t lo) {
    uint64_t v = 0;
    switch (pick(0, 3)) {
      case 0: v = pick(1, 1023) << (10 * pick(0, 5)); break;
      case 1: v = (pick(1, 1023) << (10 * pick(1, 5))) + pick(1, 1023); break;
      case 2: v = (1ull << pick(20, 63)) - pick(0, 1); break;
      default: v = pick(0, UINT64_MAX); break;
    }
    return std::max(v, lo);
  };
  static constexpr char kAlphabet[] = "ab/_-.# \"'\\,=;[]{}\t\r\n\x01\x7f\xc3\xa9";
  auto text = [&](size_t max_len) {
    std::string s;
    const size_t n = pick(0, max_len);
    for (size_t i = 0; i < n; ++i) s.push_back(kAlphabet[pick(0, sizeof(kAlphabet) - 2)]);
    return s;
  };
  auto path_text = [&](size_t max_len) { return "/" + text(max_len); };
  const char* levels[] = {"debug", "info", "warning", "error"};
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE(trial);
    DaemonOptions o;
    o.server.socket = path_text(60);
    o.tier2.data_dir = path_text(200);
    o.fd.socket = pick(0, 1) ? "" : path_text(60);
    o.tier1.pinned_bytes = size(1u << 20);
    o.tier2.spill_bytes = size(0);
    o.tier1.high_watermark = std::uniform_real_distribution<double>(0.01, 1.0)(rng);
    o.tier1.low_watermark =
        o.tier1.high_watermark * std::uniform_real_distribution<double>(0.001, 0.999)(rng);
    o.tiers.max_block_bytes = pick(1, 1ull << 30);
    o.server.max_message_bytes = pick(o.tiers.max_block_bytes + (1u << 20), 2047ull << 20);
    o.tiers.staging_bytes = pick(o.tiers.max_block_bytes, 1ull << 40);
    o.server.worker_threads = static_cast<uint32_t>(pick(0, 256));
    o.tiers.copy_threads = static_cast<uint32_t>(pick(0, 64));
    o.tiers.disk_reads_in_flight = static_cast<uint32_t>(pick(1, 64));
    o.tier1.lock_memory = pick(0, 1);
    o.tier1.prefault_memory = pick(0, 1);
    o.rings.poll_max_us = pick(0, 5000);
    o.tier2.spill_sync = pick(0, 1);
    o.tier2.spill_batch_bytes = size(1u << 20);
    o.tiers.save_wait_ms = static_cast<uint32_t>(pick(0, UINT32_MAX));
    o.server.shutdown_grace_ms = static_cast<uint32_t>(pick(0, UINT32_MAX));
    o.leases.max_leases = static_cast<uint32_t>(pick(1, UINT32_MAX));
    o.leases.max_regions_per_lease = static_cast<uint32_t>(pick(1, UINT32_MAX));
    o.leases.max_region_bytes = size(1);
    o.tier1.cuda_register_chunk_bytes = size(0);
    o.tiers.summary_layer = static_cast<int32_t>(pick(0, 1024)) - 1;
    o.log_level = levels[pick(0, 3)];
    o.server.policy = pick(0, 1) ? "" : path_text(100);
    if (pick(0, 1)) {
      o.server.policy = path_text(100);
      o.tcp.listen = pick(0, 1) ? "[::1]:" + std::to_string(pick(1, 65535))
                                : "10.0.0.1:" + std::to_string(pick(1, 65535));
      o.tcp.tls_cert = path_text(100);
      o.tcp.tls_key = path_text(100);
    }
    o.leases.max_mapped_bytes = size(1);
    o.leases.max_mappings = static_cast<uint32_t>(pick(1, 1u << 22));
    o.leases.max_mapped_bytes_per_uid = pick(0, 1) ? 0 : pick(0, o.leases.max_mapped_bytes);
    o.fd.connection_deadline_ms = static_cast<uint32_t>(pick(1, UINT32_MAX));
    o.leases.idle_ms = static_cast<uint32_t>(pick(0, UINT32_MAX));
    o.tiers.metadata_bytes = size(1u << 20);
    if (pick(0, 1)) {
      o.remote.conf = path_text(80);
      o.remote.pool = "p" + text(20);
      o.remote.user = text(20);
      o.remote.keyring = pick(0, 1) ? "" : path_text(80);
    }
    o.remote.op_timeout_ms = static_cast<uint32_t>(pick(1, UINT32_MAX));
    o.remote.required = pick(0, 1);
    o.remote.sessions = pick(0, 1);
    o.metrics.namespaces = pick(0, 1);
    o.remote.queue_bytes = size(0);
    o.remote.write_bytes_per_s = size(0);
    o.remote.write_burst_bytes = size(1);
    o.remote.inflight = static_cast<uint32_t>(pick(1, 1024));
    o.remote.retry_ms = static_cast<uint32_t>(pick(1, 1u << 20));
    o.remote.retry_max_ms = static_cast<uint32_t>(pick(o.remote.retry_ms, UINT32_MAX));
    o.remote.bytes = size(0);
    o.remote.expiry_s = pick(0, 1) ? 0 : pick(1, UINT64_MAX);
    ExpectRoundTrip(o, path);
    if (HasFailure()) break;
  }
}

TEST(DaemonFlagsTest, ConfigTextSyntax) {
  auto parsed = ParseConfigText(
      "# comment\r\n"
      "\n"
      "  a = \"x # not a comment\"   # a comment\r\n"
      "b=bare value # comment\n"
      "c = 'lit\\eral \"#\"'\n"
      "d = \"\\u00e9\\U0001F600\\t\\\\\\\"\"\n"
      "e = -1\n");
  ASSERT_OK(parsed);
  std::vector<std::pair<std::string, std::string>> want = {
      {"a", "x # not a comment"},
      {"b", "bare value"},
      {"c", "lit\\eral \"#\""},
      {"d", "\xc3\xa9\xf0\x9f\x98\x80\t\\\""},
      {"e", "-1"}};
  EXPECT_EQ(*parsed, want);
  for (const char* bad : {"[section]", "novalue", "k =", "k = # only a comment",
                          "k = \"open", "k = \"x\" trailing", "k = \"\\q\"", "k = \"\\u12\"",
                          "k = \"\\uD800\"", "k = \"\\U00110000\"", "= v", "k v"}) {
    EXPECT_THAT(ParseConfigText(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("config line 1")))
        << bad;
  }
  EXPECT_THAT(ParseConfigText("a = 1\nb = \"x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("config line 2: 'b' has an unterminated string")));
  for (const std::string& s : {std::string(""), std::string("plain"),
                               std::string("\"\\\n\t\r\x01\x1f\x7f\x80\xff#'", 11)}) {
    auto back = ParseConfigText("k = " + QuoteConfigString(s));
    ASSERT_OK(back);
    ASSERT_EQ(back->size(), 1u);
    EXPECT_EQ((*back)[0].second, s);
  }
}

TEST(DaemonFlagsTest, UnknownConfigKeyIsAnError) {
  evoke::testing::TempDir dir;
  const std::string path = dir.Join("typo.toml");
  std::ofstream(path) << "pinned-byte = \"2 GiB\"\n";
  DaemonOptions o;
  EXPECT_THAT(Parse({"--config", path}, &o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pinned-byte")));
}

}  // namespace
}  // namespace evoke
