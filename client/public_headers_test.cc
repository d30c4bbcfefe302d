// The client's public headers (include/evoke/, installed as
// <evoke/...>) stand alone, and the ones that restate declarations of the
// library's internal headers restate them exactly.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"

// The internal headers first, then the public ones: a public declaration
// that differed from the library's would be a second overload (or, for a
// class, a second definition) here.
#include "common/chain_hash.h"
#include "common/fingerprint.h"
#include "common/hash128.h"
#include "common/summaries.h"
#include "gpu/repr_keys.h"
#include "evoke/block_file.h"
#include "evoke/chain_hash.h"
#include "evoke/client.h"
#include "evoke/evoke.h"
#include "evoke/evoke_policy.h"
#include "evoke/fingerprint.h"
#include "evoke/hash128.h"
#include "evoke/summaries.h"
#include "evoke/version.h"

namespace evoke {
namespace {

namespace fs = std::filesystem;

// Taking the address of an overloaded name without a target type does not
// compile: each function <evoke/summaries.h> declares is the library's one.
[[maybe_unused]] constexpr auto kUnrotatedKeys = &UnrotatedKeys;
[[maybe_unused]] constexpr auto kDefaultSummaryLayer = &DefaultSummaryLayer;
[[maybe_unused]] constexpr auto kMeanKeysSummary = &MeanKeysSummary;
[[maybe_unused]] constexpr auto kReprKeysSummary = &ReprKeysSummary;
[[maybe_unused]] constexpr auto kTopTokensPerHead = &TopTokensPerHead;
[[maybe_unused]] constexpr auto kReprKeysSummaryOnDevice = &ReprKeysSummaryOnDevice;

const fs::path kSourceDir = EVOKE_SOURCE_DIR;
const fs::path kPublicDir = kSourceDir / "include" / "evoke";

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<fs::path> PublicHeaders() {
  std::vector<fs::path> headers;
  for (const fs::directory_entry& e : fs::directory_iterator(kPublicDir)) {
    if (e.path().extension() == ".h") headers.push_back(e.path());
  }
  std::sort(headers.begin(), headers.end());
  return headers;
}

// The code of a header: lines without // comments, trimmed, blank lines
// dropped, includes of common/X.h spelled evoke/X.h.
std::vector<std::string> CodeLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t comment = line.find("//");
    if (comment != std::string::npos) line.resize(comment);
    std::string code(absl::StripAsciiWhitespace(line));
    if (code.empty()) continue;
    if (absl::StartsWith(code, "#include \"common/")) {
      code = "#include \"evoke/" + code.substr(std::string("#include \"common/").size());
    }
    lines.push_back(code);
  }
  return lines;
}

TEST(PublicHeaders, IncludeNothingInternal) {
  // A public header may include the standard library, Abseil and evoke/...
  // (itself, the generated version.h and the generated evoke/v1/*.pb.h).
  const std::regex include_re(R"re(^\s*#\s*include\s*[<"]([^>"]+)[>"])re");
  const std::vector<fs::path> headers = PublicHeaders();
  ASSERT_GE(headers.size(), 8u);
  for (const fs::path& header : headers) {
    std::istringstream in(ReadFile(header));
    std::string line;
    while (std::getline(in, line)) {
      std::smatch m;
      if (!std::regex_search(line, m, include_re)) continue;
      const std::string included = m[1];
      const bool standard = included.find('/') == std::string::npos;
      EXPECT_TRUE(standard || absl::StartsWith(included, "absl/") ||
                  absl::StartsWith(included, "evoke/"))
          << header.filename() << " includes " << included;
      if (absl::StartsWith(included, "evoke/") && !absl::StartsWith(included, "evoke/v1/") &&
          included != "evoke/version.h") {
        EXPECT_TRUE(fs::exists(kPublicDir / fs::path(included).filename()))
            << header.filename() << " includes " << included << ", not a public header";
      }
    }
  }
}

TEST(PublicHeaders, CommonForwardsToThePublicHeader) {
  // common/ keeps no second copy of these declarations: its header of the
  // same name includes the public one and declares nothing itself.
  for (const char* name : {"hash128.h", "chain_hash.h", "fingerprint.h"}) {
    SCOPED_TRACE(name);
    const std::string internal = ReadFile(kSourceDir / "common" / name);
    EXPECT_TRUE(absl::StrContains(internal, absl::StrCat("#include \"evoke/", name, "\"")));
    for (const std::string& line : CodeLines(internal)) {
      EXPECT_TRUE(absl::StartsWith(line, "#")) << "common/" << name << " declares: " << line;
    }
  }
}

TEST(PublicHeaders, TwinsWork) {
  // The id helpers reached through <evoke/client.h> are the library's.
  const v1::LayoutFingerprint fp = MakeFingerprint("ns", "model", CacheShape{});
  const v1::BlockMeta meta = SessionBlockMeta(fp, "s", 7, 16, 0, 1, 0);
  EXPECT_EQ(BlockIdOf(meta), SessionBlockId("ns", "s", 7));
  EXPECT_EQ(Hash128::FromHex(BlockIdOf(meta).ToHex()).value(), BlockIdOf(meta));
}

TEST(PublicHeaders, VersionIsTheProjects) {
  EXPECT_STREQ(EVOKE_VERSION_STRING, EVOKE_PROJECT_VERSION);
  EXPECT_EQ(std::to_string(EVOKE_VERSION_MAJOR) + "." + std::to_string(EVOKE_VERSION_MINOR) +
                "." + std::to_string(EVOKE_VERSION_PATCH),
            EVOKE_PROJECT_VERSION);
}

}  // namespace
}  // namespace evoke
