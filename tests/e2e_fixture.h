// Shared helpers for end-to-end tests: real evoked processes, real RocksDB,
// canonical-layout blocks with deterministic content.
#ifndef EVOKE_TESTS_E2E_FIXTURE_H_
#define EVOKE_TESTS_E2E_FIXTURE_H_

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
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

// DamagePayloads walks the record headers of every segment file in
// `segments` (64 bytes on 64-byte boundaries after the 4 KiB file header:
// magic "EVR2", type at 4 (1 payload, 3 seal, 4 identity), length at 32)
// and flips a byte in the middle of the payloads `damage(n)` picks (n counts
// payload records, per file); returns how many it damaged.
template <typename Pick>
int DamagePayloads(const std::string& segments, Pick damage) {
  int damaged = 0;
  for (const auto& f : std::filesystem::directory_iterator(segments)) {
    if (f.path().extension() != ".evs") continue;
    std::fstream file(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint64_t off = 4096;
    for (int n = 0;;) {
      char h[64];
      file.seekg(static_cast<std::streamoff>(off));
      if (!file.read(h, sizeof(h)) || std::memcmp(h, "EVR2", 4) != 0) break;
      uint16_t type = 0;
      uint64_t length = 0;
      std::memcpy(&type, h + 4, 2);
      std::memcpy(&length, h + 32, 8);
      if (type == 3) break;
      if (type == 1 && damage(n++)) {
        file.seekp(static_cast<std::streamoff>(off + 64 + length / 2));
        const char c = static_cast<char>(file.peek() ^ 0x55);
        file.seekp(static_cast<std::streamoff>(off + 64 + length / 2));
        file.put(c);
        ++damaged;
      }
      off += 64 + (length + 63) / 64 * 64;
    }
  }
  return damaged;
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

// StopAndJoin sets `stop` and joins `threads` when it goes out of scope:
// however a test body ends (an ASSERT returns early), its threads are joined.
struct StopAndJoin {
  std::atomic<bool>& stop;
  std::vector<std::thread>& threads;
  ~StopAndJoin() {
    stop = true;
    for (std::thread& t : threads) t.join();
  }
};

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
