// evoke-demo: a short demonstration client for evoked (see scripts/demo.sh).
//
//   evoke-demo save   saves more session blocks than tier 1 holds (canonical
//                     layout, a Llama-3.1-8B-shaped KV cache), waits for the
//                     spill and prints where the blocks are;
//   evoke-demo load   loads every block back (after a daemon restart),
//                     checks each byte against the deterministic content it
//                     was saved with, and shows that a reader with another
//                     layout fingerprint is refused.
//   evoke-demo splice an agent session whose early blocks the engine evicted
//                     to evoked: a query about an early topic recovers the
//                     right blocks by key similarity, and the best one is
//                     loaded at the end of the context, K re-anchored by one
//                     RoPE rotation and checked against K computed directly at
//                     the new positions; V byte-identical.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/block_validation.h"
#include "common/byte_size.h"
#include "common/fingerprint.h"
#include "common/half.h"
#include "common/rope.h"
#include "evoke/client.h"

namespace evoke {
namespace {

constexpr char kSession[] = "demo-session";
constexpr uint32_t kTokensPerBlock = 32;

v1::LayoutFingerprint DemoFingerprint() {
  v1::LayoutFingerprint fp = MakeFingerprint(
      "demo", "demo/llama-3.1-8b-shape",
      {.k_dtype = v1::DTYPE_BF16, .v_dtype = v1::DTYPE_BF16, .n_layers = 32, .n_kv_heads = 8,
       .head_dim = 128});
  fp.set_model_revision("random-weights");
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
  std::printf("  tier 2 (disk):        %llu blocks, %s of payload (budget %s)\n",
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

// The splice. Block b of the agent session is about topic b: every key of
// its tokens is the topic's direction (per KV head) plus noise, un-rotated;
// stored K is that rotated to the token's position, in bf16.
constexpr char kAgent[] = "agent-42";
constexpr uint32_t kLayers = 32, kHeads = 8, kDim = 128, kQueryHeads = 32;

std::vector<float> Topic(uint32_t block) {
  std::mt19937 rng(1000 + block);
  std::normal_distribution<float> normal;
  std::vector<float> dir(kHeads * kDim);
  for (float& x : dir) x = normal(rng);
  return dir;
}

// Un-rotated keys of one layer of block b: kTokensPerBlock x kHeads x kDim.
std::vector<float> UnrotatedLayer(uint32_t block, uint32_t layer) {
  const std::vector<float> dir = Topic(block);
  std::mt19937 rng(block * 977 + layer);
  std::normal_distribution<float> normal;
  std::vector<float> k(kTokensPerBlock * kHeads * kDim);
  for (size_t i = 0; i < k.size(); ++i) k[i] = dir[i % dir.size()] + 0.5f * normal(rng);
  return k;
}

// bf16 K of one layer at consecutive positions from `first`.
std::vector<uint16_t> KAt(const RopePlan& plan, uint32_t block, uint32_t layer, int64_t first) {
  std::vector<float> k = UnrotatedLayer(block, layer);
  std::vector<int64_t> pos(kTokensPerBlock);
  for (uint32_t t = 0; t < kTokensPerBlock; ++t) pos[t] = first + t;
  RotateKeys(plan, v1::DTYPE_F32, k.data(), kTokensPerBlock, kHeads, pos);
  std::vector<uint16_t> out(k.size());
  for (size_t i = 0; i < k.size(); ++i) out[i] = FloatToBf16(k[i]);
  return out;
}

std::string AgentPayload(const RopePlan& plan, uint32_t block) {
  const size_t section = kTokensPerBlock * kHeads * kDim * 2;
  std::string payload;
  const std::string v = Content(block, section * kLayers);  // V: any bytes.
  for (uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<uint16_t> k = KAt(plan, block, l, int64_t{block} * kTokensPerBlock);
    payload.append(reinterpret_cast<const char*>(k.data()), section);
    payload.append(v, l * section, section);
  }
  return payload;
}

int Splice(Client& client) {
  const v1::LayoutFingerprint fp = DemoFingerprint();
  const RopePlan plan = MakeRopePlan(fp).value();
  constexpr uint32_t kBlocks = 24, kEvicted = 16;
  const uint32_t context = kBlocks * kTokensPerBlock;
  std::printf("evoke-demo: agent session '%s': %u blocks of %u tokens (%u tokens); the engine "
              "keeps the last %u blocks and evicts blocks 0-%u to evoked\n",
              kAgent, kBlocks, kTokensPerBlock, context, kBlocks - kEvicted, kEvicted - 1);
  std::vector<std::string> payloads;
  std::vector<BlockToSave> evicted;
  for (uint32_t b = 0; b < kEvicted; ++b) payloads.push_back(AgentPayload(plan, b));
  for (uint32_t b = 0; b < kEvicted; ++b) {
    evicted.push_back({SessionBlockMeta(fp, kAgent, b, kTokensPerBlock, 0, kLayers,
                                        static_cast<int32_t>(b * kTokensPerBlock)),
                       payloads[b], false});
  }
  absl::StatusOr<std::vector<v1::SaveResult>> saved = client.Save(evicted);
  if (!saved.ok()) return Fail(saved.status());
  std::printf("evoke-demo: saved %u blocks (%s); evoked computed each one's mean key per KV "
              "head (layer %u, RoPE undone)\n",
              kEvicted, FormatByteSize(kEvicted * payloads[0].size()).c_str(), kLayers / 2);

  // The engine now decodes about topics 5 and 11: its 32 query heads (GQA,
  // 4 per KV head) look like topic 5's keys in KV heads 0-3 and topic 11's
  // in KV heads 4-7.
  const uint32_t targets[2] = {5, 11};
  const std::vector<float> topics[2] = {Topic(targets[0]), Topic(targets[1])};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  v1::RecoverRequest query;
  query.mutable_session()->set_namespace_("demo");
  query.mutable_session()->set_session_id(kAgent);
  query.set_kind(v1::SUMMARY_MEAN_KEYS);
  query.set_layer(kLayers / 2);
  for (uint32_t q = 0; q < kQueryHeads; ++q) {
    const uint32_t h = q / (kQueryHeads / kHeads);
    const std::vector<float>& topic = topics[h < kHeads / 2 ? 0 : 1];
    for (uint32_t d = 0; d < kDim; ++d) query.add_queries(topic[h * kDim + d] + normal(rng));
  }
  query.set_n_query_heads(kQueryHeads);
  query.set_k(4);
  absl::StatusOr<v1::RecoverResponse> found = client.Recover(query);
  if (!found.ok()) return Fail(found.status());
  std::printf("evoke-demo: Recover(a query about topics %u and %u, k=4) over %llu candidates:\n",
              targets[0], targets[1], static_cast<unsigned long long>(found->candidates()));
  for (const v1::RecoveredBlock& r : found->blocks()) {
    std::printf("   block %2llu (tokens %d-%d)  score %7.3f  %s\n",
                static_cast<unsigned long long>(r.meta().sequence()), r.meta().first_position(),
                r.meta().first_position() + static_cast<int>(r.meta().n_tokens()) - 1, r.score(),
                r.bytes_available() ? "bytes available" : "breadcrumb");
  }
  if (found->blocks_size() < 2 ||
      std::minmax(found->blocks(0).meta().sequence(), found->blocks(1).meta().sequence()) !=
          std::minmax<uint64_t>(targets[0], targets[1])) {
    return Fail(absl::InternalError("the query did not recover the right blocks first"));
  }

  // Splice both back at the end of the context, without recompute.
  const std::vector<BlockId> ids = {SessionBlockId("demo", kAgent, targets[0]),
                                    SessionBlockId("demo", kAgent, targets[1])};
  const std::vector<int32_t> new_first = {static_cast<int32_t>(context),
                                          static_cast<int32_t>(context + kTokensPerBlock)};
  absl::StatusOr<std::vector<LoadedBlock>> loaded = client.LoadReanchored(ids, fp, new_first);
  if (!loaded.ok()) return Fail(loaded.status());
  const size_t section = kTokensPerBlock * kHeads * kDim * 2;
  for (size_t n = 0; n < ids.size(); ++n) {
    const std::string& got = (*loaded)[n].payload;
    const uint32_t block = targets[n];
    double worst = 0;
    bool v_identical = true;
    for (uint32_t l = 0; l < kLayers; ++l) {
      const std::vector<uint16_t> direct = KAt(plan, block, l, new_first[n]);
      for (uint32_t t = 0; t < kTokensPerBlock; ++t) {
        for (uint32_t h = 0; h < kHeads; ++h) {
          double err = 0, norm = 0;
          for (uint32_t d = 0; d < kDim; ++d) {
            const size_t i = (static_cast<size_t>(t) * kHeads + h) * kDim + d;
            uint16_t bits;
            std::memcpy(&bits, got.data() + 2 * l * section + 2 * i, 2);
            const double a = Bf16ToFloat(bits), b = Bf16ToFloat(direct[i]);
            err += (a - b) * (a - b);
            norm += b * b;
          }
          worst = std::max(worst, std::sqrt(err / norm));
        }
      }
      v_identical = v_identical && got.compare((2 * l + 1) * section, section, payloads[block],
                                               (2 * l + 1) * section, section) == 0;
    }
    const int delta = new_first[n] - static_cast<int>(block * kTokensPerBlock);
    std::printf("evoke-demo: block %2u loaded at positions %d-%d (delta %+d): K matches K "
                "computed directly there (worst ||a-b||/||b|| per head %.2e; bf16 bound 1e-2), "
                "V %s\n",
                block, new_first[n], new_first[n] + static_cast<int>(kTokensPerBlock) - 1, delta,
                worst, v_identical ? "byte-identical" : "DIFFERS");
    if (worst > 1e-2 || !v_identical || (*loaded)[n].meta.first_position() != new_first[n]) {
      return Fail(absl::DataLossError("the splice does not match the direct computation"));
    }
  }
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
  CLI::App* splice = app.add_subcommand(
      "splice", "Recover evicted blocks by similarity and load one at new positions");
  CLI11_PARSE(app, argc, argv);
  ClientOptions options;
  options.target = socket;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return Fail(client.status());
  if (*save) return Save(**client, overfill);
  if (*load) return Load(**client);
  if (*splice) return Splice(**client);
  return 2;
}

}  // namespace
}  // namespace evoke

int main(int argc, char** argv) { return evoke::Run(argc, argv); }
