#include "daemon/executor.h"

#include <atomic>
#include <thread>

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

}  // namespace
}  // namespace evoke
