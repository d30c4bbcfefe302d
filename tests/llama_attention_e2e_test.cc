// Attention capture on the real llama.cpp (random-weight tiny Llama): the
// weights captured through the eval callback equal softmax(QK^T/sqrt(d) +
// mask) computed here from the captured post-RoPE query and the keys read
// back through KvAdapter::Read, with flash attention off (llama.cpp's own
// softmax) and on (computed in the callback); the two agree with each other;
// and ObserveStep folds them into per-block mass. Label: llama.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engines/llama/attention_capture.h"
#include "engines/llama/kv_adapter.h"
#include "engines/llama/random_model.h"
#include "tests/llama_fixture.h"

namespace evoke::testing {
namespace {

using llama::AttentionCapture;
using llama::CellPositions;
using llama::ContextPtr;
using llama::KvAdapter;

struct Config {
  ggml_type type = GGML_TYPE_F16;
  bool flash_attn = false;
};

void PrintTo(const Config& c, std::ostream* os) {
  *os << (c.type == GGML_TYPE_F16 ? "f16" : "f32")
      << (c.flash_attn ? " flash-attn" : " softmax-node");
}

std::string Name(const ::testing::TestParamInfo<Config>& info) {
  return std::string(info.param.type == GGML_TYPE_F16 ? "F16" : "F32") +
         (info.param.flash_attn ? "FlashAttn" : "SoftMaxNode");
}

class LlamaAttentionTest : public LlamaTest {
 protected:
  static void SetUpTestSuite() {
    // Larger weights than the other tests' model: with the default 0.05,
    // attention is nearly uniform (weights within 1% of each other), and a
    // cell/position mix-up would not show.
    llama::RandomLlamaShape shape = llama::TinyLlamaShape();
    shape.weight_std = kWeightStd;
    SetUpModel(shape);
  }

  static constexpr float kWeightStd = 0.2f;

  // A session whose cache is not in position order: a 96-token prompt;
  // [16, 48) evicted and spliced back at [96, 128); [48, 80) evicted and
  // spliced back at [128, 160) (llama.cpp's cell search wraps to the freed
  // cells by then); one token decoded at 160 with the capture on. The
  // sequence then holds 97 tokens: 0-15, 80-160.
  struct Session {
    ContextPtr ctx;
    std::unique_ptr<KvAdapter> adapter;
    std::unique_ptr<AttentionCapture> capture;
    std::unique_ptr<CellPositions> cells;
    // Per captured layer: position -> [n_head] weights.
    std::map<int32_t, std::map<int32_t, std::vector<float>>> by_position;
  };
  static constexpr llama_pos kLast = 160;
  static constexpr size_t kHeld = 97;

  void Run(const Config& config, const std::string& name, Session* s) {
    s->capture = std::make_unique<AttentionCapture>(llama::AttentionCaptureOptions{});
    llama_context_params p = TestContextParams(256, 256, config.type, config.flash_attn);
    s->capture->Install(p);
    s->ctx.reset(llama_init_from_model(model_, p));
    ASSERT_NE(s->ctx, nullptr);
    s->cells = std::make_unique<CellPositions>(s->ctx.get(), 0);
    absl::StatusOr<std::unique_ptr<KvAdapter>> a =
        KvAdapter::Open(s->ctx.get(), p, client_.get(), TestAdapterOptions("attention-test", name));
    ASSERT_TRUE(a.ok()) << a.status();
    s->adapter = std::move(a).value();

    const std::vector<llama_token> prompt = RandomTokens(96, 21);
    s->capture->BeginStep();
    ASSERT_TRUE(llama::DecodeTokens(s->ctx.get(), prompt, 0));
    ASSERT_FALSE(s->capture->visible().empty()) << "nothing captured during the prefill";
    ASSERT_OK(s->cells->Update(s->capture->visible(), 96, 95));
    for (llama_pos first : {16, 48}) {
      absl::StatusOr<llama::EvictedBlock> e = s->adapter->Evict(first, first + 32);
      ASSERT_TRUE(e.ok()) << e.status();
      absl::StatusOr<llama::SplicedBlock> back = s->adapter->Splice(e->id, first + 80);
      ASSERT_TRUE(back.ok()) << back.status();
    }
    s->cells->Invalidate();
    s->capture->BeginStep();
    ASSERT_TRUE(llama::DecodeTokens(s->ctx.get(), {llama_token{7}}, kLast));
    ASSERT_OK(s->cells->Update(s->capture->visible(), 1, kLast));
    for (const llama::LayerAttention* la : s->capture->layers()) {
      auto& out = s->by_position[la->layer];
      for (uint32_t c = 0; c < la->n_kv; ++c) {
        if (!la->visible[c]) {
          for (uint32_t h = 0; h < la->n_head; ++h) {
            EXPECT_EQ(la->weights[size_t{h} * la->n_kv + c], 0.0f) << "masked cell " << c;
          }
          continue;
        }
        const int32_t pos = s->cells->positions()[c];
        ASSERT_GE(pos, 0);
        std::vector<float>& w = out[pos];
        for (uint32_t h = 0; h < la->n_head; ++h) w.push_back(la->weights[size_t{h} * la->n_kv + c]);
      }
    }
  }
};

class CaptureTest : public LlamaAttentionTest, public ::testing::WithParamInterface<Config> {};

TEST_P(CaptureTest, WeightsEqualSoftmaxOfCapturedQueryAndStoredKeys) {
  Session s;
  Run(GetParam(), "capture", &s);
  if (HasFatalFailure()) return;
  const v1::LayoutFingerprint& fp = s.adapter->fingerprint();
  const uint32_t d = fp.head_dim(), n_kv_heads = fp.n_kv_heads();
  ASSERT_EQ(s.capture->layers().size(), fp.n_layers()) << "every layer captured";
  // The cache is out of position order (the spliced block went into freed
  // cells), so a cell/position mix-up shows.
  bool out_of_order = false;
  for (size_t c = 1; c < s.cells->positions().size(); ++c) {
    if (s.cells->positions()[c] >= 0 && s.cells->positions()[c] < s.cells->positions()[c - 1]) {
      out_of_order = true;
    }
  }
  EXPECT_TRUE(out_of_order) << "the test meant to shuffle cells did not";

  absl::StatusOr<llama::CanonicalRange> all = s.adapter->Read(0, kLast + 1);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->positions.size(), kHeld);
  double worst = 0, spread = 0;  // Absolute error; max/min weight.
  for (uint32_t l = 0; l < fp.n_layers(); ++l) {
    const llama::LayerAttention* la = s.capture->layer(static_cast<int32_t>(l));
    ASSERT_NE(la, nullptr);
    EXPECT_EQ(la->from_flash_attn, GetParam().flash_attn);
    ASSERT_EQ(la->head_dim, d);
    ASSERT_EQ(la->query.size(), size_t{la->n_head} * d);
    const std::vector<float> keys =
        WidenBytes(LayerOf(all->payload, kHeld, fp, l).k, fp.k_dtype());
    const uint32_t group = la->n_head / n_kv_heads;
    for (uint32_t h = 0; h < la->n_head; ++h) {
      // Independently: softmax over the sequence's positions (all before
      // or at the decoded one: the causal mask hides nothing else).
      std::vector<double> logits(kHeld);
      for (size_t t = 0; t < kHeld; ++t) {
        double dot = 0;
        const float* k = keys.data() + (t * n_kv_heads + h / group) * d;
        for (uint32_t i = 0; i < d; ++i) dot += double(la->query[h * d + i]) * k[i];
        logits[t] = dot / std::sqrt(double(d));
      }
      const double top = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (double& x : logits) sum += (x = std::exp(x - top));
      double lo = 1, hi = 0;
      for (size_t t = 0; t < kHeld; ++t) {
        const double expected = logits[t] / sum;
        const std::vector<float>& got = s.by_position[static_cast<int32_t>(l)][all->positions[t]];
        ASSERT_EQ(got.size(), la->n_head) << "position " << all->positions[t] << " not captured";
        worst = std::max(worst, std::abs(got[h] - expected));
        lo = std::min(lo, expected);
        hi = std::max(hi, expected);
      }
      spread = std::max(spread, hi / lo);
    }
  }
  // Absolute error on weights of ~1/97: llama.cpp rounds Q to f16 for the
  // product with an f16 K (and casts an f32 K to f16 for flash attention),
  // which moves weights by a few 1e-6; a cell/position mix-up moves them by
  // ~1e-2.
  EXPECT_LE(worst, 1e-4) << "captured weights vs softmax(QK^T/sqrt(d))";
  // The weights are far from uniform: a wrong cell -> position map would fail.
  EXPECT_GT(spread, 3.0);
  RecordProperty("worst_abs_error", std::to_string(worst));
  RecordProperty("spread", std::to_string(spread));
  std::printf("worst absolute error %.3g, weight spread (max/min) %.3g\n", worst, spread);
}

INSTANTIATE_TEST_SUITE_P(Paths, CaptureTest,
                         ::testing::Values(Config{GGML_TYPE_F16, false},
                                           Config{GGML_TYPE_F16, true},
                                           Config{GGML_TYPE_F32, false},
                                           Config{GGML_TYPE_F32, true}),
                         Name);

TEST_F(LlamaAttentionTest, FlashAttentionScoresEqualSoftMaxNodeWeights) {
  Session off, on;
  Run({GGML_TYPE_F16, false}, "off", &off);
  if (HasFatalFailure()) return;
  Run({GGML_TYPE_F16, true}, "on", &on);
  if (HasFatalFailure()) return;
  ASSERT_EQ(off.by_position.size(), on.by_position.size());
  double worst = 0;
  size_t compared = 0;
  for (const auto& [layer, positions] : off.by_position) {
    ASSERT_EQ(positions.size(), kHeld);
    for (const auto& [pos, w] : positions) {
      const std::vector<float>& w_on = on.by_position[layer][pos];
      ASSERT_EQ(w_on.size(), w.size()) << "layer " << layer << " position " << pos;
      for (size_t h = 0; h < w.size(); ++h) {
        worst = std::max(worst, double(std::abs(w_on[h] - w[h])));
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 2u * kHeld * 4u);
  EXPECT_LE(worst, 1e-4);
  RecordProperty("worst_abs_difference", std::to_string(worst));
  std::printf("flash attention on vs off: worst absolute difference %.3g\n", worst);
}

TEST_F(LlamaAttentionTest, IncrementalCellMapMatchesAFullRead) {
  Session s;
  Run({GGML_TYPE_F16, false}, "cells", &s);
  if (HasFatalFailure()) return;
  const uint64_t reads = s.cells->full_reads();
  for (llama_pos pos = kLast + 1; pos <= kLast + 5; ++pos) {
    s.capture->BeginStep();
    ASSERT_TRUE(llama::DecodeTokens(s.ctx.get(), {llama_token{9}}, pos));
    ASSERT_OK(s.cells->Update(s.capture->visible(), 1, pos));
    CellPositions fresh(s.ctx.get(), 0);
    ASSERT_OK(fresh.Update(s.capture->visible(), 1, pos));
    EXPECT_EQ(fresh.full_reads(), 1u);
    ASSERT_EQ(std::vector<int32_t>(s.cells->positions().begin(), s.cells->positions().end()),
              std::vector<int32_t>(fresh.positions().begin(), fresh.positions().end()))
        << "after decoding position " << pos;
  }
  EXPECT_EQ(s.cells->full_reads(), reads) << "one decoded token needs no full read";
  // After a change other than a decode, Invalidate forces one.
  ASSERT_TRUE(s.adapter->Evict(0, 8).ok());
  s.cells->Invalidate();
  s.capture->BeginStep();
  ASSERT_TRUE(llama::DecodeTokens(s.ctx.get(), {llama_token{9}}, kLast + 6));
  ASSERT_OK(s.cells->Update(s.capture->visible(), 1, kLast + 6));
  EXPECT_EQ(s.cells->full_reads(), reads + 1);
  const absl::Span<const int32_t> pos = s.cells->positions();
  EXPECT_EQ(std::count_if(pos.begin(), pos.end(), [](int32_t p) { return p >= 0 && p < 8; }), 0);
  EXPECT_EQ(std::count_if(pos.begin(), pos.end(), [](int32_t p) { return p >= 0; }),
            static_cast<long>(kHeld - 8 + 6));
}

TEST_F(LlamaAttentionTest, ObserveStepSumsGroupsIntoBlocks) {
  Session s;
  Run({GGML_TYPE_F16, true}, "observe", &s);
  if (HasFatalFailure()) return;
  policy::AttentionStats::Options o;
  o.n_layers = 2;
  o.n_heads = 2;
  o.window = 4;
  o.pool_kernel = 1;
  policy::AttentionStats stats(o);
  // Blocks of 32 positions; the decoded token (160) is pending.
  auto block_of = [](int32_t pos) -> std::pair<policy::BlockHandle, uint32_t> {
    if (pos >= kLast) return {policy::AttentionStats::kNoBlock, 0};
    return {static_cast<policy::BlockHandle>(pos / 32), static_cast<uint32_t>(pos % 32)};
  };
  ASSERT_OK(llama::ObserveStep(*s.capture, *s.cells, 2, block_of, &stats));
  EXPECT_EQ(stats.steps(), 1u);
  double total = 0;
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (int32_t g = 0; g < 2; ++g) {
      for (policy::BlockHandle b = 0; b < 5; ++b) {
        double expected = 0;
        for (int32_t pos = int32_t(b) * 32; pos < int32_t(b + 1) * 32; ++pos) {
          auto it = s.by_position[layer].find(pos);
          if (it == s.by_position[layer].end()) continue;  // Not held (16-79).
          expected += it->second[2 * g] + it->second[2 * g + 1];  // Query heads 2g, 2g + 1.
        }
        EXPECT_NEAR(stats.Cumulative(b, layer, g), expected, 1e-4)
            << "block " << b << " layer " << layer << " head " << g;
        total += stats.Cumulative(b, layer, g);
      }
    }
  }
  // 2 layers x 4 query heads, each row summing to 1, minus the pending token.
  EXPECT_LT(total, 8.0);
  EXPECT_GT(total, 7.0);
  // Bad shapes are refused.
  EXPECT_EQ(llama::ObserveStep(*s.capture, *s.cells, 4, block_of, &stats).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace evoke::testing
