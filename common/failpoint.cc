#include "common/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace evoke {
namespace failpoint_internal {

std::atomic<bool> g_armed{false};

namespace {

struct Failpoint {
  std::string name;
  uint64_t nth = 1;          // Kill at this hit (when probability is 0).
  double probability = 0.0;  // Else kill each hit with this probability.
  uint64_t hits = 0;
};

// Guards everything below. Only armed processes (trials) ever take it.
std::mutex g_mu;
std::vector<Failpoint>* g_points = new std::vector<Failpoint>();  // Never freed.
uint64_t g_rng = 0;

uint64_t NextRandom() {  // splitmix64.
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool ValidName(absl::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::Status Parse(absl::string_view spec, std::vector<Failpoint>* out) {
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) continue;
    Failpoint point;
    const size_t eq = item.find('=');
    point.name = std::string(absl::StripAsciiWhitespace(item.substr(0, eq)));
    if (!ValidName(point.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("failpoint name '", point.name, "' is not [A-Za-z0-9._-]+"));
    }
    if (eq != absl::string_view::npos) {
      const absl::string_view when = absl::StripAsciiWhitespace(item.substr(eq + 1));
      if (when.find('.') != absl::string_view::npos) {
        double p = 0;
        if (!absl::SimpleAtod(when, &p) || !(p > 0.0 && p <= 1.0)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "failpoint ", point.name, ": probability '", when, "' is not in (0, 1]"));
        }
        point.probability = p;
      } else if (!absl::SimpleAtoi(when, &point.nth) || point.nth == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "failpoint ", point.name, ": '", when, "' is not a hit number >= 1"));
      }
    }
    for (const Failpoint& other : *out) {
      if (other.name == point.name) {
        return absl::InvalidArgumentError(
            absl::StrCat("failpoint ", point.name, " is named twice"));
      }
    }
    out->push_back(std::move(point));
  }
  return absl::OkStatus();
}

void WriteStderr(const std::string& line) {
  // One write(2): no allocation or locking in the stream machinery, and the
  // line is whole in the log even though the process dies right after.
  ssize_t unused = write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
}

// Arms from $EVOKE_FAILPOINTS before main().
const bool g_armed_from_env = [] {
  const char* spec = std::getenv("EVOKE_FAILPOINTS");
  if (spec == nullptr || *spec == '\0') return false;
  const char* seed = std::getenv("EVOKE_FAILPOINTS_SEED");
  uint64_t s = 0;
  if (seed == nullptr || !absl::SimpleAtoi(seed, &s)) {
    s = static_cast<uint64_t>(getpid()) * 0x100000001b3ull ^
        static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  }
  g_rng = s;
  absl::Status status = SetFailpoints(spec);
  if (!status.ok()) {
    WriteStderr(absl::StrCat("evoke: EVOKE_FAILPOINTS ignored: ", status.message(), "\n"));
    return false;
  }
  WriteStderr(absl::StrCat("evoke: failpoints armed: ", spec, "\n"));
  return true;
}();

}  // namespace

void Hit(const char* name) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (Failpoint& point : *g_points) {
    if (point.name != name) continue;
    ++point.hits;
    const bool fire = point.probability > 0
                          ? (NextRandom() >> 11) * 0x1.0p-53 < point.probability
                          : point.hits == point.nth;
    if (!fire) return;
    WriteStderr(absl::StrCat("evoke failpoint ", name, " fired (hit ", point.hits, ")\n"));
    // kill, not raise: the whole process, as kill -9 from outside would.
    kill(getpid(), SIGKILL);
    // SIGKILL cannot be caught; nothing below runs.
    _exit(137);
  }
}

}  // namespace failpoint_internal

absl::Status SetFailpoints(absl::string_view spec) {
  using namespace failpoint_internal;  // NOLINT: the internals live there.
  std::vector<Failpoint> points;
  absl::Status status = Parse(spec, &points);
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(g_mu);
  *g_points = std::move(points);
  g_armed.store(!g_points->empty(), std::memory_order_relaxed);
  return absl::OkStatus();
}

uint64_t FailpointHits(absl::string_view name) {
  using namespace failpoint_internal;  // NOLINT
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Failpoint& point : *g_points) {
    if (point.name == name) return point.hits;
  }
  return 0;
}

}  // namespace evoke
