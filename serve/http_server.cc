#include "serve/http_server.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/metric_families.h"
#include "httplib.h"
#include "prometheus/text_serializer.h"

namespace evoke::serve {
namespace {

constexpr char kJson[] = "application/json";

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  if (e.http_status == 429) res.set_header("Retry-After", "1");
  res.set_content(ErrorBody(e), kJson);
}

std::string NewId(Endpoint endpoint) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%s%016x", endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-", rng());
}

std::string Metrics(const EngineStats& s) {
  MetricFamilies f;
  f.Counter("evoke_serve_requests_total", "Generation requests received.", s.requests);
  f.Counter("evoke_serve_completed_total", "Requests that finished (stop or length).",
            s.completed);
  f.Counter("evoke_serve_failed_total", "Requests that failed after admission checks.",
            s.failed);
  f.Counter("evoke_serve_cancelled_total", "Requests whose client went away.", s.cancelled);
  f.Counter("evoke_serve_rejected_busy_total", "Requests refused with 429.", s.rejected_busy);
  f.Counter("evoke_serve_prompt_tokens_total", "Prompt tokens of admitted requests.",
            s.prompt_tokens);
  f.Counter("evoke_serve_prompt_tokens_reused_total", "Prompt tokens a slot still held.",
            s.reused_from_slot);
  f.Counter("evoke_serve_prompt_tokens_loaded_total", "Prompt tokens whose KV came from evoked.",
            s.loaded_from_evoked);
  f.Counter("evoke_serve_prompt_tokens_prefilled_total", "Prompt tokens computed.", s.prefilled);
  f.Counter("evoke_serve_generated_tokens_total", "Tokens generated.", s.generated);
  f.Counter("evoke_serve_prefix_blocks_saved_total", "Prefix blocks written to evoked.",
            s.prefix_blocks_saved);
  f.Counter("evoke_serve_prefix_errors_total", "Failed prefix saves and loads.",
            s.prefix_save_errors + s.prefix_load_errors);
  f.Counter("evoke_serve_slots_given_up_total", "Idle slots whose cells another request took.",
            s.slots_given_up);
  f.Counter("evoke_serve_policy_conversations_total",
            "Conversations started under the policy (longer than a slot's share).",
            s.policy_conversations);
  f.Counter("evoke_serve_policy_evicted_blocks_total", "Blocks the policy evicted to evoked.",
            s.policy_evicted);
  f.Counter("evoke_serve_policy_recovered_blocks_total", "Blocks the policy brought back.",
            s.policy_recovered);
  f.Counter("evoke_serve_policy_recovery_failures_total",
            "Recovery points that failed (decoding went on without them).",
            s.policy_recovery_failures);
  f.Counter("evoke_serve_policy_blocks_lost_total",
            "Blocks evicted unsaved while evoked was down.", s.policy_blocks_lost);
  f.Gauge("evoke_serve_active_requests", "Requests decoding now.", s.active);
  f.Gauge("evoke_serve_queued_requests", "Requests waiting for a slot.", s.queued);
  return prometheus::TextSerializer().Serialize(f.Take());
}

// Waits for the stream's admission: the first event (Admitted or an error).
StreamEvent AwaitAdmission(RequestStream& stream) {
  StreamEvent ev;
  while (!stream.Next(&ev, absl::Seconds(1))) {
  }
  return ev;
}

void Complete(httplib::Response& res, const std::shared_ptr<RequestStream>& stream,
              Completion c, Endpoint endpoint) {
  StreamEvent ev;
  for (;;) {
    if (!stream->Next(&ev, absl::Seconds(1))) continue;
    if (ev.kind == StreamEvent::kText) {
      c.text += ev.text;
    } else if (ev.kind == StreamEvent::kFinish) {
      c.finish_reason = ev.finish_reason;
      c.usage = ev.usage;
      res.set_content(CompletionBody(endpoint, c), kJson);
      return;
    } else if (ev.kind == StreamEvent::kError) {
      SendError(res, ev.error);
      return;
    }
  }
}

void StreamOut(httplib::Response& res, std::shared_ptr<RequestStream> stream, Completion c,
               Endpoint endpoint, bool include_usage) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream, c, endpoint, include_usage, first = endpoint == Endpoint::kChat](size_t,
                                                         httplib::DataSink& sink) mutable {
        auto send = [&](const std::string& data) {
          if (sink.write(data.data(), data.size())) return true;
          stream->Cancel();
          return false;
        };
        if (first) {
          // As OpenAI's chat: the role first, with empty content.
          first = false;
          Completion head = c;
          return send(SseData(ChunkBody(endpoint, head, /*first=*/true)));
        }
        StreamEvent ev;
        if (!stream->Next(&ev, absl::Milliseconds(200))) {
          if (!sink.is_writable()) {
            stream->Cancel();
            return false;
          }
          return true;  // Called again.
        }
        Completion piece = c;
        switch (ev.kind) {
          case StreamEvent::kText:
            piece.text = ev.text;
            return send(SseData(ChunkBody(endpoint, piece, false)));
          case StreamEvent::kFinish:
            piece.finish_reason = ev.finish_reason;
            piece.usage = ev.usage;
            if (!send(SseData(ChunkBody(endpoint, piece, false)))) return false;
            if (include_usage && !send(SseData(UsageChunkBody(endpoint, piece)))) return false;
            if (!send(kSseDone)) return false;
            sink.done();
            return true;
          case StreamEvent::kError:
            // Headers are gone: the error travels as an event, as OpenAI's do.
            if (!send(SseData(ErrorBody(ev.error)))) return false;
            sink.done();
            return true;
          case StreamEvent::kAdmitted:
            return true;
        }
        return true;
      },
      [stream](bool success) {
        if (!success) stream->Cancel();
      });
}

}  // namespace

HttpServer::HttpServer(Engine* engine, HttpOptions options)
    : engine_(engine), options_(std::move(options)), server_(std::make_unique<httplib::Server>()) {
  Routes();
}

HttpServer::~HttpServer() = default;

void HttpServer::Routes() {
  httplib::Server& s = *server_;
  const int threads = options_.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.set_payload_max_length(options_.max_body_bytes);
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path == "/health") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (req.get_header_value("Authorization") != "Bearer " + options_.api_key) {
      ApiError e;
      e.http_status = 401;
      e.message = "a valid API key is required (Authorization: Bearer ...)";
      e.code = "invalid_api_key";
      SendError(res, e);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                             std::exception_ptr) {
    // A bug of ours; the client gets an OpenAI error, not the exception's text.
    res.headers.clear();
    ApiError e;
    e.http_status = 500;
    e.type = "server_error";
    e.message = "internal error";
    SendError(res, e);
  });
  const size_t max_body = options_.max_body_bytes;
  s.set_error_handler([max_body](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.http_status = res.status;
    if (res.status == 404) {
      e.message = absl::StrCat("no route ", req.method, " ", req.path);
    } else if (res.status == 413) {
      e.message = absl::StrCat("the request body is too large (over ", max_body,
                               " bytes; over 8 KiB when sent as a form: send "
                               "Content-Type: application/json)");
    } else {
      e.message = absl::StrCat("HTTP ", res.status);
    }
    SendError(res, e);
  });
  s.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", kJson);
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(ModelsBody(engine_->limits().models, engine_->created()), kJson);
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(Metrics(engine_->stats()), "text/plain; version=0.0.4");
  });
  for (const auto& [path, endpoint] : {std::pair{"/v1/chat/completions", Endpoint::kChat},
                                       std::pair{"/v1/completions", Endpoint::kCompletion}}) {
    s.Post(path, [this, endpoint = endpoint](const httplib::Request& req,
                                             httplib::Response& res) {
      auto parsed = ParseGenerationRequest(req.body, endpoint, engine_->limits());
      if (auto* e = std::get_if<ApiError>(&parsed)) {
        SendError(res, *e);
        return;
      }
      GenerationRequest r = std::get<GenerationRequest>(std::move(parsed));
      r.session = req.get_header_value("X-Evoke-Session");
      const bool stream = r.stream, include_usage = r.include_usage;
      std::shared_ptr<RequestStream> events = engine_->Submit(std::move(r));
      const StreamEvent admitted = AwaitAdmission(*events);
      if (admitted.kind == StreamEvent::kError) {
        SendError(res, admitted.error);
        return;
      }
      Completion c;
      c.id = NewId(endpoint);
      c.created = absl::ToUnixSeconds(absl::Now());
      c.model = engine_->model_name();
      c.usage = admitted.usage;
      if (stream) {
        StreamOut(res, std::move(events), std::move(c), endpoint, include_usage);
      } else {
        Complete(res, events, std::move(c), endpoint);
      }
    });
  }
}

absl::StatusOr<int> HttpServer::Bind() {
  if (options_.port == 0) {
    const int port = server_->bind_to_any_port(options_.host);
    if (port <= 0) return absl::UnavailableError(absl::StrCat("cannot bind ", options_.host));
    return port;
  }
  if (!server_->bind_to_port(options_.host, options_.port)) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind ", options_.host, ":", options_.port, " (in use?)"));
  }
  return options_.port;
}

void HttpServer::Serve() { server_->listen_after_bind(); }

void HttpServer::Stop() { server_->stop(); }

}  // namespace evoke::serve
