#include "serve/openai_api.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace evoke::serve {
namespace {

using json = nlohmann::json;

std::string Dump(const json& j) {
  // Text from a model may hold invalid UTF-8 (a character split over
  // tokens at the very end): replaced, never an exception.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json NullIfEmpty(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

// What a present parameter must be; nullopt: fine.
std::optional<ApiError> CheckNumber(const json& body, const char* name, double lo, double hi,
                                    bool lo_open, double* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return InvalidParam(name, absl::StrCat(name, " must be a number"));
  const double v = it->get<double>();
  if (v < lo || v > hi || (lo_open && v == lo)) {
    return InvalidParam(name, absl::StrCat(name, ": ", v, " is out of range ",
                                           lo_open ? "(" : "[", lo, ", ", hi, "]"));
  }
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> CheckMaxTokens(const json& body, const Limits& limits,
                                       std::optional<int64_t>* out) {
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) continue;
    if (!it->is_number_integer()) {
      return InvalidParam(name, absl::StrCat(name, " must be an integer"));
    }
    // Non-negative integers parse as unsigned, negative ones as signed.
    const bool ok = it->is_number_unsigned()
                        ? it->get<uint64_t>() >= 1 &&
                              it->get<uint64_t>() <= static_cast<uint64_t>(limits.max_tokens)
                        : false;
    if (!ok) {
      return InvalidParam(name, absl::StrCat(name, ": ", it->dump(), " is out of range [1, ",
                                             limits.max_tokens, "]"));
    }
    const auto v = static_cast<int64_t>(it->get<uint64_t>());
    if (out->has_value() && **out != v) {
      return InvalidParam(name, "max_tokens and max_completion_tokens disagree");
    }
    *out = v;
  }
  return std::nullopt;
}

// Parameters that would change the answer in ways not implemented.
std::optional<ApiError> RefuseUnsupported(const json& body) {
  auto truthy = [&](const char* name) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return false;
    if (it->is_boolean()) return it->get<bool>();
    if (it->is_number()) return it->get<double>() != 0;
    if (it->is_string()) return !it->get<std::string>().empty();
    return !it->empty();
  };
  for (const char* name : {"logprobs", "top_logprobs", "tools", "tool_choice", "functions",
                           "function_call", "logit_bias", "echo", "suffix",
                           "presence_penalty", "frequency_penalty", "audio", "prediction"}) {
    if (truthy(name)) {
      return InvalidParam(name, absl::StrCat(name, " is not supported by evoke-serve"));
    }
  }
  auto best_of = body.find("best_of");
  if (best_of != body.end() && !best_of->is_null() &&
      !(best_of->is_number_integer() && best_of->get<int64_t>() == 1)) {
    return InvalidParam("best_of", "best_of: only 1 is supported");
  }
  auto format = body.find("response_format");
  if (format != body.end() && !format->is_null() &&
      !(format->is_object() && format->contains("type") && (*format)["type"] == "text")) {
    return InvalidParam("response_format", "response_format: only {\"type\": \"text\"}");
  }
  return std::nullopt;
}

std::optional<ApiError> ParseContent(const json& content, size_t i, std::string* out) {
  const std::string param = absl::StrCat("messages[", i, "].content");
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) {
    return InvalidParam(param, param + " must be a string or an array of text parts");
  }
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    const std::string where = absl::StrCat(param, "[", k, "]");
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
        !part.contains("text") ||
        !part["text"].is_string()) {
      return InvalidParam(where, where + ": only {\"type\": \"text\", \"text\": string} parts");
    }
    *out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> ParseMessages(const json& body, const Limits& limits,
                                      std::vector<ChatMessage>* out) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    return InvalidParam("messages", "messages must be a non-empty array");
  }
  if (it->size() > limits.max_messages) {
    return InvalidParam("messages", absl::StrCat("messages: ", it->size(), " is more than ",
                                                 limits.max_messages));
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return InvalidParam(param, param + " must be an object");
    ChatMessage msg;
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return InvalidParam(param + ".role", param + ".role must be a string");
    }
    msg.role = role->get<std::string>();
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    if (std::find(std::begin(kRoles), std::end(kRoles), msg.role) == std::end(kRoles)) {
      return InvalidParam(param + ".role",
                          absl::StrCat(param, ".role: '", msg.role,
                                       "' is not system, developer, user, assistant or tool"));
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      return InvalidParam(param + ".tool_calls", "tool calls are not supported by evoke-serve");
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      return InvalidParam(param + ".content", param + ".content is required");
    }
    if (auto e = ParseContent(*content, i, &msg.content)) return e;
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseStop(const json& body, std::vector<std::string>* out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    if (!it->get<std::string>().empty()) out->push_back(it->get<std::string>());
    return std::nullopt;
  }
  if (!it->is_array() || it->size() > 4) {
    return InvalidParam("stop", "stop must be a string or an array of up to 4 strings");
  }
  for (const json& s : *it) {
    if (!s.is_string() || s.get<std::string>().empty()) {
      return InvalidParam("stop", "stop: each entry must be a non-empty string");
    }
    out->push_back(s.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> ParseRest(const json& body, const Limits& limits, GenerationRequest* r) {
  if (auto e = CheckMaxTokens(body, limits, &r->max_tokens)) return e;
  if (auto e = CheckNumber(body, "temperature", 0, 2, false, &r->sampling.temperature)) return e;
  if (auto e = CheckNumber(body, "top_p", 0, 1, true, &r->sampling.top_p)) return e;
  auto seed = body.find("seed");
  if (seed != body.end() && !seed->is_null()) {
    if (!seed->is_number_integer()) return InvalidParam("seed", "seed must be an integer");
    r->sampling.seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                                  : static_cast<uint64_t>(seed->get<int64_t>());
  }
  if (auto e = ParseStop(body, &r->sampling.stop)) return e;
  auto n = body.find("n");
  if (n != body.end() && !n->is_null() &&
      !(n->is_number_integer() && n->get<int64_t>() == 1)) {
    return InvalidParam("n", "n: only 1 is supported");
  }
  auto stream = body.find("stream");
  if (stream != body.end() && !stream->is_null()) {
    if (!stream->is_boolean()) return InvalidParam("stream", "stream must be a boolean");
    r->stream = stream->get<bool>();
  }
  auto options = body.find("stream_options");
  if (options != body.end() && !options->is_null()) {
    if (!r->stream) {
      return InvalidParam("stream_options", "stream_options is only allowed with stream: true");
    }
    if (!options->is_object()) {
      return InvalidParam("stream_options", "stream_options must be an object");
    }
    auto usage = options->find("include_usage");
    if (usage != options->end() && !usage->is_null()) {
      if (!usage->is_boolean()) {
        return InvalidParam("stream_options.include_usage", "include_usage must be a boolean");
      }
      r->include_usage = usage->get<bool>();
    }
  }
  auto user = body.find("user");
  if (user != body.end() && !user->is_null()) {
    if (!user->is_string()) return InvalidParam("user", "user must be a string");
    r->user = user->get<std::string>();
  }
  return RefuseUnsupported(body);
}

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json Envelope(Endpoint endpoint, const Completion& c, bool chunk) {
  const char* object = endpoint == Endpoint::kChat
                           ? (chunk ? "chat.completion.chunk" : "chat.completion")
                           : "text_completion";
  return {{"id", c.id}, {"object", object}, {"created", c.created}, {"model", c.model},
          {"system_fingerprint", nullptr}};
}

}  // namespace

ApiError InvalidParam(const std::string& param, const std::string& message) {
  ApiError e;
  e.message = message;
  e.param = param;
  return e;
}

std::string ErrorBody(const ApiError& e) {
  return Dump({{"error",
                {{"message", e.message},
                 {"type", e.type},
                 {"param", NullIfEmpty(e.param)},
                 {"code", NullIfEmpty(e.code)}}}});
}

std::variant<GenerationRequest, ApiError> ParseGenerationRequest(const std::string& body,
                                                                 Endpoint endpoint,
                                                                 const Limits& limits) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    ApiError e;
    e.message = "the body of the request is not valid JSON";
    return e;
  }
  if (!j.is_object()) {
    ApiError e;
    e.message = "the body of the request must be a JSON object";
    return e;
  }
  GenerationRequest r;
  r.endpoint = endpoint;
  auto model = j.find("model");
  if (model == j.end() || !model->is_string() || model->get<std::string>().empty()) {
    return InvalidParam("model", "model is required (a string; GET /v1/models lists them)");
  }
  r.model = model->get<std::string>();
  if (std::find(limits.models.begin(), limits.models.end(), r.model) == limits.models.end()) {
    ApiError e;
    e.http_status = 404;
    e.message = absl::StrCat("The model '", r.model, "' does not exist");
    e.param = "model";
    e.code = "model_not_found";
    return e;
  }
  if (endpoint == Endpoint::kChat) {
    if (auto e = ParseMessages(j, limits, &r.messages)) return *e;
  } else {
    auto prompt = j.find("prompt");
    if (prompt != j.end() && prompt->is_array() && prompt->size() == 1 &&
        (*prompt)[0].is_string()) {
      r.prompt = (*prompt)[0].get<std::string>();
    } else if (prompt != j.end() && prompt->is_string()) {
      r.prompt = prompt->get<std::string>();
    } else {
      return InvalidParam("prompt", "prompt must be a string (or an array of one string)");
    }
  }
  if (auto e = ParseRest(j, limits, &r)) return *e;
  return r;
}

std::string CompletionBody(Endpoint endpoint, const Completion& c) {
  json j = Envelope(endpoint, c, false);
  json choice = {{"index", 0}, {"finish_reason", c.finish_reason}, {"logprobs", nullptr}};
  if (endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
  } else {
    choice["text"] = c.text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = UsageJson(c.usage);
  return Dump(j);
}

std::string ChunkBody(Endpoint endpoint, const Completion& c, bool first) {
  json j = Envelope(endpoint, c, true);
  json choice = {{"index", 0}, {"finish_reason", NullIfEmpty(c.finish_reason)},
                 {"logprobs", nullptr}};
  if (endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!c.text.empty() || c.finish_reason.empty()) delta["content"] = c.text;
    choice["delta"] = delta;
  } else {
    choice["text"] = c.text;
  }
  j["choices"] = json::array({choice});
  return Dump(j);
}

std::string UsageChunkBody(Endpoint endpoint, const Completion& c) {
  json j = Envelope(endpoint, c, true);
  j["choices"] = json::array();
  j["usage"] = UsageJson(c.usage);
  return Dump(j);
}

std::string ModelsBody(const std::vector<std::string>& models, int64_t created) {
  json data = json::array();
  for (const std::string& m : models) {
    data.push_back({{"id", m}, {"object", "model"}, {"created", created}, {"owned_by", "evoke"}});
  }
  return Dump({{"object", "list"}, {"data", data}});
}

std::string SseData(const std::string& json_text) { return "data: " + json_text + "\n\n"; }

namespace {

// The length of `s`'s longest prefix that does not end inside a UTF-8
// character (an incomplete one at the end is held back).
size_t CompleteUtf8Prefix(const std::string& s) {
  size_t i = s.size();
  size_t back = 0;
  while (i > 0 && back < 4) {
    const auto c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) != 0x80) {  // A lead byte (or ASCII).
      const size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3
                                       : (c >> 3) == 0x1E ? 4 : 1;
      return back + 1 >= need ? s.size() : i - 1;
    }
    --i;
    ++back;
  }
  return s.size();
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::Push(const std::string& piece) {
  if (stopped_) return "";
  held_ += piece;
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that could begin a stop string.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  size_t emit = held_.size() - keep;
  emit = std::min(emit, CompleteUtf8Prefix(held_.substr(0, emit)));
  std::string out = held_.substr(0, emit);
  held_.erase(0, emit);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace evoke::serve
