#include "tests/chaos/crash_trial.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/checksum.h"
#include "common/subprocess.h"
#include "evoke/client.h"
#include "testing/blocks.h"
#include "testing/daemon_process.h"
#include "tests/chaos/crash_model.h"

namespace evoke::chaos {
namespace {

constexpr char kNamespace[] = "crash";
constexpr uint32_t kLayers = 4;           // SmallFingerprint: 4 layers, 2 KV heads, 64 dims.
constexpr uint32_t kTokenBytes = 2048;    // f16 K and V over all layers.
constexpr size_t kMaxViolations = 30;     // Described in the report; all are counted.

uint64_t Mix(uint64_t a, uint64_t b) {  // splitmix64 of a combination.
  uint64_t z = a * 0x9e3779b97f4a7c15ull + b + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A small deterministic generator per thread and trial.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return state_ = Mix(state_, 0x5851f42d4c957f2dull); }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
  bool Percent(int p) { return static_cast<int>(Below(100)) < p; }
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// ---------------------------------------------------------------------------
// Blocks: slot s is session block (s % per_thread) of session "c<thread>";
// version v of it has its own token count and bytes.

class Blocks {
 public:
  Blocks(uint64_t seed, int threads, int per_thread, uint32_t max_tokens)
      : seed_(seed), per_thread_(per_thread), max_tokens_(max_tokens),
        fp_(testing::SmallFingerprint(kNamespace)) {
    for (int s = 0; s < threads * per_thread; ++s) {
      ids_.push_back(testing::IdOf(Meta(s, 1)));
    }
  }
  size_t slots() const { return ids_.size(); }
  int per_thread() const { return per_thread_; }
  const BlockId& id(size_t slot) const { return ids_[slot]; }
  const v1::LayoutFingerprint& fingerprint() const { return fp_; }
  std::string Session(size_t slot) const { return absl::StrCat("c", slot / per_thread_); }

  uint32_t Tokens(size_t slot, uint32_t version) const {
    return 1 + static_cast<uint32_t>(Mix(Mix(seed_, slot), version) % max_tokens_);
  }
  v1::BlockMeta Meta(size_t slot, uint32_t version) const {
    const uint64_t seq = slot % per_thread_;
    return testing::SessionMeta(fp_, Session(slot), seq, Tokens(slot, version), 0, kLayers,
                                static_cast<int32_t>(seq * max_tokens_));
  }
  // Random finite f16 values (bit 14 clear: exponent below 31, so no NaN or
  // Inf), so that the daemon's summaries are finite and Recover ranks them.
  std::string Payload(size_t slot, uint32_t version) const {
    std::string out(static_cast<size_t>(Tokens(slot, version)) * kTokenBytes, '\0');
    uint64_t x = Mix(Mix(seed_ ^ 0xabcdef, slot), version) | 1;
    for (size_t i = 0; i + 8 <= out.size(); i += 8) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      const uint64_t v = x & 0xbfffbfffbfffbfffull;
      std::memcpy(&out[i], &v, 8);
    }
    return out;
  }
  // Which version's bytes `payload` is, looking at versions 1..max; nullopt
  // when none (wrong bytes).
  std::optional<uint32_t> VersionOf(size_t slot, const std::string& payload,
                                    uint32_t max) const {
    for (uint32_t v = max; v >= 1; --v) {
      if (payload.size() != static_cast<size_t>(Tokens(slot, v)) * kTokenBytes) continue;
      if (payload == Payload(slot, v)) return v;
    }
    return std::nullopt;
  }

 private:
  uint64_t seed_;
  int per_thread_;
  uint32_t max_tokens_;
  v1::LayoutFingerprint fp_;
  std::vector<BlockId> ids_;
};

// ---------------------------------------------------------------------------
// The daemon: like testing::DaemonProcess, with an environment (for
// EVOKE_FAILPOINTS) and its start timed.

class TrialDaemon {
 public:
  static absl::StatusOr<std::unique_ptr<TrialDaemon>> Start(
      const std::string& dir, const std::vector<std::string>& flags,
      const std::vector<std::string>& env, absl::Duration timeout, double* start_ms,
      double* serving_ms) {
    std::unique_ptr<TrialDaemon> d(new TrialDaemon());
    d->socket_ = dir + "/evoked.sock";
    d->log_path_ = dir + "/evoked.log";
    std::vector<std::string> argv = {testing::EvokedPath(), "--socket", d->socket_,
                                     "--data-dir", dir + "/data"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    {
      std::ofstream(d->log_path_, std::ios::app)
          << "---- start: " << absl::FormatTime(absl::Now()) << " "
          << absl::StrJoin(env, " ") << "\n";
    }
    SpawnOptions options{.argv = argv, .env = env};
    options.stdin_path = "/dev/null";
    options.stdout_path = "/dev/null";
    options.stderr_path = d->log_path_;
    options.stderr_append = true;
    options.death_signal = SIGKILL;  // Spawned from the trial's main thread.
    const absl::Time t0 = absl::Now();
    absl::StatusOr<Subprocess> process = Subprocess::Spawn(options);
    if (!process.ok()) return process.status();
    d->process_ = std::move(process).value();
    std::string exited;
    const bool up = testing::WaitUntil(
        [&] {
          int code = 0;
          absl::StatusOr<bool> gone = d->process_.TryWait(&code);
          if (!gone.ok() || *gone) {
            exited = gone.ok() ? absl::StrCat("exit ", code) : gone.status().ToString();
            return true;
          }
          if (access(d->socket_.c_str(), F_OK) != 0) return false;
          std::unique_ptr<Client> c = d->Connect(absl::Milliseconds(200));
          if (c == nullptr || !c->HealthCheck().ok()) return false;
          absl::StatusOr<v1::StatResponse> stat = c->Stat();
          return stat.ok() && stat->pid() == static_cast<uint32_t>(d->process_.pid());
        },
        timeout, absl::Milliseconds(5));
    *start_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    *serving_ms = d->ServingAfter(t0);
    if (!exited.empty()) {
      return absl::UnavailableError(absl::StrCat("evoked exited during start (", exited,
                                                 "):\n", d->LogTail(4000)));
    }
    if (!up) {
      return absl::UnavailableError(
          absl::StrCat("evoked did not become healthy in time:\n", d->LogTail(4000)));
    }
    return d;
  }
  ~TrialDaemon() { Kill(); }

  std::unique_ptr<Client> Connect(absl::Duration connect_timeout = absl::Seconds(10)) const {
    ClientOptions options;
    options.target = socket_;
    options.connect_timeout = connect_timeout;
    options.call_timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(options);
    return c.ok() ? std::move(c).value() : nullptr;
  }
  // Whether the process has exited (reaped then); its code in *code.
  bool Exited(int* code) {
    if (!process_.running()) return true;
    absl::StatusOr<bool> gone = process_.TryWait(code);
    return !gone.ok() || *gone;
  }
  void Kill() {
    if (process_.running()) process_.Kill().IgnoreError();
  }
  std::string Log() const {
    std::ifstream in(log_path_, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // ServingAfter returns the milliseconds from `spawned` to the daemon's own
  // "serving on" log line of this start (RocksDB open, the index rebuilt
  // from tier 2), free of the trial's polling and scheduling; -1 when the
  // line is missing.
  double ServingAfter(absl::Time spawned) const {
    const std::string log = Log();
    const size_t start = log.rfind("---- start: ");
    const size_t line = log.find(" serving on ", start == std::string::npos ? 0 : start);
    if (line == std::string::npos) return -1;
    const size_t begin = log.rfind('\n', line);
    size_t stamp = begin == std::string::npos ? 0 : begin + 1;
    // Lines are key=value: "ts=<RFC 3339> level=info prog=evoked msg=...".
    if (log.compare(stamp, 3, "ts=") == 0) stamp += 3;
    const size_t space = log.find(' ', stamp);
    absl::Time t;
    std::string err;
    if (!absl::ParseTime(absl::RFC3339_full, log.substr(stamp, space - stamp), &t, &err)) {
      return -1;
    }
    return absl::ToDoubleMilliseconds(t - spawned);
  }
  std::string LogTail(size_t bytes) const {
    const std::string log = Log();
    return log.size() <= bytes ? log : log.substr(log.size() - bytes);
  }

 private:
  TrialDaemon() = default;
  Subprocess process_;
  std::string socket_;
  std::string log_path_;
};

// ---------------------------------------------------------------------------
// Counters shared by the threads of one run.

struct Shared {
  absl::Mutex mu;
  CrashTrialReport* report = nullptr;  // Written under mu while workers run.

  void Violation(const std::string& what) {
    absl::MutexLock lock(&mu);
    if (report->violations.size() < kMaxViolations) report->violations.push_back(what);
  }
  template <typename F>
  void Update(F f) {
    absl::MutexLock lock(&mu);
    f(*report);
  }
};

// A killed daemon closes its connections: calls in flight and later ones
// fail with UNAVAILABLE. `killed` is set before the trial's own SIGKILL, so
// any error after it counts as the kill's.
bool DaemonGone(const absl::Status& s, const std::atomic<bool>& killed) {
  return absl::IsUnavailable(s) || killed.load();
}

// ---------------------------------------------------------------------------
// One client thread's traffic during one trial.

class Worker {
 public:
  Worker(int thread, uint64_t seed, const Blocks& blocks, ExpectedState& model,
         Shared& shared, std::atomic<bool>& stop)
      : thread_(thread), rng_(seed), blocks_(blocks), model_(model), shared_(shared),
        stop_(stop) {}

  void Run(const TrialDaemon& daemon) {
    client_ = daemon.Connect(absl::Seconds(2));
    if (client_ == nullptr) return;  // Killed already.
    while (!stop_.load() && !gone_) {
      const int r = static_cast<int>(rng_.Below(100));
      if (r < 35) {
        Save();
      } else if (r < 62) {
        LoadOwn();
      } else if (r < 75) {
        Delete();
      } else if (r < 79) {
        Flush();
      } else if (r < 87) {
        Recover();
      } else {
        LoadOther();
      }
    }
  }

 private:
  size_t OwnSlot() {
    return static_cast<size_t>(thread_) * blocks_.per_thread() +
           rng_.Below(blocks_.per_thread());
  }
  // A free slot of this thread: no operation in flight, outcome known.
  std::optional<size_t> FreeSlot(bool want_present) {
    for (int tries = 0; tries < 16; ++tries) {
      const size_t s = OwnSlot();
      if (model_.Busy(s)) continue;
      if (want_present && model_.presence(s) == Presence::kAbsent) continue;
      return s;
    }
    return std::nullopt;
  }

  // An error: the daemon went away (stop), or an unexpected answer (counted).
  void Failed(const absl::Status& s, const char* what) {
    if (DaemonGone(s, stop_)) {
      gone_ = true;
      ++in_flight_;
      return;
    }
    shared_.Update([&](CrashTrialReport& r) { ++r.unexpected_errors; });
    shared_.Violation(absl::StrCat("unexpected error (not counted as a violation) from ",
                                   what, ": ", s.ToString()));
  }

  void Acked(const char* kind) {
    shared_.Update([&](CrashTrialReport& r) { ++r.acked[kind]; });
  }

  void Save() {
    const bool durable = rng_.Percent(30);
    const int n = 1 + static_cast<int>(rng_.Below(3));
    std::vector<size_t> slots;
    for (int i = 0; i < n; ++i) {
      std::optional<size_t> s = FreeSlot(false);
      if (s && std::find(slots.begin(), slots.end(), *s) == slots.end()) slots.push_back(*s);
    }
    if (slots.empty()) return;
    std::vector<v1::BlockMeta> metas;
    std::vector<std::string> payloads;
    for (size_t s : slots) {
      const uint32_t v = model_.BeginSave(s, durable);
      metas.push_back(blocks_.Meta(s, v));
      payloads.push_back(blocks_.Payload(s, v));
    }
    std::vector<BlockToSave> batch;
    for (size_t i = 0; i < slots.size(); ++i) batch.emplace_back(metas[i], payloads[i]);
    absl::StatusOr<std::vector<v1::SaveResult>> saved = client_->Save(batch, durable);
    for (size_t s : slots) saved.ok() ? model_.AckSave(s) : model_.FailSave(s);
    if (!saved.ok()) return Failed(saved.status(), "Save");
    Acked(durable ? "save_durable" : "save");
  }

  // Loads `slot` and returns what it observed: nullopt NOT_FOUND, else the
  // version. False when it could not tell (error, wrong bytes: counted).
  bool LoadSlot(size_t slot, std::optional<uint32_t>* observed) {
    absl::StatusOr<std::vector<LoadedBlock>> got =
        client_->Load({blocks_.id(slot)}, blocks_.fingerprint());
    if (absl::IsNotFound(got.status())) {
      observed->reset();
      return true;
    }
    if (absl::IsDataLoss(got.status())) {
      shared_.Update([&](CrashTrialReport& r) { ++r.data_loss_errors; });
      shared_.Violation(absl::StrCat("live DATA_LOSS on ", model_.Describe(slot), ": ",
                                     got.status().ToString()));
      return false;
    }
    if (!got.ok()) {
      Failed(got.status(), "Load");
      return false;
    }
    const LoadedBlock& b = (*got)[0];
    *observed = blocks_.VersionOf(slot, b.payload, model_.max_version(slot));
    const bool checksum_ok = b.meta.checksum() == PayloadChecksum(b.payload.data(),
                                                                   b.payload.size());
    if (!observed->has_value() || !checksum_ok) {
      shared_.Update([&](CrashTrialReport& r) { ++r.wrong_bytes; });
      shared_.Violation(absl::StrCat("WRONG BYTES served live for ", model_.Describe(slot),
                                     " (", b.payload.size(), " bytes, checksum ",
                                     checksum_ok ? "matches" : "differs", ")"));
      return false;
    }
    return true;
  }

  void LoadOwn() {
    std::optional<size_t> slot = FreeSlot(false);
    if (!slot) return;
    std::optional<uint32_t> observed;
    if (!LoadSlot(*slot, &observed)) return;
    const Verdict v = model_.Classify(*slot, model_.AllowedLive(*slot), observed);
    shared_.Update([&](CrashTrialReport& r) {
      ++r.live_loads_checked;
      if (v == Verdict::kLostDurable || v == Verdict::kLostLive) ++r.live_lost;
      if (v == Verdict::kResurrected) ++r.resurrected;
      if (v == Verdict::kPhantom) ++r.phantom;
    });
    if (v != Verdict::kOk) {
      shared_.Violation(absl::StrCat("live Load: ", VerdictName(v), ": ",
                                     model_.Describe(*slot), ", observed ",
                                     observed ? absl::StrCat("v", *observed) : "NOT_FOUND"));
    }
    Acked("load");
  }

  // Another thread's block, which may change meanwhile: only its bytes are
  // checked (they must be one of its versions).
  void LoadOther() {
    const size_t slot = rng_.Below(blocks_.slots());
    std::optional<uint32_t> observed;
    if (!LoadSlot(slot, &observed)) return;
    shared_.Update([&](CrashTrialReport& r) { ++r.cross_loads_checked; });
  }

  void Delete() {
    std::optional<size_t> slot = FreeSlot(true);
    if (!slot) return;
    model_.BeginDelete(*slot);
    const absl::Status s = client_->Delete({blocks_.id(*slot)});
    if (s.ok()) {
      model_.AckDelete(*slot);
      Acked("delete");
      return;
    }
    model_.FailDelete(*slot);
    if (absl::IsNotFound(s)) {
      shared_.Update([&](CrashTrialReport& r) { ++r.live_lost; });
      shared_.Violation(absl::StrCat("Delete: NOT_FOUND for stored ", model_.Describe(*slot)));
      return;
    }
    Failed(s, "Delete");
  }

  void Flush() {
    const bool evict = rng_.Percent(25);
    ExpectedState::FlushTicket ticket = model_.BeginFlush();
    absl::StatusOr<v1::FlushResponse> r = client_->Flush(evict);
    if (!r.ok()) return Failed(r.status(), "Flush");
    const size_t promoted = model_.AckFlush(ticket);
    shared_.Update([&](CrashTrialReport& rep) { rep.flush_promoted += promoted; });
    Acked(evict ? "flush_evict" : "flush");
  }

  // Recover in this thread's session: every block it names must be one
  // that may exist.
  void Recover() {
    const size_t first = static_cast<size_t>(thread_) * blocks_.per_thread();
    v1::RecoverRequest req;
    req.mutable_session()->set_namespace_(kNamespace);
    req.mutable_session()->set_session_id(blocks_.Session(first));
    req.set_kind(v1::SUMMARY_MEAN_KEYS);
    req.set_layer(kLayers / 2);  // The daemon summarizes the middle layer.
    req.set_n_query_heads(2);
    for (int i = 0; i < 2 * 64; ++i) req.add_queries(static_cast<float>(rng_.Unit() - 0.5));
    req.set_k(8);
    absl::StatusOr<v1::RecoverResponse> r = client_->Recover(req);
    // NOT_FOUND: no block of the session has a summary (none stored now).
    if (absl::IsNotFound(r.status())) r = v1::RecoverResponse();
    if (!r.ok()) return Failed(r.status(), "Recover");
    for (const v1::RecoveredBlock& b : r->blocks()) {
      std::optional<size_t> slot;
      for (size_t s = first; s < first + blocks_.per_thread(); ++s) {
        if (blocks_.id(s).ToBytes() == b.id()) slot = s;
      }
      bool ok = slot.has_value();
      if (ok) {
        const Allowed a = model_.AllowedLive(*slot);
        ok = !a.versions.empty();  // Something may be stored there.
      }
      if (!ok) {
        shared_.Update([&](CrashTrialReport& rep) { ++rep.phantom; });
        shared_.Violation(absl::StrCat("Recover named a block that cannot exist: ",
                                       slot ? model_.Describe(*slot) : "not of this session"));
      }
    }
    shared_.Update([&](CrashTrialReport& rep) { ++rep.recovers_checked; });
    Acked("recover");
  }

 public:
  int in_flight() const { return in_flight_; }

 private:
  const int thread_;
  Rng rng_;
  const Blocks& blocks_;
  ExpectedState& model_;
  Shared& shared_;
  std::atomic<bool>& stop_;
  std::unique_ptr<Client> client_;
  bool gone_ = false;
  int in_flight_ = 0;
};

// ---------------------------------------------------------------------------

// After a restart: Load every slot, check it against the model, and make
// what was seen the model's state.
void Verify(TrialDaemon& daemon, const Blocks& blocks, ExpectedState& model, bool crashed,
            Shared& shared, const std::string& when) {
  std::unique_ptr<Client> client = daemon.Connect();
  if (client == nullptr) {
    shared.Update([](CrashTrialReport& r) { ++r.restarts_failed; });
    shared.Violation(absl::StrCat(when, ": cannot connect to verify"));
    return;
  }
  for (size_t slot = 0; slot < blocks.slots(); ++slot) {
    const Allowed allowed = crashed ? model.AllowedAfterCrash(slot) : model.AllowedLive(slot);
    const bool was_volatile = model.presence(slot) == Presence::kVolatile;
    const bool was_pending = model.Busy(slot);
    const Presence before = model.presence(slot);
    absl::StatusOr<std::vector<LoadedBlock>> got =
        client->Load({blocks.id(slot)}, blocks.fingerprint());
    std::optional<uint32_t> observed;
    bool wrong = false;
    if (got.ok()) {
      const LoadedBlock& b = (*got)[0];
      observed = blocks.VersionOf(slot, b.payload, model.max_version(slot));
      wrong = !observed.has_value() ||
              b.meta.checksum() != PayloadChecksum(b.payload.data(), b.payload.size());
    } else if (absl::IsDataLoss(got.status())) {
      shared.Update([](CrashTrialReport& r) { ++r.data_loss_errors; });
      shared.Violation(absl::StrCat(when, ": DATA_LOSS for ", model.Describe(slot)));
    } else if (!absl::IsNotFound(got.status())) {
      shared.Update([](CrashTrialReport& r) { ++r.restarts_failed; });
      shared.Violation(absl::StrCat(when, ": Load failed: ", got.status().ToString()));
      return;
    }
    const Verdict v = wrong ? Verdict::kOk : model.Classify(slot, allowed, observed);
    shared.Update([&](CrashTrialReport& r) {
      ++r.blocks_checked;
      if (wrong) ++r.wrong_bytes;
      if (v == Verdict::kLostDurable) ++r.durable_lost;
      if (v == Verdict::kLostLive) ++r.live_lost;
      if (v == Verdict::kResurrected) ++r.resurrected;
      if (v == Verdict::kPhantom) ++r.phantom;
      if (crashed && !wrong && v == Verdict::kOk && !was_pending && was_volatile) {
        observed ? ++r.volatile_kept : ++r.volatile_lost;
      }
      if (crashed && was_pending && !wrong && v == Verdict::kOk) {
        // The unacknowledged operation took effect when the state moved.
        const bool applied = (before == Presence::kAbsent) == observed.has_value();
        if (applied) ++r.in_flight_applied;
      }
    });
    if (wrong || v != Verdict::kOk) {
      shared.Violation(absl::StrCat(when, ": ", wrong ? "WRONG BYTES" : VerdictName(v), ": ",
                                    model.Describe(slot), ", observed ",
                                    observed ? absl::StrCat("v", *observed) : "NOT_FOUND"));
    }
    model.Resolve(slot, wrong ? std::nullopt : observed);
  }
  absl::StatusOr<v1::StatResponse> stat = client->Stat();
  if (stat.ok()) {
    shared.Update([&](CrashTrialReport& r) {
      r.checksum_failures += stat->counters().checksum_failures();
      r.invalid_records += stat->counters().invalid_records();
    });
  }
}

// The failpoint kills at hit N, N uniform in [1, MaxHitFor(name)]: below
// what the traffic reaches in a short window (4 threads make ~40 operations
// a second on a busy 2-core machine: ~14 saves, ~5 deletes, ~1.6 flushes).
uint64_t MaxHitFor(const std::string& name) {
  if (name.rfind("flush.", 0) == 0) return 2;
  if (name.rfind("spill.", 0) == 0) return 20;
  if (name.rfind("delete.", 0) == 0) return 10;
  if (name.rfind("save.durable", 0) == 0) return 10;
  return 30;
}

}  // namespace

const std::vector<std::string>& KnownFailpoints() {
  static const std::vector<std::string>* names = new std::vector<std::string>{
      "save.copied",          "save.before_ack",    "save.durable.synced",
      "spill.before_put",     "spill.after_put",    "spill.after_mark",
      "delete.before_disk",   "delete.after_disk",  "delete.after_index",
      "flush.after_writeback", "flush.after_persist",
      "segment.synced",       "compaction.committed",
  };
  return *names;
}

std::vector<std::string> FailpointsIn(const std::string& binary,
                                      const std::vector<std::string>& candidates) {
  std::ifstream in(binary, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  const std::string bytes = s.str();
  std::vector<std::string> out;
  for (const std::string& name : candidates) {
    // The literal as the compiler stores it: NUL-terminated.
    const std::string needle = name + std::string(1, '\0');
    if (bytes.find(needle) != std::string::npos) out.push_back(name);
  }
  return out;
}

double CrashTrialReport::Percentile(const std::vector<double>& ms, double p) {
  if (ms.empty()) return 0;
  std::vector<double> v = ms;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(p * v.size())) - 1);
  return v[p <= 0 ? 0 : i];
}

std::string CrashTrialReport::Summary() const {
  std::string out = absl::StrCat(
      "seed ", seed, ": ", trials, " trials, ", random_kills, " random kills");
  for (const auto& [name, c] : failpoints) {
    absl::StrAppend(&out, "\n  failpoint ", name, ": fired ", c.fired, ", not reached ",
                    c.not_reached);
  }
  absl::StrAppend(&out, "\n  checked: ", blocks_checked, " blocks after restarts, ",
                  live_loads_checked, " live loads, ", cross_loads_checked,
                  " cross-thread loads, ", recovers_checked, " recovers");
  absl::StrAppend(&out, "\n  violations: wrong bytes ", wrong_bytes, ", durable lost ",
                  durable_lost, ", live lost ", live_lost, ", resurrected ", resurrected,
                  ", phantom ", phantom, ", DATA_LOSS ", data_loss_errors,
                  ", restarts failed ", restarts_failed, ", checksum failures ",
                  checksum_failures);
  absl::StrAppend(&out, "\n  allowed: volatile lost ", volatile_lost, ", volatile kept ",
                  volatile_kept, ", in flight at kill ", in_flight_at_kill, " (applied ",
                  in_flight_applied, "), flush-promoted ", flush_promoted,
                  ", invalid records ", invalid_records, ", unexpected errors ",
                  unexpected_errors);
  std::vector<std::string> acks;
  for (const auto& [k, n] : acked) acks.push_back(absl::StrCat(k, " ", n));
  absl::StrAppend(&out, "\n  acknowledged: ", absl::StrJoin(acks, ", "));
  absl::StrAppend(&out, "\n  recovery (spawn to evoked's 'serving' line) ms: p50 ",
                  Percentile(recovery_ms, 0.5), ", p99 ", Percentile(recovery_ms, 0.99),
                  ", max ", Percentile(recovery_ms, 1.0), " over ", recovery_ms.size(),
                  " restarts");
  absl::StrAppend(&out, "\n  ready (spawn to a client's health check and Stat) ms: p50 ",
                  Percentile(ready_ms, 0.5), ", p99 ", Percentile(ready_ms, 0.99), ", max ",
                  Percentile(ready_ms, 1.0));
  for (const std::string& v : violations) absl::StrAppend(&out, "\n  ! ", v);
  return out;
}

absl::StatusOr<CrashTrialReport> RunCrashTrials(const CrashTrialOptions& o) {
  CrashTrialReport report;
  report.seed = o.seed;
  Shared shared;
  shared.report = &report;
  const Blocks blocks(o.seed, o.client_threads, o.slots_per_thread, o.max_tokens);
  ExpectedState model(blocks.slots());
  // Tier 1 is small so that blocks spill all the time; the spill budget is
  // never reached (past it evoked drops payloads on purpose).
  std::vector<std::string> flags = {"--pinned-bytes", "8MiB",         "--spill-bytes",
                                    "64GiB",          "--worker-threads", "4",
                                    "--copy-threads", "1",            "--spill-batch-bytes",
                                    "1MiB",           "--lock-memory", "false"};
  flags.insert(flags.end(), o.extra_flags.begin(), o.extra_flags.end());

  // The plan: random kills first, then each failpoint in turn.
  struct Plan {
    std::string failpoint;  // Empty: a random kill.
  };
  std::vector<Plan> plans(o.random_kills);
  for (const std::string& f : o.failpoints) {
    for (int i = 0; i < o.trials_per_failpoint; ++i) plans.push_back({f});
  }

  Rng plan_rng(Mix(o.seed, 0x7a11));
  bool crashed = false;
  for (size_t t = 0; t < plans.size(); ++t) {
    const Plan& plan = plans[t];
    std::vector<std::string> env;
    uint64_t nth = 0;
    if (!plan.failpoint.empty()) {
      nth = 1 + plan_rng.Below(MaxHitFor(plan.failpoint));
      env.push_back(absl::StrCat("EVOKE_FAILPOINTS=", plan.failpoint, "=", nth));
    }
    const absl::Duration traffic =
        o.min_traffic + (o.max_traffic - o.min_traffic) * plan_rng.Unit();
    double start_ms = 0, serving_ms = 0;
    absl::StatusOr<std::unique_ptr<TrialDaemon>> daemon =
        TrialDaemon::Start(o.dir, flags, env, absl::Seconds(60), &start_ms, &serving_ms);
    if (!daemon.ok()) {
      if (t == 0) return daemon.status();
      ++report.restarts_failed;
      shared.Violation(absl::StrCat("trial ", t, ": restart failed: ",
                                    daemon.status().ToString()));
      // Try once more without failpoints, so that the rest can go on.
      daemon = TrialDaemon::Start(o.dir, flags, {}, absl::Seconds(60), &start_ms, &serving_ms);
      if (!daemon.ok()) return report;
    }
    if (t > 0) {
      report.ready_ms.push_back(start_ms);
      if (serving_ms >= 0) report.recovery_ms.push_back(serving_ms);
    }
    Verify(**daemon, blocks, model, crashed, shared, absl::StrCat("trial ", t, " start"));

    std::atomic<bool> stop{false};
    std::vector<std::unique_ptr<Worker>> workers;
    std::vector<std::thread> threads;
    for (int w = 0; w < o.client_threads; ++w) {
      workers.push_back(std::make_unique<Worker>(w, Mix(Mix(o.seed, t), w), blocks, model,
                                                 shared, stop));
    }
    for (auto& w : workers) threads.emplace_back([&, wp = w.get()] { wp->Run(**daemon); });

    std::string how;
    bool fired = false, died_alone = false;
    int code = 0;
    if (plan.failpoint.empty()) {
      absl::SleepFor(traffic);
      stop.store(true);  // Before the kill: every error from now on is the kill's.
      (*daemon)->Kill();
      how = absl::StrCat("SIGKILL after ", absl::FormatDuration(traffic));
    } else {
      const bool died = testing::WaitUntil([&] { return (*daemon)->Exited(&code); },
                                           o.failpoint_window, absl::Milliseconds(5));
      stop.store(true);
      const std::string marker = absl::StrCat("evoke failpoint ", plan.failpoint, " fired");
      fired = died && code == -SIGKILL && (*daemon)->Log().find(marker) != std::string::npos;
      died_alone = died && !fired;
      if (!fired) (*daemon)->Kill();
      how = absl::StrCat("failpoint ", plan.failpoint, "=", nth,
                         fired ? "" : " not reached; SIGKILL");
    }
    for (std::thread& th : threads) th.join();
    if (plan.failpoint.empty()) {
      ++report.random_kills;
    } else {
      FailpointCount& c = report.failpoints[plan.failpoint];
      fired ? ++c.fired : ++c.not_reached;
    }
    if (died_alone) {
      ++report.restarts_failed;
      shared.Violation(absl::StrCat("trial ", t, ": evoked died by itself (", code,
                                    ") without its failpoint firing:\n",
                                    (*daemon)->LogTail(3000)));
    }
    for (auto& w : workers) report.in_flight_at_kill += w->in_flight();
    crashed = true;
    ++report.trials;
    if (o.verbose) {
      absl::MutexLock lock(&shared.mu);
      fprintf(stderr,
              "crash trial %zu/%zu: %s; restart serving after %.0f ms (ready to the client "
              "after %.0f ms); violations so far %llu\n",
              t + 1, plans.size(), how.c_str(), serving_ms, start_ms,
              static_cast<unsigned long long>(report.Violations()));
    }
  }
  // The last kill's restart and check.
  double start_ms = 0, serving_ms = 0;
  absl::StatusOr<std::unique_ptr<TrialDaemon>> daemon =
      TrialDaemon::Start(o.dir, flags, {}, absl::Seconds(60), &start_ms, &serving_ms);
  if (!daemon.ok()) {
    ++report.restarts_failed;
    shared.Violation(absl::StrCat("final restart failed: ", daemon.status().ToString()));
    return report;
  }
  report.ready_ms.push_back(start_ms);
  if (serving_ms >= 0) report.recovery_ms.push_back(serving_ms);
  Verify(**daemon, blocks, model, crashed, shared, "final");
  return report;
}

}  // namespace evoke::chaos
