#include <fstream>
#include <string>
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
  EXPECT_EQ(o.pinned_bytes, 1ull << 30);
  EXPECT_EQ(o.socket, "evoked.sock");
  EXPECT_EQ(o.data_dir, "evoke-data");
  EXPECT_GE(o.max_message_bytes, o.max_block_bytes + (1u << 20));
}

TEST(DaemonOptionsTest, ValidateNamesTheFlag) {
  struct Case {
    void (*mutate)(DaemonOptions*);
    const char* message;
  } cases[] = {
      {[](DaemonOptions* o) { o->socket = ""; }, "--socket: is required"},
      {[](DaemonOptions* o) { o->socket = std::string(200, 's'); }, "--socket: path"},
      {[](DaemonOptions* o) { o->data_dir = ""; }, "--data-dir: is required"},
      {[](DaemonOptions* o) { o->pinned_bytes = 1000; }, "--pinned-bytes"},
      {[](DaemonOptions* o) { o->low_watermark = 0.99; }, "--low-watermark: 0.99"},
      {[](DaemonOptions* o) { o->high_watermark = 1.5; }, "--high-watermark: 1.5"},
      {[](DaemonOptions* o) { o->max_block_bytes = 0; }, "--max-block-bytes"},
      {[](DaemonOptions* o) { o->max_message_bytes = 64ull << 20; },
       "--max-message-bytes"},
      {[](DaemonOptions* o) { o->worker_threads = 1000; }, "--worker-threads"},
      {[](DaemonOptions* o) { o->log_level = "loud"; }, "--log-level: 'loud'"},
      {[](DaemonOptions* o) { o->tcp_listen = "nonsense"; }, "--tcp-listen: 'nonsense'"},
      {[](DaemonOptions* o) { o->tcp_listen = "host:0"; }, "--tcp-listen"},
      {[](DaemonOptions* o) { o->tcp_listen = "host:65536"; }, "--tcp-listen"},
      {[](DaemonOptions* o) { o->tcp_listen = "::1:7070"; }, "--tcp-listen"},
      {[](DaemonOptions* o) { o->tcp_listen = "0.0.0.0:7070"; },
       "--tcp-listen: requires --tls-cert"},
      {[](DaemonOptions* o) {
         o->tcp_listen = "0.0.0.0:7070";
         o->tls_cert = "c.pem";
         o->tls_key = "k.pem";
       },
       "--tcp-listen: requires --policy"},
      {[](DaemonOptions* o) { o->tls_cert = "c.pem"; }, "--tls-cert: is used only"},
      {[](DaemonOptions* o) { o->tls_key = "k.pem"; }, "--tls-key: is used only"},
      {[](DaemonOptions* o) { o->max_mapped_bytes = 0; }, "--max-mapped-bytes: must be"},
      {[](DaemonOptions* o) { o->max_mappings = 0; }, "--max-mappings"},
      {[](DaemonOptions* o) { o->max_mapped_bytes_per_uid = 65ull << 30; },
       "--max-mapped-bytes-per-uid: 65 GiB exceeds"},
      {[](DaemonOptions* o) { o->fd_connection_deadline_ms = 0; },
       "--fd-connection-deadline-ms"},
      {[](DaemonOptions* o) { o->metadata_bytes = 4096; }, "--metadata-bytes"},
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
  EXPECT_EQ(o.policy, "");
  EXPECT_EQ(o.tcp_listen, "");
  EXPECT_EQ(o.tls_cert, "");
  EXPECT_EQ(o.tls_key, "");
  EXPECT_EQ(o.max_mapped_bytes, 64ull << 30);
  EXPECT_EQ(o.max_mappings, 16384u);
  EXPECT_EQ(o.max_mapped_bytes_per_uid, 0u);
  EXPECT_EQ(o.ResolvedMaxMappedBytesPerUid(), 64ull << 30);
  o.max_mapped_bytes = 8ull << 30;
  EXPECT_EQ(o.ResolvedMaxMappedBytesPerUid(), 8ull << 30);
  o.max_mapped_bytes_per_uid = 1ull << 30;
  EXPECT_EQ(o.ResolvedMaxMappedBytesPerUid(), 1ull << 30);
  EXPECT_EQ(o.fd_connection_deadline_ms, 2000u);
  EXPECT_EQ(o.lease_idle_ms, 0u);
  EXPECT_EQ(o.metadata_bytes, 1ull << 30);
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

TEST(DaemonFlagsTest, HardeningFlagsMapOntoOptions) {
  DaemonOptions o;
  ASSERT_OK(Parse({"--policy", "/etc/evoke/policy", "--tcp-listen", "[::]:7070",
                   "--tls-cert", "/etc/evoke/c.pem", "--tls-key", "/etc/evoke/k.pem",
                   "--max-mapped-bytes", "8GiB", "--max-mappings", "100",
                   "--max-mapped-bytes-per-uid", "1GiB", "--fd-connection-deadline-ms",
                   "500", "--lease-idle-ms", "60000", "--metadata-bytes", "256MiB"},
                  &o));
  EXPECT_EQ(o.policy, "/etc/evoke/policy");
  EXPECT_EQ(o.tcp_listen, "[::]:7070");
  EXPECT_EQ(o.tls_cert, "/etc/evoke/c.pem");
  EXPECT_EQ(o.tls_key, "/etc/evoke/k.pem");
  EXPECT_EQ(o.max_mapped_bytes, 8ull << 30);
  EXPECT_EQ(o.max_mappings, 100u);
  EXPECT_EQ(o.max_mapped_bytes_per_uid, 1ull << 30);
  EXPECT_EQ(o.fd_connection_deadline_ms, 500u);
  EXPECT_EQ(o.lease_idle_ms, 60000u);
  EXPECT_EQ(o.metadata_bytes, 256ull << 20);
}

TEST(DaemonFlagsTest, FlagsMapOntoOptions) {
  DaemonOptions o;
  ASSERT_OK(Parse({"--socket", "/tmp/x.sock", "--data-dir=/tmp/d", "--pinned-bytes",
                   "64MiB", "--spill-bytes=2GiB", "--high-watermark", "0.9",
                   "--low-watermark", "0.5", "--max-block-bytes", "16MiB",
                   "--max-message-bytes", "32MiB", "--worker-threads", "3",
                   "--lock-memory=false", "--spill-sync=true", "--save-wait-ms",
                   "250", "--log-level", "debug"},
                  &o));
  EXPECT_EQ(o.socket, "/tmp/x.sock");
  EXPECT_EQ(o.data_dir, "/tmp/d");
  EXPECT_EQ(o.pinned_bytes, 64ull << 20);
  EXPECT_EQ(o.spill_bytes, 2ull << 30);
  EXPECT_DOUBLE_EQ(o.high_watermark, 0.9);
  EXPECT_DOUBLE_EQ(o.low_watermark, 0.5);
  EXPECT_EQ(o.max_block_bytes, 16ull << 20);
  EXPECT_EQ(o.max_message_bytes, 32ull << 20);
  EXPECT_EQ(o.worker_threads, 3u);
  EXPECT_FALSE(o.lock_memory);
  EXPECT_TRUE(o.spill_sync);
  EXPECT_EQ(o.save_wait_ms, 250u);
  EXPECT_EQ(o.log_level, "debug");
}

TEST(DaemonFlagsTest, BadValuesAreRejectedWithTheFlagName) {
  DaemonOptions o;
  EXPECT_THAT(Parse({"--pinned-bytes", "lots"}, &o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--pinned-bytes")));
  EXPECT_THAT(Parse({"--no-such-flag"}, &o),
              StatusIs(absl::StatusCode::kInvalidArgument));
  DaemonOptions p;
  EXPECT_THAT(Parse({"--low-watermark", "0.97"}, &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--low-watermark")));
}

TEST(DaemonFlagsTest, ConfigFileRoundTripsAndFlagsOverride) {
  evoke::testing::TempDir dir;
  DaemonOptions custom;
  custom.socket = dir.Join("d.sock");
  custom.data_dir = dir.Join("data");
  custom.pinned_bytes = 96ull << 20;
  custom.spill_bytes = 3ull << 30;
  custom.high_watermark = 0.9;
  custom.low_watermark = 0.7;
  custom.max_block_bytes = 8ull << 20;
  custom.max_message_bytes = (16ull << 20) + 12345;  // Not a round unit.
  custom.worker_threads = 5;
  custom.copy_threads = 3;
  custom.lock_memory = false;
  custom.spill_sync = true;
  custom.spill_batch_bytes = 32ull << 20;
  custom.save_wait_ms = 777;
  custom.shutdown_grace_ms = 999;
  custom.log_level = "warning";
  custom.fd_socket = dir.Join("d.fd");
  custom.max_leases = 9;
  custom.max_regions_per_lease = 7;
  custom.max_region_bytes = 5ull << 30;
  custom.cuda_register_chunk_bytes = 0;
  custom.summary_layer = 7;
  custom.policy = dir.Join("policy");
  custom.tcp_listen = "127.0.0.1:7070";
  custom.tls_cert = dir.Join("c.pem");
  custom.tls_key = dir.Join("k.pem");
  custom.max_mapped_bytes = 9ull << 30;
  custom.max_mappings = 77;
  custom.max_mapped_bytes_per_uid = 3ull << 30;
  custom.fd_connection_deadline_ms = 1234;
  custom.lease_idle_ms = 4321;
  custom.metadata_bytes = 300ull << 20;
  const std::string path = dir.Join("evoked.toml");
  std::ofstream(path) << OptionsToConfig(custom);

  DaemonOptions read;
  ASSERT_OK(Parse({"--config", path}, &read));
  EXPECT_EQ(OptionsToConfig(read), OptionsToConfig(custom));

  DaemonOptions overridden;
  ASSERT_OK(Parse({"--config", path, "--pinned-bytes", "128MiB"}, &overridden));
  EXPECT_EQ(overridden.pinned_bytes, 128ull << 20);
  EXPECT_EQ(overridden.spill_bytes, 3ull << 30);
}

TEST(DaemonFlagsTest, ShippedProductionConfigIsValid) {
  DaemonOptions o;
  ASSERT_OK(Parse({"--config", std::string(EVOKE_SOURCE_DIR) + "/deploy/evoked.toml"}, &o));
  EXPECT_EQ(o.socket, "/run/evoke/evoked.sock");
  EXPECT_EQ(o.data_dir, "/var/lib/evoke");
  EXPECT_EQ(o.pinned_bytes, 32ull << 30);
  EXPECT_EQ(o.spill_bytes, 512ull << 30);
}

TEST(DaemonFlagsTest, PrintConfigPrintsEveryOption) {
  DaemonOptions o;
  std::string out;
  ASSERT_OK(Parse({"--print-config", "--pinned-bytes", "2GiB"}, &o, &out));
  EXPECT_THAT(out, HasSubstr("pinned-bytes = \"2 GiB\""));
  for (const char* key : {"socket", "data-dir", "spill-bytes", "high-watermark",
                          "low-watermark", "max-block-bytes", "max-message-bytes",
                          "worker-threads", "copy-threads", "lock-memory", "spill-sync",
                          "spill-batch-bytes", "save-wait-ms", "shutdown-grace-ms",
                          "fd-socket", "max-leases", "max-regions-per-lease",
                          "max-region-bytes", "cuda-register-chunk-bytes", "summary-layer",
                          "log-level", "policy", "tcp-listen", "tls-cert", "tls-key",
                          "max-mapped-bytes", "max-mappings", "max-mapped-bytes-per-uid",
                          "fd-connection-deadline-ms", "lease-idle-ms", "metadata-bytes"}) {
    EXPECT_THAT(out, HasSubstr(std::string("\n") + key + " = ")) << key;
  }
}

}  // namespace
}  // namespace evoke
