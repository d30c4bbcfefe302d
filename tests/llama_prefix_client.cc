// llama_prefix_client: an engine process for the shared-prefix test. It
// builds the tests' random-weight tiny Llama, connects to evoked and
//   llama_prefix_client SOCKET save PROMPT OUT   prefills PROMPT, saves its
//                                                full 64-token blocks as
//                                                prefix blocks;
//   llama_prefix_client SOCKET load PROMPT OUT   loads the longest stored
//                                                prefix of PROMPT, prefills
//                                                the rest;
// then writes to OUT the number of prompt tokens it did not prefill (int32)
// and the next-token logits (float32 each), and prints "loaded N".
// PROMPT is a file of token ids, whitespace-separated.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "engines/llama/kv_adapter.h"
#include "engines/llama/random_model.h"
#include "evoke/client.h"
#include "tests/llama_test_util.h"

int main(int argc, char** argv) {
  using namespace evoke;
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s SOCKET save|load PROMPT OUT\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[2];
  std::vector<llama_token> prompt;
  {
    std::ifstream in(argv[3]);
    for (llama_token t; in >> t;) prompt.push_back(t);
  }
  if (prompt.empty() || (mode != "save" && mode != "load")) return 2;
  absl::StatusOr<llama::ModelPtr> model = testing::InitRandomModel();
  if (!model.ok()) return 3;
  llama_context_params p = testing::PrefixContextParams();
  llama::ContextPtr ctx(llama_init_from_model(model->get(), p));
  if (ctx == nullptr) return 3;
  ClientOptions options;
  options.target = argv[1];
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return 4;
  const llama::AdapterOptions ao = testing::TestAdapterOptions("prefix-test", "engine-" + mode);
  absl::StatusOr<std::unique_ptr<llama::KvAdapter>> adapter =
      llama::KvAdapter::Open(ctx.get(), p, client->get(), ao);
  if (!adapter.ok()) {
    std::fprintf(stderr, "%s\n", adapter.status().ToString().c_str());
    return 4;
  }
  int32_t loaded = 0;
  if (mode == "load") {
    absl::StatusOr<llama::PrefixResult> r = (*adapter)->LoadLongestPrefix(prompt, 64);
    if (!r.ok()) {
      std::fprintf(stderr, "load: %s\n", r.status().ToString().c_str());
      return 5;
    }
    loaded = static_cast<int32_t>(r->tokens);
  }
  const std::vector<llama_token> rest(prompt.begin() + loaded, prompt.end());
  if (rest.empty() || !llama::DecodeTokens(ctx.get(), rest, loaded)) return 6;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model->get()));
  const float* last = llama_get_logits_ith(ctx.get(), -1);
  const std::vector<float> logits(last, last + n_vocab);
  if (mode == "save") {
    absl::StatusOr<llama::PrefixResult> r = (*adapter)->SavePrefix(prompt, 64);
    if (!r.ok()) {
      std::fprintf(stderr, "save: %s\n", r.status().ToString().c_str());
      return 5;
    }
    std::printf("saved %u present %u\n", r->blocks, r->present);
  }
  std::ofstream out(argv[4], std::ios::binary);
  out.write(reinterpret_cast<const char*>(&loaded), sizeof(loaded));
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(n_vocab * sizeof(float)));
  if (!out) return 7;
  std::printf("loaded %d\n", loaded);
  return 0;
}
