// tenant_client: one tenant of the tenancy trials, run as a uid of the
// test's choosing (the kernel, not the request, says who calls).
//
//   tenant_client SOCKET UID GID OP...
//
// It drops to UID/GID (when they differ from its own; needs root), connects,
// runs each OP in order and prints one line per OP:
//   <op> <grpc status code> <message>[ <extra>]
// OPs (ids are hex):
//   save-session:NS:SESSION   a 4-token session block (extra: id=<hex>)
//   save-prefix:NS[:SEED]     a 4-token prefix block with its tokens, payload
//                             from SEED (extra: id= sent=<bytes' sum> dedup=)
//   NS may be NS/GROUP: the fingerprint's trust_group is GROUP
//   save-prefix-bare:NS:HEX   a prefix block without tokens claiming HEX
//   load:NS:HEX (extra: sum=<bytes' sum>)  describe:HEX (extra: n_tokens= tokens=)  lookup:HEX
//   delete:HEX  verify:HEX  pin:HEX
//   list:NS (extra: blocks= tokens=, tokens shown in all)  list-all  drop:NS:SESSION  recover:NS:SESSION  stat  flush
//   verify-all
//   save-many:NS:SESSION:N:THREADS:TOKENS  N session blocks of TOKENS tokens
//                             from THREADS threads at once (extra: saved=
//                             refused= other=, refused: RESOURCE_EXHAUSTED;
//                             finite keys, so the daemon adds summaries)
#include <grp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_split.h"
#include "tests/e2e_fixture.h"

namespace evoke::testing {
namespace {

void Print(const std::string& op, const grpc::Status& s, const std::string& extra = "") {
  std::string msg = s.error_message();
  for (char& c : msg) {
    if (c == '\n') c = ' ';
  }
  std::printf("%s %d %s%s%s\n", op.c_str(), static_cast<int>(s.error_code()), msg.c_str(),
              extra.empty() ? "" : " ", extra.c_str());
}

// "NS" or "NS/GROUP": SmallFingerprint(NS) with trust_group GROUP.
v1::LayoutFingerprint Fp(const std::string& spec) {
  const std::vector<std::string> parts = absl::StrSplit(spec, absl::MaxSplits('/', 1));
  v1::LayoutFingerprint fp = SmallFingerprint(parts[0]);
  if (parts.size() > 1) fp.set_trust_group(parts[1]);
  return fp;
}

// A digest of payload bytes, to tell whose bytes a load returned.
std::string Sum(const std::string& bytes) {
  return std::to_string(std::hash<std::string>()(bytes));
}

std::string IdBytes(const std::string& hex) {
  absl::StatusOr<BlockId> id = BlockId::FromHex(hex);
  return id.ok() ? id->ToBytes() : std::string(16, '\0');
}

int Run(const std::string& socket, const std::vector<std::string>& ops) {
  std::unique_ptr<v1::KvTier::Stub> stub = RawStub(socket);
  for (const std::string& op : ops) {
    const std::vector<std::string> f = absl::StrSplit(op, ':');
    const std::string& verb = f[0];
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (verb == "save-session" || verb == "save-prefix" || verb == "save-prefix-bare") {
      const v1::LayoutFingerprint fp = Fp(f.at(1));
      TestBlock b;
      if (verb == "save-session") {
        b = SessionBlock(f.at(2), 0, 4, fp);
      } else {
        const std::vector<int32_t> tokens = {11, 12, 13, 14};
        b.meta = PrefixMeta(fp, BlockId(), tokens, 0, fp.n_layers(), 0);
        if (verb == "save-prefix-bare") {
          b.meta.clear_tokens();
          b.meta.set_id(IdBytes(f.at(2)));
        }
        // save-prefix:NS[:SEED]: the payload's bytes depend on SEED.
        const uint32_t seed =
            verb == "save-prefix" && f.size() > 2 ? static_cast<uint32_t>(std::stoul(f[2])) : 7;
        b.payload = CanonicalPayload(b.meta, seed);
      }
      v1::SaveRequest req;
      v1::SaveBlock* block = req.add_blocks();
      *block->mutable_meta() = b.meta;
      block->set_inline_bytes(b.payload);
      v1::SaveResponse resp;
      const grpc::Status s = stub->Save(&ctx, req, &resp);
      Print(verb, s,
            "id=" + BlockId::FromBytes(b.meta.id())->ToHex() + " sent=" + Sum(b.payload) +
                " dedup=" + std::to_string(resp.results_size() > 0 &&
                                           resp.results(0).deduplicated()));
    } else if (verb == "load") {
      v1::LoadRequest req;
      req.add_ids(IdBytes(f.at(2)));
      *req.mutable_fingerprint() = Fp(f.at(1));
      v1::LoadResponse resp;
      const grpc::Status s = stub->Load(&ctx, req, &resp);
      Print(verb, s, "sum=" + (resp.blocks_size() > 0 ? Sum(resp.blocks(0).inline_bytes()) : ""));
    } else if (verb == "prefetch") {
      v1::PrefetchRequest req;
      req.add_ids(IdBytes(f.at(1)));
      req.set_wait(true);
      v1::PrefetchResponse resp;
      const grpc::Status s = stub->Prefetch(&ctx, req, &resp);
      Print(verb, s,
            "missing=" + std::to_string(resp.missing()) +
                " in_tier1=" + std::to_string(resp.in_tier1() + resp.promoted()));
    } else if (verb == "retain") {
      v1::SetRetentionRequest req;
      req.add_ids(IdBytes(f.at(1)));
      req.set_retention(v1::RETENTION_HIGH);
      v1::SetRetentionResponse resp;
      Print(verb, stub->SetRetention(&ctx, req, &resp), "");
    } else if (verb == "watch-from") {
      // watch-from:HEX: the events after that resume token, for 300 ms.
      v1::WatchBlocksRequest req;
      req.set_resume_token(absl::HexStringToBytes(f.at(1)));
      grpc::ClientContext wctx;
      wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
      std::unique_ptr<grpc::ClientReader<v1::BlockEvents>> reader = stub->WatchBlocks(&wctx, req);
      v1::BlockEvents batch;
      int events = 0;
      std::string namespaces;
      while (reader->Read(&batch)) {
        for (const v1::BlockEvent& e : batch.events()) {
          ++events;
          namespaces += e.namespace_() + ",";
        }
      }
      const grpc::Status s = reader->Finish();
      // The deadline ends every watch: report what came before it.
      Print(verb, s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ? grpc::Status::OK : s,
            "events=" + std::to_string(events) + " namespaces=" + namespaces);
    } else if (verb == "describe") {
      v1::DescribeRequest req;
      req.set_id(IdBytes(f.at(1)));
      v1::BlockInfo resp;
      const grpc::Status s = stub->Describe(&ctx, req, &resp);
      Print(verb, s,
            "n_tokens=" + std::to_string(resp.meta().n_tokens()) +
                " tokens=" + std::to_string(resp.meta().tokens_size()));
    } else if (verb == "lookup") {
      v1::LookupRequest req;
      req.add_ids(IdBytes(f.at(1)));
      v1::LookupResponse resp;
      const grpc::Status s = stub->Lookup(&ctx, req, &resp);
      Print(verb, s, "n_present=" + std::to_string(resp.n_present()));
    } else if (verb == "delete") {
      v1::DeleteRequest req;
      req.add_ids(IdBytes(f.at(1)));
      v1::DeleteResponse resp;
      Print(verb, stub->Delete(&ctx, req, &resp));
    } else if (verb == "verify" || verb == "verify-all") {
      v1::VerifyRequest req;
      if (verb == "verify") req.add_ids(IdBytes(f.at(1)));
      v1::VerifyResponse resp;
      const grpc::Status s = stub->Verify(&ctx, req, &resp);
      Print(verb, s,
            "checked=" + std::to_string(resp.blocks_checked()) +
                " missing=" + std::to_string(resp.missing()));
    } else if (verb == "pin") {
      // A lease of this caller, then the pin.
      grpc::ClientContext lease_ctx;
      v1::OpenLeaseRequest lreq;
      lreq.set_client_name("tenant");
      auto reader = stub->OpenLease(&lease_ctx, lreq);
      v1::LeaseEvent ev;
      if (!reader->Read(&ev)) {
        Print(verb, reader->Finish());
        continue;
      }
      v1::PinRequest req;
      req.add_ids(IdBytes(f.at(1)));
      req.set_lease_id(ev.grant().lease_id());
      v1::PinResponse resp;
      Print(verb, stub->Pin(&ctx, req, &resp));
      lease_ctx.TryCancel();
      reader->Finish();
    } else if (verb == "list" || verb == "list-all") {
      v1::ListRequest req;
      if (verb == "list") req.set_namespace_(f.at(1));
      v1::ListResponse resp;
      const grpc::Status s = stub->List(&ctx, req, &resp);
      int tokens = 0;
      for (const v1::BlockInfo& b : resp.blocks()) tokens += b.meta().tokens_size();
      Print(verb, s,
            "blocks=" + std::to_string(resp.blocks_size()) + " tokens=" + std::to_string(tokens));
    } else if (verb == "drop") {
      v1::DropSessionRequest req;
      req.set_namespace_(f.at(1));
      req.set_session_id(f.at(2));
      v1::DropSessionResponse resp;
      Print(verb, stub->DropSession(&ctx, req, &resp));
    } else if (verb == "recover") {
      v1::RecoverRequest req;
      req.mutable_session()->set_namespace_(f.at(1));
      req.mutable_session()->set_session_id(f.at(2));
      req.set_kind(v1::SUMMARY_MEAN_KEYS);
      req.set_k(4);
      const v1::LayoutFingerprint fp = Fp(f.at(1));
      req.set_n_query_heads(fp.n_kv_heads());
      for (uint32_t i = 0; i < fp.n_kv_heads() * fp.head_dim(); ++i) req.add_queries(1.0f);
      v1::RecoverResponse resp;
      const grpc::Status s = stub->Recover(&ctx, req, &resp);
      Print(verb, s, "found=" + std::to_string(resp.blocks_size()));
    } else if (verb == "stat") {
      v1::StatResponse resp;
      const grpc::Status s = stub->Stat(&ctx, v1::StatRequest(), &resp);
      Print(verb, s,
            "has_counters=" + std::to_string(resp.has_counters() || resp.has_pinned()));
    } else if (verb == "save-many") {
      const v1::LayoutFingerprint fp = Fp(f.at(1));
      const std::string session = f.at(2);
      const int n = std::stoi(f.at(3)), threads = std::stoi(f.at(4));
      const uint32_t tokens = static_cast<uint32_t>(std::stoul(f.at(5)));
      std::atomic<int> next{0}, saved{0}, refused{0}, other{0};
      std::vector<std::thread> workers;
      for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&] {
          for (int i = next++; i < n; i = next++) {
            TestBlock b = SessionBlock(session, static_cast<uint64_t>(i), tokens, fp);
            // Finite f16 keys (high bytes below 0x40), so the daemon adds its
            // MEAN_KEYS summary to the metadata.
            for (size_t k = 1; k < b.payload.size(); k += 2) b.payload[k] &= 0x3f;
            v1::SaveRequest req;
            v1::SaveBlock* block = req.add_blocks();
            *block->mutable_meta() = b.meta;
            block->set_inline_bytes(b.payload);
            v1::SaveResponse resp;
            grpc::ClientContext one;
            one.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
            const grpc::Status s = stub->Save(&one, req, &resp);
            ++(s.ok() ? saved : s.error_code() == grpc::RESOURCE_EXHAUSTED ? refused : other);
          }
        });
      }
      for (std::thread& w : workers) w.join();
      Print(verb, grpc::Status::OK,
            "saved=" + std::to_string(saved.load()) + " refused=" +
                std::to_string(refused.load()) + " other=" + std::to_string(other.load()));
    } else if (verb == "flush") {
      v1::FlushRequest req;
      v1::FlushResponse resp;
      Print(verb, stub->Flush(&ctx, req, &resp));
    } else {
      std::fprintf(stderr, "unknown op %s\n", op.c_str());
      return 2;
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace evoke::testing

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: tenant_client SOCKET UID GID OP...\n");
    return 2;
  }
  uint32_t uid = 0, gid = 0;
  if (!absl::SimpleAtoi(argv[2], &uid) || !absl::SimpleAtoi(argv[3], &gid)) return 2;
  // Drop to the tenant's identity before anything connects: SO_PEERCRED
  // records who connected, at connect time.
  if (gid != getgid() && (setgroups(0, nullptr) != 0 || setgid(gid) != 0)) {
    std::perror("setgid");
    return 3;
  }
  if (uid != getuid() && setuid(uid) != 0) {
    std::perror("setuid");
    return 3;
  }
  return evoke::testing::Run(argv[1], std::vector<std::string>(argv + 4, argv + argc));
}
