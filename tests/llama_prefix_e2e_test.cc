// Shared prefixes between llama.cpp engine processes: one engine process
// prefills a prompt and saves its full 64-token blocks as content-addressed
// prefix blocks in evoked; a second process given the same prompt (or one
// sharing only its first blocks) finds the longest stored prefix, loads it
// instead of prefilling it, and its next-token logits are bitwise equal to
// a prefill of the whole prompt (done here, in the test's own process).
// Label: llama.
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engines/llama/kv_adapter.h"
#include "engines/llama/random_model.h"
#include "tests/llama_fixture.h"

namespace evoke::testing {
namespace {

class LlamaPrefixTest : public LlamaTest {
 protected:
  // Runs an engine process; returns {tokens it did not prefill, logits}.
  std::pair<int32_t, std::vector<float>> Engine(const std::string& mode,
                                                const std::vector<llama_token>& prompt,
                                                const std::string& tag) {
    const std::string prompt_path = dir_.path() + "/prompt-" + tag;
    const std::string out_path = dir_.path() + "/logits-" + tag;
    {
      std::ofstream p(prompt_path);
      for (llama_token t : prompt) p << t << ' ';
    }
    const CommandResult r = RunCommand({BinaryPath("EVOKE_LLAMA_PREFIX_CLIENT",
                                                   EVOKE_LLAMA_PREFIX_CLIENT_PATH),
                                        daemon_->socket(), mode, prompt_path, out_path});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    std::ifstream in(out_path, std::ios::binary);
    int32_t loaded = -1;
    in.read(reinterpret_cast<char*>(&loaded), sizeof(loaded));
    std::vector<float> logits(static_cast<size_t>(
        llama_vocab_n_tokens(llama_model_get_vocab(model_))));
    in.read(reinterpret_cast<char*>(logits.data()),
            static_cast<std::streamsize>(logits.size() * sizeof(float)));
    EXPECT_TRUE(in.good()) << "short output from the engine process";
    return {loaded, logits};
  }

  // This process's own prefill of the whole prompt.
  std::vector<float> Prefill(const std::vector<llama_token>& prompt) {
    llama_context_params p = PrefixContextParams();
    llama::ContextPtr ctx(llama_init_from_model(model_, p));
    EXPECT_NE(ctx, nullptr);
    EXPECT_TRUE(llama::DecodeTokens(ctx.get(), prompt, 0));
    return Logits(ctx.get());
  }

  static bool Bitwise(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }
};

TEST_F(LlamaPrefixTest, SecondProcessLoadsTheLongestStoredPrefixInsteadOfPrefilling) {
  // 3 full blocks of 64 and 8 more tokens.
  const std::vector<llama_token> prompt = RandomTokens(200, 31);
  const std::vector<float> own = Prefill(prompt);

  // Nothing stored yet: the loading engine prefills everything.
  auto [cold, cold_logits] = Engine("load", prompt, "cold");
  EXPECT_EQ(cold, 0);
  EXPECT_TRUE(Bitwise(cold_logits, own));

  auto [saver, saver_logits] = Engine("save", prompt, "save");
  EXPECT_EQ(saver, 0);
  EXPECT_TRUE(Bitwise(saver_logits, own));

  // Same prompt, another process: 192 tokens loaded, 8 prefilled.
  auto [warm, warm_logits] = Engine("load", prompt, "warm");
  EXPECT_EQ(warm, 192);
  EXPECT_TRUE(Bitwise(warm_logits, own)) << "logits differ from a full prefill";

  // A prompt that shares the first two blocks only.
  std::vector<llama_token> fork = prompt;
  for (size_t i = 150; i < fork.size(); ++i) fork[i] = (fork[i] + 1) % 256;
  auto [partial, partial_logits] = Engine("load", fork, "fork");
  EXPECT_EQ(partial, 128);
  const std::vector<float> own_fork = Prefill(fork);
  EXPECT_TRUE(Bitwise(partial_logits, own_fork));
  EXPECT_FALSE(Bitwise(own_fork, own)) << "the forked prompt must change the logits";

  // A prompt differing in its first token shares nothing.
  std::vector<llama_token> other = prompt;
  other[0] = (other[0] + 1) % 256;
  auto [none, none_logits] = Engine("load", other, "other");
  EXPECT_EQ(none, 0);
  EXPECT_TRUE(Bitwise(none_logits, Prefill(other)));
}

TEST_F(LlamaPrefixTest, SavingTwiceSavesOnlyTheMissingBlocks) {
  const std::vector<llama_token> prompt = RandomTokens(200, 32);
  llama_context_params p = PrefixContextParams();
  llama::ContextPtr ctx(llama_init_from_model(model_, p));
  ASSERT_NE(ctx, nullptr);
  absl::StatusOr<std::unique_ptr<llama::KvAdapter>> adapter =
      llama::KvAdapter::Open(ctx.get(), p, client_.get(), TestAdapterOptions("prefix-test", "twice"));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  // Two blocks first (the prompt's first 130 tokens), then all three.
  ASSERT_TRUE(llama::DecodeTokens(ctx.get(), prompt, 0));
  absl::StatusOr<llama::PrefixResult> first =
      (*adapter)->SavePrefix(absl::MakeConstSpan(prompt).subspan(0, 130), 64);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->blocks, 2u);
  EXPECT_EQ(first->present, 0u);
  absl::StatusOr<llama::PrefixResult> second = (*adapter)->SavePrefix(prompt, 64);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->present, 2u);
  EXPECT_EQ(second->blocks, 1u);
  EXPECT_EQ(second->tokens, 192u);
  // Loaded back into an emptied sequence: the chain comes through the shared
  // region (one copy by the daemon), the same bytes as saved; a cap of 100
  // tokens takes one whole block.
  const std::vector<float> before = Logits(ctx.get());
  llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, -1, -1);
  const llama::TransferStats t0 = (*adapter)->transfer_stats();
  absl::StatusOr<llama::PrefixResult> back = (*adapter)->LoadLongestPrefix(prompt, 64);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tokens, 192u);
  EXPECT_EQ((*adapter)->transfer_stats().shm_transfers - t0.shm_transfers, 3u);
  EXPECT_EQ((*adapter)->transfer_stats().inline_transfers, t0.inline_transfers);
  ASSERT_TRUE(llama::DecodeTokens(ctx.get(), absl::MakeConstSpan(prompt).subspan(192), 192));
  const std::vector<float> after = Logits(ctx.get());
  EXPECT_TRUE(Bitwise(after, before)) << "the loaded prefix must give the same logits";
  llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, -1, -1);
  absl::StatusOr<llama::PrefixResult> capped = (*adapter)->LoadLongestPrefix(prompt, 64, 100);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->tokens, 64u);
  // Bad input.
  EXPECT_EQ((*adapter)->SavePrefix(prompt, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*adapter)->LoadLongestPrefix(prompt, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A prompt longer than what the sequence holds: its missing block is named.
  std::vector<llama_token> longer = prompt;
  longer.resize(320, 5);
  EXPECT_EQ((*adapter)->SavePrefix(longer, 64).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace evoke::testing
