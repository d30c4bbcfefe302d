// fuzz_daemon_flags: evoked's command line and config file
// (daemon/daemon_flags.h) from arbitrary bytes.
//
// Input (FuzzedDataProvider): a flag byte, a config file (used with
// `--config FILE` when bit 0 of the flag byte is set), then argv: the rest of
// the input split at '\0' bytes. ParseDaemonFlags must never crash; options
// it accepts must pass DaemonOptions::Validate(), and (when bit 1 is set, or
// always with EVOKE_FUZZ_ROUNDTRIP=1 in the environment) their
// --print-config rendering must read back to the same options, as
// daemon_flags.h promises.
//
// Files: one temp file per process under $TMPDIR (overwritten each run).
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/daemon_flags.h"
#include "daemon/daemon_options.h"
#include "fuzz/fuzz_check.h"

namespace evoke {
namespace {

const std::string& ConfigPath() {
  static const std::string path = [] {
    const char* tmp = getenv("TMPDIR");
    return absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                        "/evoke-fuzz-flags-", getpid(), ".conf");
  }();
  return path;
}

void WriteConfig(const std::string& text) {
  std::ofstream out(ConfigPath(), std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

absl::Status Parse(const std::vector<std::string>& args, DaemonOptions* options,
                   std::string* output, bool* exit_now) {
  std::vector<const char*> argv;
  argv.push_back("evoked");
  for (const std::string& a : args) argv.push_back(a.c_str());
  return ParseDaemonFlags(static_cast<int>(argv.size()), argv.data(), options, output,
                          exit_now);
}

bool RoundTripAlways() {
  static const bool always = [] {
    const char* v = getenv("EVOKE_FUZZ_ROUNDTRIP");
    return v != nullptr && std::string(v) == "1";
  }();
  return always;
}

void Run(FuzzedDataProvider& in) {
  const uint8_t flags = in.ConsumeIntegral<uint8_t>();
  const std::string config = in.ConsumeRandomLengthString(4096);
  std::vector<std::string> args;
  if (flags & 1) {
    WriteConfig(config);
    args.push_back("--config");
    args.push_back(ConfigPath());
  }
  // argv strings cannot hold '\0': split there.
  const std::string rest = in.ConsumeRemainingBytesAsString();
  size_t start = 0;
  while (start <= rest.size() && args.size() < 64) {
    const size_t end = rest.find('\0', start);
    args.push_back(rest.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }

  DaemonOptions options;
  std::string output;
  bool exit_now = false;
  if (!Parse(args, &options, &output, &exit_now).ok() || exit_now) return;
  FUZZ_CHECK(options.Validate().ok());
  (void)options.server.ResolvedWorkerThreads();
  (void)options.ResolvedFdSocket();

  if (!(flags & 2) && !RoundTripAlways()) return;
  const std::string printed = OptionsToConfig(options);
  WriteConfig(printed);
  DaemonOptions back;
  bool back_exit = false;
  const absl::Status reread = Parse({"--config", ConfigPath()}, &back, &output, &back_exit);
  if (!reread.ok()) {
    fprintf(stderr, "--print-config output does not read back: %s\n---\n%s---\n",
            std::string(reread.message()).c_str(), printed.c_str());
  }
  FUZZ_CHECK(reread.ok());
  const std::string again = OptionsToConfig(back);
  if (again != printed) {
    fprintf(stderr, "--print-config output reads back differently:\n%s---\n%s---\n",
            printed.c_str(), again.c_str());
  }
  FUZZ_CHECK(again == printed);
}

}  // namespace
}  // namespace evoke

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;
  FuzzedDataProvider in(data, size);
  evoke::Run(in);
  return 0;
}
