// fuzz_openai_request: what an HTTP client sends evoke-serve (issue #29):
// the body of /v1/chat/completions or /v1/completions through
// ParseGenerationRequest, and generated text through StopMatcher.
//
// Input: byte 0 picks the endpoint and the limits (max_tokens 1..4096,
// messages 1..64); byte 1 the number of stop strings given to a
// StopMatcher; the rest is the body (and, split at 0xff bytes, the stop
// strings and the pieces pushed through the matcher).
//
// Checked:
//   - the parser never throws or crashes; an error is a 400 (or 404 for an
//     unknown model, with code model_not_found), its message non-empty, and
//     its body is JSON that says so;
//   - an accepted request is within the limits: the model is the served
//     one, max_tokens in [1, limit] when given, temperature in [0, 2], top_p
//     in (0, 1], at most 4 non-empty stop strings, chat messages in
//     [1, limit] with a known role, a completion's prompt set;
//   - StopMatcher: what it lets out, concatenated with what Flush returns,
//     is a prefix of the pushed text; no stop string occurs in it; when it
//     says stopped, the text out ends exactly where a stop string began.
#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_split.h"
#include "fuzz/fuzz_check.h"
#include "nlohmann/json.hpp"
#include "serve/openai_api.h"

namespace evoke::serve {
namespace {

void CheckRequest(const GenerationRequest& r, const Limits& limits) {
  FUZZ_CHECK(r.model == limits.models[0]);
  if (r.max_tokens.has_value()) {
    FUZZ_CHECK(*r.max_tokens >= 1 && *r.max_tokens <= limits.max_tokens);
  }
  FUZZ_CHECK(r.sampling.temperature >= 0 && r.sampling.temperature <= 2);
  FUZZ_CHECK(r.sampling.top_p > 0 && r.sampling.top_p <= 1);
  FUZZ_CHECK(r.sampling.stop.size() <= 4);
  for (const std::string& s : r.sampling.stop) FUZZ_CHECK(!s.empty());
  if (r.endpoint == Endpoint::kChat) {
    FUZZ_CHECK(!r.messages.empty() && r.messages.size() <= limits.max_messages);
    for (const ChatMessage& m : r.messages) {
      FUZZ_CHECK(m.role == "system" || m.role == "developer" || m.role == "user" ||
                 m.role == "assistant" || m.role == "tool");
    }
  }
  FUZZ_CHECK(!r.include_usage || r.stream);
}

void CheckStops(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher m(stops);
  std::string pushed, out;
  for (const std::string& p : pieces) {
    pushed += p;
    out += m.Push(p);
  }
  const bool stopped = m.stopped();
  out += m.Flush();
  FUZZ_CHECK(pushed.compare(0, out.size(), out) == 0);
  size_t first = std::string::npos;
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    FUZZ_CHECK(out.find(s) == std::string::npos);
    first = std::min(first, pushed.find(s));
  }
  if (stopped) {
    FUZZ_CHECK(first == out.size());
  } else {
    FUZZ_CHECK(first == std::string::npos && out == pushed);
  }
}

}  // namespace
}  // namespace evoke::serve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace evoke::serve;  // NOLINT
  if (size < 2) return 0;
  Limits limits;
  limits.models = {"evoke-recall"};
  limits.max_tokens = 1 + (data[0] & 0x3f) * 64;
  limits.max_messages = 1 + (data[0] >> 6) * 21;
  const Endpoint endpoint = (data[0] & 0x40) ? Endpoint::kCompletion : Endpoint::kChat;
  const std::string body(reinterpret_cast<const char*>(data + 2), size - 2);
  std::variant<GenerationRequest, ApiError> r = ParseGenerationRequest(body, endpoint, limits);
  if (auto* e = std::get_if<ApiError>(&r)) {
    FUZZ_CHECK(e->http_status == 400 || (e->http_status == 404 && e->code == "model_not_found"));
    FUZZ_CHECK(!e->message.empty());
    const nlohmann::json j = nlohmann::json::parse(ErrorBody(*e), nullptr, false);
    FUZZ_CHECK(!j.is_discarded() && j["error"]["message"].is_string());
  } else {
    CheckRequest(std::get<GenerationRequest>(r), limits);
  }
  std::vector<std::string> parts = absl::StrSplit(body, '\xff');
  const size_t n_stops = std::min<size_t>(data[1] % 5, parts.size());
  std::vector<std::string> stops(parts.begin(), parts.begin() + static_cast<ptrdiff_t>(n_stops));
  std::vector<std::string> pieces(parts.begin() + static_cast<ptrdiff_t>(n_stops), parts.end());
  CheckStops(stops, pieces);
  return 0;
}
