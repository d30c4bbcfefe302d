#include "daemon/executor.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace evoke {
namespace {

TEST(ExecutorTest, RunsEveryTaskOffTheCallingThread) {
  std::atomic<int> ran{0};
  std::atomic<int> inline_runs{0};
  const std::thread::id caller = std::this_thread::get_id();
  {
    Executor executor(3);
    for (int i = 0; i < 1000; ++i) {
      executor.Submit([&] {
        if (std::this_thread::get_id() == caller) ++inline_runs;
        ++ran;
      });
    }
  }  // The destructor drains the queue.
  EXPECT_EQ(ran.load(), 1000);
  EXPECT_EQ(inline_runs.load(), 0);
}

TEST(ExecutorTest, BlockedTaskDoesNotStallOthers) {
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  Executor executor(2);
  executor.Submit([&] {
    while (!release) std::this_thread::yield();
  });
  for (int i = 0; i < 10; ++i) executor.Submit([&] { ++ran; });
  while (ran.load() < 10) std::this_thread::yield();
  release = true;
}

// Keys take turns: with one worker busy and one key's 50 tasks queued, a
// task of another key runs right after the task running now, not after 50.
TEST(ExecutorTest, KeysTakeTurns) {
  Executor executor(1);
  std::atomic<bool> release{false};
  absl::Mutex mu;
  std::vector<int> order;
  std::atomic<bool> started{false};
  ASSERT_TRUE(executor.TrySubmit(1, 0, [&] {
    started = true;
    while (!release) std::this_thread::yield();
  }));
  while (!started) std::this_thread::yield();  // The worker is busy now.
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(executor.TrySubmit(1, 0, [&, i] {
      absl::MutexLock lock(&mu);
      order.push_back(i);
    }));
  }
  ASSERT_TRUE(executor.TrySubmit(2, 0, [&] {
    absl::MutexLock lock(&mu);
    order.push_back(-1);
  }));
  release = true;
  while (executor.InFlight(1) + executor.InFlight(2) > 0) std::this_thread::yield();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(order.size(), 51u);
  EXPECT_EQ(order[0], 0);   // Key 1's next task (it was first in turn)...
  EXPECT_EQ(order[1], -1);  // ...then key 2's, before key 1's other 49.
  for (int i = 2; i < 51; ++i) EXPECT_EQ(order[i], i - 1);  // Key 1's in order.
}

// TrySubmit refuses past a key's cap on tasks queued or running, leaves the
// task to the caller, and takes more once one finishes.
TEST(ExecutorTest, CapsTasksPerKey) {
  Executor executor(2);
  std::atomic<bool> release{false};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(executor.TrySubmit(7, 3, [&] {
      while (!release) std::this_thread::yield();
    }));
  }
  int ran_refused = 0;
  Executor::Task refused = [&] { ++ran_refused; };
  EXPECT_FALSE(executor.TrySubmit(7, 3, std::move(refused)));
  std::move(refused)();  // Still the caller's.
  EXPECT_EQ(ran_refused, 1);
  std::atomic<bool> other{false};
  EXPECT_TRUE(executor.TrySubmit(8, 3, [&] { other = true; }));
  EXPECT_EQ(executor.InFlight(7), 3u);
  release = true;
  while (executor.InFlight(7) > 0) std::this_thread::yield();
  EXPECT_TRUE(executor.TrySubmit(7, 3, [] {}));
  while (!other) std::this_thread::yield();
}

}  // namespace
}  // namespace evoke
