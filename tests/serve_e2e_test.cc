// evoke-serve end to end (issue #29): the real evoke-serve process on the
// shipped trained model (models/evoke-recall.gguf), over a real evoked,
// driven by an HTTP client and by curl.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// Two facts and a question in the model's task language; greedy decoding
// answers the first fact's code.
constexpr char kFactPrompt[] =
    "the code for red fox is 4 2 7 . the code for blue cat is 9 1 3 . question : what is the "
    "code for red fox ? answer :";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ServeTest : public E2eTest {
 protected:
  void SetUp() override { StartDaemon(); }
  void TearDown() override { StopServe(); }

  // Starts evoke-serve on a free port over this test's evoked.
  void StartServe(const std::vector<std::string>& flags = {}) {
    log_ = dir_.Join(absl::StrCat("serve-", ++starts_, ".log"));
    std::vector<std::string> argv = {EVOKE_SERVE_PATH, "--model", EVOKE_SHIPPED_MODEL,
                                     "--socket", daemon_->socket(), "--port", "0",
                                     "--threads", "2", "--block-tokens", "8"};
    if (std::find(flags.begin(), flags.end(), "--kv-budget") == flags.end()) {
      argv.insert(argv.end(), {"--kv-budget", "1024"});
    }
    argv.insert(argv.end(), flags.begin(), flags.end());
    SpawnOptions spawn{.argv = argv};
    spawn.stdout_path = spawn.stderr_path = log_;
    absl::StatusOr<Subprocess> p = Subprocess::Spawn(spawn);
    ASSERT_TRUE(p.ok()) << p.status();
    serve_ = std::make_unique<Subprocess>(*std::move(p));
    port_ = 0;
    ASSERT_TRUE(WaitUntil(
        [&] {
          const std::string text = ReadFile(log_);
          const size_t at = text.find("listening on http://127.0.0.1:");
          if (at == std::string::npos) return false;
          const std::string rest = text.substr(at + 30);
          return absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &port_);
        },
        absl::Seconds(60)))
        << ReadFile(log_);
    client_http_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_http_->set_read_timeout(60, 0);
  }
  // SIGTERM, and it must exit cleanly.
  void StopServe() {
    if (serve_ == nullptr) return;
    serve_->Signal(SIGTERM);
    absl::StatusOr<int> code = serve_->Wait(absl::Seconds(30));
    EXPECT_TRUE(code.ok() && *code == 0) << ReadFile(log_);
    serve_.reset();
  }

  json Post(const std::string& path, const json& body, int want_status = 200,
            const httplib::Headers& headers = {}) {
    httplib::Result r = client_http_->Post(path, headers, body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return json();
    EXPECT_EQ(r->status, want_status) << r->body;
    return json::parse(r->body, nullptr, false);
  }
  std::map<std::string, double> Metrics() {
    std::map<std::string, double> out;
    httplib::Result r = client_http_->Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    if (!r) return out;
    for (absl::string_view line : absl::StrSplit(r->body, '\n', absl::SkipEmpty())) {
      if (line[0] == '#') continue;
      const std::vector<std::string> kv = absl::StrSplit(line, ' ');
      double v = 0;
      if (kv.size() == 2 && absl::SimpleAtod(kv[1], &v)) out[kv[0]] = v;
    }
    return out;
  }
  static json Completion(const std::string& prompt, int max_tokens) {
    return {{"model", "evoke-recall"}, {"prompt", prompt}, {"max_tokens", max_tokens},
            {"temperature", 0}};
  }

  std::unique_ptr<Subprocess> serve_;
  std::unique_ptr<httplib::Client> client_http_;
  std::string log_;
  int port_ = 0;
  int starts_ = 0;
};

TEST_F(ServeTest, HealthModelsAndMetrics) {
  StartServe();
  httplib::Result r = client_http_->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = client_http_->Get("/v1/models");
  ASSERT_TRUE(r);
  const json models = json::parse(r->body);
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "evoke-recall");
  EXPECT_EQ(Metrics().at("evoke_serve_requests_total"), 0);
}

TEST_F(ServeTest, AFactIsAnsweredAndAReturningPromptComesFromTheSlotThenFromEvoked) {
  StartServe();
  json r = Post("/v1/completions", Completion(kFactPrompt, 4));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], " 4 2 7 .");
  const int64_t prompt_tokens = r["usage"]["prompt_tokens"];
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // Again: the slot holds all but the last token.
  r = Post("/v1/completions", Completion(kFactPrompt, 4));
  EXPECT_EQ(r["choices"][0]["text"], " 4 2 7 .");
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], prompt_tokens - 1);
  // After a restart of evoke-serve, from evoked: its whole blocks of 8.
  StopServe();
  StartServe();
  r = Post("/v1/completions", Completion(kFactPrompt, 4));
  EXPECT_EQ(r["choices"][0]["text"], " 4 2 7 .");
  const int64_t loaded = (prompt_tokens - 1) / 8 * 8;
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], loaded);
  const auto m = Metrics();
  EXPECT_EQ(m.at("evoke_serve_prompt_tokens_loaded_total"), loaded);
  EXPECT_EQ(m.at("evoke_serve_prompt_tokens_prefilled_total"), prompt_tokens - loaded);
}

// Conversations sharing only a few first words do not take over each
// other's slots; one whose slot went to another comes back from evoked.
TEST_F(ServeTest, AConversationWhoseSlotWentElsewhereComesBackFromEvoked) {
  StartServe({"--slots", "2"});
  const std::string b = "the code for green owl is 1 1 1 . question : what is the code for "
                        "green owl ? answer :";
  const std::string c = "the code for amber ant is 5 5 5 . the code for ivory squid is 6 6 6 . "
                        "question : what is the code for amber ant ? answer :";
  json r = Post("/v1/completions", Completion(kFactPrompt, 4));  // Slot 1.
  const int64_t prompt_tokens = r["usage"]["prompt_tokens"];
  r = Post("/v1/completions", Completion(b, 4));  // Slot 2, empty: not slot 1.
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  r = Post("/v1/completions", Completion(c, 4));  // The coldest: slot 1.
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(Metrics().at("evoke_serve_slots_given_up_total"), 0);
  r = Post("/v1/completions", Completion(kFactPrompt, 4));  // No slot holds it: evoked.
  EXPECT_EQ(r["choices"][0]["text"], " 4 2 7 .");
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], (prompt_tokens - 1) / 8 * 8);
  EXPECT_EQ(Metrics().at("evoke_serve_prompt_tokens_loaded_total"), (prompt_tokens - 1) / 8 * 8);
}

TEST_F(ServeTest, OptionsThatLeaveNoRoomAreRefusedAtStart) {
  const std::string log = dir_.Join("refused.log");
  SpawnOptions spawn{.argv = {EVOKE_SERVE_PATH, "--model", EVOKE_SHIPPED_MODEL, "--socket",
                              daemon_->socket(), "--port", "0", "--kv-budget", "256",
                              "--max-prompt-tokens", "1000", "--policy", "none"}};
  spawn.stdout_path = spawn.stderr_path = log;
  absl::StatusOr<Subprocess> p = Subprocess::Spawn(spawn);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = p->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(ReadFile(log), HasSubstr("max_prompt_tokens: 1000 leaves no room"));
  // Under a policy a long prompt has room, but a slot's share must hold
  // what the policy needs, and the policy must exist.
  for (const auto& [flags, why] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--kv-budget", "256", "--slots", "16"}, "a slot's share of kv_budget / slots = 16"},
           {{"--policy", "fifo"}, "fifo"}}) {
    SpawnOptions again = spawn;
    again.argv = {EVOKE_SERVE_PATH, "--model", EVOKE_SHIPPED_MODEL, "--socket",
                  daemon_->socket(), "--port", "0"};
    again.argv.insert(again.argv.end(), flags.begin(), flags.end());
    absl::StatusOr<Subprocess> q = Subprocess::Spawn(again);
    ASSERT_TRUE(q.ok()) << q.status();
    absl::StatusOr<int> rc = q->Wait(absl::Seconds(60));
    ASSERT_TRUE(rc.ok());
    EXPECT_EQ(*rc, 1) << why;
    EXPECT_THAT(ReadFile(log), HasSubstr(why));
  }
}

// A conversation longer than its slot's share of the KV budget runs under
// the policy (EVOKE): blocks go to evoked as it grows, recovery points bring
// some back, the slot never holds more than its share, and its next turn
// decodes only what the turn adds.
TEST_F(ServeTest, AConversationLongerThanItsSlotsShareRunsUnderThePolicy) {
  StartServe({"--slots", "1", "--kv-budget", "256"});
  std::string prompt = "the code for red fox is 4 2 7 . ";
  const std::string filler = "the tall castle needs the loud bridge . each river crosses . ";
  for (int i = 0; i < 60; ++i) prompt += filler;
  prompt += "question : what is the code for red fox ? answer :";
  json r = Post("/v1/completions", Completion(prompt, 3));
  ASSERT_TRUE(r.contains("usage")) << r.dump();
  const int64_t first_prompt = r["usage"]["prompt_tokens"].get<int64_t>();
  EXPECT_GT(first_prompt, 600);  // More than twice the budget.
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  std::map<std::string, double> m = Metrics();
  EXPECT_EQ(m["evoke_serve_policy_conversations_total"], 1);
  EXPECT_GT(m["evoke_serve_policy_evicted_blocks_total"], 30);
  EXPECT_EQ(m["evoke_serve_policy_recovery_failures_total"], 0);
  EXPECT_EQ(m["evoke_serve_failed_total"], 0);
  // The next turn: the conversation so far, the reply, more text.
  prompt += r["choices"][0]["text"].get<std::string>() + " . " + filler +
            "question : what is the code for red fox ? answer :";
  r = Post("/v1/completions", Completion(prompt, 3));
  ASSERT_TRUE(r.contains("usage")) << r.dump();
  // All the slot's conversation held: the first prompt and the reply's
  // tokens before its last.
  EXPECT_GE(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), first_prompt);
  m = Metrics();
  EXPECT_EQ(m["evoke_serve_policy_conversations_total"], 1);  // Continued, not restarted.
  EXPECT_GT(m["evoke_serve_policy_recovered_blocks_total"], 0);
  // The slot held at most its share: evoked has the rest, as a session.
  const v1::StatResponse st = Stat();
  EXPECT_GT(st.pinned().blocks() + st.spill().blocks(), 30u);
  // Conversations that replace one another in the slot leave no shared
  // region behind in evoked (each has its adapter, and its region, while
  // it lasts).
  for (int i = 0; i < 4; ++i) {
    std::string other = absl::StrCat("the code for green owl is ", i, " 5 1 . ");
    for (int j = 0; j < 40; ++j) other += filler;
    other += "question : what is the code for green owl ? answer :";
    Post("/v1/completions", Completion(other, 1));
  }
  EXPECT_EQ(Metrics()["evoke_serve_policy_conversations_total"], 5);
  EXPECT_LE(Stat().leases().shm_regions(), 3u);
  StopServe();  // Its conversation's session goes with it.
}

// A conversation that outgrows its slot's share after a first turn that
// fitted: the policy takes over what the slot holds (nothing is computed
// again). After a restart, its prefix blocks (written when the first turn
// ended) come back from evoked, up to the share, and the rest is decoded
// under the policy.
TEST_F(ServeTest, AConversationOutgrowingItsShareIsAdoptedAndComesBackAfterARestart) {
  StartServe({"--slots", "1", "--kv-budget", "256"});
  const std::string filler = "the tall castle needs the loud bridge . each river crosses . ";
  std::string prompt = std::string(kFactPrompt);
  json r = Post("/v1/completions", Completion(prompt, 4));  // Fits: no policy.
  ASSERT_TRUE(r.contains("usage")) << r.dump();
  const int64_t first = r["usage"]["prompt_tokens"].get<int64_t>();
  EXPECT_EQ(Metrics()["evoke_serve_policy_conversations_total"], 0);
  prompt += r["choices"][0]["text"].get<std::string>() + " ";
  for (int i = 0; i < 30; ++i) prompt += filler;
  prompt += "question : what is the code for red fox ? answer :";
  r = Post("/v1/completions", Completion(prompt, 3));
  ASSERT_TRUE(r.contains("usage")) << r.dump();
  EXPECT_GE(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), first);
  std::map<std::string, double> m = Metrics();
  EXPECT_EQ(m["evoke_serve_policy_conversations_total"], 1);
  EXPECT_GT(m["evoke_serve_policy_evicted_blocks_total"], 0);
  EXPECT_EQ(m["evoke_serve_prompt_tokens_prefilled_total"],
            m["evoke_serve_prompt_tokens_total"] - m["evoke_serve_prompt_tokens_reused_total"]);
  StopServe();
  StartServe({"--slots", "1", "--kv-budget", "256"});
  r = Post("/v1/completions", Completion(prompt, 3));
  ASSERT_TRUE(r.contains("usage")) << r.dump();
  m = Metrics();
  EXPECT_EQ(m["evoke_serve_policy_conversations_total"], 1);
  // The first turn's whole blocks, at most the share.
  EXPECT_GE(m["evoke_serve_prompt_tokens_loaded_total"], 8);
  EXPECT_LE(m["evoke_serve_prompt_tokens_loaded_total"], 256);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<double>(),
            m["evoke_serve_prompt_tokens_loaded_total"]);
  EXPECT_EQ(m["evoke_serve_failed_total"], 0);
}

// X-Evoke-Session names a conversation: its idle slot is chosen first,
// whatever the tokens say; without the header, the tokens decide.
TEST_F(ServeTest, XEvokeSessionChoosesItsSlot) {
  StartServe({"--slots", "2"});
  const std::string other =
      "the tall castle needs the loud bridge . each river crosses . the code for green owl is "
      "5 5 1 . question : what is the code for green owl ? answer :";
  Post("/v1/completions", Completion(kFactPrompt, 1), 200, {{"X-Evoke-Session", "conv-a"}});
  const json b = Post("/v1/completions", Completion(other, 1));
  const double other_tokens = b["usage"]["prompt_tokens"].get<double>();
  // Unnamed, the other conversation goes where its tokens are: the second
  // slot, which holds all of it.
  std::map<std::string, double> m0 = Metrics();
  Post("/v1/completions", Completion(other, 1));
  std::map<std::string, double> m1 = Metrics();
  EXPECT_EQ(m1["evoke_serve_prompt_tokens_reused_total"] -
                m0["evoke_serve_prompt_tokens_reused_total"],
            other_tokens - 1);
  // Named conv-a, it goes to conv-a's slot, which holds only their common
  // start (BOS, "the"): its blocks come from evoked instead.
  Post("/v1/completions", Completion(other, 1), 200, {{"X-Evoke-Session", "conv-a"}});
  std::map<std::string, double> m2 = Metrics();
  EXPECT_EQ(m2["evoke_serve_prompt_tokens_reused_total"],
            m1["evoke_serve_prompt_tokens_reused_total"]);
  EXPECT_GT(m2["evoke_serve_prompt_tokens_loaded_total"],
            m1["evoke_serve_prompt_tokens_loaded_total"]);
}

// A chat's second turn (the first turn, the reply as the client got it, a
// new message) reuses what the slot holds of the first; after a restart,
// the third turn comes from evoked.
TEST_F(ServeTest, AChatsNextTurnsReuseItsEarlierTurns) {
  StartServe();
  json messages = {{{"role", "user"}, {"content", kFactPrompt}}};
  auto turn = [&] {
    const json r = Post("/v1/chat/completions", {{"model", "evoke-recall"},
                                                 {"messages", messages},
                                                 {"max_tokens", 4},
                                                 {"temperature", 0}});
    messages.push_back({{"role", "assistant"},
                        {"content", r["choices"][0]["message"]["content"]}});
    messages.push_back({{"role", "user"}, {"content", "what is the code for blue cat ?"}});
    return r;
  };
  json r = turn();
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const int64_t first_prompt = r["usage"]["prompt_tokens"];
  r = turn();
  // All of the first turn's prompt at least: the slot held it.
  EXPECT_GE(r["usage"]["prompt_tokens_details"]["cached_tokens"], first_prompt);
  const int64_t second_prompt = r["usage"]["prompt_tokens"];
  StopServe();
  StartServe();
  r = turn();
  // From evoked: the whole blocks of what the second turn decoded.
  EXPECT_GE(r["usage"]["prompt_tokens_details"]["cached_tokens"], second_prompt / 8 * 8 - 8);
  EXPECT_GT(Metrics().at("evoke_serve_prompt_tokens_loaded_total"), 0);
}

TEST_F(ServeTest, AChatStreamsInOpenAisChunksWithUsage) {
  StartServe();
  const json body = {{"model", "evoke-recall"},
                     {"messages", {{{"role", "user"}, {"content", kFactPrompt}}}},
                     {"max_tokens", 6},
                     {"temperature", 0},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  httplib::Result r = client_http_->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->get_header_value("Content-Type"), HasSubstr("text/event-stream"));
  std::vector<json> chunks;
  bool done = false;
  for (absl::string_view event : absl::StrSplit(r->body, "\n\n", absl::SkipEmpty())) {
    ASSERT_TRUE(absl::ConsumePrefix(&event, "data: ")) << event;
    if (event == "[DONE]") {
      done = true;
      continue;
    }
    chunks.push_back(json::parse(event));
  }
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 3u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 2 < chunks.size(); ++i) {
    text += chunks[i]["choices"][0]["delta"]["content"].get<std::string>();
    EXPECT_EQ(chunks[i]["id"], chunks[0]["id"]);
  }
  const json& last = chunks[chunks.size() - 2];
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  const json& usage = chunks.back();
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 6);
  EXPECT_FALSE(text.empty());
}

TEST_F(ServeTest, BadRequestsGetOpenAiErrorsAndTheServerGoesOn) {
  StartServe({"--max-prompt-tokens", "16"});
  httplib::Result r = client_http_->Post("/v1/completions", "{\"model\": ", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(json::parse(r->body)["error"]["message"].get<std::string>(), HasSubstr("JSON"));
  json e = Post("/v1/completions", {{"model", "gpt-9"}, {"prompt", "x"}}, 404);
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  e = Post("/v1/completions", {{"model", "evoke-recall"}, {"prompt", "x"}, {"max_tokens", -1}},
           400);
  EXPECT_EQ(e["error"]["param"], "max_tokens");
  e = Post("/v1/completions", Completion(kFactPrompt, 4), 400);  // Past 16 tokens.
  EXPECT_EQ(e["error"]["code"], "context_length_exceeded");
  r = client_http_->Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_THAT(r->body, HasSubstr("no route"));
  r = client_http_->Post("/v1/completions", std::string(17 << 20, 'x'), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  // Still serving.
  e = Post("/v1/completions", Completion("the code for red fox is", 2));
  EXPECT_EQ(e["usage"]["completion_tokens"], 2);
}

TEST_F(ServeTest, ConcurrentRequestsAreServedInSlotsAndTheRestQueueOrGet429) {
  StartServe({"--slots", "2"});
  std::atomic<int> ok{0}, bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      httplib::Client c("127.0.0.1", port_);
      c.set_read_timeout(60, 0);
      for (int i = 0; i < 3; ++i) {
        // Each its own conversation (a different first word), the same question.
        const std::string prompt = absl::StrCat(t % 2 ? "the " : "", kFactPrompt);
        httplib::Result r = c.Post("/v1/completions", Completion(prompt, 4).dump(),
                                   "application/json");
        if (r && r->status == 200 &&
            json::parse(r->body)["usage"]["completion_tokens"] == 4) {
          ++ok;
        } else {
          ++bad;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok, 24);
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(Metrics().at("evoke_serve_completed_total"), 24);
  StopServe();

  // One slot, no waiting: a second request while the first decodes is 429.
  StartServe({"--slots", "1", "--queue-wait-ms", "1"});
  std::thread long_one([&] {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    c.Post("/v1/completions", Completion(kFactPrompt, 900).dump(), "application/json");
  });
  absl::Cleanup join_long_one = [&] { long_one.join(); };
  // Probe once it decodes (900 tokens: long enough to be caught at it).
  ASSERT_TRUE(WaitUntil([&] { return Metrics()["evoke_serve_active_requests"] == 1; },
                        absl::Seconds(30), absl::Milliseconds(1)))
      << ReadFile(log_);
  bool saw_429 = false;
  for (int i = 0; i < 200 && !saw_429; ++i) {
    httplib::Result r = client_http_->Post("/v1/completions", Completion("x y", 1).dump(),
                                           "application/json");
    ASSERT_TRUE(r);
    if (r->status == 429) {
      saw_429 = true;
      EXPECT_EQ(r->get_header_value("Retry-After"), "1");
      EXPECT_EQ(json::parse(r->body)["error"]["code"], "rate_limit_exceeded");
    }
  }
  EXPECT_TRUE(saw_429);
}

TEST_F(ServeTest, AClientLeavingMidStreamFreesItsSlot) {
  StartServe({"--slots", "1"});
  {
    // By hand over a socket: read three events, then close the connection.
    const json body = {{"model", "evoke-recall"}, {"prompt", kFactPrompt},
                       {"max_tokens", 900}, {"stream", true}};
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string request = absl::StrCat(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: ", body.dump().size(), "\r\n\r\n", body.dump());
    ASSERT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
    std::string got;
    char buf[4096];
    while (std::count(got.begin(), got.end(), '\n') < 16) {  // Headers, then a few events.
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      ASSERT_GT(n, 0) << got;
      got.append(buf, static_cast<size_t>(n));
    }
    EXPECT_THAT(got, HasSubstr("data: "));
    ::close(fd);
  }
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto m = Metrics();
        return m["evoke_serve_cancelled_total"] == 1 && m["evoke_serve_active_requests"] == 0;
      },
      absl::Seconds(30)));
  // The one slot serves the next request.
  const json r = Post("/v1/completions", Completion(kFactPrompt, 4));
  EXPECT_EQ(r["choices"][0]["text"], " 4 2 7 .");
}

TEST_F(ServeTest, TheOfficialOpenAiNodeClientWorks) {
  StartServe();
  const std::string out = dir_.Join("node.out");
  SpawnOptions spawn{.argv = {EVOKE_NODE, EVOKE_OPENAI_CLIENT,
                              absl::StrCat("http://127.0.0.1:", port_, "/v1")}};
  spawn.stdout_path = spawn.stderr_path = out;
  absl::StatusOr<Subprocess> node = Subprocess::Spawn(spawn);
  ASSERT_TRUE(node.ok()) << node.status() << " (Node.js: scripts/setup-debian.sh)";
  absl::StatusOr<int> code = node->Wait(absl::Seconds(120));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << ReadFile(out);
  EXPECT_THAT(ReadFile(out), HasSubstr("all checks passed"));
}

TEST_F(ServeTest, CurlStreamsAChat) {
  StartServe();
  const json body = {{"model", "evoke-recall"},
                     {"messages", {{{"role", "user"}, {"content", "the code for red fox is"}}}},
                     {"max_tokens", 3},
                     {"stream", true}};
  const std::string out = dir_.Join("curl.out");
  SpawnOptions spawn{.argv = {"curl", "-sN", "-H", "Content-Type: application/json", "-d",
                              body.dump(),
                              absl::StrCat("http://127.0.0.1:", port_, "/v1/chat/completions")}};
  spawn.stdout_path = out;
  absl::StatusOr<Subprocess> curl = Subprocess::Spawn(spawn);
  ASSERT_TRUE(curl.ok()) << curl.status();
  absl::StatusOr<int> code = curl->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
  const std::string text = ReadFile(out);
  EXPECT_THAT(text, HasSubstr("\"object\":\"chat.completion.chunk\""));
  EXPECT_THAT(text, HasSubstr("\"finish_reason\":\"length\""));
  EXPECT_TRUE(absl::EndsWith(text, "data: [DONE]\n\n")) << text;
}

}  // namespace
}  // namespace evoke::testing
