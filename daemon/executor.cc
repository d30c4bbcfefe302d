#include "daemon/executor.h"

#include <utility>

namespace evoke {

Executor::Executor(int threads) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

Executor::~Executor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool Executor::TrySubmit(uint64_t key, uint32_t limit, Task&& task) {
  absl::MutexLock lock(&mu_);
  Lane& lane = lanes_[key];
  if (limit > 0 && lane.in_flight >= limit) return false;
  ++lane.in_flight;
  if (lane.tasks.empty()) turns_.push_back(key);
  lane.tasks.push_back(std::move(task));
  return true;
}

uint32_t Executor::InFlight(uint64_t key) const {
  absl::MutexLock lock(&mu_);
  auto it = lanes_.find(key);
  return it == lanes_.end() ? 0 : it->second.in_flight;
}

void Executor::Work() {
  for (;;) {
    Task task;
    uint64_t key;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !turns_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (turns_.empty()) return;  // stop_ and drained.
      key = turns_.front();
      turns_.pop_front();
      Lane& lane = lanes_[key];
      task = std::move(lane.tasks.front());
      lane.tasks.pop_front();
      if (!lane.tasks.empty()) turns_.push_back(key);  // Its next turn.
    }
    std::move(task)();
    absl::MutexLock lock(&mu_);
    auto it = lanes_.find(key);
    if (--it->second.in_flight == 0) lanes_.erase(it);
  }
}

}  // namespace evoke
