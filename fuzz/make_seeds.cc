// make_seeds: writes the seed corpora of the fuzz targets, a handful of valid
// inputs each, built with the real encoders (so they stay valid as formats
// change: re-run it and commit what changed).
//
//   build-fuzz/fuzz/make_seeds fuzz/corpus
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engines/llama/seq_state.h"
#include "common/block_validation.h"
#include "common/checksum.h"
#include "daemon/daemon_flags.h"
#include "daemon/daemon_options.h"
#include "evoke/block_file.h"
#include "evoke/chain_hash.h"
#include "evoke/fingerprint.h"
#include "evoke/v1/kvtier.pb.h"
#include "fuzz/fuzz_blocks.h"
#include "storage/spill_record.pb.h"

namespace evoke {
namespace {

using fuzz::Fp;
using fuzz::Payload;
using fuzz::PrefixBlockMeta;
using fuzz::SessionBlockMeta;
using fuzz::WithChecksum;

std::string root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = absl::StrCat(root, "/", target);
  mkdir(root.c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  std::ofstream out(absl::StrCat(dir, "/", name), std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void AddSummary(v1::BlockMeta* meta, v1::SummaryKind kind, uint32_t heads, uint32_t dim) {
  v1::Summary* s = meta->add_summaries();
  s->set_kind(kind);
  s->set_layer(kind == v1::SUMMARY_EMBEDDING ? 0 : 1);
  s->set_heads(heads);
  s->set_dim(dim);
  if (kind == v1::SUMMARY_REPR_KEYS) s->set_r(1);
  for (uint32_t i = 0; i < heads * dim; ++i) s->add_values(std::sin(i * 0.7f));
}

void RequestSeeds() {
  const std::string t = "fuzz_request_validation";
  auto put = [&](const std::string& name, char which, const google::protobuf::Message& m) {
    Write(t, name, std::string(1, which) + m.SerializeAsString());
  };
  // Save: a session block with a summary, inline; a RoPE'd prefix chain of
  // two; a region payload under a lease.
  {
    v1::SaveRequest save;
    const std::string payload = Payload(4, 1);
    v1::SaveBlock* b = save.add_blocks();
    *b->mutable_meta() = WithChecksum(SessionBlockMeta(Fp(false), "s", 0, 4, 0, 2, 0), payload);
    AddSummary(b->mutable_meta(), v1::SUMMARY_MEAN_KEYS, 2, 8);
    AddSummary(b->mutable_meta(), v1::SUMMARY_EMBEDDING, 1, 4);
    b->set_inline_bytes(payload);
    put("save_session", 0, save);
  }
  {
    v1::SaveRequest save;
    const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
    BlockId parent;
    for (int i = 0; i < 2; ++i) {
      const std::string payload = Payload(4, 10 + i);
      v1::SaveBlock* b = save.add_blocks();
      *b->mutable_meta() = WithChecksum(
          PrefixBlockMeta(Fp(true), parent, absl::MakeConstSpan(tokens).subspan(4 * i, 4), 0,
                          2, 4 * i),
          payload);
      parent = *BlockId::FromBytes(b->meta().id());
      b->set_inline_bytes(payload);
    }
    put("save_prefix_rope", 0, save);
  }
  {
    v1::SaveRequest save;
    save.set_lease_id("lease-1");
    save.set_durable(true);
    v1::SaveBlock* b = save.add_blocks();
    const std::string payload = Payload(4, 3);
    *b->mutable_meta() = WithChecksum(SessionBlockMeta(Fp(false), "s", 7, 4, 0, 2, 100), payload);
    b->mutable_region()->set_region_id(1);
    b->mutable_region()->set_length(payload.size());
    b->set_pin(true);
    put("save_region_pin", 0, save);
  }
  // Load with new positions.
  {
    v1::LoadRequest load;
    load.add_ids(SessionBlockId("ns", "s", 0).ToBytes());
    load.add_ids(SessionBlockId("ns", "s", 1).ToBytes());
    *load.mutable_fingerprint() = Fp(true);
    put("load", 1, load);
  }
  // Recover: session scope (MEAN_KEYS, GQA 4 query heads, MAX), the
  // embedding, and the model scope with exclusions and a min score.
  {
    v1::RecoverRequest r;
    r.mutable_session()->set_namespace_("ns");
    r.mutable_session()->set_session_id("s");
    r.set_kind(v1::SUMMARY_MEAN_KEYS);
    r.set_layer(1);
    r.set_n_query_heads(4);
    for (int i = 0; i < 4 * 8; ++i) r.add_queries(std::cos(i * 0.3f));
    r.set_k(5);
    r.set_aggregation(v1::AGGREGATION_MAX);
    put("recover_session", 2, r);
    r.set_kind(v1::SUMMARY_EMBEDDING);
    r.set_layer(0);
    r.set_n_query_heads(1);
    r.clear_queries();
    for (int i = 0; i < 4; ++i) r.add_queries(0.5f * i);
    r.set_aggregation(v1::AGGREGATION_MEAN);
    put("recover_embedding", 2, r);
    v1::RecoverRequest m;
    *m.mutable_model()->mutable_fingerprint() = Fp(false);
    m.set_kind(v1::SUMMARY_MEAN_KEYS);
    m.set_layer(1);
    m.set_n_query_heads(2);
    for (int i = 0; i < 2 * 8; ++i) m.add_queries(std::sin(i * 1.0f));
    m.set_k(3);
    m.set_aggregation(v1::AGGREGATION_MEAN);
    m.add_exclude_ids(SessionBlockId("ns", "s", 3).ToBytes());
    m.set_min_score(-1.0f);
    put("recover_model", 2, m);
  }
  {
    v1::ListRequest l;
    l.set_namespace_("ns");
    l.set_session_id("s");
    l.set_tier(v1::TIER_SPILL);
    l.set_page_size(10);
    l.set_page_token(SessionBlockId("ns", "s", 2).ToHex());
    put("list", 3, l);
  }
  {
    v1::DeleteRequest d;
    for (int i = 0; i < 3; ++i) d.add_ids(SessionBlockId("ns", "s", i).ToBytes());
    put("ids", 4, d);
  }
}

void BlockFileSeeds() {
  const std::string t = "fuzz_block_file";
  const std::string payload = Payload(4, 5);
  v1::BlockMeta meta = WithChecksum(SessionBlockMeta(Fp(true), "s", 1, 4, 0, 2, 0), payload);
  AddSummary(&meta, v1::SUMMARY_MEAN_KEYS, 2, 8);
  absl::StatusOr<std::string> file = EncodeBlockFile(meta, payload);
  Write(t, "session", std::string(1, '\0') + *file);
  Write(t, "session_fix_checksum", std::string(1, '\1') + *file);
  const std::vector<int32_t> tokens = {9, 8, 7, 6};
  v1::BlockMeta prefix =
      WithChecksum(PrefixBlockMeta(Fp(false), BlockId(), tokens, 0, 2, 0), payload);
  Write(t, "prefix", std::string(1, '\0') + *EncodeBlockFile(prefix, payload));
  const std::string opaque = "opaque engine bytes";
  v1::LayoutFingerprint ofp = Fp(false);
  ofp.set_layout(v1::LAYOUT_OPAQUE);
  ofp.set_k_dtype(v1::DTYPE_OPAQUE);
  ofp.set_v_dtype(v1::DTYPE_OPAQUE);
  Write(t, "opaque",
        std::string(1, '\0') +
            *EncodeBlockFile(WithChecksum(SessionBlockMeta(ofp, "o", 0, 3, 0, 2, 0), opaque),
                             opaque));
}

// fuzz_spill_record's input, as FuzzedDataProvider reads it: integral values
// come from the END of the input (ConsumeIntegral), strings from the front
// (ConsumeRandomLengthString: a backslash followed by anything but a
// backslash ends the string; "\\\\" is one backslash).
struct ProviderInput {
  std::string front;
  std::string back;  // Reversed order: the first integral consumed is last.
  void Integral(uint64_t v, int bytes) {
    // ConsumeIntegral reads bytes from the end, most significant first.
    std::string b;
    for (int i = 0; i < bytes; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    back = b + back;
  }
  void String(const std::string& s) {
    for (char c : s) {
      front.push_back(c);
      if (c == '\\') front.push_back('\\');
    }
    front += "\\n";  // Terminator.
  }
  void Bytes(const std::string& s) { front += s; }
  std::string Build() const { return front + back; }
};

void SpillSeeds() {
  const std::string t = "fuzz_spill_record";
  auto record_of = [](v1::BlockMeta meta, bool present) {
    storage::SpillRecord r;
    *r.mutable_meta() = std::move(meta);
    r.set_payload_present(present);
    r.set_last_access_unix_ms(1700000000000);
    return r.SerializeAsString();
  };
  const std::string p0 = Payload(4, 20), p1 = Payload(4, 21);
  v1::BlockMeta m0 = WithChecksum(SessionBlockMeta(Fp(false), "s", 0, 4, 0, 2, 0), p0);
  AddSummary(&m0, v1::SUMMARY_MEAN_KEYS, 2, 8);
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  v1::BlockMeta m1 = WithChecksum(PrefixBlockMeta(Fp(true), BlockId(), tokens, 0, 2, 0), p1);
  AddSummary(&m1, v1::SUMMARY_EMBEDDING, 1, 4);
  // Each seed: n, then per block: how, key length, key, record, payload.
  auto seed = [&](const std::string& name,
                  const std::vector<std::tuple<uint8_t, std::string, std::string, std::string>>&
                      blocks) {
    ProviderInput in;
    in.Integral(blocks.size() - 1, 1);  // ConsumeIntegralInRange(1, 4).
    for (const auto& [how, key, record, payload] : blocks) {
      in.Integral(how, 1);
      in.Integral(key.size(), 1);  // ConsumeIntegralInRange(0, 24).
      in.Bytes(key);
      in.String(record);
      in.String(payload);
    }
    Write(t, name, in.Build());
  };
  seed("two_blocks", {{0, m0.id(), record_of(m0, true), p0}, {0, m1.id(), record_of(m1, true), p1}});
  seed("breadcrumb", {{0, m0.id(), record_of(m0, false), ""}});
  v1::BlockMeta bad = m0;
  bad.set_payload_bytes(1ull << 62);
  seed("huge_payload_bytes", {{0, bad.id(), record_of(bad, true), p0}});
  v1::BlockMeta zero_heads = m0;
  zero_heads.mutable_summaries(0)->set_heads(0);
  seed("summary_zero_heads", {{0, m0.id(), record_of(zero_heads, true), p0}});
  seed("short_key", {{0, "short", record_of(m0, true), p0}});
  // Two summaries of one kind and layer: Save refuses them, a record on disk
  // may hold them (ValidateStoredBlock does not look at summaries).
  v1::BlockMeta twice = m0;
  *twice.add_summaries() = m0.summaries(0);
  seed("duplicate_summaries", {{0, m0.id(), record_of(twice, true), p0}});
}

void FlagsSeeds() {
  const std::string t = "fuzz_daemon_flags";
  // flags byte, config (FuzzedDataProvider string), argv split at '\0'.
  auto seed = [&](const std::string& name, uint8_t flags, const std::string& config,
                  const std::vector<std::string>& args) {
    ProviderInput in;
    in.Integral(flags, 1);
    in.String(config);
    std::string rest;
    for (size_t i = 0; i < args.size(); ++i) {
      if (i > 0) rest.push_back('\0');
      rest += args[i];
    }
    // The remaining bytes are the front after the config string; integrals
    // come from the back, so keep the flag byte last.
    Write(t, name, in.front + rest + in.back);
  };
  seed("flags", 2, "",
       {"--socket", "/run/evoke/evoke.sock", "--pinned-bytes", "1.5GiB", "--spill-bytes",
        "64GiB", "--high-watermark", "0.9", "--low-watermark", "0.7", "--log-level", "warning"});
  DaemonOptions defaults;
  seed("print_config", 3, OptionsToConfig(defaults), {});
  seed("config_override", 3,
       "# comment\nsocket = \"/tmp/a.sock\"\ndata-dir = /var/lib/evoke\nworker-threads = 4\n",
       {"--worker-threads=8", "--summary-layer", "-1", "--lock-memory", "false"});
  seed("help", 0, "", {"--help"});
  seed("bad_size", 0, "", {"--max-block-bytes", "12XB"});
}

void SeqStateSeeds() {
  const std::string t = "fuzz_seq_state";
  using llama::CacheFormat;
  auto seed = [&](const std::string& name, uint32_t heads, uint32_t head_dim, v1::DType k,
                  v1::DType v, bool v_trans, std::vector<int32_t> positions) {
    CacheFormat f;
    f.n_layer = 2;
    f.n_kv_heads = heads;
    f.head_dim = head_dim;
    f.k_dtype = k;
    f.v_dtype = v;
    f.v_trans = v_trans;
    const uint64_t bytes = f.n_layer * positions.size() * heads * head_dim *
                           (DTypeBytes(k) + DTypeBytes(v));
    std::string payload(bytes, '\0');
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 31);
    absl::StatusOr<std::string> blob = llama::ToSeqStateBlob(payload, positions, f, 0);
    Write(t, name, std::string(1, static_cast<char>(heads - 1)) + std::string(1, '\0') + *blob);
  };
  seed("f16", 2, 4, v1::DTYPE_F16, v1::DTYPE_F16, false, {0, 1, 2});
  seed("f32_unsorted", 1, 8, v1::DTYPE_F32, v1::DTYPE_F32, false, {5, 2, 9, 3});
  seed("bf16_vtrans", 4, 2, v1::DTYPE_BF16, v1::DTYPE_F16, true, {7, 1});
  // An empty sequence.
  std::string empty;
  auto u32 = [&](uint32_t v) { empty.append(reinterpret_cast<const char*>(&v), 4); };
  u32(llama::kSeqStateMagic);
  u32(0);  // seq_id
  u32(1);  // n_stream
  u32(0);  // cell_count
  Write(t, "empty", std::string(2, '\0') + empty);
}

}  // namespace
}  // namespace evoke

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  evoke::root = argv[1];
  evoke::RequestSeeds();
  evoke::BlockFileSeeds();
  evoke::SpillSeeds();
  evoke::FlagsSeeds();
  evoke::SeqStateSeeds();
  return 0;
}
