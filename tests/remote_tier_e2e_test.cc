// The remote tier (issue #14) end to end: two real evoked daemons ("host A"
// and "host B": own data dirs and sockets) share prefix blocks through a real
// throwaway Ceph cluster (scripts/ceph-dev-cluster.sh: 1 mon, 1 mgr, 3
// memstore OSDs, pool `evoke` size 3 / min_size 2), started once for this
// binary. The drills:
//   a) a chain saved on A is found by B's fleet-wide Lookup and loaded
//      byte-identical from RADOS; B saving the chain again writes nothing;
//   b) A killed -9 after its write-behind drained: B still loads its blocks;
//   c) an OSD killed -9 during write-behind: no client error, nothing wrong
//      served, writes continue (the cluster stays degraded afterwards);
//   d) the whole cluster frozen: local loads stay fast, a remote-only block is
//      UNAVAILABLE (not NOT_FOUND), service resumes after the thaw;
//   e) a remote object's bytes flipped with `rados put`: refused (DATA_LOSS),
//      counted, removed from the pool, never served;
//   f) bad configuration: a clear error at start with --remote-required, a
//      degraded start (local service, Stat says why) without it;
//   g) expiry: a host started with --remote-expiry-s removes the blocks
//      written before the cut-off, whichever host wrote them.
// Each drill uses its own evoke namespace (= RADOS namespace), so the drills
// do not see each other's objects. Skips (saying how to run it) only when
// Ceph is not installed or the cluster does not start; EVOKE_REQUIRE_CEPH=1
// makes that a failure.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "evoke/client.h"
#include "gtest/gtest.h"
#include "testing/blocks.h"
#include "testing/ceph_cluster.h"
#include "testing/daemon_process.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke::testing {
namespace {

// ---------------------------------------------------------------------------
// One cluster for the whole binary.

class CephEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>();
    absl::StatusOr<std::unique_ptr<CephCluster>> c = CephCluster::Start(dir_->Join("ceph"));
    if (c.ok()) {
      cluster_ = std::move(c).value();
      std::cerr << "[ceph] cluster up in " << absl::FormatDuration(cluster_->start_time())
                << ": " << cluster_->conf_path() << "\n";
    } else {
      status_ = c.status();
    }
  }
  void TearDown() override {
    cluster_.reset();
    dir_.reset();
  }
  CephCluster* cluster() const { return cluster_.get(); }
  const absl::Status& status() const { return status_; }

 private:
  std::unique_ptr<TempDir> dir_;
  std::unique_ptr<CephCluster> cluster_;
  absl::Status status_;
};

CephEnvironment* const g_ceph = static_cast<CephEnvironment*>(
    ::testing::AddGlobalTestEnvironment(new CephEnvironment()));

// ---------------------------------------------------------------------------

// One evoked "host": its own directory, socket and tiers.
struct Host {
  TempDir dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<Client> client;
};

// A prefix chain of `n` blocks of `block_tokens` tokens in namespace `ns`,
// tokens starting at `first_token` (different chains: different tokens).
std::vector<TestBlock> Chain(const std::string& ns, int n, int block_tokens,
                             int32_t first_token = 1000) {
  const v1::LayoutFingerprint fp = SmallFingerprint(ns);
  std::vector<int32_t> tokens(static_cast<size_t>(n) * block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = first_token + static_cast<int32_t>(i);
  std::vector<TestBlock> blocks;
  uint64_t seed = std::hash<std::string>()(ns) + first_token;
  for (v1::BlockMeta& meta : PrefixChainMetas(fp, tokens, block_tokens)) {
    TestBlock b;
    b.meta = std::move(meta);
    b.payload = CanonicalPayload(b.meta, seed++);
    blocks.push_back(std::move(b));
  }
  return blocks;
}

std::vector<BlockId> Ids(const std::vector<TestBlock>& blocks) {
  std::vector<BlockId> ids;
  for (const TestBlock& b : blocks) ids.push_back(b.id());
  return ids;
}

absl::Status Save(Client& client, const std::vector<TestBlock>& blocks) {
  std::vector<BlockToSave> batch;
  for (const TestBlock& b : blocks) batch.push_back({b.meta, b.payload, false});
  return client.Save(batch).status();
}

std::string ObjectName(const BlockId& id) { return "b." + id.ToHex(); }

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (g_ceph->cluster() == nullptr) {
      if (CephCluster::Required()) FAIL() << g_ceph->status();
      GTEST_SKIP() << "no Ceph cluster: " << g_ceph->status().message() << "\n"
                   << CephCluster::kHowToRun;
    }
  }

  CephCluster& ceph() { return *g_ceph->cluster(); }

  // The flags of the tests: short deadlines and breaker intervals.
  std::vector<std::string> RemoteFlags(const std::string& conf, const std::string& pool) {
    return {"--remote-conf", conf, "--remote-pool", pool, "--remote-op-timeout-ms", "3000",
            "--remote-retry-ms", "500", "--remote-retry-max-ms", "2000"};
  }
  std::vector<std::string> RemoteFlags() {
    return RemoteFlags(ceph().conf_path(), ceph().pool());
  }

  void StartHost(Host& host, std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = RemoteFlags();
    flags.insert(flags.end(), extra.begin(), extra.end());
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(host.dir.path(), flags);
    ASSERT_TRUE(d.ok()) << d.status();
    host.daemon = std::move(d).value();
    host.client = host.daemon->Connect();
    ASSERT_NE(host.client, nullptr);
    const v1::RemoteStat r = Remote(host);
    ASSERT_TRUE(r.enabled()) << "evoked has no remote tier: " << r.DebugString();
    ASSERT_TRUE(r.connected()) << r.DebugString() << "\n" << host.daemon->Log();
  }

  static v1::RemoteStat Remote(Host& host) {
    absl::StatusOr<v1::StatResponse> s = host.client->Stat();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? s->remote() : v1::RemoteStat();
  }

  // Waits until `host`'s write-behind has nothing queued or in flight and
  // has written (or found written) at least `expected` objects.
  static ::testing::AssertionResult Drained(Host& host, uint64_t expected,
                                            absl::Duration timeout = absl::Seconds(20)) {
    v1::RemoteStat r;
    if (WaitUntil(
            [&] {
              r = Remote(host);
              return r.queue_blocks() == 0 && r.inflight() == 0 &&
                     r.objects_written() + r.dedups() >= expected;
            },
            timeout, absl::Milliseconds(50))) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "write-behind did not drain " << expected << " objects in "
           << absl::FormatDuration(timeout) << ": " << r.DebugString();
  }

  // Loads `blocks` on `host` and checks every payload; `from` is the tier
  // each must be served from (TIER_UNSPECIFIED: any).
  static void ExpectLoads(Host& host, const std::vector<TestBlock>& blocks,
                          v1::Tier from = v1::TIER_UNSPECIFIED) {
    ASSERT_FALSE(blocks.empty());
    absl::StatusOr<std::vector<LoadedBlock>> loaded =
        host.client->Load(Ids(blocks), blocks[0].meta.fingerprint());
    ASSERT_OK(loaded.status());
    ASSERT_EQ(loaded->size(), blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_TRUE((*loaded)[i].payload == blocks[i].payload) << "block " << i << " differs";
      if (from != v1::TIER_UNSPECIFIED) {
        EXPECT_EQ((*loaded)[i].served_from, from) << "block " << i;
      }
    }
  }
};

// a) A chain saved on A, found on B by fleet-wide longest prefix and loaded
// byte-identical from RADOS; saving it again on B writes nothing remote.
TEST_F(RemoteTierTest, ChainSavedOnOneHostIsFoundAndLoadedOnAnother) {
  const std::string ns = "drill-a";
  Host a, b;
  StartHost(a);
  StartHost(b);
  const std::vector<TestBlock> chain = Chain(ns, 16, 16);
  ASSERT_OK(Save(*a.client, chain));
  ASSERT_TRUE(Drained(a, chain.size()));
  const v1::RemoteStat ra = Remote(a);
  EXPECT_EQ(ra.objects_written(), chain.size());
  EXPECT_EQ(ra.bytes_written(), chain.size() * chain[0].payload.size());
  EXPECT_EQ(ra.dropped_blocks(), 0u);

  // One object per block, named b.<hex id>, in the namespace's RADOS
  // namespace; its data is the payload.
  absl::StatusOr<std::vector<std::string>> names = ceph().RadosList(ns);
  ASSERT_OK(names.status());
  EXPECT_EQ(names->size(), chain.size());
  absl::StatusOr<std::string> stored = ceph().RadosGet(ns, ObjectName(chain[3].id()));
  ASSERT_OK(stored.status());
  EXPECT_TRUE(*stored == chain[3].payload);

  // B has none of it locally; the local-only Lookup finds nothing, the
  // fleet-wide one the whole chain in the remote tier.
  absl::StatusOr<std::vector<v1::Tier>> local = b.client->Lookup(Ids(chain));
  ASSERT_OK(local.status());
  EXPECT_EQ(local->size(), 0u);
  absl::StatusOr<std::vector<v1::Tier>> found = b.client->Lookup(Ids(chain), ns);
  ASSERT_OK(found.status());
  ASSERT_EQ(found->size(), chain.size());
  for (v1::Tier t : *found) EXPECT_EQ(t, v1::TIER_REMOTE);
  // A longer query stops where the chain does.
  std::vector<BlockId> longer = Ids(chain);
  longer.push_back(Chain(ns, 1, 16, 9000)[0].id());
  found = b.client->Lookup(longer, ns);
  ASSERT_OK(found.status());
  EXPECT_EQ(found->size(), chain.size());

  ExpectLoads(b, chain, v1::TIER_REMOTE);
  const v1::RemoteStat rb = Remote(b);
  EXPECT_GE(rb.fetches(), chain.size());
  EXPECT_EQ(rb.fetched_bytes(), chain.size() * chain[0].payload.size());
  EXPECT_EQ(rb.checksum_failures(), 0u);
  // Promoted: a second Load is served locally.
  ExpectLoads(b, chain, v1::TIER_PINNED_HOST);

  // B saves the chain it now holds: nothing new goes to RADOS.
  ASSERT_OK(Save(*b.client, chain));
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(Drained(b, 0));
  EXPECT_EQ(Remote(b).objects_written(), 0u);

  // B computes a chain that A already wrote (B never loaded it): B's
  // write-behind finds each object there, a no-op (dedups), no bytes.
  const std::vector<TestBlock> chain2 = Chain(ns, 8, 16, 5000);
  ASSERT_OK(Save(*a.client, chain2));
  ASSERT_TRUE(Drained(a, chain.size() + chain2.size()));
  const v1::RemoteStat rb1 = Remote(b);
  ASSERT_OK(Save(*b.client, chain2));
  ASSERT_TRUE(Drained(b, rb1.objects_written() + rb1.dedups() + chain2.size()));
  const v1::RemoteStat rb2 = Remote(b);
  EXPECT_EQ(rb2.objects_written(), 0u);
  EXPECT_EQ(rb2.bytes_written(), 0u);
  EXPECT_EQ(rb2.dedups() - rb1.dedups(), chain2.size());
  names = ceph().RadosList(ns);
  ASSERT_OK(names.status());
  EXPECT_EQ(names->size(), chain.size() + chain2.size());
}

// b) A is killed -9 after its write-behind drained: B still loads A's blocks.
TEST_F(RemoteTierTest, BlocksOutliveTheHostThatWroteThem) {
  const std::string ns = "drill-b";
  Host a, b;
  StartHost(a);
  StartHost(b);
  const std::vector<TestBlock> chain = Chain(ns, 8, 32);
  ASSERT_OK(Save(*a.client, chain));
  ASSERT_TRUE(Drained(a, chain.size()));
  a.client.reset();
  a.daemon->KillHard();
  absl::StatusOr<std::vector<v1::Tier>> found = b.client->Lookup(Ids(chain), ns);
  ASSERT_OK(found.status());
  EXPECT_EQ(found->size(), chain.size());
  ExpectLoads(b, chain, v1::TIER_REMOTE);
}

// d) The whole cluster frozen (SIGSTOP of every daemon): B's local loads and
// saves stay fast, even while a remote fetch waits on the frozen cluster; a
// block only in RADOS is UNAVAILABLE, not NOT_FOUND; after the thaw it loads,
// and what B saved meanwhile is written behind.
TEST_F(RemoteTierTest, FrozenClusterLeavesLocalServiceAloneAndResumes) {
  const std::string ns = "drill-d";
  Host a, b;
  StartHost(a);
  StartHost(b);
  const std::vector<TestBlock> remote_only = Chain(ns, 4, 16);
  ASSERT_OK(Save(*a.client, remote_only));
  ASSERT_TRUE(Drained(a, remote_only.size()));
  std::vector<TestBlock> local;
  for (uint64_t i = 0; i < 8; ++i) {
    local.push_back(SessionBlock("frozen-session", i, 16, SmallFingerprint(ns)));
  }
  ASSERT_OK(Save(*b.client, local));
  ExpectLoads(b, local, v1::TIER_PINNED_HOST);

  ASSERT_OK(ceph().Freeze());
  // Thaw however this test ends: the other drills share the cluster.
  struct Thawer {
    CephCluster& c;
    ~Thawer() { c.Thaw().IgnoreError(); }
  } thawer{ceph()};

  // A remote fetch in another thread, waiting on the frozen cluster...
  std::atomic<bool> fetch_done{false};
  absl::Status fetch_status;
  absl::Duration fetch_time;
  std::unique_ptr<Client> other = b.daemon->Connect();
  ASSERT_NE(other, nullptr);
  std::thread fetch([&] {
    const absl::Time t0 = absl::Now();
    fetch_status = other->Load({remote_only[1].id()}, remote_only[1].meta.fingerprint()).status();
    fetch_time = absl::Now() - t0;
    fetch_done = true;
  });
  absl::SleepFor(absl::Milliseconds(200));
  // ...while local loads and saves go on at full speed.
  absl::Duration slowest_local;
  int local_ops = 0;
  do {
    const absl::Time t0 = absl::Now();
    ExpectLoads(b, local, v1::TIER_PINNED_HOST);
    slowest_local = std::max(slowest_local, absl::Now() - t0);
    ++local_ops;
  } while (!fetch_done && local_ops < 200);
  const std::vector<TestBlock> saved_while_frozen = Chain(ns, 4, 16, 7000);
  const absl::Time s0 = absl::Now();
  ASSERT_OK(Save(*b.client, saved_while_frozen));
  const absl::Duration save_time = absl::Now() - s0;
  fetch.join();
  std::cerr << "[frozen] remote fetch: " << fetch_status << " after "
            << absl::FormatDuration(fetch_time) << "; " << local_ops
            << " local loads, slowest " << absl::FormatDuration(slowest_local)
            << "; save " << absl::FormatDuration(save_time) << "\n";
  EXPECT_LT(slowest_local, absl::Seconds(1));
  EXPECT_LT(save_time, absl::Seconds(1));
  EXPECT_EQ(fetch_status.code(), absl::StatusCode::kUnavailable) << fetch_status;
  EXPECT_LT(fetch_time, absl::Seconds(8));

  // Again, now that the breaker knows: UNAVAILABLE at once or within the
  // op deadline; the fleet-wide Lookup answers too (not hangs).
  absl::Time t0 = absl::Now();
  absl::Status again =
      b.client->Load({remote_only[0].id()}, remote_only[0].meta.fingerprint()).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kUnavailable) << again;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(8));
  t0 = absl::Now();
  absl::StatusOr<std::vector<v1::Tier>> lookup = b.client->Lookup(Ids(remote_only), ns);
  std::cerr << "[frozen] fleet-wide Lookup: "
            << (lookup.ok() ? absl::StrCat(lookup->size(), " present") : lookup.status().ToString())
            << " after " << absl::FormatDuration(absl::Now() - t0) << "\n";
  EXPECT_LT(absl::Now() - t0, absl::Seconds(8));
  const v1::RemoteStat frozen = Remote(b);
  EXPECT_FALSE(frozen.last_error().empty()) << frozen.DebugString();
  EXPECT_GE(frozen.unavailable(), 1u) << frozen.DebugString();

  ASSERT_OK(ceph().Thaw());
  const absl::Time thawed = absl::Now();
  absl::Status resumed;
  EXPECT_TRUE(Eventually(
      [&] {
        resumed =
            b.client->Load({remote_only[0].id()}, remote_only[0].meta.fingerprint()).status();
        return resumed.ok();
      },
      "the remote-only block loads after the thaw", absl::Seconds(20),
      absl::Milliseconds(250)))
      << resumed;
  std::cerr << "[frozen] remote loads again " << absl::FormatDuration(absl::Now() - thawed)
            << " after the thaw\n";
  ExpectLoads(b, remote_only, v1::TIER_UNSPECIFIED);
  // The prefix blocks B saved while frozen reach RADOS.
  EXPECT_TRUE(Drained(b, saved_while_frozen.size(), absl::Seconds(20)));
  EXPECT_EQ(Remote(b).dropped_blocks(), 0u);
  absl::StatusOr<std::string> stored = ceph().RadosGet(ns, ObjectName(saved_while_frozen[2].id()));
  ASSERT_OK(stored.status());
  EXPECT_TRUE(*stored == saved_while_frozen[2].payload);
}

// e) A stored object's bytes flipped behind evoked's back: B refuses it with
// DATA_LOSS, counts it and removes the object (so no host fetches it again);
// from then on the block is NOT_FOUND on B, never served; the rest of the
// chain still loads.
TEST_F(RemoteTierTest, FlippedRemoteBytesAreRefusedAndCounted) {
  const std::string ns = "drill-e";
  Host a, b;
  StartHost(a);
  StartHost(b);
  const std::vector<TestBlock> chain = Chain(ns, 4, 16);
  ASSERT_OK(Save(*a.client, chain));
  ASSERT_TRUE(Drained(a, chain.size()));
  const std::string object = ObjectName(chain[2].id());
  absl::StatusOr<std::string> stored = ceph().RadosGet(ns, object);
  ASSERT_OK(stored.status());
  ASSERT_TRUE(*stored == chain[2].payload) << "object " << object << " is not the payload";
  std::string flipped = *stored;
  flipped[flipped.size() / 2] ^= 0x01;
  ASSERT_OK(ceph().RadosPut(ns, object, flipped));

  absl::StatusOr<std::vector<LoadedBlock>> bad =
      b.client->Load({chain[2].id()}, chain[2].meta.fingerprint());
  ASSERT_FALSE(bad.ok()) << "served a flipped object";
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_EQ(Remote(b).checksum_failures(), 1u);
  EXPECT_EQ(ceph().RadosGet(ns, object).status().code(), absl::StatusCode::kNotFound)
      << "the corrupt object is still in the pool";
  bad = b.client->Load({chain[2].id()}, chain[2].meta.fingerprint());
  ASSERT_FALSE(bad.ok()) << "served a flipped object (second load)";
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound) << bad.status();
  // The intact blocks load; A still serves its own good copy.
  ExpectLoads(b, {chain[0], chain[1], chain[3]}, v1::TIER_REMOTE);
  ExpectLoads(a, chain, v1::TIER_PINNED_HOST);
  // Never promoted: B's local-only Lookup of the flipped block finds nothing.
  absl::StatusOr<std::vector<v1::Tier>> local = b.client->Lookup({chain[2].id()});
  ASSERT_OK(local.status());
  EXPECT_EQ(local->size(), 0u);
}

// f) Bad configuration. With --remote-required evoked exits at start with a
// message naming the problem; without it, it starts degraded: local Saves and
// Loads work, Stat.remote says it is not connected and why.
TEST_F(RemoteTierTest, BadConfigurationIsAClearErrorOrADegradedStart) {
  TempDir files;
  const std::string missing_conf = files.Join("no-such-ceph.conf");
  const std::string unreachable_conf = files.Join("unreachable.conf");
  {
    std::ofstream f(unreachable_conf);
    f << "[global]\nmon host = 127.0.0.1:1\nauth cluster required = none\n"
         "auth service required = none\nauth client required = none\nkeyring = /dev/null\n";
  }
  struct Case {
    std::string name;
    std::vector<std::string> flags;
    std::vector<std::string> message_names;  // Each must appear in the log.
  };
  const std::vector<Case> cases = {
      {"unknown pool", RemoteFlags(ceph().conf_path(), "no-such-pool"),
       {"--remote-pool", "no-such-pool"}},
      {"unreachable monitors", RemoteFlags(unreachable_conf, ceph().pool()),
       {"--remote-conf"}},
      {"missing conf", RemoteFlags(missing_conf, ceph().pool()),
       {"--remote-conf", missing_conf}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    {
      TempDir dir;
      std::vector<std::string> flags = c.flags;
      flags.push_back("--remote-required");
      const absl::Time t0 = absl::Now();
      absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(dir.path(), flags);
      std::cerr << "[config] " << c.name << ", required: "
                << (d.ok() ? "started" : "refused") << " after "
                << absl::FormatDuration(absl::Now() - t0) << "\n";
      ASSERT_FALSE(d.ok()) << "evoked started with --remote-required and " << c.name;
      const std::string message(d.status().message());
      EXPECT_NE(message.find("exited with"), std::string::npos) << message;
      EXPECT_EQ(message.find("exited with 0 "), std::string::npos) << message;
      for (const std::string& name : c.message_names) {
        EXPECT_NE(message.find(name), std::string::npos)
            << "the error does not name '" << name << "':\n" << message;
      }
    }
    {
      Host h;
      absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(h.dir.path(), c.flags);
      ASSERT_TRUE(d.ok()) << d.status();
      h.daemon = std::move(d).value();
      h.client = h.daemon->Connect();
      ASSERT_NE(h.client, nullptr);
      const std::string ns = "drill-f";
      std::vector<TestBlock> blocks = Chain(ns, 4, 16);
      blocks.push_back(SessionBlock("degraded", 0, 16, SmallFingerprint(ns)));
      ASSERT_OK(Save(*h.client, blocks));
      ExpectLoads(h, blocks, v1::TIER_PINNED_HOST);
      const v1::RemoteStat r = Remote(h);
      EXPECT_TRUE(r.enabled()) << r.DebugString();
      EXPECT_FALSE(r.connected()) << r.DebugString();
      EXPECT_FALSE(r.last_error().empty()) << r.DebugString();
      std::cerr << "[config] " << c.name << ", degraded: state " << r.state() << ", last_error '"
                << r.last_error() << "'\n";
    }
  }
}

// g) Expiry: host C, started with --remote-expiry-s 6, sweeps every 1.5 s
// and removes the blocks A wrote more than 6 s ago, in every namespace;
// younger blocks stay. A still serves its own copies.
TEST_F(RemoteTierTest, ExpiryRemovesBlocksOlderThanTheCutOffFromEveryHost) {
  Host a, c;
  StartHost(a);
  StartHost(c, {"--remote-expiry-s", "6"});
  const std::vector<TestBlock> old_g = Chain("drill-g", 4, 16);
  const std::vector<TestBlock> old_h = Chain("drill-h", 4, 16);
  ASSERT_OK(Save(*a.client, old_g));
  ASSERT_OK(Save(*a.client, old_h));
  ASSERT_TRUE(Drained(a, old_g.size() + old_h.size()));
  absl::SleepFor(absl::Milliseconds(7500));
  const std::vector<TestBlock> young = Chain("drill-g", 4, 16, 50000);
  ASSERT_OK(Save(*a.client, young));
  ASSERT_TRUE(Drained(a, old_g.size() + old_h.size() + young.size()));
  std::vector<std::string> want;
  for (const TestBlock& b : young) want.push_back(ObjectName(b.id()));
  std::sort(want.begin(), want.end());
  std::vector<std::string> in_g, in_h;
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<std::vector<std::string>> g = ceph().RadosList("drill-g");
        absl::StatusOr<std::vector<std::string>> h = ceph().RadosList("drill-h");
        if (!g.ok() || !h.ok()) return false;
        in_g = *g;
        in_h = *h;
        std::sort(in_g.begin(), in_g.end());
        return in_g == want && in_h.empty();
      },
      "the sweep removes the old blocks and only those", absl::Seconds(10),
      absl::Milliseconds(200)))
      << in_g.size() << " objects in drill-g (want the " << want.size()
      << " young ones), " << in_h.size() << " in drill-h; " << Remote(c).DebugString();
  // Other drills' older objects may have gone in the same sweeps.
  EXPECT_GE(Remote(c).expired_objects(), old_g.size() + old_h.size());
  ExpectLoads(a, old_g, v1::TIER_PINNED_HOST);
  Host b;
  StartHost(b);
  ExpectLoads(b, young, v1::TIER_REMOTE);
  EXPECT_EQ(b.client->Load({old_g[0].id()}, old_g[0].meta.fingerprint()).status().code(),
            absl::StatusCode::kNotFound);
}

// c) An OSD killed -9 while write-behind runs (pool size 3, min_size 2): no
// Save or Load fails or stalls, every block reaches RADOS and loads
// byte-identical on B, writes continue. The OSD stays down (memstore), so the
// cluster is degraded after this drill: it is defined last so that it runs
// last (the other drills would pass on 2 of 3 OSDs too, only slower).
TEST_F(RemoteTierTest, OsdKilledDuringWriteBehindLosesNothing) {
  const std::string ns = "drill-c";
  Host a, b;
  StartHost(a);
  StartHost(b);
  // 8 batches of 8 blocks of 64 tokens (128 KiB each): 8 MiB in all.
  const std::vector<TestBlock> chain = Chain(ns, 64, 64);
  absl::Duration slowest_save;
  for (size_t batch = 0; batch < 8; ++batch) {
    const std::vector<TestBlock> part(chain.begin() + batch * 8, chain.begin() + batch * 8 + 8);
    const absl::Time t0 = absl::Now();
    ASSERT_OK(Save(*a.client, part)) << "batch " << batch;
    slowest_save = std::max(slowest_save, absl::Now() - t0);
    ExpectLoads(a, part, v1::TIER_PINNED_HOST);
    if (batch == 1) {
      const v1::RemoteStat before = Remote(a);
      std::cerr << "[osd] killing osd.2 with " << before.queue_blocks() << " queued, "
                << before.inflight() << " in flight, " << before.objects_written()
                << " written\n";
      ASSERT_OK(ceph().KillOsd(2));
    }
    absl::SleepFor(absl::Milliseconds(150));
  }
  EXPECT_LT(slowest_save, absl::Seconds(2)) << "a Save waited on the remote tier";
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(Drained(a, chain.size(), absl::Seconds(60)));
  const v1::RemoteStat ra = Remote(a);
  std::cerr << "[osd] drained " << absl::FormatDuration(absl::Now() - t0)
            << " after the last save: " << ra.DebugString() << "\n";
  EXPECT_EQ(ra.dropped_blocks(), 0u);
  ExpectLoads(b, chain, v1::TIER_REMOTE);
  EXPECT_EQ(Remote(b).checksum_failures(), 0u);
  // Writes continue on the degraded cluster.
  const std::vector<TestBlock> more = Chain(ns, 4, 64, 90000);
  ASSERT_OK(Save(*b.client, more));
  ASSERT_TRUE(Drained(b, more.size(), absl::Seconds(30)));
  Host c;
  StartHost(c);
  ExpectLoads(c, more, v1::TIER_REMOTE);
}

}  // namespace
}  // namespace evoke::testing
