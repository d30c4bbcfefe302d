// fuzz_bearer_token: how a TCP call is identified (daemon/tcp_auth.h): the
// token file a principal's token is read from, the call's metadata, the
// "Bearer <token>" parser and BearerTokenProcessor, which gRPC runs on every
// TCP call before any handler.
//
// Input (FuzzedDataProvider): the bytes of principal "b"'s token file, then
// up to 8 metadata entries, each a key (authorization, another one, or
// bytes) and a value: bytes, or "<scheme> <token> <suffix>" around a real
// token (a's fixed one, or b's as read), so that the fuzzer reaches both
// sides of the comparison.
//
// Checked:
//   - a token file the policy accepts yields b's token: its first line
//     without surrounding white space, at least 16 characters, with no white
//     space or control byte (a token no call could present is refused at
//     start); a file it refuses is refused with a message that does not
//     contain the token (checked for tokens with a non-ASCII byte);
//   - BearerToken returns a non-empty view inside the value, after a
//     case-insensitive "bearer ", with no white space or control byte;
//   - TokenCaller accepts a call exactly when it has one authorization
//     entry whose bearer token is a's or b's, and answers with that
//     principal; every refusal is UNAUTHENTICATED and its message (and the
//     processor's) never contains either token.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/access_policy.h"
#include "daemon/tcp_auth.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/stubs/logging.h"

namespace evoke {
namespace {

constexpr absl::string_view kTokenA = "tok-a-4f1d8e2b7c9a0d35e6b1";
std::string g_dir;

bool Clean(absl::string_view t) {
  if (t.empty()) return false;
  for (char c : t) {
    const auto u = static_cast<unsigned char>(c);
    if (absl::ascii_isspace(u) || absl::ascii_iscntrl(u)) return false;
  }
  return true;
}

void Run(FuzzedDataProvider& in) {
  const std::string file_b = in.ConsumeRandomLengthString(5000);
  const std::string path_a = g_dir + "/a.token", path_b = g_dir + "/b.token";
  std::ofstream(path_b, std::ios::binary | std::ios::trunc) << file_b;
  const std::string text = absl::StrCat(
      "principals { name: \"a\" token_file: \"", path_a, "\" namespaces: \"na\" }\n",
      "principals { name: \"b\" token_file: \"", path_b, "\" namespaces: \"nb\" }\n");
  absl::StatusOr<AccessPolicy> policy = AccessPolicy::Parse(text, "fuzz");
  // The token is the file's first line, without surrounding white space.
  const std::string stripped(
      absl::StripAsciiWhitespace(absl::string_view(file_b).substr(0, file_b.find('\n'))));
  if (!policy.ok()) {
    // Checked for tokens with a byte past ASCII, which no message template
    // or path here holds (the fuzzer copies the templates' own words).
    const bool marked = std::any_of(stripped.begin(), stripped.end(),
                                    [](char ch) { return static_cast<unsigned char>(ch) >= 0x80; });
    FUZZ_CHECK(!marked || stripped.size() < 8 ||
               !absl::StrContains(policy.status().message(), stripped));
    return;
  }
  // Accepted: a token a call can present ("Bearer <token>" allows no white
  // space or control byte in it), of at least 16 characters.
  FUZZ_CHECK(Clean(stripped) && stripped.size() >= 16);
  FUZZ_CHECK(stripped != kTokenA);
  absl::StatusOr<std::shared_ptr<const Caller>> b = policy->ForToken(stripped);
  FUZZ_CHECK(b.ok() && (*b)->name() == "b (token)");
  const std::string token_b = stripped;

  std::vector<std::pair<std::string, std::string>> entries;
  const size_t n = in.ConsumeIntegralInRange<size_t>(0, 8);
  for (size_t i = 0; i < n && in.remaining_bytes() > 0; ++i) {
    std::string key;
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: case 1: key = "authorization"; break;
      case 2: key = "x-other"; break;
      default: key = in.ConsumeRandomLengthString(16); break;
    }
    std::string value;
    if (in.ConsumeBool()) {
      value = in.ConsumeRandomLengthString(64);
    } else {
      const std::string scheme = in.ConsumeRandomLengthString(10);
      const std::string sep = in.ConsumeRandomLengthString(3);
      const std::string suffix = in.ConsumeRandomLengthString(6);
      value = absl::StrCat(scheme, sep, in.ConsumeBool() ? kTokenA : token_b, suffix);
    }
    entries.emplace_back(std::move(key), std::move(value));
  }
  std::multimap<grpc::string_ref, grpc::string_ref> metadata;
  size_t auth_entries = 0;
  const std::string* auth_value = nullptr;
  for (const auto& [k, v] : entries) {
    metadata.emplace(grpc::string_ref(k.data(), k.size()), grpc::string_ref(v.data(), v.size()));
    if (k == "authorization") {
      ++auth_entries;
      auth_value = &v;
    }
  }
  for (const auto& [k, v] : entries) {
    const std::optional<absl::string_view> t = BearerToken(v);
    if (!t.has_value()) continue;
    FUZZ_CHECK(Clean(*t));
    FUZZ_CHECK(t->data() >= v.data() + 7 && t->data() + t->size() <= v.data() + v.size());
    FUZZ_CHECK(absl::EqualsIgnoreCase(absl::string_view(v).substr(0, 7), "bearer "));
  }

  absl::StatusOr<std::shared_ptr<const Caller>> caller = TokenCaller(metadata, *policy);
  std::optional<absl::string_view> token;
  if (auth_entries == 1) token = BearerToken(*auth_value);
  const bool known = token.has_value() && (*token == kTokenA || *token == token_b);
  FUZZ_CHECK(caller.ok() == known);
  if (caller.ok()) {
    FUZZ_CHECK((*caller)->name() == (*token == kTokenA ? "a (token)" : "b (token)"));
  } else {
    FUZZ_CHECK(caller.status().code() == absl::StatusCode::kUnauthenticated);
    FUZZ_CHECK(!absl::StrContains(caller.status().message(), kTokenA));
    FUZZ_CHECK(!absl::StrContains(caller.status().message(), token_b));
  }
  BearerTokenProcessor processor(&*policy);
  grpc::AuthMetadataProcessor::OutputMetadata consumed, response;
  const grpc::Status s = processor.Process(metadata, nullptr, &consumed, &response);
  FUZZ_CHECK(s.ok() == known);
  FUZZ_CHECK(processor.refused() == (known ? 0u : 1u));
  FUZZ_CHECK(!absl::StrContains(s.error_message(), kTokenA));
  FUZZ_CHECK(!absl::StrContains(s.error_message(), token_b));
}

}  // namespace
}  // namespace evoke

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  char tmpl[] = "/tmp/fuzz_bearer_token.XXXXXX";
  FUZZ_CHECK(::mkdtemp(tmpl) != nullptr);
  evoke::g_dir = tmpl;
  std::ofstream(evoke::g_dir + "/a.token") << evoke::kTokenA << "\n";
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  evoke::Run(in);
  return 0;
}
