// evoke-demo: a short demonstration client for evoked (see scripts/demo.sh).
//
//   evoke-demo save   saves more session blocks than tier 1 holds (canonical
//                     layout, a Llama-3.1-8B-shaped KV cache), waits for the
//                     spill and prints where the blocks are;
//   evoke-demo load   loads every block back (after a daemon restart),
//                     checks each byte against the deterministic content it
//                     was saved with, and shows that a reader with another
//                     layout fingerprint is refused.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/block_validation.h"
#include "common/byte_size.h"
#include "evoke/client.h"

namespace evoke {
namespace {

constexpr char kSession[] = "demo-session";
constexpr uint32_t kTokensPerBlock = 32;

v1::LayoutFingerprint DemoFingerprint() {
  v1::LayoutFingerprint fp;
  fp.set_namespace_("demo");
  fp.set_model_id("demo/llama-3.1-8b-shape");
  fp.set_model_revision("random-weights");
  fp.set_k_dtype(v1::DTYPE_BF16);
  fp.set_v_dtype(v1::DTYPE_BF16);
  fp.set_n_layers(32);
  fp.set_n_kv_heads(8);
  fp.set_head_dim(128);
  fp.set_layout(v1::LAYOUT_CANONICAL_V1);
  fp.mutable_rope()->set_type(v1::ROPE_NEOX);
  fp.mutable_rope()->set_freq_base(500000);
  return fp;
}

// Deterministic content of block `seq`: what save writes and load expects.
std::string Content(uint64_t seq, uint64_t size) {
  std::string s(size, '\0');
  uint64_t x = 0x9e3779b97f4a7c15ULL * (seq + 1);
  for (uint64_t i = 0; i + 8 <= size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(&s[i], &x, 8);
  }
  return s;
}

uint64_t BlockBytes() {
  return CanonicalPayloadBytes(DemoFingerprint(), kTokensPerBlock, 32).value();
}

void PrintTiers(const v1::StatResponse& s) {
  std::printf("  tier 1 (pinned host): %llu blocks, %s used of %s\n",
              static_cast<unsigned long long>(s.pinned().blocks()),
              FormatByteSize(s.pinned().used_bytes()).c_str(),
              FormatByteSize(s.pinned().capacity_bytes()).c_str());
  std::printf("  tier 2 (RocksDB):     %llu blocks, %s of payload (budget %s)\n",
              static_cast<unsigned long long>(s.spill().blocks()),
              FormatByteSize(s.spill().payload_bytes()).c_str(),
              FormatByteSize(s.spill().capacity_bytes()).c_str());
  std::printf("  counters: saves=%llu spills=%llu evictions=%llu hits_tier1=%llu "
              "hits_tier2=%llu promotions=%llu checksum_failures=%llu\n",
              static_cast<unsigned long long>(s.counters().saves()),
              static_cast<unsigned long long>(s.counters().spills()),
              static_cast<unsigned long long>(s.counters().evictions()),
              static_cast<unsigned long long>(s.counters().hits_tier1()),
              static_cast<unsigned long long>(s.counters().hits_tier2()),
              static_cast<unsigned long long>(s.counters().promotions()),
              static_cast<unsigned long long>(s.counters().checksum_failures()));
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "evoke-demo: %s\n", s.ToString().c_str());
  return 1;
}

int Save(Client& client, double overfill) {
  absl::StatusOr<v1::StatResponse> stat = client.Stat();
  if (!stat.ok()) return Fail(stat.status());
  const uint64_t capacity = stat->pinned().capacity_bytes();
  const uint64_t block = BlockBytes();
  const uint64_t n = static_cast<uint64_t>(overfill * capacity / block) + 1;
  std::printf("evoke-demo: saving %llu session blocks of %u tokens x 32 layers "
              "(%s each, %s in all) into a tier 1 of %s\n",
              static_cast<unsigned long long>(n), kTokensPerBlock,
              FormatByteSize(block).c_str(), FormatByteSize(n * block).c_str(),
              FormatByteSize(capacity).c_str());
  const v1::LayoutFingerprint fp = DemoFingerprint();
  const absl::Time start = absl::Now();
  for (uint64_t seq = 0; seq < n; seq += 8) {
    std::vector<std::string> payloads;
    std::vector<BlockToSave> batch;
    for (uint64_t s = seq; s < std::min(n, seq + 8); ++s) payloads.push_back(Content(s, block));
    for (uint64_t s = seq; s < std::min(n, seq + 8); ++s) {
      batch.push_back({SessionBlockMeta(fp, kSession, s, kTokensPerBlock, 0, 32,
                                        static_cast<int32_t>(s * kTokensPerBlock)),
                       payloads[s - seq], false});
    }
    absl::StatusOr<std::vector<v1::SaveResult>> r = client.Save(batch);
    if (!r.ok()) return Fail(r.status());
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("evoke-demo: saved %s in %.2f s (%.2f GB/s over inline gRPC)\n",
              FormatByteSize(n * block).c_str(), secs, n * block / secs / 1e9);
  // Give the background spiller a moment to reach its low watermark.
  absl::SleepFor(absl::Milliseconds(500));
  stat = client.Stat();
  if (!stat.ok()) return Fail(stat.status());
  std::printf("evoke-demo: tier 1 passed its high watermark, so the coldest blocks "
              "spilled to disk:\n");
  PrintTiers(*stat);
  if (stat->spill().blocks() == 0) {
    return Fail(absl::InternalError("expected blocks to spill, none did"));
  }
  return 0;
}

int Load(Client& client) {
  const v1::LayoutFingerprint fp = DemoFingerprint();
  absl::StatusOr<v1::StatResponse> stat = client.Stat();
  if (!stat.ok()) return Fail(stat.status());
  std::printf("evoke-demo: after the restart evoked rebuilt its index from RocksDB:\n");
  PrintTiers(*stat);
  v1::ListRequest list;
  list.set_namespace_("demo");
  list.set_session_id(kSession);
  list.set_page_size(1000);
  uint64_t n = 0;
  for (;;) {
    absl::StatusOr<v1::ListResponse> page = client.List(list);
    if (!page.ok()) return Fail(page.status());
    n += page->blocks_size();
    if (page->next_page_token().empty()) break;
    list.set_page_token(page->next_page_token());
  }
  const uint64_t block = BlockBytes();
  uint64_t identical = 0, from_tier1 = 0, from_tier2 = 0;
  const absl::Time start = absl::Now();
  for (uint64_t seq = 0; seq < n; seq += 8) {
    std::vector<BlockId> ids;
    for (uint64_t s = seq; s < std::min(n, seq + 8); ++s) {
      ids.push_back(SessionBlockId("demo", kSession, s));
    }
    absl::StatusOr<std::vector<LoadedBlock>> loaded = client.Load(ids, fp);
    if (!loaded.ok()) return Fail(loaded.status());
    for (size_t i = 0; i < loaded->size(); ++i) {
      const LoadedBlock& b = (*loaded)[i];
      if (b.payload == Content(seq + i, block)) ++identical;
      (b.served_from == v1::TIER_PINNED_HOST ? from_tier1 : from_tier2)++;
    }
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("evoke-demo: loaded %llu blocks back in %.2f s: %llu byte-identical to "
              "what was saved (%llu from tier 1, %llu from tier 2)\n",
              static_cast<unsigned long long>(n), secs,
              static_cast<unsigned long long>(identical),
              static_cast<unsigned long long>(from_tier1),
              static_cast<unsigned long long>(from_tier2));
  if (n == 0 || identical != n) {
    return Fail(absl::DataLossError("some blocks did not come back identical"));
  }
  v1::LayoutFingerprint other = fp;
  other.set_model_revision("other-weights");
  const BlockId first = SessionBlockId("demo", kSession, 0);
  absl::StatusOr<std::vector<LoadedBlock>> refused = client.Load({&first, 1}, other);
  std::printf("evoke-demo: a reader with another model revision is refused: %s\n",
              refused.ok() ? "NOT REFUSED" : refused.status().ToString().c_str());
  if (refused.ok()) return Fail(absl::InternalError("fingerprint check failed open"));
  return 0;
}

int Run(int argc, char** argv) {
  CLI::App app{"evoke-demo: a short demonstration client for evoked"};
  std::string socket;
  double overfill = 1.25;
  app.add_option("--socket", socket, "evoked's socket");
  app.require_subcommand(1);
  CLI::App* save = app.add_subcommand("save", "Save more blocks than tier 1 holds");
  save->add_option("--overfill", overfill, "Blocks to save, as a multiple of tier 1")
      ->capture_default_str();
  CLI::App* load = app.add_subcommand("load", "Load every block back and check it");
  CLI11_PARSE(app, argc, argv);
  ClientOptions options;
  options.target = socket;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return Fail(client.status());
  if (*save) return Save(**client, overfill);
  if (*load) return Load(**client);
  return 2;
}

}  // namespace
}  // namespace evoke

int main(int argc, char** argv) { return evoke::Run(argc, argv); }
