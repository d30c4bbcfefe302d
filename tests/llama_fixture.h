// The fixture of the llama.cpp end-to-end tests: a real evoked per test (see
// tests/e2e_fixture.h) and one random-weight Llama per test suite. Kept apart
// from tests/llama_test_util.h, which the engine processes (no gtest) use too.
#ifndef EVOKE_TESTS_LLAMA_FIXTURE_H_
#define EVOKE_TESTS_LLAMA_FIXTURE_H_

#include <memory>
#include <string>
#include <vector>

#include "engines/llama/kv_adapter.h"
#include "engines/llama/random_model.h"
#include "tests/e2e_fixture.h"
#include "tests/llama_test_util.h"

namespace evoke::testing {

class LlamaTest : public E2eTest {
 protected:
  static void SetUpTestSuite() { SetUpModel(llama::TinyLlamaShape()); }
  static void TearDownTestSuite() {
    llama_model_free(model_);
    model_ = nullptr;
  }
  // Quiets llama.cpp, initialises its backend and builds the suite's model.
  static void SetUpModel(const llama::RandomLlamaShape& shape) {
    absl::StatusOr<llama::ModelPtr> m = InitRandomModel(shape);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }

  void SetUp() override { StartDaemon(); }

  // The next-token logits of the last decoded token.
  static std::vector<float> Logits(llama_context* ctx) {
    const float* l = llama_get_logits_ith(ctx, -1);
    return std::vector<float>(l, l + llama_vocab_n_tokens(llama_model_get_vocab(model_)));
  }

  // Opens a KvAdapter on `ctx` (created with `p`) through `client`, or
  // client_; nullptr (and a test failure) if it cannot.
  std::unique_ptr<llama::KvAdapter> OpenAdapter(llama_context* ctx, const llama_context_params& p,
                                                const llama::AdapterOptions& o,
                                                Client* client = nullptr) {
    absl::StatusOr<std::unique_ptr<llama::KvAdapter>> a =
        llama::KvAdapter::Open(ctx, p, client != nullptr ? client : client_.get(), o);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(a).value() : nullptr;
  }

  static inline llama_model* model_ = nullptr;
};

}  // namespace evoke::testing

#endif  // EVOKE_TESTS_LLAMA_FIXTURE_H_
