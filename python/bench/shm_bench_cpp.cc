// evoke-shm-bench-cpp: the C++ client's side of the Python shared-memory
// benchmark (python/bench/shm_bench.py runs both against one evoked
// and reports Python / C++). Each round saves `blocks` session blocks of
// `size` bytes from one shared region through the command ring (one batch),
// then loads them all back into it, and prints one JSON line with the two
// times. Blocks are canonical f16 (32 layers, 8 KV heads, head_dim 128:
// 128 KiB per token), deleted after each round (untimed).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "evoke/client.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Fail(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "evoke-shm-bench-cpp: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("The C++ half of the Python shared-memory benchmark");
  std::string socket, tag = "cpp";
  uint64_t size = 1 << 20;
  uint32_t blocks = 16, rounds = 3;
  app.add_option("--socket", socket, "evoked's socket")->required();
  app.add_option("--size", size, "Bytes per block (a multiple of 128 KiB)")->required();
  app.add_option("--blocks", blocks, "Blocks per round")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "Rounds")->check(CLI::PositiveNumber);
  app.add_option("--tag", tag, "Session name prefix (unique per run)");
  CLI11_PARSE(app, argc, argv);
  const uint64_t per_token = uint64_t{32} * 8 * 128 * 2 * 2;
  if (size == 0 || size % per_token != 0) {
    std::fprintf(stderr, "--size: %llu is not a positive multiple of %llu\n",
                 static_cast<unsigned long long>(size), static_cast<unsigned long long>(per_token));
    return 2;
  }
  evoke::ClientOptions options;
  options.target = socket;
  auto client = evoke::Client::Connect(options);
  if (!client.ok()) return Fail(client.status(), "connect");
  if (absl::Status s = (*client)->OpenLease("shm-bench-cpp"); !s.ok()) return Fail(s, "lease");
  auto region = (*client)->CreateSharedRegion(size * blocks);
  if (!region.ok()) return Fail(region.status(), "region");
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i + 8 <= size * blocks; i += 8) {
    const uint64_t r = rng() & 0x3bff3bff3bff3bffull;  // Finite f16 values.
    std::memcpy((*region)->data() + i, &r, 8);
  }
  evoke::CacheShape shape;
  shape.n_layers = 32;
  shape.n_kv_heads = 8;
  shape.head_dim = 128;
  const evoke::v1::LayoutFingerprint fp = evoke::MakeFingerprint("bench", "shm-bench", shape);
  for (uint32_t round = 0; round < rounds; ++round) {
    const std::string session = tag + "-" + std::to_string(round);
    std::vector<evoke::BlockToSave> save;
    std::vector<evoke::BlockId> ids;
    std::vector<evoke::v1::RegionSlice> where;
    for (uint32_t b = 0; b < blocks; ++b) {
      evoke::v1::BlockMeta meta;
      const evoke::BlockId id = evoke::SessionBlockId("bench", session, b);
      meta.set_id(id.ToBytes());
      meta.set_kind(evoke::v1::BLOCK_KIND_SESSION);
      *meta.mutable_fingerprint() = fp;
      meta.set_session_id(session);
      meta.set_sequence(b);
      meta.set_n_tokens(static_cast<uint32_t>(size / per_token));
      meta.set_layer_begin(0);
      meta.set_layer_end(32);
      where.push_back((*region)->Slice(uint64_t{b} * size, size));
      save.emplace_back(std::move(meta), where.back());
      ids.push_back(id);
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto saved = (*client)->Save(save, false);
    const auto t1 = std::chrono::steady_clock::now();
    if (!saved.ok()) return Fail(saved.status(), "save");
    auto loaded = (*client)->LoadInto(ids, fp, where);
    const auto t2 = std::chrono::steady_clock::now();
    if (!loaded.ok()) return Fail(loaded.status(), "load");
    std::printf("{\"lang\": \"cpp\", \"size\": %llu, \"blocks\": %u, \"round\": %u, "
                "\"save_s\": %.6f, \"load_s\": %.6f, \"ring\": %s}\n",
                static_cast<unsigned long long>(size), blocks, round, Seconds(t0, t1),
                Seconds(t1, t2), (*client)->has_ring() ? "true" : "false");
    std::fflush(stdout);
    if (absl::Status s = (*client)->Delete(ids); !s.ok()) return Fail(s, "delete");
  }
  return 0;
}
