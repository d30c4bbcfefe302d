// lease_client: a client process for the lease tests, which kill it.
//   lease_client SOCKET hold   opens a lease, registers a 16 MiB shared
//                              region, saves 8 blocks from it pinned, prints
//                              "ready", then sleeps until killed;
//   lease_client SOCKET churn  opens a lease and a region, then saves
//                              batches of 32 blocks from it in a loop,
//                              printing "ready" after the first batch.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "tests/e2e_fixture.h"

int main(int argc, char** argv) {
  using namespace evoke;
  using namespace evoke::testing;
  if (argc != 3) return 2;
  ClientOptions options;
  options.target = argv[1];
  auto client = Client::Connect(options);
  if (!client.ok() || !(*client)->OpenLease("lease_client").ok()) return 3;
  auto region = (*client)->CreateSharedRegion(16 << 20);
  if (!region.ok()) {
    std::fprintf(stderr, "%s\n", region.status().ToString().c_str());
    return 4;
  }
  const v1::LayoutFingerprint fp = SmallFingerprint("leases");
  const std::string mode = argv[2];
  uint64_t seq = 0;
  for (int round = 0;; ++round) {
    const int n = mode == "hold" ? 8 : 32;
    std::vector<BlockToSave> batch;
    uint64_t offset = 0;
    for (int i = 0; i < n; ++i, ++seq) {
      const TestBlock b = SessionBlock("s" + std::to_string(getpid()), seq, 64, fp);
      std::memcpy((*region)->data() + offset, b.payload.data(), b.payload.size());
      batch.emplace_back(b.meta, (*region)->Slice(offset, b.payload.size()), mode == "hold");
      offset += b.payload.size();
    }
    auto saved = (*client)->Save(batch);
    if (!saved.ok()) {
      std::fprintf(stderr, "%s\n", saved.status().ToString().c_str());
      return 5;
    }
    if (round == 0) {
      std::printf("ready\n");
      std::fflush(stdout);
    }
    if (mode == "hold") pause();
  }
}
