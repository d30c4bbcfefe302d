// RequestStream: one generation request's events, from the engine's thread
// to the HTTP handler that waits for them. The engine says, in order:
// Admitted (once, with the prompt's token counts) or Fail; then Text pieces;
// then Finish (or Fail). The handler reads them with Next and may Cancel
// (its client went away): the engine stops that request at its next step
// and frees its slot.
#ifndef EVOKE_SERVE_REQUEST_STREAM_H_
#define EVOKE_SERVE_REQUEST_STREAM_H_

#include <atomic>
#include <deque>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "serve/openai_api.h"

namespace evoke::serve {

struct StreamEvent {
  enum Kind { kAdmitted, kText, kFinish, kError } kind = kText;
  std::string text;           // kText.
  std::string finish_reason;  // kFinish: "stop" or "length".
  Usage usage;                // kAdmitted (prompt counts) and kFinish.
  ApiError error;             // kError.
};

class RequestStream {
 public:
  // --- the engine's side ---
  void Admitted(const Usage& prompt) { Push({StreamEvent::kAdmitted, {}, {}, prompt, {}}); }
  void Text(std::string piece) { Push({StreamEvent::kText, std::move(piece), {}, {}, {}}); }
  void Finish(std::string reason, const Usage& usage) {
    Push({StreamEvent::kFinish, {}, std::move(reason), usage, {}});
  }
  void Fail(ApiError error) { Push({StreamEvent::kError, {}, {}, {}, std::move(error)}); }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // --- the handler's side ---
  // Next waits up to `timeout` for the next event; false on timeout.
  bool Next(StreamEvent* out, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !events_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return false;
    *out = std::move(events_.front());
    events_.pop_front();
    return true;
  }
  void Cancel() { cancelled_.store(true, std::memory_order_release); }

 private:
  void Push(StreamEvent e) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(e));
  }
  absl::Mutex mu_;
  std::deque<StreamEvent> events_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancelled_{false};
};

}  // namespace evoke::serve

#endif  // EVOKE_SERVE_REQUEST_STREAM_H_
