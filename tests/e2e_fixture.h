// Shared helpers for end-to-end tests: real evoked processes, real RocksDB,
// canonical-layout blocks with deterministic content.
#ifndef EVOKE_TESTS_E2E_FIXTURE_H_
#define EVOKE_TESTS_E2E_FIXTURE_H_

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/block_validation.h"
#include "evoke/client.h"
#include "evoke/v1/kvtier.grpc.pb.h"
#include "gtest/gtest.h"
#include "testing/daemon_process.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke::testing {

// A small Llama-shaped layout: 4 layers, 2 KV heads, head_dim 64, f16.
// One token over all layers is 4 * 2 * 64 * (2 + 2) = 2 KiB.
inline v1::LayoutFingerprint SmallFingerprint(const std::string& ns = "test") {
  v1::LayoutFingerprint fp;
  fp.set_namespace_(ns);
  fp.set_model_id("test/tiny-llama");
  fp.set_model_revision("r1");
  fp.set_k_dtype(v1::DTYPE_F16);
  fp.set_v_dtype(v1::DTYPE_F16);
  fp.set_n_layers(4);
  fp.set_n_kv_heads(2);
  fp.set_head_dim(64);
  fp.set_layout(v1::LAYOUT_CANONICAL_V1);
  fp.mutable_rope()->set_type(v1::ROPE_NEOX);
  fp.mutable_rope()->set_freq_base(10000);
  return fp;
}

// Deterministic bytes for (seed, size).
inline std::string Bytes(uint64_t seed, uint64_t size) {
  std::string s(size, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ULL ^ (seed * 0xbf58476d1ce4e5b9ULL) ^ size;
  for (uint64_t i = 0; i < size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&s[i], &x, std::min<uint64_t>(8, size - i));
  }
  return s;
}

// A session block of `n_tokens` tokens over all layers, with its payload.
struct TestBlock {
  v1::BlockMeta meta;
  std::string payload;
  BlockId id() const { return BlockIdOf(meta); }
};

inline TestBlock SessionBlock(const std::string& session, uint64_t seq,
                              uint32_t n_tokens,
                              const v1::LayoutFingerprint& fp = SmallFingerprint()) {
  TestBlock b;
  b.meta = SessionBlockMeta(fp, session, seq, n_tokens, 0, fp.n_layers(),
                            static_cast<int32_t>(seq * n_tokens));
  const uint64_t size = CanonicalPayloadBytes(fp, n_tokens, fp.n_layers()).value();
  b.payload = Bytes(seq * 7919 + std::hash<std::string>()(session), size);
  return b;
}

inline absl::Status SaveBlocks(Client& client, const std::vector<TestBlock>& blocks,
                               bool durable = false, bool pin = false) {
  std::vector<BlockToSave> batch;
  for (const TestBlock& b : blocks) batch.push_back({b.meta, b.payload, pin});
  return client.Save(batch, durable).status();
}

// A raw stub, for requests the client library would never build.
inline std::unique_ptr<v1::KvTier::Stub> RawStub(const std::string& socket,
                                                 int max_message = 200 << 20) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(max_message);
  args.SetMaxReceiveMessageSize(max_message);
  return v1::KvTier::NewStub(grpc::CreateCustomChannel(
      "unix:" + socket, grpc::InsecureChannelCredentials(), args));
}

class E2eTest : public ::testing::Test {
 protected:
  // Starts (or restarts) the daemon in this test's directory.
  void StartDaemon(const std::vector<std::string>& flags = {}) {
    flags_ = flags;
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(dir_.path(), flags);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(d).value();
    client_ = daemon_->Connect();
    ASSERT_NE(client_, nullptr);
    ASSERT_OK(client_->OpenLease("e2e-test"));
  }
  void Restart() {
    client_.reset();
    StartDaemon(flags_);
  }
  v1::StatResponse Stat() {
    absl::StatusOr<v1::StatResponse> s = client_->Stat();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : v1::StatResponse();
  }
  // Waits until tier 1 stops spilling (its usage is stable under the high
  // watermark for a few polls).
  void WaitForSpillToSettle() {
    uint64_t last = UINT64_MAX;
    int stable = 0;
    for (int i = 0; i < 500 && stable < 5; ++i) {
      const v1::StatResponse s = Stat();
      const uint64_t used = s.pinned().used_bytes();
      stable = (used == last && used <= s.pinned().capacity_bytes() * 95 / 100)
                   ? stable + 1 : 0;
      last = used;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  TempDir dir_;
  std::vector<std::string> flags_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

}  // namespace evoke::testing

#endif  // EVOKE_TESTS_E2E_FIXTURE_H_
