#include "common/background_thread.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace evoke {

void BecomeBackgroundThread(absl::string_view name, int nice) {
  const std::string short_name(name.substr(0, 15));
  pthread_setname_np(pthread_self(), short_name.c_str());
  setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), nice);
}

std::optional<int> NiceOfThread(absl::string_view name) {
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string got;
    if (!std::getline(comm, got) || got != name.substr(0, 15)) continue;
    std::ifstream stat_file(task.path() / "stat");
    std::stringstream buffer;
    buffer << stat_file.rdbuf();
    const std::string stat = buffer.str();
    // After the command (in parentheses, which may hold spaces): field 3 on.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return std::nullopt;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(absl::string_view(stat).substr(close + 2), ' ', absl::SkipEmpty());
    // Field 19 (nice) is the 17th after the command.
    int nice = 0;
    if (fields.size() < 17 || !absl::SimpleAtoi(fields[16], &nice)) return std::nullopt;
    return nice;
  }
  return std::nullopt;
}

}  // namespace evoke
