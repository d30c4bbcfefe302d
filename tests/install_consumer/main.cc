// evoke_consumer: what an engine does with an installed evoke before (and
// without) any daemon: block ids, layout fingerprints, key summaries, block
// files, target resolution, a refused connection, the C API and a policy.
// Exits 0 when every check holds; prints each failure otherwise.
#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <evoke/block_file.h>
#include <evoke/client.h>
#include <evoke/evoke.h>
#include <evoke/evoke_policy.h>
#include <evoke/summaries.h>
#include <evoke/version.h>

extern "C" size_t consumer_block_bytes_c(uint32_t n_tokens);
extern "C" int consumer_version_major_c(void);

namespace {

int failures = 0;

#define CHECK(cond)                                                    \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,      \
                   __LINE__, #cond);                                   \
      ++failures;                                                      \
    }                                                                  \
  } while (0)

constexpr uint32_t kLayers = 4, kHeads = 2, kDim = 8, kTokens = 16;
constexpr uint32_t kLayerBegin = 1, kLayerEnd = 3, kSummaryLayer = 2;

bool Near(float a, float b) { return a - b < 1e-4f && b - a < 1e-4f; }

void Version() {
  CHECK(std::string(EVOKE_VERSION_STRING) == EVOKE_PACKAGE_VERSION);
  CHECK(consumer_version_major_c() == EVOKE_VERSION_MAJOR);
}

void Ids(const evoke::v1::LayoutFingerprint& fp) {
  // Session blocks: the id is a function of (namespace, session, sequence).
  const evoke::v1::BlockMeta meta =
      evoke::SessionBlockMeta(fp, "sess-1", 3, kTokens, kLayerBegin, kLayerEnd, 100);
  CHECK(evoke::BlockIdOf(meta) == evoke::SessionBlockId("ns", "sess-1", 3));
  CHECK(evoke::BlockIdOf(meta) != evoke::SessionBlockId("ns", "sess-1", 4));
  CHECK(evoke::BlockIdOf(meta) != evoke::SessionBlockId("other", "sess-1", 3));

  // Prefix blocks: a hash chain over full blocks of tokens.
  std::vector<int32_t> tokens(130);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(1000 + i);
  const evoke::FingerprintDigest digest = evoke::DigestFingerprint(fp);
  const std::vector<evoke::BlockId> chain = evoke::PrefixChain(tokens, 64, digest);
  CHECK(chain.size() == 2);  // The trailing 2 tokens are not a block yet.
  if (chain.size() == 2) {
    const absl::Span<const int32_t> all(tokens);
    CHECK(chain[0] == evoke::PrefixBlockId(evoke::BlockId(), all.subspan(0, 64), digest));
    CHECK(chain[1] == evoke::PrefixBlockId(chain[0], all.subspan(64, 64), digest));
    CHECK(evoke::BlockIdOf(evoke::PrefixBlockMeta(fp, chain[0], all.subspan(64, 64), 0,
                                                  kLayers, 64)) == chain[1]);
  }

  // Ids as bytes and hex.
  const evoke::BlockId id = evoke::BlockIdOf(meta);
  CHECK(id.ToHex().size() == 32);
  const absl::StatusOr<evoke::BlockId> back = evoke::Hash128::FromHex(id.ToHex());
  CHECK(back.ok() && *back == id);
  CHECK(evoke::Hash128::FromHex("not hex").status().code() ==
        absl::StatusCode::kInvalidArgument);

  // Messages round-trip through protobuf.
  evoke::v1::BlockMeta parsed;
  CHECK(parsed.ParseFromString(meta.SerializeAsString()));
  CHECK(evoke::BlockIdOf(parsed) == id);
}

void Fingerprints(const evoke::v1::LayoutFingerprint& fp) {
  CHECK(evoke::FingerprintMismatch(fp, fp).empty());
  evoke::v1::LayoutFingerprint other = fp;
  other.set_model_revision("r2");
  CHECK(evoke::FingerprintMismatch(fp, other).find("model_revision") != std::string::npos);
  CHECK(evoke::DigestFingerprint(fp) != evoke::DigestFingerprint(other));
  CHECK(evoke::DigestFingerprint(fp) ==
        evoke::DigestFingerprint(evoke::NormalizeFingerprint(fp)));
}

// A canonical block of layers [1, 3): per layer the K rows, then the V rows;
// a row is one token across the KV heads. Layer 2's keys are
// t + 100 h + d; everything else is -1.
std::vector<float> Payload() {
  std::vector<float> p(size_t{kLayerEnd - kLayerBegin} * 2 * kTokens * kHeads * kDim, -1.0f);
  const size_t layer2_k = size_t{kSummaryLayer - kLayerBegin} * 2 * kTokens * kHeads * kDim;
  for (uint32_t t = 0; t < kTokens; ++t) {
    for (uint32_t h = 0; h < kHeads; ++h) {
      for (uint32_t d = 0; d < kDim; ++d) {
        p[layer2_k + (size_t{t} * kHeads + h) * kDim + d] = static_cast<float>(t + 100 * h + d);
      }
    }
  }
  return p;
}

void Summaries(const evoke::v1::LayoutFingerprint& fp) {
  const evoke::v1::BlockMeta meta =
      evoke::SessionBlockMeta(fp, "sess-1", 0, kTokens, kLayerBegin, kLayerEnd, 0);
  const std::vector<float> payload = Payload();
  const auto* bytes = reinterpret_cast<const uint8_t*>(payload.data());
  const uint64_t n_bytes = payload.size() * sizeof(float);
  // The C API and the block agree on the size.
  CHECK(consumer_block_bytes_c(kTokens) == n_bytes);
  CHECK(evoke::DefaultSummaryLayer(meta) == kSummaryLayer);

  // Mean keys: per head, the mean over the tokens (no RoPE to undo here).
  const absl::StatusOr<evoke::v1::Summary> mean =
      evoke::MeanKeysSummary(meta, bytes, n_bytes, kSummaryLayer);
  CHECK(mean.ok());
  if (mean.ok()) {
    CHECK(mean->kind() == evoke::v1::SUMMARY_MEAN_KEYS);
    CHECK(mean->heads() == kHeads && mean->dim() == kDim);
    CHECK(mean->values_size() == static_cast<int>(kHeads * kDim));
    for (uint32_t h = 0; h < kHeads && mean->values_size() == int{kHeads * kDim}; ++h) {
      for (uint32_t d = 0; d < kDim; ++d) {
        CHECK(Near(mean->values(h * kDim + d), 7.5f + 100 * h + d));
      }
    }
  }

  // Representative keys: the mean of the r most attended tokens per head.
  std::vector<float> attention(size_t{kTokens} * kHeads, 0.0f);
  attention[3 * kHeads + 0] = 5;
  attention[9 * kHeads + 0] = 4;
  attention[12 * kHeads + 1] = 5;
  attention[1 * kHeads + 1] = 4;
  CHECK((evoke::TopTokensPerHead(attention, kTokens, kHeads, 2) ==
         std::vector<uint32_t>{3, 9, 12, 1}));
  const absl::StatusOr<evoke::v1::Summary> repr =
      evoke::ReprKeysSummary(meta, bytes, n_bytes, kSummaryLayer, attention, 2);
  CHECK(repr.ok());
  if (repr.ok() && repr->values_size() == int{kHeads * kDim}) {
    CHECK(repr->kind() == evoke::v1::SUMMARY_REPR_KEYS && repr->r() == 2);
    for (uint32_t d = 0; d < kDim; ++d) {
      CHECK(Near(repr->values(d), 6.0f + d));             // tokens 3 and 9
      CHECK(Near(repr->values(kDim + d), 106.5f + d));    // tokens 12 and 1
    }
  }
  CHECK(evoke::ReprKeysSummary(meta, bytes, n_bytes, kSummaryLayer, attention, 0)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  CHECK(evoke::MeanKeysSummary(meta, bytes, n_bytes - 4, kSummaryLayer).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // Host memory is no device's memory (and a build without CUDA has none).
  CHECK(!evoke::ReprKeysSummaryOnDevice(meta, bytes, n_bytes, kSummaryLayer,
                                        attention.data(), 2, 0, nullptr)
             .ok());
}

void BlockFiles(const evoke::v1::LayoutFingerprint& fp) {
  const std::vector<float> floats = Payload();
  const std::string payload(reinterpret_cast<const char*>(floats.data()),
                            floats.size() * sizeof(float));
  evoke::v1::BlockMeta meta =
      evoke::SessionBlockMeta(fp, "sess-1", 0, kTokens, kLayerBegin, kLayerEnd, 0);
  // Without its checksum a block cannot be written.
  CHECK(evoke::EncodeBlockFile(meta, payload).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // The checksum of a payload up to 1 MiB is its XXH3-64 (block.proto).
  meta.set_checksum(XXH3_64bits(payload.data(), payload.size()));
  meta.set_payload_bytes(payload.size());
  const absl::StatusOr<std::string> file = evoke::EncodeBlockFile(meta, payload);
  CHECK(file.ok());
  if (!file.ok()) return;
  CHECK(file->compare(0, 8, "EVOKEBLK") == 0);
  const absl::StatusOr<evoke::BlockFile> decoded = evoke::DecodeBlockFile(*file);
  CHECK(decoded.ok() && decoded->payload == payload &&
        evoke::BlockIdOf(decoded->meta) == evoke::BlockIdOf(meta));
  std::string corrupt = *file;
  corrupt[corrupt.size() - 20] ^= 0x01;  // A payload byte.
  CHECK(evoke::DecodeBlockFile(corrupt).status().code() == absl::StatusCode::kDataLoss);
  CHECK(evoke::DecodeBlockFile("not a block file").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

void Connection() {
  CHECK(evoke::ResolveTarget("/run/evoke/evoked.sock") == "unix:/run/evoke/evoked.sock");
  CHECK(evoke::ResolveTarget("localhost:7070") == "localhost:7070");
  // Nobody listens here: Connect gives up after connect_timeout.
  const std::filesystem::path socket =
      std::filesystem::temp_directory_path() / "evoke-consumer-no-daemon.sock";
  std::filesystem::remove(socket);
  evoke::ClientOptions options;
  options.target = socket.string();
  options.connect_timeout = absl::Milliseconds(200);
  const absl::StatusOr<std::unique_ptr<evoke::Client>> client = evoke::Client::Connect(options);
  CHECK(client.status().code() == absl::StatusCode::kUnavailable);

  evoke_client* c = nullptr;
  CHECK(evoke_connect(nullptr, nullptr) == EVOKE_INVALID_ARGUMENT);
  evoke_close(c);  // NULL is allowed.
}

void Policy() {
  evoke_policy* bad = nullptr;
  CHECK(evoke_policy_create("no-such-policy", nullptr, &bad) == EVOKE_INVALID_ARGUMENT);
  CHECK(std::strstr(evoke_policy_last_error(), "recency") != nullptr);  // Lists the known ones.

  evoke_policy* p = nullptr;
  CHECK(evoke_policy_create("recency", nullptr, &p) == EVOKE_OK);
  if (p == nullptr) return;
  int recovers = -1, needs_attention = -1;
  evoke_policy_describe(p, &recovers, &needs_attention);
  CHECK(recovers == 0 && needs_attention == 0);

  // Three 32-token blocks in a 64-token budget, 32 tokens coming: the two
  // oldest go, oldest first.
  evoke_resident_block blocks[3] = {};
  for (int i = 0; i < 3; ++i) {
    blocks[i].handle = 10 + static_cast<uint64_t>(i);
    blocks[i].first_token = 32 * static_cast<uint64_t>(i);
    blocks[i].n_tokens = 32;
    blocks[i].first_position = 32 * i;
  }
  evoke_cache_view view = {};
  view.layer = EVOKE_POLICY_ALL;
  view.head = EVOKE_POLICY_ALL;
  view.budget_tokens = 64;
  view.session_tokens = 96;
  view.resident = blocks;
  view.n_resident = 3;
  uint64_t victims[3] = {};
  size_t n_victims = 0;
  CHECK(evoke_policy_choose_evictions(p, &view, 32, victims, 3, &n_victims) == EVOKE_OK);
  CHECK(n_victims == 2 && victims[0] == 10 && victims[1] == 11);
  evoke_policy_destroy(p);
}

}  // namespace

int main() {
  evoke::CacheShape shape;
  shape.k_dtype = evoke::v1::DTYPE_F32;
  shape.v_dtype = evoke::v1::DTYPE_F32;
  shape.n_layers = kLayers;
  shape.n_kv_heads = kHeads;
  shape.head_dim = kDim;
  const evoke::v1::LayoutFingerprint fp = evoke::MakeFingerprint("ns", "consumer-model", shape);

  Version();
  Ids(fp);
  Fingerprints(fp);
  Summaries(fp);
  BlockFiles(fp);
  Connection();
  Policy();

  if (failures != 0) {
    std::fprintf(stderr, "evoke_consumer: %d check(s) failed\n", failures);
    return 1;
  }
  std::printf("evoke_consumer: evoke %s installed and working\n", EVOKE_VERSION_STRING);
  return 0;
}
