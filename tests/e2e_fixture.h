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
#include "testing/blocks.h"  // SmallFingerprint, TestBlock, SessionBlock, Payload.
#include "testing/daemon_process.h"
#include "testing/status_matchers.h"
#include "testing/temp_dir.h"

namespace evoke::testing {

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
    WaitUntil(
        [&] {
          const v1::StatResponse s = Stat();
          const uint64_t used = s.pinned().used_bytes();
          stable = (used == last && used <= s.pinned().capacity_bytes() * 95 / 100)
                       ? stable + 1 : 0;
          last = used;
          return stable >= 5;
        },
        absl::Seconds(10), absl::Milliseconds(20));
  }

  TempDir dir_;
  std::vector<std::string> flags_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

}  // namespace evoke::testing

#endif  // EVOKE_TESTS_E2E_FIXTURE_H_
