// evokectl: inspect, verify and manage the blocks stored by evoked, and
// watch it (`evokectl top`).
//
//   evokectl [--socket PATH] [--json] [--progress MODE] COMMAND ...
//
// The socket comes from --socket, else $EVOKE_SOCKET, else ./evoked.sock.
// Errors print one line on stderr; the exit status says what kind of error
// it was (tools/evokectl/exit_codes.h, docs/EVOKECTL.md).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tools/evokectl/exit_codes.h"
#include "tools/evokectl/print.h"
#include "tools/evokectl/recover.h"
#include "tools/evokectl/watch.h"
#include "tools/evokectl/progress.h"
#include "tools/evokectl/socket_probe.h"
#include "tools/evokectl/top.h"
#include "common/byte_size.h"
#include "common/checksum.h"
#include "common/fingerprint.h"
#include "evoke/block_file.h"
#include "evoke/client.h"

namespace evoke {
namespace {

using ctl::ExitCodeFor;
using ctl::Layers;
using ctl::PrintBlock;
using ctl::PrintJson;
using ctl::PrintQuota;
using ctl::PrintStat;
using ctl::Progress;
using ctl::StartupLosses;
using ctl::TierName;
using ctl::ToJson;

// Fails the command: printed as one line; the exit status follows the
// status code (ctl::ExitCodeFor).
struct CommandError {
  absl::Status status;
};
// A command line that parses but makes no sense (a malformed id, a flag
// that needs another): exit status 2, as CLI11's own usage errors.
struct UsageError {
  std::string message;
};

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) throw CommandError{v.status()};
  return std::move(v).value();
}
void Check(const absl::Status& s) {
  if (!s.ok()) throw CommandError{s};
}

BlockId ParseId(const std::string& hex) {
  absl::StatusOr<BlockId> id = BlockId::FromHex(hex);
  if (!id.ok()) throw UsageError{absl::StrCat("block id '", hex, "': ", id.status().message())};
  return *id;
}

// Rewrites proto-JSON bytes fields that hold ids (base64) as hex, so that
// ids in --json output can be pasted into other commands.
// Batches of Load and Save while streaming: small enough that neither side
// holds much (never a whole namespace), large enough to amortize a call.
constexpr size_t kBatchBlocks = 128;
constexpr uint64_t kBatchBytes = 16ull << 20;

struct ExportCounts {
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  uint64_t breadcrumbs = 0;  // Listed without bytes: nothing to export.
  uint64_t vanished = 0;     // Deleted between List and Load.
};

// ExportStream writes every block of `ns` (of `session` when set) to a block
// stream: List page by page, Load each page in batches of one fingerprint,
// append each block as it comes.
ExportCounts ExportStream(Client& client, const std::string& ns, const std::string& session,
                          const std::string& out, bool progress) {
  uint64_t total = 0;
  if (session.empty()) {
    if (absl::StatusOr<v1::StatResponse> s = client.Stat(); s.ok()) {
      for (const v1::NamespaceStat& n : s->namespaces()) {
        if (n.name() == ns) total = n.blocks();
      }
    }
  }
  std::unique_ptr<BlockStreamWriter> writer = Check(BlockStreamWriter::Create(out));
  Progress bar("export", total, "blocks", progress);
  ExportCounts counts;
  auto append = [&](const v1::BlockInfo& info, LoadedBlock& loaded) {
    // The listed metadata is the stored one (Load leaves out summaries); the
    // loaded one wins if the block changed in between.
    const v1::BlockMeta& meta =
        info.meta().checksum() == loaded.meta.checksum() &&
                info.meta().payload_bytes() == loaded.payload.size()
            ? info.meta()
            : loaded.meta;
    Check(writer->Append(meta, loaded.payload));
    ++counts.blocks;
    counts.bytes += loaded.payload.size();
    bar.Add(1);
  };
  auto load_batch = [&](const std::vector<const v1::BlockInfo*>& batch) {
    if (batch.empty()) return;
    std::vector<BlockId> ids;
    for (const v1::BlockInfo* b : batch) ids.push_back(BlockIdOf(b->meta()));
    const v1::LayoutFingerprint& fp = batch[0]->meta().fingerprint();
    absl::StatusOr<std::vector<LoadedBlock>> loaded = client.Load(ids, fp);
    if (loaded.ok()) {
      for (size_t i = 0; i < batch.size(); ++i) append(*batch[i], (*loaded)[i]);
      return;
    }
    if (loaded.status().code() != absl::StatusCode::kNotFound) Check(loaded.status());
    // One of them went away since it was listed: the others one by one.
    for (size_t i = 0; i < batch.size(); ++i) {
      absl::StatusOr<std::vector<LoadedBlock>> one = client.Load({&ids[i], 1}, fp);
      if (!one.ok() && one.status().code() == absl::StatusCode::kNotFound) {
        ++counts.vanished;
        bar.Add(1);
        continue;
      }
      append(*batch[i], Check(std::move(one))[0]);
    }
  };
  v1::ListRequest request;
  request.set_namespace_(ns);
  request.set_session_id(session);
  request.set_page_size(256);
  for (;;) {
    const v1::ListResponse page = Check(client.List(request));
    std::vector<const v1::BlockInfo*> batch;
    std::string batch_fp;
    uint64_t batch_bytes = 0;
    for (const v1::BlockInfo& b : page.blocks()) {
      if (!b.bytes_available()) {
        ++counts.breadcrumbs;
        bar.Add(1);
        continue;
      }
      const std::string fp = DigestFingerprint(b.meta().fingerprint()).ToHex();
      if (!batch.empty() && (fp != batch_fp || batch.size() >= kBatchBlocks ||
                             batch_bytes + b.meta().payload_bytes() > kBatchBytes)) {
        load_batch(batch);
        batch.clear();
        batch_bytes = 0;
      }
      batch_fp = fp;
      batch.push_back(&b);
      batch_bytes += b.meta().payload_bytes();
    }
    load_batch(batch);
    if (page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  Check(writer->Finish());
  bar.Finish();
  return counts;
}

struct ImportCounts {
  bool stream = false;
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  uint64_t deduplicated = 0;  // Already stored: importing twice is harmless.
  std::string single_id;      // A single block file: its block.
};

// ImportStream stores every block of a block stream (or block file). A
// regular file is read through once first, so that a damaged or truncated
// one stores nothing; from a pipe, blocks are checked one by one and stored
// in batches, and an error says how many were stored before it.
ImportCounts ImportStream(Client& client, const std::string& path, bool durable,
                          bool progress) {
  std::unique_ptr<BlockStreamReader> reader = Check(BlockStreamReader::Open(path));
  ImportCounts counts;
  counts.stream = reader->is_stream();
  uint64_t total = 0;
  if (reader->size().has_value() && reader->is_stream()) {
    Progress check("check", *reader->size(), "bytes", progress);
    BlockFile block;
    while (Check(reader->Next(&block))) check.Set(reader->offset());
    check.Set(reader->offset());
    check.Finish(/*erase=*/true);
    total = reader->records();
    reader = Check(BlockStreamReader::Open(path));
  }
  Progress bar("import", total, "blocks", progress && reader->is_stream());
  std::vector<BlockFile> batch;
  uint64_t batch_bytes = 0;
  auto save = [&] {
    if (batch.empty()) return;
    std::vector<BlockToSave> blocks;
    for (const BlockFile& b : batch) blocks.emplace_back(b.meta, b.payload);
    absl::StatusOr<std::vector<v1::SaveResult>> r = client.Save(blocks, durable);
    if (!r.ok()) {
      throw CommandError{absl::Status(
          r.status().code(),
          absl::StrCat(r.status().message(), " (", counts.blocks,
                       " blocks were stored before this batch)"))};
    }
    for (const v1::SaveResult& one : *r) counts.deduplicated += one.deduplicated() ? 1 : 0;
    counts.blocks += batch.size();
    bar.Add(batch.size());
    batch.clear();
    batch_bytes = 0;
  };
  for (;;) {
    BlockFile block;
    absl::StatusOr<bool> more = reader->Next(&block);
    if (!more.ok()) {
      save();  // The intact blocks before the damage (a pipe: not checked up front).
      throw CommandError{absl::Status(
          more.status().code(),
          absl::StrCat(more.status().message(), "; ", counts.blocks,
                       " intact blocks before it were stored (importing again is safe)"))};
    }
    if (!*more) break;
    if (!reader->is_stream()) counts.single_id = BlockIdOf(block.meta).ToHex();
    counts.bytes += block.payload.size();
    batch_bytes += block.payload.size();
    batch.push_back(std::move(block));
    if (batch.size() >= kBatchBlocks || batch_bytes >= kBatchBytes) save();
  }
  save();
  bar.Finish();
  return counts;
}

// Verify with a progress bar: the ids (every listed block when none are
// named) in batches, the answers added up.
v1::VerifyResponse VerifyInBatches(Client& client, std::vector<BlockId> ids) {
  if (ids.empty()) {
    v1::ListRequest request;
    request.set_page_size(1000);
    Progress listing("list", 0, "blocks", true);
    for (;;) {
      const v1::ListResponse page = Check(client.List(request));
      for (const v1::BlockInfo& b : page.blocks()) ids.push_back(BlockIdOf(b.meta()));
      listing.Set(ids.size());
      if (page.next_page_token().empty()) break;
      request.set_page_token(page.next_page_token());
    }
    listing.Finish(/*erase=*/true);
  }
  v1::VerifyResponse all;
  Progress bar("verify", ids.size(), "blocks", true);
  constexpr size_t kVerifyBatch = 256;
  for (size_t at = 0; at < ids.size(); at += kVerifyBatch) {
    const size_t n = std::min(kVerifyBatch, ids.size() - at);
    const v1::VerifyResponse r = Check(client.Verify({ids.data() + at, n}));
    all.set_blocks_checked(all.blocks_checked() + r.blocks_checked());
    all.set_copies_checked(all.copies_checked() + r.copies_checked());
    all.set_copies_ok(all.copies_ok() + r.copies_ok());
    all.set_missing(all.missing() + r.missing());
    for (const v1::CorruptCopy& c : r.corrupt()) *all.add_corrupt() = c;
    bar.Add(n);
  }
  bar.Finish();
  return all;
}

// Flush with a progress bar: the blocks written so far, from the daemon's
// spill counter, polled beside the call (Flush is one RPC).
v1::FlushResponse FlushWithProgress(Client& client, bool evict) {
  uint64_t base = 0;
  if (absl::StatusOr<v1::StatResponse> s = client.Stat(); s.ok()) base = s->counters().spills();
  Progress bar("flush", 0, "blocks written", true);
  std::atomic<bool> done{false};
  std::thread poller([&] {
    while (!done.load()) {
      if (absl::StatusOr<v1::StatResponse> s = client.Stat(); s.ok()) {
        bar.Set(s->counters().spills() >= base ? s->counters().spills() - base : 0);
      }
      for (int i = 0; i < 10 && !done.load(); ++i) absl::SleepFor(absl::Milliseconds(10));
    }
  });
  absl::StatusOr<v1::FlushResponse> r = client.Flush(evict);
  done = true;
  poller.join();
  if (r.ok()) bar.Set(r->blocks_written());
  bar.Finish();
  return Check(std::move(r));
}

int Run(int argc, char** argv) {
  CLI::App app{"evokectl: inspect, verify and manage the blocks stored by evoked"};
  app.require_subcommand(1);
  app.fallthrough();  // --socket/--json/--timeout may follow the command.
  app.footer(ctl::ExitCodeTable());
  std::string socket;
  bool json = false;
  double timeout_s = 60;
  std::string progress_mode = "auto";
  app.add_option("--socket", socket,
                 "evoked's socket (default: $EVOKE_SOCKET, else ./evoked.sock)");
  app.add_flag("--json", json, "Print JSON instead of text");
  app.add_option("--timeout", timeout_s, "Seconds per call")->capture_default_str();
  app.add_option("--progress", progress_mode,
                 "Progress bars on stderr for verify, export, import, flush: auto (when "
                 "stdout and stderr are terminals), always or never")
      ->check(CLI::IsMember({"auto", "always", "never"}))
      ->capture_default_str();

  CLI::App* stat = app.add_subcommand("stat", "Occupancy of each tier and counters");
  CLI::App* ls = app.add_subcommand("ls", "List blocks");
  std::string ls_ns, ls_session, ls_tier;
  int64_t ls_limit = 0;
  ls->add_option("--namespace", ls_ns, "Only this namespace");
  ls->add_option("--session", ls_session, "Only this session (needs --namespace)");
  ls->add_option("--tier", ls_tier, "pinned, spill or breadcrumb");
  ls->add_option("--limit", ls_limit, "At most this many blocks (0 = all)")
      ->check(CLI::NonNegativeNumber);
  CLI::App* show = app.add_subcommand("show", "One block's metadata and state");
  std::string show_id;
  show->add_option("ID", show_id, "Block id (32 hex digits)")->required();
  CLI::App* rm = app.add_subcommand("rm", "Delete blocks from every tier");
  std::vector<std::string> rm_ids;
  rm->add_option("ID", rm_ids, "Block ids")->required();
  CLI::App* drop = app.add_subcommand("drop-session", "Delete every block of a session");
  std::string drop_ns, drop_session;
  drop->add_option("NAMESPACE", drop_ns)->required();
  drop->add_option("SESSION", drop_session)->required();
  CLI::App* lookup = app.add_subcommand(
      "lookup", "Where the longest run of leading ids (a prefix chain) is held");
  std::vector<std::string> lookup_ids;
  lookup->add_option("ID", lookup_ids, "Block ids, in chain order")->required();
  CLI::App* keep = app.add_subcommand(
      "keep", "Keep a session's blocks where they are for SECONDS (0 ends the keep)");
  std::string keep_ns, keep_session;
  uint32_t keep_seconds = 0;
  keep->add_option("NAMESPACE", keep_ns)->required();
  keep->add_option("SESSION", keep_session)->required();
  keep->add_option("SECONDS", keep_seconds)->required()->check(CLI::NonNegativeNumber);
  CLI::App* prefetch = app.add_subcommand(
      "prefetch", "Bring blocks into tier 1 ahead of their loads (waits for it)");
  std::vector<std::string> prefetch_ids;
  prefetch->add_option("ID", prefetch_ids, "Block ids, the likeliest first")->required();
  CLI::App* ttl = app.add_subcommand(
      "ttl", "Set blocks' retention class (low: evicted first, high: last) for SECONDS");
  std::string ttl_class;
  uint32_t ttl_seconds = 0;
  std::vector<std::string> ttl_ids;
  ttl->add_option("CLASS", ttl_class, "low, normal or high")
      ->required()
      ->check(CLI::IsMember({"low", "normal", "high"}));
  ttl->add_option("SECONDS", ttl_seconds, "How long it holds (0: until changed)")
      ->required()
      ->check(CLI::NonNegativeNumber);
  ttl->add_option("ID", ttl_ids, "Block ids")->required();
  // pin / unpin: an operator's durable pin is class high (a lease's pin
  // would end with this process); unpin returns the blocks to normal.
  CLI::App* pin = app.add_subcommand("pin", "Keep blocks in their tiers (class high) until unpin");
  pin->add_option("--ttl", ttl_seconds, "End the pin after SECONDS (0: none)")
      ->check(CLI::NonNegativeNumber);
  pin->add_option("ID", ttl_ids, "Block ids")->required();
  CLI::App* unpin = app.add_subcommand("unpin", "Let pinned blocks compete again (class normal)");
  unpin->add_option("ID", ttl_ids, "Block ids")->required();
  CLI::App* recover = app.add_subcommand(
      "recover", "The blocks of a session a recovery query would bring back, best first");
  ctl::RecoverCommand rc;
  recover->add_option("NAMESPACE", rc.ns)->required();
  recover->add_option("SESSION", rc.session)->required();
  recover->add_option("--like", rc.like, "Query with this block's key summary");
  recover->add_option("--query-file", rc.query_file, "Query vectors: floats, heads x dim");
  recover->add_option("--heads", rc.heads, "Query heads in --query-file");
  recover->add_option("--kind", rc.kind, "Summary kind: mean, repr or embedding")
      ->capture_default_str();
  recover->add_option("--layer", rc.layer, "The layer scored");
  recover->add_option("-k", rc.k, "How many blocks (1-1024)")->capture_default_str();
  CLI::App* quota = app.add_subcommand(
      "quota", "A namespace's usage against its quotas and its retention cap");
  std::string quota_ns;
  quota->add_option("NAMESPACE", quota_ns)->required();
  CLI::App* watch = app.add_subcommand(
      "watch", "Stream block events (stored, spilled, demoted, promoted, evicted, removed, expired)");
  std::string watch_ns, watch_resume;
  std::vector<std::string> watch_kinds;
  uint64_t watch_count = 0;
  watch->add_option("--namespace", watch_ns, "Only this namespace");
  watch->add_option("--kind", watch_kinds, "Only these kinds (repeatable)")
      ->check(CLI::IsMember({"stored", "spilled", "demoted", "promoted", "evicted", "removed",
                                "expired"}));
  watch->add_option("--resume", watch_resume,
                    "Continue after this token (hex, as printed at exit)");
  watch->add_option("--count", watch_count, "Exit after this many events (0 = never)");
  CLI::App* verify = app.add_subcommand(
      "verify", "Re-read blocks from every tier and check their checksums");
  std::vector<std::string> verify_ids;
  verify->add_option("ID", verify_ids, "Block ids (default: all)");
  CLI::App* flush = app.add_subcommand("flush", "Write tier 1 to disk");
  bool flush_evict = false;
  flush->add_flag("--evict", flush_evict, "Then release tier 1 of unpinned blocks");
  CLI::App* exp = app.add_subcommand(
      "export",
      "Write one block to a block file (ID FILE), or every block of a namespace or "
      "session to one block stream (--namespace NS [--session S] -o FILE)");
  std::string exp_id, exp_file, exp_ns, exp_session, exp_out;
  exp->add_option("ID", exp_id, "Block id (32 hex digits)");
  exp->add_option("FILE", exp_file, "The block file to write");
  exp->add_option("--namespace", exp_ns, "Export every block of this namespace");
  exp->add_option("--session", exp_session, "Only this session's blocks (needs --namespace)");
  exp->add_option("-o,--output", exp_out, "The block stream to write; - for stdout");
  CLI::App* imp = app.add_subcommand(
      "import", "Store the blocks of a block file or block stream (- reads stdin)");
  std::string imp_file;
  bool imp_durable = false;
  imp->add_option("FILE", imp_file)->required();
  imp->add_flag("--durable", imp_durable, "Return once the blocks are on disk");
  CLI::App* health = app.add_subcommand("health", "Ask whether evoked is serving");
  CLI::App* top = app.add_subcommand(
      "top", "Live view of tiers, hit rates, throughput and RPC latency (q quits)");
  ctl::TopOptions top_options;
  top->add_option("--interval", top_options.interval_seconds, "Seconds between refreshes")
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  top->add_option("--iterations", top_options.iterations,
                  "Refresh this many times, then exit (0: until q)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? ctl::kExitOk : ctl::kExitUsage;
  }
  const bool progress =
      progress_mode == "always" ||
      (progress_mode == "auto" && ::isatty(STDOUT_FILENO) == 1 && ::isatty(STDERR_FILENO) == 1);

  if (*top) {
    // top keeps trying while evoked is away, so it skips the checks below.
    top_options.socket = socket;
    top_options.timeout_seconds = std::min(timeout_s, 5.0);
    return ctl::RunTop(top_options);
  }

  try {
    // An operator's tool fails at once when there is no socket to dial,
    // rather than waiting out the connect timeout.
    // Usage checks first: they need no daemon.
    const bool exp_stream = *exp && !exp_ns.empty();
    if (*exp) {
      if (exp_stream) {
        if (!exp_id.empty()) {
          throw UsageError{"export: give either ID FILE or --namespace, not both"};
        }
        if (exp_out.empty()) throw UsageError{"export --namespace: -o FILE (or -o -) is required"};
        if (exp_out == "-" && ::isatty(STDOUT_FILENO) == 1) {
          throw UsageError{
              "export -o -: stdout is a terminal; redirect it or write to a file"};
        }
      } else {
        if (!exp_session.empty()) throw UsageError{"export --session needs --namespace"};
        if (exp_id.empty()) throw UsageError{"export: give ID FILE or --namespace NS -o FILE"};
        if (exp_file.empty()) exp_file = exp_out;
        if (exp_file.empty()) throw UsageError{"export ID: the FILE to write is required"};
      }
    }
    std::vector<BlockId> verify_parsed;
    for (const std::string& h : verify_ids) verify_parsed.push_back(ParseId(h));

    const std::string target = ResolveTarget(socket);
    // A missing path, a directory, a regular file, a stale socket or a
    // listener that never answers: each fails at once (or within
    // kUnixConnectSeconds), in one line that names the path and the reason.
    const bool unix_target = absl::StartsWith(target, "unix:");
    if (unix_target) Check(ctl::ProbeUnixSocket(target.substr(5)));
    ClientOptions options;
    options.target = socket;
    options.call_timeout = absl::Seconds(timeout_s);
    options.connect_timeout =
        absl::Seconds(std::min(timeout_s, unix_target ? ctl::kUnixConnectSeconds : 10.0));
    absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(options);
    if (unix_target && connected.status().code() == absl::StatusCode::kUnavailable) {
      Check(absl::UnavailableError(absl::StrCat(
          "cannot reach evoked at ", target, ": a process accepts connections there but did not "
          "answer within ", absl::FormatDuration(options.connect_timeout),
          " (is evoked stuck, or is this another program's socket?)")));
    }
    std::unique_ptr<Client> client = Check(std::move(connected));

    if (*stat) {
      const v1::StatResponse s = Check(client->Stat());
      json ? PrintJson(s) : PrintStat(s);
    } else if (*ls) {
      v1::ListRequest request;
      request.set_namespace_(ls_ns);
      request.set_session_id(ls_session);
      if (!ls_tier.empty()) {
        if (ls_tier == "pinned") {
          request.set_tier(v1::TIER_PINNED_HOST);
        } else if (ls_tier == "spill") {
          request.set_tier(v1::TIER_SPILL);
        } else if (ls_tier == "breadcrumb") {
          request.set_tier(v1::TIER_BREADCRUMB);
        } else {
          throw UsageError{
              absl::StrCat("--tier: '", ls_tier, "' is not pinned, spill or breadcrumb")};
        }
      }
      v1::ListResponse all;
      for (;;) {
        request.set_page_size(1000);
        v1::ListResponse page = Check(client->List(request));
        for (auto& b : *page.mutable_blocks()) {
          if (ls_limit != 0 && all.blocks_size() >= ls_limit) break;
          *all.add_blocks() = std::move(b);
        }
        if (page.next_page_token().empty() ||
            (ls_limit != 0 && all.blocks_size() >= ls_limit)) {
          break;
        }
        request.set_page_token(page.next_page_token());
      }
      if (json) {
        PrintJson(all);
      } else {
        std::cout << absl::StrFormat("%-32s %-7s %-10s %12s %7s %7s %s\n", "ID", "KIND",
                                     "TIER", "BYTES", "TOKENS", "LAYERS",
                                     "SESSION#SEQ / NAMESPACE");
        for (const v1::BlockInfo& b : all.blocks()) {
          const v1::BlockMeta& m = b.meta();
          std::cout << absl::StrFormat(
              "%-32s %-7s %-10s %12d %7d %7s %s\n", BlockIdOf(m).ToHex(),
              m.kind() == v1::BLOCK_KIND_PREFIX ? "prefix" : "session",
              TierName(b.tier()) + (b.pin_count() > 0 ? "*" : ""), m.payload_bytes(),
              m.n_tokens(), Layers(m),
              m.kind() == v1::BLOCK_KIND_SESSION
                  ? absl::StrCat(m.session_id(), "#", m.sequence())
                  : m.fingerprint().namespace_());
        }
        std::cout << all.blocks_size() << " blocks\n";
      }
    } else if (*show) {
      const v1::BlockInfo info = Check(client->Describe(ParseId(show_id)));
      json ? PrintJson(info) : PrintBlock(info);
    } else if (*rm) {
      std::vector<BlockId> ids;
      for (const std::string& h : rm_ids) ids.push_back(ParseId(h));
      Check(client->Delete(ids));
      if (json) {
        std::cout << "{\"deleted\":" << ids.size() << "}\n";
      } else {
        std::cout << "deleted " << ids.size() << " block(s)\n";
      }
    } else if (*drop) {
      const uint32_t n = Check(client->DropSession(drop_ns, drop_session));
      if (json) {
        std::cout << "{\"deleted\":" << n << "}\n";
      } else {
        std::cout << "deleted " << n << " block(s) of session " << drop_session << "\n";
      }
    } else if (*lookup) {
      std::vector<BlockId> ids;
      for (const std::string& h : lookup_ids) ids.push_back(ParseId(h));
      const std::vector<v1::Tier> tiers = Check(client->Lookup(ids));
      if (json) {
        std::cout << "{\"n_present\":" << tiers.size() << ",\"tiers\":[";
        for (size_t i = 0; i < tiers.size(); ++i) {
          std::cout << (i > 0 ? "," : "") << "\"" << TierName(tiers[i]) << "\"";
        }
        std::cout << "]}\n";
      } else {
        std::cout << tiers.size() << " of " << ids.size() << " leading blocks held\n";
        for (size_t i = 0; i < tiers.size(); ++i) {
          std::cout << "  " << ids[i].ToHex() << " " << TierName(tiers[i]) << "\n";
        }
      }
    } else if (*keep) {
      const uint32_t n = Check(client->KeepSession(keep_ns, keep_session, keep_seconds));
      if (json) {
        std::cout << "{\"n_blocks\":" << n << ",\"seconds\":" << keep_seconds << "}\n";
      } else if (keep_seconds == 0) {
        std::cout << "session " << keep_session << " no longer kept (" << n << " blocks)\n";
      } else {
        std::cout << "session " << keep_session << " kept for " << keep_seconds << " s (" << n
                  << " blocks now)\n";
      }
    } else if (*prefetch) {
      std::vector<BlockId> ids;
      for (const std::string& h : prefetch_ids) ids.push_back(ParseId(h));
      Client::PrefetchOptions options;
      options.wait = true;
      const v1::PrefetchResponse r = Check(client->Prefetch(ids, options));
      if (json) {
        PrintJson(r);
      } else {
        std::cout << r.promoted() << " promoted, " << r.fetched() << " fetched, " << r.in_tier1()
                  << " in tier 1 already, " << r.missing() << " missing, " << r.no_room()
                  << " without room, " << r.failed() << " failed\n";
      }
    } else if (*ttl || *pin || *unpin) {
      if (!*ttl) ttl_class = *pin ? "high" : "normal";
      if (*unpin) ttl_seconds = 0;
      std::vector<BlockId> ids;
      for (const std::string& h : ttl_ids) ids.push_back(ParseId(h));
      const v1::RetentionClass c = ttl_class == "low"    ? v1::RETENTION_LOW
                                   : ttl_class == "high" ? v1::RETENTION_HIGH
                                                         : v1::RETENTION_NORMAL;
      Check(client->SetRetention(ids, c, ttl_seconds));
      if (json) {
        std::cout << "{\"blocks\":" << ids.size() << ",\"class\":\"" << ttl_class
                  << "\",\"seconds\":" << ttl_seconds << "}\n";
      } else {
        std::cout << ids.size() << " block(s) " << ttl_class;
        if (ttl_seconds > 0) std::cout << " for " << ttl_seconds << " s";
        std::cout << "\n";
      }
    } else if (*recover) {
      rc.json = json;
      Check(ctl::Recover(*client, rc));
    } else if (*quota) {
      const v1::StatResponse s = Check(client->Stat());
      const v1::NamespaceStat* found = nullptr;
      for (const v1::NamespaceStat& n : s.namespaces()) {
        if (n.name() == quota_ns) found = &n;
      }
      if (json && found != nullptr) {
        PrintJson(*found);
      } else if (json) {
        std::cout << "{}\n";
      } else if (found == nullptr) {
        std::cout << "namespace " << quota_ns << " holds no blocks\n";
      } else {
        PrintQuota(*found);
      }
    } else if (*watch) {
      const bool hex = watch_resume.size() % 2 == 0 &&
                       std::all_of(watch_resume.begin(), watch_resume.end(),
                                   [](char c) { return absl::ascii_isxdigit(c); });
      if (!hex) throw UsageError{absl::StrCat("--resume '", watch_resume, "': not hex")};
      Check(ctl::WatchEvents(*client, watch_ns, watch_kinds,
                             absl::HexStringToBytes(watch_resume), watch_count, json));
    } else if (*verify) {
      // A progress bar needs batches. Records that failed validation at
      // start are found only by a whole-store Verify, which is then used.
      bool batches = progress;
      if (batches && verify_parsed.empty()) {
        absl::StatusOr<v1::StatResponse> s = client->Stat();
        batches = s.ok() && s->counters().invalid_records() == 0;
      }
      const v1::VerifyResponse r = batches ? VerifyInBatches(*client, verify_parsed)
                                           : Check(client->Verify(verify_parsed));
      if (json) {
        PrintJson(r);
      } else {
        std::cout << "checked " << r.blocks_checked() << " blocks, "
                  << r.copies_checked() << " copies: " << r.copies_ok() << " ok, "
                  << r.corrupt_size() << " corrupt, " << r.missing() << " missing\n";
        for (const v1::CorruptCopy& c : r.corrupt()) {
          std::cout << "  corrupt " << BlockId::FromBytes(c.id())->ToHex() << " in "
                    << TierName(c.tier()) << ": " << c.detail() << "\n";
        }
      }
      if (r.corrupt_size() > 0 || r.missing() > 0) {
        throw CommandError{absl::DataLossError(absl::StrCat(
            r.corrupt_size(), " corrupt copies and ", r.missing(),
            " missing blocks (corrupt copies were dropped, never served)"))};
      }
      // A whole-store check also reports what the daemon's last start could
      // not bring back: blocks that are no longer there to be checked.
      if (verify_parsed.empty()) {
        const std::string lost = StartupLosses(Check(client->Stat()).disk_health());
        if (!lost.empty()) {
          throw CommandError{absl::DataLossError(absl::StrCat(
              "the blocks present verify, but the daemon's last start lost data: ", lost,
              " (evokectl stat; the daemon's log names each step)"))};
        }
      }
    } else if (*flush) {
      const v1::FlushResponse r =
          progress ? FlushWithProgress(*client, flush_evict) : Check(client->Flush(flush_evict));
      if (json) {
        PrintJson(r);
      } else {
        std::cout << "wrote " << r.blocks_written() << " blocks ("
                  << FormatByteSize(r.bytes_written()) << ") to disk";
        if (flush_evict) std::cout << ", released " << r.blocks_evicted() << " from tier 1";
        std::cout << "\n";
      }
    } else if (exp_stream) {
      const ExportCounts n = ExportStream(*client, exp_ns, exp_session, exp_out, progress);
      // With -o -, stdout carries the stream: the summary goes to stderr.
      std::ostream& out = exp_out == "-" ? std::cerr : std::cout;
      if (json) {
        out << "{\"blocks\":" << n.blocks << ",\"bytes\":" << n.bytes
            << ",\"breadcrumbs_skipped\":" << n.breadcrumbs << ",\"vanished\":" << n.vanished
            << ",\"file\":\"" << exp_out << "\"}\n";
      } else {
        out << "exported " << n.blocks << " blocks (" << FormatByteSize(n.bytes) << ") to "
            << (exp_out == "-" ? "stdout" : exp_out);
        if (n.breadcrumbs > 0) out << "; skipped " << n.breadcrumbs << " breadcrumbs (no bytes)";
        if (n.vanished > 0) out << "; " << n.vanished << " deleted meanwhile";
        out << "\n";
      }
    } else if (*exp) {
      const BlockId id = ParseId(exp_id);
      const v1::BlockInfo info = Check(client->Describe(id));
      std::vector<LoadedBlock> loaded =
          Check(client->Load({&id, 1}, info.meta().fingerprint()));
      Check(WriteBlockFile(exp_file, loaded[0].meta, loaded[0].payload));
      if (json) {
        std::cout << "{\"id\":\"" << id.ToHex() << "\",\"bytes\":"
                  << loaded[0].payload.size() << ",\"file\":\"" << exp_file << "\"}\n";
      } else {
        std::cout << "exported " << id.ToHex() << " ("
                  << FormatByteSize(loaded[0].payload.size()) << ") to " << exp_file << "\n";
      }
    } else if (*imp) {
      const ImportCounts n = ImportStream(*client, imp_file, imp_durable, progress);
      if (!n.stream) {  // One block file: as before streams existed.
        if (json) {
          std::cout << "{\"id\":\"" << n.single_id << "\",\"deduplicated\":"
                    << (n.deduplicated > 0 ? "true" : "false") << "}\n";
        } else {
          std::cout << "imported " << n.single_id << " (" << FormatByteSize(n.bytes) << ")"
                    << (n.deduplicated > 0 ? ", already stored" : "") << "\n";
        }
      } else if (json) {
        std::cout << "{\"blocks\":" << n.blocks << ",\"bytes\":" << n.bytes
                  << ",\"deduplicated\":" << n.deduplicated << "}\n";
      } else {
        std::cout << "imported " << n.blocks << " blocks (" << FormatByteSize(n.bytes) << "): "
                  << n.blocks - n.deduplicated << " new, " << n.deduplicated
                  << " already stored\n";
      }
    } else if (*health) {
      Check(client->HealthCheck());
      std::cout << (json ? "{\"status\":\"SERVING\"}" : "SERVING") << "\n";
    }
  } catch (const UsageError& e) {
    std::cerr << "evokectl: INVALID_ARGUMENT: " << e.message << "\n";
    return ctl::kExitUsage;
  } catch (const CommandError& e) {
    std::cerr << "evokectl: " << absl::StatusCodeToString(e.status.code()) << ": "
              << e.status.message() << "\n";
    return ExitCodeFor(e.status);
  }
  return ctl::kExitOk;
}

}  // namespace
}  // namespace evoke

int main(int argc, char** argv) { return evoke::Run(argc, argv); }
