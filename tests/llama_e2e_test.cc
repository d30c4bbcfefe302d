// End-to-end tests of the llama.cpp adapter: the real llama.cpp (built from
// its pinned source), random-weight Llama models, and a real evoked on a Unix
// socket with RocksDB. Label: llama.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engines/llama/kv_adapter.h"
#include "engines/llama/random_model.h"
#include "common/block_validation.h"
#include "common/half.h"
#include "ggml-backend.h"
#include "gguf.h"
#include "tests/llama_fixture.h"

namespace evoke::testing {
namespace {

using llama::CanonicalRange;
using llama::ContextPtr;
using llama::KvAdapter;
using llama::SpliceMode;

struct CacheConfig {
  ggml_type type = GGML_TYPE_F16;
  bool flash_attn = true;
};

void PrintTo(const CacheConfig& c, std::ostream* os) {
  *os << (c.type == GGML_TYPE_F16 ? "f16" : "f32") << (c.flash_attn ? " flash-attn" : " transposed-V");
}

std::string Name(const ::testing::TestParamInfo<CacheConfig>& info) {
  return std::string(info.param.type == GGML_TYPE_F16 ? "F16" : "F32") +
         (info.param.flash_attn ? "FlashAttn" : "TransposedV");
}

class LlamaE2eTest : public LlamaTest {
 protected:
  ContextPtr MakeContext(const CacheConfig& cache, llama_context_params* used,
                         uint32_t n_ctx = 512, llama::QueryCapture* capture = nullptr) {
    llama_context_params p = TestContextParams(n_ctx, 512, cache.type, cache.flash_attn);
    if (capture != nullptr) capture->Install(p);
    if (used != nullptr) *used = p;
    return ContextPtr(llama_init_from_model(model_, p));
  }

  // Decodes `tokens` at positions first, first + 1, ... of sequence 0.
  static void Decode(llama_context* ctx, const std::vector<llama_token>& tokens,
                     llama_pos first) {
    ASSERT_TRUE(llama::DecodeTokens(ctx, tokens, first)) << "llama_decode failed";
  }

  std::unique_ptr<KvAdapter> OpenAdapter(llama_context* ctx, const llama_context_params& p,
                                         const std::string& session, Client* client = nullptr,
                                         bool shared_memory = true) {
    llama::AdapterOptions o = TestAdapterOptions("llama-test", session);
    o.shared_memory = shared_memory;
    return LlamaTest::OpenAdapter(ctx, p, o, client);
  }
};

// f16 keeps 11 significant bits: one rounding is within 2^-11 relative; a
// re-anchored K is rounded twice and rotated from a rounded value.
double KTolerance(ggml_type type) { return type == GGML_TYPE_F16 ? 2e-3 : 2e-5; }

class LlamaCacheTest : public LlamaE2eTest,
                       public ::testing::WithParamInterface<CacheConfig> {};

TEST_P(LlamaCacheTest, EvictAndRestoreAtSamePositionsGivesBitwiseEqualLogits) {
  const std::vector<llama_token> prompt = RandomTokens(96, 11);
  const llama_token next = 42;
  llama_context_params pa, pb, pc;

  // The uninterrupted run.
  ContextPtr b = MakeContext(GetParam(), &pb);
  ASSERT_NE(b, nullptr);
  Decode(b.get(), prompt, 0);
  Decode(b.get(), {next}, 96);
  const std::vector<float> expected = Logits(b.get());

  // Evict [16, 48), restore it, decode the same next token.
  ContextPtr a = MakeContext(GetParam(), &pa);
  Decode(a.get(), prompt, 0);
  std::unique_ptr<KvAdapter> adapter = OpenAdapter(a.get(), pa, "same-positions");
  ASSERT_NE(adapter, nullptr);
  absl::StatusOr<llama::EvictedBlock> evicted = adapter->Evict(16, 48);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(evicted->positions.front(), 16);
  EXPECT_EQ(evicted->positions.size(), 32u);
  EXPECT_EQ(evicted->payload_bytes,
            CanonicalPayloadBytes(adapter->fingerprint(), 32, 2).value());
  EXPECT_EQ(adapter->Read(16, 48).status().code(), absl::StatusCode::kNotFound)
      << "the range is still in the cache after Evict";
  absl::StatusOr<llama::SplicedBlock> restored = adapter->Restore(evicted->id);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->positions.front(), 16);
  Decode(a.get(), {next}, 96);
  const std::vector<float> got = Logits(a.get());
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
      << "next-token logits differ from the uninterrupted run";

  // Control: without the restore the logits do differ, so the check above
  // can fail.
  ContextPtr c = MakeContext(GetParam(), &pc);
  Decode(c.get(), prompt, 0);
  std::unique_ptr<KvAdapter> control = OpenAdapter(c.get(), pc, "control");
  ASSERT_NE(control, nullptr);
  ASSERT_TRUE(control->Evict(16, 48).ok());
  Decode(c.get(), {next}, 96);
  const std::vector<float> without = Logits(c.get());
  EXPECT_NE(std::memcmp(without.data(), expected.data(), got.size() * sizeof(float)), 0);

  // The bytes went through shared memory, both ways.
  EXPECT_EQ(adapter->transfer_stats().shm_transfers, 2u);
  EXPECT_EQ(adapter->transfer_stats().inline_transfers, 0u);
}

TEST_P(LlamaCacheTest, RangesWithHolesKeepTheirPositions) {
  const std::vector<llama_token> prompt = RandomTokens(64, 13);
  llama_context_params p;
  ContextPtr ctx = MakeContext(GetParam(), &p);
  Decode(ctx.get(), prompt, 0);
  std::unique_ptr<KvAdapter> adapter = OpenAdapter(ctx.get(), p, "holes");
  ASSERT_NE(adapter, nullptr);
  absl::StatusOr<CanonicalRange> original = adapter->Read(16, 48);
  ASSERT_TRUE(original.ok()) << original.status();

  // [20, 24) leaves first; then [16, 48) holds 28 tokens around a hole.
  absl::StatusOr<llama::EvictedBlock> inner = adapter->Evict(20, 24);
  ASSERT_TRUE(inner.ok()) << inner.status();
  absl::StatusOr<llama::EvictedBlock> outer = adapter->Evict(16, 48);
  ASSERT_TRUE(outer.ok()) << outer.status();
  ASSERT_EQ(outer->positions.size(), 28u);
  EXPECT_EQ(outer->positions[3], 19);
  EXPECT_EQ(outer->positions[4], 24);
  absl::StatusOr<v1::BlockInfo> info = client_->Describe(outer->id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->meta().positions_size(), 28) << "a gapped block carries its positions";

  // Back, the inner one first: restoring the outer block must not clear the
  // positions of its gap. Every position holds its own K and V again.
  ASSERT_TRUE(adapter->Restore(inner->id).ok());
  ASSERT_TRUE(adapter->Restore(outer->id).ok());
  absl::StatusOr<CanonicalRange> after = adapter->Read(16, 48);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->positions, original->positions);
  EXPECT_TRUE(after->payload == original->payload) << "K/V bytes differ after the round trip";
}

TEST_P(LlamaCacheTest, SpliceAtNewPositionsMatchesFreshPrefillAndKeepsVBytes) {
  const ggml_type type = GetParam().type;
  const std::vector<llama_token> prompt = RandomTokens(96, 12);
  const std::vector<llama_token> moved(prompt.begin() + 16, prompt.begin() + 48);
  llama_context_params pa, pc, pd;

  // Re-anchored by evoked, written at the tail [96, 128).
  ContextPtr a = MakeContext(GetParam(), &pa);
  Decode(a.get(), prompt, 0);
  std::unique_ptr<KvAdapter> adapter_a = OpenAdapter(a.get(), pa, "splice-daemon");
  ASSERT_NE(adapter_a, nullptr);
  absl::StatusOr<CanonicalRange> before = adapter_a->Read(16, 48);
  ASSERT_TRUE(before.ok()) << before.status();
  absl::StatusOr<llama::EvictedBlock> ea = adapter_a->Evict(16, 48);
  ASSERT_TRUE(ea.ok()) << ea.status();
  absl::StatusOr<llama::SplicedBlock> sa =
      adapter_a->Splice(ea->id, 96, SpliceMode::kReanchorInDaemon);
  ASSERT_TRUE(sa.ok()) << sa.status();
  EXPECT_EQ(sa->positions.front(), 96);
  EXPECT_EQ(sa->positions.back(), 127);

  // Written at the original positions, shifted by llama.cpp.
  ContextPtr c = MakeContext(GetParam(), &pc);
  Decode(c.get(), prompt, 0);
  // This one moves bytes inside gRPC messages.
  std::unique_ptr<KvAdapter> adapter_c =
      OpenAdapter(c.get(), pc, "splice-engine", nullptr, /*shared_memory=*/false);
  ASSERT_NE(adapter_c, nullptr);
  absl::StatusOr<llama::EvictedBlock> ec = adapter_c->Evict(16, 48);
  ASSERT_TRUE(ec.ok()) << ec.status();
  absl::StatusOr<llama::SplicedBlock> sc =
      adapter_c->Splice(ec->id, 96, SpliceMode::kShiftInEngine);
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_EQ(sc->positions.front(), 96);
  EXPECT_EQ(adapter_c->transfer_stats().inline_transfers, 2u);
  EXPECT_EQ(adapter_c->transfer_stats().shm_transfers, 0u);
  // llama.cpp applies the shift in its next decode; decode one token in both.
  Decode(a.get(), {7}, 128);
  Decode(c.get(), {7}, 128);

  // A fresh prefill of the same tokens at [96, 128).
  ContextPtr d = MakeContext(GetParam(), &pd);
  Decode(d.get(), prompt, 0);
  Decode(d.get(), moved, 96);
  std::unique_ptr<KvAdapter> adapter_d = OpenAdapter(d.get(), pd, "fresh");
  ASSERT_NE(adapter_d, nullptr);

  absl::StatusOr<CanonicalRange> ra = adapter_a->Read(96, 128);
  absl::StatusOr<CanonicalRange> rc = adapter_c->Read(96, 128);
  absl::StatusOr<CanonicalRange> rd = adapter_d->Read(96, 128);
  ASSERT_TRUE(ra.ok() && rc.ok() && rd.ok()) << ra.status() << rc.status() << rd.status();
  const v1::LayoutFingerprint& fp = adapter_a->fingerprint();
  const uint32_t hd = fp.head_dim();
  const v1::DType kd = fp.k_dtype();

  // Layer 0's K depends only on the token and its position.
  const double err_daemon = WorstHeadRelError(WidenBytes(LayerOf(*ra, fp, 0).k, kd),
                                           WidenBytes(LayerOf(*rd, fp, 0).k, kd), hd);
  const double err_engine = WorstHeadRelError(WidenBytes(LayerOf(*rc, fp, 0).k, kd),
                                           WidenBytes(LayerOf(*rd, fp, 0).k, kd), hd);
  EXPECT_LE(err_daemon, KTolerance(type)) << "evoked re-anchored K vs fresh prefill";
  EXPECT_LE(err_engine, KTolerance(type)) << "llama.cpp-shifted K vs fresh prefill";
  // The K did move: the original rotation is far from the new one.
  EXPECT_GT(WorstHeadRelError(WidenBytes(LayerOf(*before, fp, 0).k, kd), WidenBytes(LayerOf(*rd, fp, 0).k, kd), hd),
            0.1);
  // Both ways of moving agree on every layer.
  for (uint32_t l = 0; l < fp.n_layers(); ++l) {
    EXPECT_LE(WorstHeadRelError(WidenBytes(LayerOf(*ra, fp, l).k, kd), WidenBytes(LayerOf(*rc, fp, l).k, kd), hd),
              KTolerance(type))
        << "layer " << l;
    // V comes back byte-identical, both ways.
    EXPECT_TRUE(LayerOf(*ra, fp, l).v == LayerOf(*before, fp, l).v) << "layer " << l;
    EXPECT_TRUE(LayerOf(*rc, fp, l).v == LayerOf(*before, fp, l).v) << "layer " << l;
  }
  RecordProperty("k_error_daemon", std::to_string(err_daemon));
  RecordProperty("k_error_engine", std::to_string(err_engine));
}

INSTANTIATE_TEST_SUITE_P(Caches, LlamaCacheTest,
                         ::testing::Values(CacheConfig{GGML_TYPE_F16, true},
                                           CacheConfig{GGML_TYPE_F16, false},
                                           CacheConfig{GGML_TYPE_F32, true},
                                           CacheConfig{GGML_TYPE_F32, false}),
                         Name);

TEST_F(LlamaE2eTest, RefusesWhatItCannotServeWithClearReasons) {
  llama_context_params p;
  ContextPtr ctx = MakeContext({GGML_TYPE_F16, true}, &p);
  ASSERT_NE(ctx, nullptr);
  llama::AdapterOptions o;
  o.model_id = "random-llama-tiny";
  o.session_id = "refusals";

  llama_context_params quantized = p;
  quantized.type_k = GGML_TYPE_Q8_0;
  absl::Status s = KvAdapter::Open(ctx.get(), quantized, client_.get(), o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("type_k"));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("quantized"));

  llama_context_params split = p;
  split.kv_unified = false;
  s = KvAdapter::Open(ctx.get(), split, client_.get(), o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("kv_unified"));

  llama::AdapterOptions same = o;
  same.scratch_seq = 0;
  s = KvAdapter::Open(ctx.get(), p, client_.get(), same).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("scratch_seq"));

  llama::AdapterOptions factors = o;
  factors.rope_freq_factors = {1.0f, 2.0f, 4.0f};  // head_dim 64 needs 32.
  s = KvAdapter::Open(ctx.get(), p, client_.get(), factors).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("freq_factors"));

  // A context created without kv_unified really has several streams: the
  // adapter finds out from the cache itself even when told otherwise.
  llama_context_params streams = p;
  streams.kv_unified = false;
  ContextPtr multi(llama_init_from_model(model_, streams));
  ASSERT_NE(multi, nullptr);
  s = KvAdapter::Open(multi.get(), p, client_.get(), o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("streams"));

  // Evicting a range that holds nothing names it; the daemon keeps serving.
  std::unique_ptr<KvAdapter> adapter = OpenAdapter(ctx.get(), p, "refusals");
  ASSERT_NE(adapter, nullptr);
  s = adapter->Evict(0, 10).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("[0, 10)"));
  EXPECT_EQ(adapter->Evict(5, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(adapter->Restore(BlockId::FromBytes(std::string(16, 'x')).value()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_OK(client_->HealthCheck());
}

TEST_F(LlamaE2eTest, FailedSaveLeavesTheCacheAsItWas) {
  const std::vector<llama_token> prompt = RandomTokens(32, 14);
  llama_context_params p;
  ContextPtr ctx = MakeContext({GGML_TYPE_F16, true}, &p);
  Decode(ctx.get(), prompt, 0);
  // The engine's own client: StartDaemon below replaces client_.
  std::unique_ptr<Client> engine_client = daemon_->Connect();
  ASSERT_NE(engine_client, nullptr);
  std::unique_ptr<KvAdapter> adapter =
      OpenAdapter(ctx.get(), p, "daemon-down", engine_client.get());
  ASSERT_NE(adapter, nullptr);
  absl::StatusOr<CanonicalRange> before = adapter->Read(0, 16);
  ASSERT_TRUE(before.ok()) << before.status();

  ASSERT_OK(daemon_->Terminate());
  absl::Status s = adapter->Evict(0, 16).status();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  absl::StatusOr<CanonicalRange> after = adapter->Read(0, 16);
  ASSERT_TRUE(after.ok()) << after.status() << ": the range left the cache unsaved";
  EXPECT_TRUE(after->payload == before->payload);
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(ctx.get()), 0), 31);

  // A daemon that refuses blocks this large: the status names the payload,
  // and the cache keeps the range.
  StartDaemon({"--max-block-bytes", "8KiB"});
  s = adapter->Evict(0, 16).status();  // 16 tokens x 1 KiB
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr("payload"));
  EXPECT_TRUE(adapter->Read(0, 16).ok());

  // Within the limit, the call works.
  absl::StatusOr<llama::EvictedBlock> e = adapter->Evict(0, 8);
  EXPECT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(adapter->Read(0, 8).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LlamaE2eTest, DemoRunsAgainstTheDaemon) {
  // The README demo's llama.cpp step.
  const CommandResult r =
      RunCommand({BinaryPath("EVOKE_LLAMA_DEMO", EVOKE_LLAMA_DEMO_PATH), daemon_->socket()});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr("bitwise equal"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("(rotated), V byte-identical"));
}

void ZeroFill(ggml_tensor* t, void*) {
  std::vector<uint8_t> zeros(ggml_nbytes(t), 0);
  ggml_backend_tensor_set(t, zeros.data(), 0, zeros.size());
}

TEST_F(LlamaE2eTest, RefusesRecurrentModels) {
  // A tiny Mamba (recurrent: its state is not a cache of tokens).
  gguf_context* meta = gguf_init_empty();
  gguf_set_val_str(meta, "general.architecture", "mamba");
  gguf_set_val_u32(meta, "mamba.context_length", 256);
  gguf_set_val_u32(meta, "mamba.embedding_length", 64);
  gguf_set_val_u32(meta, "mamba.block_count", 2);
  gguf_set_val_u32(meta, "mamba.feed_forward_length", 0);
  gguf_set_val_u32(meta, "mamba.attention.head_count", 0);
  gguf_set_val_f32(meta, "mamba.attention.layer_norm_rms_epsilon", 1e-5f);
  gguf_set_val_u32(meta, "mamba.ssm.conv_kernel", 4);
  gguf_set_val_u32(meta, "mamba.ssm.inner_size", 128);
  gguf_set_val_u32(meta, "mamba.ssm.state_size", 16);
  gguf_set_val_u32(meta, "mamba.ssm.time_step_rank", 4);
  gguf_set_val_u32(meta, "mamba.vocab_size", 64);
  gguf_set_val_str(meta, "tokenizer.ggml.model", "none");
  llama_model* mamba = llama_model_init_from_user(meta, ZeroFill, nullptr,
                                                  llama_model_default_params());
  gguf_free(meta);
  ASSERT_NE(mamba, nullptr) << "llama.cpp refused the tiny Mamba";
  ASSERT_TRUE(llama_model_is_recurrent(mamba));
  llama_context_params p = llama_context_default_params();
  p.n_ctx = 256;
  p.n_seq_max = 2;
  p.kv_unified = true;
  ContextPtr ctx(llama_init_from_model(mamba, p));
  ASSERT_NE(ctx, nullptr);
  llama::AdapterOptions o;
  o.model_id = "random-mamba";
  o.session_id = "recurrent";
  absl::Status s = KvAdapter::Open(ctx.get(), p, client_.get(), o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("recurrent"));
  ctx.reset();
  llama_model_free(mamba);
}

// The independent pre-RoPE key of a token in layer 0: its K at position 0,
// where RoPE is the identity.
std::vector<float> PreRopeKey(llama_context* probe, KvAdapter& adapter, llama_token token) {
  llama_memory_seq_rm(llama_get_memory(probe), 0, -1, -1);
  llama_batch batch = llama_batch_get_one(&token, 1);
  EXPECT_EQ(llama_decode(probe, batch), 0);
  absl::StatusOr<CanonicalRange> r = adapter.Read(0, 1);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  return WidenBytes(LayerOf(*r, adapter.fingerprint(), 0).k, adapter.fingerprint().k_dtype());
}

TEST_F(LlamaE2eTest, LongSessionEvictsRecoversAndKeepsDecodingAcrossDaemonRestart) {
  // A 160-cell cache for a 420-token session: blocks of 32 leave by
  // StreamingLLM's policy (4 sink tokens stay, the oldest block after them
  // goes); every 64 tokens the block that best matches the current query
  // comes back, re-anchored at the tail.
  constexpr uint32_t kCells = 160, kBlock = 32, kSink = 4, kSteps = 420;
  // evoked summarises layer 0, whose keys the test can compute on its own.
  ASSERT_OK(daemon_->Terminate());
  StartDaemon({"--summary-layer", "0"});
  llama::QueryCapture capture(/*layer=*/0);
  llama_context_params p;
  ContextPtr ctx = MakeContext({GGML_TYPE_F16, true}, &p, kCells, &capture);
  ASSERT_NE(ctx, nullptr);
  // The engine's own client: it must survive the daemon's restart.
  std::unique_ptr<Client> engine_client = daemon_->Connect();
  ASSERT_NE(engine_client, nullptr);
  std::unique_ptr<KvAdapter> adapter = OpenAdapter(ctx.get(), p, "long", engine_client.get());
  ASSERT_NE(adapter, nullptr);
  llama_context_params pp;
  ContextPtr probe = MakeContext({GGML_TYPE_F16, true}, &pp, 64);
  std::unique_ptr<KvAdapter> probe_adapter = OpenAdapter(probe.get(), pp, "probe");
  ASSERT_NE(probe_adapter, nullptr);

  struct Resident {
    llama_pos begin, end;              // Positions in the cache.
    std::vector<llama_token> tokens;   // Their tokens.
  };
  struct Stored {
    std::vector<llama_token> tokens;
    std::string v_layer0;  // Evicted V bytes of layer 0.
  };
  std::vector<Resident> resident;
  std::map<BlockId, Stored> stored;
  std::vector<llama_token> pending;  // Decoded since the last full block.
  llama_pos n_past = 0;
  int evictions = 0, recoveries = 0, since_recovery = 0;
  bool restarted = false;
  const v1::LayoutFingerprint& fp = adapter->fingerprint();

  auto used_cells = [&] {
    uint32_t n = static_cast<uint32_t>(pending.size());
    for (const Resident& r : resident) n += static_cast<uint32_t>(r.end - r.begin);
    return n;
  };
  auto evict_oldest = [&] {
    // resident[0] holds the sink; the oldest evictable block is resident[1].
    ASSERT_GE(resident.size(), 2u);
    const Resident victim = resident[1];
    absl::StatusOr<CanonicalRange> bytes = adapter->Read(victim.begin, victim.end);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    absl::StatusOr<llama::EvictedBlock> e = adapter->Evict(victim.begin, victim.end);
    ASSERT_TRUE(e.ok()) << e.status();
    stored[e->id] = {victim.tokens, std::string(LayerOf(*bytes, fp, 0).v)};
    resident.erase(resident.begin() + 1);
    ++evictions;
  };

  llama_token token = 1;
  for (uint32_t step = 0; step < kSteps; ++step) {
    while (used_cells() + 1 > kCells) {
      evict_oldest();
      if (HasFatalFailure()) return;
    }
    Decode(ctx.get(), {token}, n_past);
    if (HasFatalFailure()) return;
    pending.push_back(token);
    ++n_past;
    const std::vector<float> logits = Logits(ctx.get());
    ASSERT_TRUE(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));
    token = static_cast<llama_token>(std::max_element(logits.begin(), logits.end()) -
                                     logits.begin());
    const size_t group = resident.empty() ? kSink : kBlock;
    if (pending.size() == group) {
      resident.push_back({n_past - static_cast<llama_pos>(group), n_past, pending});
      pending.clear();
    }

    if (step == kSteps / 2) {
      // The daemon restarts mid-session (SIGTERM: flush, exit; start again).
      ASSERT_OK(daemon_->Terminate());
      Restart();
      restarted = true;
    }

    // At the first block boundary 64 tokens after the last recovery.
    if (++since_recovery < 64 || stored.empty() || !pending.empty()) continue;
    since_recovery = 0;
    // Recover by similarity to the query being decoded.
    const std::vector<float>& query = capture.last_query();
    ASSERT_EQ(query.size(), 4u * fp.head_dim());
    absl::StatusOr<std::vector<v1::RecoveredBlock>> hits =
        adapter->Recover(query, 4, 0, static_cast<uint32_t>(stored.size()));
    ASSERT_TRUE(hits.ok()) << hits.status();
    ASSERT_EQ(hits->size(), stored.size()) << "every stored block is a candidate";

    // The same scores, computed independently: mean pre-RoPE key per KV head
    // (from a probe context at position 0) against the query, mean over the
    // 4 query heads (2 per KV head).
    std::map<BlockId, double> expected;
    for (const auto& [id, block] : stored) {
      std::vector<double> mean(2 * fp.head_dim(), 0.0);
      for (llama_token t : block.tokens) {
        const std::vector<float> k = PreRopeKey(probe.get(), *probe_adapter, t);
        ASSERT_EQ(k.size(), mean.size());
        for (size_t i = 0; i < k.size(); ++i) mean[i] += k[i] / block.tokens.size();
      }
      double score = 0;
      for (uint32_t h = 0; h < 4; ++h) {
        for (uint32_t i = 0; i < fp.head_dim(); ++i) {
          score += query[h * fp.head_dim() + i] * mean[(h / 2) * fp.head_dim() + i];
        }
      }
      expected[id] = score / 4;
    }
    for (const v1::RecoveredBlock& hit : *hits) {
      const BlockId id = BlockId::FromBytes(hit.id()).value();
      ASSERT_TRUE(expected.count(id));
      EXPECT_NEAR(hit.score(), expected[id], 2e-2 * std::max(1.0, std::abs(expected[id])));
    }
    const BlockId best = BlockId::FromBytes(hits->front().id()).value();
    for (const auto& [id, score] : expected) {
      EXPECT_LE(score, expected[best] + 2e-2 * std::max(1.0, std::abs(score)))
          << "a block scoring higher than the recovered one";
    }

    // Make room and splice the best block back at the tail.
    const Stored back = stored[best];
    while (used_cells() + back.tokens.size() + 1 > kCells) {
      evict_oldest();
      if (HasFatalFailure()) return;
    }
    absl::StatusOr<llama::SplicedBlock> s = adapter->Splice(best, n_past);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(s->positions.size(), back.tokens.size());
    absl::StatusOr<CanonicalRange> now = adapter->Read(n_past, n_past + kBlock);
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_TRUE(LayerOf(*now, fp, 0).v == back.v_layer0) << "V changed on its way back";
    resident.push_back({n_past, n_past + static_cast<llama_pos>(kBlock), back.tokens});
    n_past += static_cast<llama_pos>(kBlock);
    stored.erase(best);
    ++recoveries;
    // Drop it from the daemon too: it is resident again, and will be saved
    // anew if evicted.
    ASSERT_OK(engine_client->Delete({best}));
  }
  EXPECT_TRUE(restarted);
  // Shared memory carried the bytes; the region that died with the daemon
  // was replaced (at most one transfer retried inline).
  const llama::TransferStats& t = adapter->transfer_stats();
  EXPECT_GT(t.shm_transfers, static_cast<uint64_t>(evictions));
  EXPECT_LE(t.shm_fallbacks, 1u);
  EXPECT_EQ(t.inline_transfers, t.shm_fallbacks);
  RecordProperty("shm_fallbacks", static_cast<int>(t.shm_fallbacks));
  EXPECT_GE(evictions, 10);
  EXPECT_GE(recoveries, 5);
  EXPECT_GT(n_past, static_cast<llama_pos>(2 * kCells)) << "the session outgrew its cache";
  EXPECT_LE(llama_memory_seq_pos_max(llama_get_memory(ctx.get()), 0), n_past - 1);
  RecordProperty("evictions", evictions);
  RecordProperty("recoveries", recoveries);
}

}  // namespace
}  // namespace evoke::testing
