#include "common/background_thread.h"

#include <sys/resource.h>
#include <unistd.h>

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace evoke {
namespace {

TEST(BackgroundThreadTest, NamesTheThreadAndLowersItsPriority) {
  const int mine = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  ASSERT_LT(mine, 7) << "the test runs at nice " << mine << " already";
  EXPECT_EQ(NiceOfThread("evoke-bg-test"), std::nullopt);
  absl::Notification ready, done;
  std::thread t([&] {
    BecomeBackgroundThread("evoke-bg-test", 7);
    ready.Notify();
    done.WaitForNotification();
  });
  ready.WaitForNotification();
  EXPECT_EQ(NiceOfThread("evoke-bg-test"), 7);
  // Only that thread: the calling one keeps its own.
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(gettid())), mine);
  done.Notify();
  t.join();
  EXPECT_EQ(NiceOfThread("evoke-bg-test"), std::nullopt);
}

}  // namespace
}  // namespace evoke
