// Prometheus /metrics end to end: a real evoked with --metrics-address
// 127.0.0.1:0, scraped over HTTP, checked by promtool, and every counter a
// known workload moves compared with the exact amount it must move (and with
// Stat's `rpcs`, the same figures). Also: an explicit address that is busy
// stops the start; a busy default does not; the Grafana dashboard and the
// Kubernetes manifests parse and name only metrics evoked exports.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/half.h"
#include "gmock/gmock.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// HttpGet fetches http://127.0.0.1:PORT/PATH (HTTP/1.0) and returns the
// body, or "" with a test failure.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "connect to 127.0.0.1:" << port << ": " << std::strerror(errno);
    close(fd);
    return "";
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    response.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  EXPECT_THAT(response, StartsWith("HTTP/1.1 200")) << response.substr(0, 200);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// Samples of one scrape: "name{labels}" exactly as printed -> value; plus
// the families it declared (# TYPE lines).
struct Scrape {
  std::string text;
  std::map<std::string, double> samples;
  std::set<std::string> families;

  // The sample's value; 0 when absent (a counter not yet moved, e.g. a
  // status code not yet answered).
  double operator[](const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? 0 : it->second;
  }
  bool Has(const std::string& series) const { return samples.count(series) > 0; }
};

Scrape Parse(const std::string& text) {
  Scrape s;
  s.text = text;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() >= 3) s.families.insert(parts[2]);
      continue;
    }
    if (absl::StartsWith(line, "#")) continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    if (space == absl::string_view::npos ||
        !absl::SimpleAtod(line.substr(space + 1), &value)) {
      ADD_FAILURE() << "unparsable sample line: " << line;
      continue;
    }
    s.samples[std::string(line.substr(0, space))] = value;
  }
  return s;
}

// A session block whose payload is finite f16 values (random bytes would
// hold NaNs, and the daemon computes no Recover summary of those).
TestBlock FiniteBlock(const std::string& session, uint64_t seq) {
  TestBlock b = SessionBlock(session, seq, 16);
  for (size_t i = 0; i + 1 < b.payload.size(); i += 2) {
    const uint16_t h = FloatToHalf(static_cast<float>((i / 2 * 31 + seq * 17) % 13) * 0.125f - 0.75f);
    std::memcpy(&b.payload[i], &h, 2);
  }
  return b;
}

int PortOf(const std::string& address) {
  int port = 0;
  const size_t colon = address.rfind(':');
  EXPECT_NE(colon, std::string::npos) << address;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(colon + 1), &port)) << address;
  return port;
}

std::string SourcePath(const std::string& relative) {
  return absl::StrCat(EVOKE_SOURCE_DIR, "/", relative);
}

// PromtoolPath finds promtool (Debian's `prometheus` package; CI installs
// it with scripts/setup-debian.sh). Its absence fails the test.
std::string PromtoolPath() {
  const CommandResult r = RunCommand({"/bin/sh", "-c", "command -v promtool"});
  std::string path = r.out;
  while (!path.empty() && (path.back() == '\n' || path.back() == ' ')) path.pop_back();
  return r.exit_code == 0 ? path : "";
}

class MetricsTest : public E2eTest {
 protected:
  // Per-namespace series on (the dashboard's namespace panels read them);
  // MetricsDefaultTest checks the default, aggregates only.
  void SetUp() override { Start({"--metrics-address", "127.0.0.1:0", "--metrics-namespaces"}); }
  void Start(const std::vector<std::string>& args) {
    StartDaemon(args);
    address_ = Stat().metrics_address();
    ASSERT_THAT(address_, StartsWith("127.0.0.1:"));
    port_ = PortOf(address_);
    ASSERT_GT(port_, 0);
  }
  Scrape ScrapeNow() { return Parse(HttpGet(port_, "/metrics")); }

  std::string address_;
  int port_ = 0;
};

std::string Rpc(const std::string& method, const std::string& code) {
  return absl::StrCat("evoke_rpc_requests_total{method=\"", method, "\",code=\"", code, "\"}");
}
std::string RpcCount(const std::string& method) {
  return absl::StrCat("evoke_rpc_duration_seconds_count{method=\"", method, "\"}");
}

class MetricsDefaultTest : public MetricsTest {
 protected:
  void SetUp() override { Start({"--metrics-address", "127.0.0.1:0"}); }
};

TEST_F(MetricsDefaultTest, NamespacesAreCountedButNeverNamed) {
  // /metrics on loopback is readable by every local user, including those
  // the access policy keeps off the socket: by default it must not tell
  // them which tenants exist or what each stores.
  ASSERT_OK(SaveBlocks(*client_, {SessionBlock("private-session", 0, 16)}));
  const Scrape s = ScrapeNow();
  ASSERT_FALSE(s.text.empty());
  EXPECT_EQ(s["evoke_namespaces"], 1);
  EXPECT_EQ(s["evoke_tier_blocks{tier=\"1\"}"], 1);
  EXPECT_THAT(s.text, Not(HasSubstr("namespace=\""))) << s.text;
  for (const std::string& family : s.families) {
    EXPECT_FALSE(absl::StartsWith(family, "evoke_namespace_")) << family;
  }
}

TEST_F(MetricsTest, AddressIsReportedAndLogged) {
  EXPECT_THAT(daemon_->Log(),
              HasSubstr(absl::StrCat("serving /metrics on http://", address_, "/metrics")));
}

TEST_F(MetricsTest, PromtoolFindsNothingToReport) {
  const std::string promtool = PromtoolPath();
  ASSERT_FALSE(promtool.empty())
      << "promtool not found: install Debian's `prometheus` (scripts/setup-debian.sh)";
  // Some traffic first, so that histograms and per-code counters have
  // samples, and a namespace label exists.
  const TestBlock b = SessionBlock("lint", 0, 16);
  ASSERT_OK(SaveBlocks(*client_, {b}));
  ASSERT_OK(client_->Load({b.id()}, SmallFingerprint()).status());
  const Scrape s = ScrapeNow();
  ASSERT_FALSE(s.text.empty());
  const std::string file = dir_.Join("metrics.txt");
  std::ofstream(file) << s.text;
  const CommandResult r =
      RunCommand({"/bin/sh", "-c", absl::StrCat("'", promtool, "' check metrics < '", file, "'")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // promtool prints its lint findings; clean means none.
  EXPECT_EQ(r.out + r.err, "") << s.text;
}

TEST_F(MetricsTest, WorkloadMovesEachCounterByItsAmount) {
  const v1::LayoutFingerprint fp = SmallFingerprint();
  std::vector<TestBlock> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(FiniteBlock("work", i));
  std::vector<BlockId> missing;
  for (int i = 100; i < 103; ++i) missing.push_back(SessionBlock("work", i, 16).id());
  // The ring: a shared region makes the client attach one (AttachRing).
  ASSERT_OK_AND_ASSIGN(auto region, client_->CreateSharedRegion(1 << 20));
  ASSERT_TRUE(client_->has_ring());
  const TestBlock r0 = SessionBlock("ring", 0, 16), r1 = SessionBlock("ring", 1, 16);

  const Scrape before = ScrapeNow();

  // 3 Save calls of 2 blocks each: 6 blocks stored.
  for (int i = 0; i < 6; i += 2) ASSERT_OK(SaveBlocks(*client_, {blocks[i], blocks[i + 1]}));
  // 2 Load calls of 2 blocks each, all tier-1 hits.
  ASSERT_OK(client_->Load({blocks[0].id(), blocks[1].id()}, fp).status());
  ASSERT_OK(client_->Load({blocks[2].id(), blocks[3].id()}, fp).status());
  // 1 Lookup of 3 absent blocks (it answers the present prefix: none).
  ASSERT_OK_AND_ASSIGN(std::vector<v1::Tier> found, client_->Lookup(missing));
  ASSERT_EQ(found.size(), 0u);
  // 3 Loads of an absent block each: NOT_FOUND, 3 misses.
  for (const BlockId& id : missing) {
    EXPECT_THAT(client_->Load({id}, fp).status(), StatusIs(absl::StatusCode::kNotFound));
  }
  // 1 Recover over the session's 6 blocks.
  v1::RecoverRequest recover;
  recover.mutable_session()->set_namespace_(fp.namespace_());
  recover.mutable_session()->set_session_id("work");
  recover.set_kind(v1::SUMMARY_MEAN_KEYS);
  // The layer the daemon summarized (the middle of the block's layers).
  ASSERT_OK_AND_ASSIGN(v1::BlockInfo info, client_->Describe(blocks[0].id()));
  ASSERT_EQ(info.meta().summaries_size(), 1);
  recover.set_layer(info.meta().summaries(0).layer());
  recover.set_n_query_heads(2);
  for (int i = 0; i < 2 * 64; ++i) recover.add_queries(i % 7 == 0 ? 1.0f : 0.0f);
  recover.set_k(2);
  ASSERT_OK_AND_ASSIGN(v1::RecoverResponse recovered, client_->Recover(recover));
  ASSERT_EQ(recovered.candidates(), 6u);
  // 1 bad request: Delete without ids (the client library would refuse to
  // send it, so a raw stub does).
  {
    std::unique_ptr<v1::KvTier::Stub> stub = RawStub(daemon_->socket());
    grpc::ClientContext context;
    v1::DeleteRequest request;
    v1::DeleteResponse response;
    const grpc::Status s = stub->Delete(&context, request, &response);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  // 1 Delete of 1 block.
  ASSERT_OK(client_->Delete({blocks[5].id()}));
  // 2 ring saves and 2 ring loads (region slices go through the ring).
  std::memcpy(region->data(), r0.payload.data(), r0.payload.size());
  std::memcpy(region->data() + 65536, r1.payload.data(), r1.payload.size());
  ASSERT_OK(client_
                ->Save({BlockToSave(r0.meta, region->Slice(0, r0.payload.size())),
                        BlockToSave(r1.meta, region->Slice(65536, r1.payload.size()))})
                .status());
  ASSERT_OK(client_
                ->LoadInto({r0.id(), r1.id()}, fp,
                           {region->Slice(4 * 65536, 65536), region->Slice(5 * 65536, 65536)})
                .status());

  const Scrape after = ScrapeNow();
  auto delta = [&](const std::string& series) { return after[series] - before[series]; };

  // Calls by method and status (the ring's entries are not RPCs).
  EXPECT_EQ(delta(Rpc("Save", "OK")), 3);
  EXPECT_EQ(delta(Rpc("Load", "OK")), 2);
  EXPECT_EQ(delta(Rpc("Load", "NOT_FOUND")), 3);
  EXPECT_EQ(delta(Rpc("Lookup", "OK")), 1);
  EXPECT_EQ(delta(Rpc("Recover", "OK")), 1);
  EXPECT_EQ(delta(Rpc("Delete", "OK")), 1);
  EXPECT_EQ(delta(Rpc("Delete", "INVALID_ARGUMENT")), 1);
  EXPECT_EQ(delta(Rpc("ring.Save", "OK")), 2);
  EXPECT_EQ(delta(Rpc("ring.Load", "OK")), 2);
  EXPECT_EQ(delta(Rpc("Describe", "OK")), 1);
  EXPECT_EQ(delta(Rpc("Stat", "OK")), 0);
  // Latency histograms count the same calls, every status.
  EXPECT_EQ(delta(RpcCount("Save")), 3);
  EXPECT_EQ(delta(RpcCount("Load")), 5);
  EXPECT_EQ(delta(RpcCount("Delete")), 2);
  EXPECT_EQ(delta(RpcCount("Recover")), 1);
  EXPECT_EQ(delta(RpcCount("ring.Save")), 2);
  EXPECT_EQ(delta(RpcCount("ring.Load")), 2);
  EXPECT_GT(delta("evoke_rpc_duration_seconds_sum{method=\"Save\"}"), 0);
  EXPECT_EQ(delta("evoke_rpc_duration_seconds_bucket{method=\"Save\",le=\"+Inf\"}"), 3);
  // Recover: one search over 6 candidates.
  EXPECT_EQ(delta("evoke_recover_candidates_count"), 1);
  EXPECT_EQ(delta("evoke_recover_candidates_sum"), 6);
  // Storage counters (blocks).
  EXPECT_EQ(delta("evoke_saves_total"), 8);
  EXPECT_EQ(delta("evoke_dedups_total"), 0);
  EXPECT_EQ(delta("evoke_loads_total"), 6);
  EXPECT_EQ(delta("evoke_hits_total{tier=\"1\"}"), 6);
  EXPECT_EQ(delta("evoke_hits_total{tier=\"2\"}"), 0);
  EXPECT_EQ(delta("evoke_misses_total"), 3);
  EXPECT_EQ(delta("evoke_deletes_total"), 1);
  EXPECT_EQ(delta("evoke_checksum_failures_total"), 0);
  EXPECT_EQ(delta("evoke_ring_ops_total"), 4);
  // Occupancy: 7 blocks of 32 KiB each left in tier 1.
  EXPECT_EQ(delta("evoke_tier_blocks{tier=\"1\"}"), 7);
  EXPECT_EQ(delta("evoke_tier_payload_bytes{tier=\"1\"}"), 7.0 * static_cast<double>(r0.payload.size()));
  EXPECT_EQ(after["evoke_namespace_blocks{namespace=\"test\"}"], 7);
  EXPECT_EQ(after["evoke_namespaces"], 1);
  EXPECT_EQ(after["evoke_leases"], 1);
  EXPECT_EQ(after["evoke_rings"], 1);
  EXPECT_GE(after["evoke_regions{kind=\"shm\"}"], 1);
  EXPECT_GT(after["evoke_tier_capacity_bytes{tier=\"1\"}"], 0);
  // Phases: every Save copied (one observation per batch: 3 RPC batches and
  // at least one ring batch) and summarized its canonical blocks.
  EXPECT_GE(delta("evoke_phase_duration_seconds_count{phase=\"copy\"}"), 4);
  EXPECT_GE(delta("evoke_phase_duration_seconds_count{phase=\"summary\"}"), 4);
  for (const char* phase : {"copy", "checksum", "summary", "reanchor", "rocksdb"}) {
    EXPECT_TRUE(after.Has(absl::StrCat("evoke_phase_duration_seconds_count{phase=\"", phase,
                                       "\"}")))
        << phase;
  }

  // Stat's `rpcs` are the same figures (Stat's own call is still running
  // when it answers, so Stat is left out).
  const v1::StatResponse stat = Stat();
  EXPECT_EQ(stat.metrics_address(), address_);
  std::set<std::string> seen;
  for (const v1::RpcStat& r : stat.rpcs()) {
    seen.insert(r.method());
    if (r.method() == "Stat") continue;
    SCOPED_TRACE(r.method());
    EXPECT_EQ(static_cast<double>(r.calls()), after[RpcCount(r.method())]);
    EXPECT_EQ(static_cast<double>(r.calls() - r.errors()), after[Rpc(r.method(), "OK")]);
    ASSERT_EQ(r.bucket_counts_size(), r.bucket_upper_seconds_size() + 1);
    uint64_t total = 0;
    for (uint64_t n : r.bucket_counts()) total += n;
    EXPECT_EQ(total, r.calls());
    EXPECT_NEAR(r.seconds_sum(),
                after[absl::StrCat("evoke_rpc_duration_seconds_sum{method=\"", r.method(),
                                   "\"}")],
                1e-6);
  }
  for (const char* method : {"Save", "Load", "Lookup", "Recover", "Delete", "ring.Save",
                             "ring.Load", "Stat"}) {
    EXPECT_TRUE(seen.count(method)) << method;
  }

  // The lease ends with the client: one key=value line, and its stream is
  // now a completed OpenLease call (CANCELLED: the client went away).
  region.reset();
  client_.reset();
  EXPECT_TRUE(Eventually(
      [&] {
        return absl::StrContains(daemon_->Log(),
                                 "level=info prog=evoked msg=\"lease ended\" client=e2e-test uid=");
      },
      "the lease-ended line"));
  EXPECT_TRUE(Eventually([&] { return ScrapeNow()[RpcCount("OpenLease")] == 1; },
                         "OpenLease counted"));
}

TEST_F(MetricsTest, DashboardAndManifestsNameOnlyExportedMetrics) {
  const Scrape s = ScrapeNow();
  const std::string dashboard = SourcePath("deploy/grafana/evoke-dashboard.json");
  const CommandResult json = RunCommand({"python3", "-m", "json.tool", dashboard});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  std::ifstream in(dashboard);
  std::stringstream text;
  text << in.rdbuf();
  const std::string body = text.str();
  const std::regex name("evoke_[a-z0-9_]+");
  int names = 0;
  for (auto it = std::sregex_iterator(body.begin(), body.end(), name);
       it != std::sregex_iterator(); ++it) {
    std::string metric = it->str();
    for (const char* suffix : {"_bucket", "_count", "_sum"}) {
      if (absl::EndsWith(metric, suffix) && !s.families.count(metric)) {
        metric = metric.substr(0, metric.size() - std::strlen(suffix));
      }
    }
    EXPECT_TRUE(s.families.count(metric)) << it->str() << " is not exported";
    ++names;
  }
  EXPECT_GT(names, 10);
  // The manifests are valid YAML, and the DaemonSet is annotated for
  // scraping.
  const CommandResult yaml = RunCommand(
      {"python3", "-c",
       "import sys, yaml\n"
       "for path in sys.argv[1:]:\n"
       "    list(yaml.safe_load_all(open(path)))\n",
       SourcePath("deploy/kubernetes/evoked-daemonset.yaml")});
  EXPECT_EQ(yaml.exit_code, 0) << yaml.err;
  std::ifstream ds(SourcePath("deploy/kubernetes/evoked-daemonset.yaml"));
  std::stringstream ds_text;
  ds_text << ds.rdbuf();
  EXPECT_THAT(ds_text.str(), HasSubstr("prometheus.io/scrape: \"true\""));
  EXPECT_THAT(ds_text.str(), HasSubstr("--metrics-address"));
}

// An address given explicitly that is busy stops the start, naming the flag.
TEST(MetricsAddressTest, BusyExplicitAddressRefusesToStart) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string busy = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  TempDir dir;
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start(dir.path(), {"--metrics-address", busy});
  close(fd);
  ASSERT_FALSE(d.ok()) << "evoked started on a busy --metrics-address";
  EXPECT_THAT(d.status().message(), HasSubstr("exited"));
  EXPECT_THAT(d.status().message(), HasSubstr("--metrics-address: cannot serve /metrics on " + busy));
}

// The default address busy (held here, or by another evoked): evoked warns
// and serves without /metrics.
TEST(MetricsAddressTest, BusyDefaultAddressOnlyWarns) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(9464);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Other tests' daemons take the default port for a moment: wait for it
  // (up to 30 s), so that it is surely busy while the daemon starts. A
  // holder that never lets go keeps it busy just the same.
  bool held = false;
  WaitUntil(
      [&] {
        held = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
               listen(fd, 1) == 0;
        return held;
      },
      absl::Seconds(30), absl::Milliseconds(100));
  TempDir dir;
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  std::unique_ptr<Client> client = (*d)->Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(v1::StatResponse stat, client->Stat());
  close(fd);
  EXPECT_EQ(stat.metrics_address(), "") << (held ? "held by this test" : "held elsewhere");
  EXPECT_THAT((*d)->Log(), HasSubstr("serving without /metrics"));
}

// Empty turns /metrics off, silently.
TEST(MetricsAddressTest, EmptyAddressTurnsMetricsOff) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d =
      DaemonProcess::Start(dir.path(), {"--metrics-address="});
  ASSERT_TRUE(d.ok()) << d.status();
  std::unique_ptr<Client> client = (*d)->Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(v1::StatResponse stat, client->Stat());
  EXPECT_EQ(stat.metrics_address(), "");
  EXPECT_THAT((*d)->Log(), Not(HasSubstr("/metrics")));
}

}  // namespace
}  // namespace evoke::testing
