// evoke-serve's HTTP side (cpp-httplib): the OpenAI-compatible routes over
// an Engine.
//
//   POST /v1/chat/completions, /v1/completions   streamed (SSE) or not
//   GET  /v1/models, /health, /metrics (Prometheus text)
//
// Errors are OpenAI error objects with their HTTP status (400, 404, 413 for
// a body over max_body_bytes, 429 with Retry-After when the slots stay
// busy, 500). A client that goes away mid-stream cancels its request: the
// engine frees its slot at its next step.
#ifndef EVOKE_SERVE_HTTP_SERVER_H_
#define EVOKE_SERVE_HTTP_SERVER_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "serve/engine.h"

namespace httplib {
class Server;
}

namespace evoke::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (Listen returns it).
  size_t max_body_bytes = 16 << 20;
  // Connections served at once. Each request waiting or decoding holds one,
  // so at least slots + max_queue + 16 (what main sets), or /health starves.
  int threads = 64;
  // When set, requests must carry "Authorization: Bearer <api_key>" (401).
  std::string api_key;
};

class HttpServer {
 public:
  HttpServer(Engine* engine, HttpOptions options);
  ~HttpServer();
  // Bind binds the port; returns it. UNAVAILABLE when it cannot.
  absl::StatusOr<int> Bind();
  // Serve answers until Stop (blocks).
  void Serve();
  void Stop();

 private:
  void Routes();
  Engine* const engine_;
  const HttpOptions options_;
  std::unique_ptr<httplib::Server> server_;
};

}  // namespace evoke::serve

#endif  // EVOKE_SERVE_HTTP_SERVER_H_
