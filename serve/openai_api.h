// evoke-serve's OpenAI-compatible protocol (issue #29): requests of
// /v1/chat/completions and /v1/completions parsed and checked, responses
// and stream chunks built, errors in OpenAI's error object. No HTTP and no
// model here: the server (http_server.h) calls these, the generator fills
// in the text.
//
// What is accepted, and what is refused with a 400 naming the parameter:
//   model                  required; an unknown one is a 404 model_not_found
//   messages (chat)        a non-empty array of {role, content}; role system,
//                          developer, user, assistant or tool; content a
//                          string or an array of {"type": "text", "text"}
//                          parts (other part types are refused)
//   prompt (completions)   a string, or an array of exactly one string
//   max_tokens,            1 .. Limits::max_tokens (absent: the server's
//   max_completion_tokens  default); both given must agree
//   temperature            0 .. 2 (0: greedy)
//   top_p                  (0, 1]
//   seed                   an integer
//   stop                   a string or up to 4 non-empty strings
//   n                      1 only
//   stream, stream_options.include_usage
//   user                   a string (kept for logs)
// Anything that would change the answer in a way evoke-serve does not
// implement (logprobs, tools, response_format other than text, logit_bias,
// echo, best_of > 1, suffix) is refused rather than ignored; unknown
// parameters are ignored, as OpenAI's own server does.
#ifndef EVOKE_SERVE_OPENAI_API_H_
#define EVOKE_SERVE_OPENAI_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace evoke::serve {

// An error as OpenAI sends it: HTTP status, then
// {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // Empty: null.
  std::string code;   // Empty: null.
};
std::string ErrorBody(const ApiError& e);
ApiError InvalidParam(const std::string& param, const std::string& message);

struct ChatMessage {
  std::string role;
  std::string content;
};

struct Sampling {
  double temperature = 1.0;  // 0: greedy.
  double top_p = 1.0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
};

enum class Endpoint { kChat, kCompletion };

struct GenerationRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  std::vector<ChatMessage> messages;  // kChat.
  std::string prompt;                 // kCompletion.
  std::optional<int64_t> max_tokens;  // Absent: the server's default.
  Sampling sampling;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage.
  std::string user;
  std::string session;  // X-Evoke-Session: the conversation's id, when the client names it.
};

struct Limits {
  std::vector<std::string> models;  // The ids served (the first is listed first).
  int64_t max_tokens = 4096;        // The most a request may ask for.
  size_t max_messages = 4096;
};

// Parse checks `body` (the raw HTTP body) against OpenAI's schema for
// `endpoint` and `limits`.
std::variant<GenerationRequest, ApiError> ParseGenerationRequest(const std::string& body,
                                                                 Endpoint endpoint,
                                                                 const Limits& limits);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // Of the prompt, the tokens whose KV came from a slot or from evoked
  // instead of being computed (usage.prompt_tokens_details.cached_tokens).
  int64_t cached_tokens = 0;
};

// "stop" (a stop string or the end-of-generation token), "length"
// (max_tokens or the context) or "" (a stream chunk before the end).
struct Completion {
  std::string id;        // chatcmpl-... / cmpl-...
  int64_t created = 0;   // Unix seconds.
  std::string model;
  std::string text;
  std::string finish_reason;
  Usage usage;
};

// The whole (non-streamed) response of `endpoint`.
std::string CompletionBody(Endpoint endpoint, const Completion& c);
// One streamed chunk: `c.text` is the delta (the first chat chunk carries
// the role too, `first`), finish_reason set on the last.
std::string ChunkBody(Endpoint endpoint, const Completion& c, bool first);
// The usage chunk streamed last when stream_options.include_usage.
std::string UsageChunkBody(Endpoint endpoint, const Completion& c);
// /v1/models.
std::string ModelsBody(const std::vector<std::string>& models, int64_t created);

// Server-sent events: "data: <json>\n\n", and the stream's end.
std::string SseData(const std::string& json);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// StopMatcher holds back streamed text that may be the start of a stop
// string, so that a stop string never reaches the client, even when it
// arrives split over several tokens.
class StopMatcher {
 public:
  // Empty strings are ignored.
  explicit StopMatcher(std::vector<std::string> stops);
  // Push adds generated text and returns what may be sent now. After it
  // returns with stopped() true, the text before the stop string has been
  // returned and the rest is dropped.
  std::string Push(const std::string& piece);
  // Flush returns what is held back (at the end of generation).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace evoke::serve

#endif  // EVOKE_SERVE_OPENAI_API_H_
