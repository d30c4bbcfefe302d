#include "serve/openai_api.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace evoke::serve {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

Limits TestLimits() {
  Limits l;
  l.models = {"evoke-recall"};
  l.max_tokens = 512;
  l.max_messages = 8;
  return l;
}

ApiError ErrorOf(const std::string& body, Endpoint endpoint = Endpoint::kChat) {
  auto r = ParseGenerationRequest(body, endpoint, TestLimits());
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

GenerationRequest Parsed(const std::string& body, Endpoint endpoint = Endpoint::kChat) {
  auto r = ParseGenerationRequest(body, endpoint, TestLimits());
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << ": " << e->message;
    return {};
  }
  return std::get<GenerationRequest>(r);
}

TEST(OpenAiApiTest, AChatRequestParsesWithItsOptions) {
  const GenerationRequest r = Parsed(R"({
    "model": "evoke-recall",
    "messages": [{"role": "system", "content": "be brief"},
                 {"role": "user", "content": [{"type": "text", "text": "what is "},
                                              {"type": "text", "text": "the code ?"}]}],
    "max_completion_tokens": 16, "temperature": 0, "top_p": 0.5, "seed": -3,
    "stop": ["\n", "."], "n": 1, "stream": true, "stream_options": {"include_usage": true},
    "user": "u1", "presence_penalty": 0, "unknown_thing": {"ignored": true}})");
  EXPECT_EQ(r.model, "evoke-recall");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content, "what is the code ?");
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_EQ(r.sampling.temperature, 0);
  EXPECT_EQ(r.sampling.top_p, 0.5);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"\n", "."}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "u1");
  // Defaults.
  const GenerationRequest d =
      Parsed(R"({"model": "evoke-recall", "prompt": ["one"], "stop": "x"})",
             Endpoint::kCompletion);
  EXPECT_EQ(d.prompt, "one");
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_EQ(d.sampling.temperature, 1.0);
  EXPECT_FALSE(d.stream);
  EXPECT_EQ(d.sampling.stop, std::vector<std::string>{"x"});
}

TEST(OpenAiApiTest, BadRequestsAreRefusedNamingTheParameter) {
  struct Case {
    std::string body;
    std::string param;
    std::string says;
  };
  const std::string m = R"("model": "evoke-recall", )";
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}])";
  const Case cases[] = {
      {R"({"messages": []})", "model", "model is required"},
      {"{" + m + R"("messages": []})", "messages", "non-empty"},
      {"{" + m + R"("messages": [{"role": "king", "content": "x"}]})", "messages[0].role",
       "'king'"},
      {"{" + m + R"("messages": [{"role": "user"}]})", "messages[0].content", "required"},
      {"{" + m + R"("messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "messages[0].content[0]", "text"},
      {"{" + m + R"("messages": [{"role": "assistant", "content": "x", "tool_calls": []}]})",
       "messages[0].tool_calls", "not supported"},
      {"{" + m + msgs + R"(, "max_tokens": -1})", "max_tokens", "out of range [1, 512]"},
      {"{" + m + msgs + R"(, "max_tokens": 0})", "max_tokens", "out of range"},
      {"{" + m + msgs + R"(, "max_tokens": 100000000000000000000})", "max_tokens", "integer"},
      {"{" + m + msgs + R"(, "max_tokens": 513})", "max_tokens", "out of range"},
      {"{" + m + msgs + R"(, "max_tokens": 1.5})", "max_tokens", "integer"},
      {"{" + m + msgs + R"(, "max_tokens": 5, "max_completion_tokens": 6})",
       "max_completion_tokens", "disagree"},
      {"{" + m + msgs + R"(, "temperature": 3})", "temperature", "out of range"},
      {"{" + m + msgs + R"(, "temperature": "hot"})", "temperature", "number"},
      {"{" + m + msgs + R"(, "top_p": 0})", "top_p", "out of range"},
      {"{" + m + msgs + R"(, "n": 2})", "n", "only 1"},
      {"{" + m + msgs + R"(, "stop": ["a", "b", "c", "d", "e"]})", "stop", "up to 4"},
      {"{" + m + msgs + R"(, "stop": [""]})", "stop", "non-empty"},
      {"{" + m + msgs + R"(, "stream": "yes"})", "stream", "boolean"},
      {"{" + m + msgs + R"(, "stream_options": {"include_usage": true}})", "stream_options",
       "stream: true"},
      {"{" + m + msgs + R"(, "logprobs": true})", "logprobs", "not supported"},
      {"{" + m + msgs + R"(, "tools": [{"type": "function"}]})", "tools", "not supported"},
      {"{" + m + msgs + R"(, "response_format": {"type": "json_object"}})", "response_format",
       "text"},
      {"{" + m + msgs + R"(, "seed": "x"})", "seed", "integer"},
      // Fields of the wrong JSON type where a string is read.
      {"{" + m + msgs + R"(, "response_format": {"type": 1}})", "response_format", "text"},
      {"{" + m + R"("messages": [{"role": "user", "content": [{"type": 7, "text": "x"}]}]})",
       "messages[0].content[0]", "text"},
  };
  for (const Case& c : cases) {
    const ApiError e = ErrorOf(c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_THAT(e.message, HasSubstr(c.says)) << c.body;
  }
  EXPECT_EQ(ErrorOf(R"({"model": "evoke-recall", "prompt": 7})", Endpoint::kCompletion).param,
            "prompt");
  EXPECT_EQ(ErrorOf(R"({"model": "evoke-recall", "prompt": ["a", "b"]})", Endpoint::kCompletion)
                .param,
            "prompt");
  // Not JSON, not an object, an unknown model (404, as OpenAI).
  EXPECT_THAT(ErrorOf("{\"model\": ").message, HasSubstr("not valid JSON"));
  EXPECT_THAT(ErrorOf("[1, 2]").message, HasSubstr("JSON object"));
  const ApiError unknown = ErrorOf(R"({"model": "gpt-9", "messages": []})");
  EXPECT_EQ(unknown.http_status, 404);
  EXPECT_EQ(unknown.code, "model_not_found");
  // Too many messages.
  std::string many = "{" + m + R"("messages": [)";
  for (int i = 0; i < 9; ++i) {
    many += std::string(i ? "," : "") + R"({"role": "user", "content": "x"})";
  }
  EXPECT_EQ(ErrorOf(many + "]}").param, "messages");
}

TEST(OpenAiApiTest, ErrorsAreOpenAisErrorObject) {
  const json j = json::parse(ErrorBody(InvalidParam("max_tokens", "bad")));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "max_tokens");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(OpenAiApiTest, ResponsesAndChunksHaveOpenAisShape) {
  Completion c;
  c.id = "chatcmpl-1";
  c.created = 1700000000;
  c.model = "evoke-recall";
  c.text = "4 2 7";
  c.finish_reason = "stop";
  c.usage = {10, 3, 8};
  json j = json::parse(CompletionBody(Endpoint::kChat, c));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "4 2 7");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["total_tokens"], 13);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  j = json::parse(CompletionBody(Endpoint::kCompletion, c));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "4 2 7");

  c.text = "4";
  c.finish_reason = "";
  j = json::parse(ChunkBody(Endpoint::kChat, c, /*first=*/true));
  EXPECT_EQ(j["object"], "chat.completion.chunk");
  EXPECT_EQ(j["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "4");
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  c.text = "";
  c.finish_reason = "length";
  j = json::parse(ChunkBody(Endpoint::kChat, c, false));
  EXPECT_FALSE(j["choices"][0]["delta"].contains("role"));
  EXPECT_FALSE(j["choices"][0]["delta"].contains("content"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  j = json::parse(UsageChunkBody(Endpoint::kChat, c));
  EXPECT_TRUE(j["choices"].empty());
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(SseData("{}"), "data: {}\n\n");
  j = json::parse(ModelsBody({"evoke-recall"}, 5));
  EXPECT_EQ(j["data"][0]["id"], "evoke-recall");
  // Invalid UTF-8 from a model is replaced, not thrown.
  c.text = "\xe2\x82";
  EXPECT_NO_THROW(json::parse(ChunkBody(Endpoint::kChat, c, false)));
}

TEST(OpenAiApiTest, AStopStringSplitOverPiecesNeverReachesTheClient) {
  StopMatcher m({"END", "\n\n"});
  std::string out = m.Push("the code is 4");
  out += m.Push(" 2 E");   // "E" may begin END: held.
  EXPECT_EQ(out, "the code is 4 2 ");
  out += m.Push("N");
  EXPECT_EQ(out, "the code is 4 2 ");
  out += m.Push("D and more");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "the code is 4 2 ");
  EXPECT_EQ(m.Push("after"), "");
  EXPECT_EQ(m.Flush(), "");

  StopMatcher held({"END"});
  EXPECT_EQ(held.Push("EN"), "");
  EXPECT_EQ(held.Push("d"), "ENd");  // Not a stop after all.
  EXPECT_EQ(held.Push("xE"), "x");
  EXPECT_EQ(held.Flush(), "E");     // The end: what was held goes out.
  EXPECT_FALSE(held.stopped());
}

TEST(OpenAiApiTest, AStreamNeverSplitsAUtf8Character) {
  StopMatcher m({});
  const std::string euro = "\xe2\x82\xac";
  EXPECT_EQ(m.Push("a\xe2"), "a");
  EXPECT_EQ(m.Push("\x82"), "");
  EXPECT_EQ(m.Push("\xac" "b"), euro + "b");
  EXPECT_EQ(m.Push("\xf0\x9f"), "");
  EXPECT_EQ(m.Flush(), "\xf0\x9f");
}

}  // namespace
}  // namespace evoke::serve
