#include "recovery/recovery_index.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/fingerprint.h"

namespace evoke {

struct RecoveryIndex::Table {
  uint32_t heads = 0;
  uint32_t dim = 0;
  std::vector<BlockId> ids;
  std::vector<int8_t> codes;  // rows x heads x dim
  std::vector<float> scales;  // rows x heads
  std::vector<float> exact;   // rows x heads x dim
  absl::flat_hash_map<BlockId, size_t> row_of;

  size_t rows() const { return ids.size(); }
  size_t width() const { return static_cast<size_t>(heads) * dim; }
};

namespace {

// The scan's kernel: approximate scores of rows [begin, end) into out[].
// Queries are int16 with a scale per vector, codes int8 with a scale per
// (row, head); each head's dot product is exact in int32 (the bound on the
// query's range in Prepare keeps dim * 127 * qmax below 2^31), then scaled.
// The compiler builds the kernel for x86-64-v4 (AVX-512BW), v3 (AVX2) and the
// baseline and picks one at run time.
//
// Query vectors come `group` per KV head, in head order: MEAN has one per KV
// head (group 1), summed; MAX has every query head, best one wins.
#if defined(__x86_64__)
#define EVOKE_SCAN_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define EVOKE_DOT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define EVOKE_SCAN_CLONES
#define EVOKE_DOT_CLONES
#endif

// Integer dot product; GCC turns this loop into pmaddwd (int16 pairs summed
// into int32) for every clone. No `omp simd` here: integer sums reassociate
// freely, and the pragma makes GCC pick a worse pattern.
inline int32_t DotI16I8(const int16_t* __restrict q, const int8_t* __restrict c, uint32_t n) {
  int32_t acc = 0;
  for (uint32_t d = 0; d < n; ++d) {
    acc += static_cast<int32_t>(q[d]) * static_cast<int32_t>(static_cast<int16_t>(c[d]));
  }
  return acc;
}

EVOKE_SCAN_CLONES
void ScanRows(const int16_t* q, const float* q_scale, uint32_t group,
              const int8_t* codes, const float* scales, uint32_t heads, uint32_t dim,
              size_t begin, size_t end, bool max, float* out) {
  const size_t width = static_cast<size_t>(heads) * dim;
  for (size_t row = begin; row < end; ++row) {
    const int8_t* c = codes + row * width;
    const float* sc = scales + row * heads;
    float total = 0, best = -INFINITY;
    const int16_t* qv = q;
    for (uint32_t h = 0; h < heads; ++h) {
      const int8_t* ch = c + static_cast<size_t>(h) * dim;
      for (uint32_t g = 0; g < group; ++g, qv += dim) {
        const float score =
            static_cast<float>(DotI16I8(qv, ch, dim)) * q_scale[h * group + g] * sc[h];
        total += score;
        best = std::max(best, score);
      }
    }
    out[row - begin] = max ? best : total;
  }
}

EVOKE_DOT_CLONES
float DotF32(const float* q, const float* v, uint32_t n) {
  float acc = 0;
#pragma omp simd reduction(+ : acc)
  for (uint32_t i = 0; i < n; ++i) acc += q[i] * v[i];
  return acc;
}

// The plain scalar loop the benchmarks compare with (no vectorization).
__attribute__((optimize("no-tree-vectorize")))
double DotScalar(const float* q, const float* v, uint32_t n) {
  double acc = 0;
  for (uint32_t i = 0; i < n; ++i) acc += static_cast<double>(q[i]) * v[i];
  return acc;
}

// Prepared query: for MEAN, one vector per KV head (the mean over its query
// heads' share); for MAX, every query head with its KV head.
struct PreparedQuery {
  bool max = false;
  uint32_t heads = 0;  // KV heads of the table.
  uint32_t dim = 0;
  uint32_t n_query_heads = 0;
  std::vector<float> per_kv;  // MEAN: heads x dim, already divided by n_q.
  absl::Span<const float> raw;
  // The scan's query: MEAN per_kv, MAX raw, quantized (one scale per vector).
  std::vector<int16_t> q16;
  std::vector<float> q_scale;
  uint32_t scan_vectors = 0;
  uint32_t scan_group = 1;  // Scan vectors per KV head.
};

float ScoreExact(const PreparedQuery& p, const RecoveryIndex::Table& t, size_t row) {
  const float* v = t.exact.data() + row * t.width();
  if (!p.max) {
    float s = 0;
    for (uint32_t h = 0; h < p.heads; ++h) {
      s += DotF32(p.per_kv.data() + h * p.dim, v + h * p.dim, p.dim);
    }
    return s;
  }
  const uint32_t group = p.n_query_heads / p.heads;
  float best = -INFINITY;
  for (uint32_t q = 0; q < p.n_query_heads; ++q) {
    best = std::max(best, DotF32(p.raw.data() + q * p.dim, v + (q / group) * p.dim, p.dim));
  }
  return best;
}

double ScoreScalar(const RecoveryQuery& query, const RecoveryIndex::Table& t, size_t row) {
  const float* v = t.exact.data() + row * t.width();
  const uint32_t group = query.n_query_heads / t.heads;
  double total = 0, best = -INFINITY;
  for (uint32_t q = 0; q < query.n_query_heads; ++q) {
    const double d = DotScalar(query.queries.data() + q * t.dim, v + (q / group) * t.dim, t.dim);
    total += d;
    best = std::max(best, d);
  }
  return query.aggregate_max ? best : total / query.n_query_heads;
}

absl::Status CheckShape(const RecoveryQuery& q, const RecoveryIndex::Table& t) {
  if (q.n_query_heads == 0 || q.n_query_heads % t.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n_query_heads: ", q.n_query_heads, " is not a positive multiple of the "
        "summaries' heads (", t.heads, t.heads == 1 ? ")" : " KV heads)"));
  }
  if (q.queries.size() != static_cast<size_t>(q.n_query_heads) * t.dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "queries: has ", q.queries.size(), " floats, expected n_query_heads (",
        q.n_query_heads, ") x dim (", t.dim, ") = ",
        static_cast<size_t>(q.n_query_heads) * t.dim));
  }
  for (float v : q.queries) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError("queries: not all finite");
  }
  return absl::OkStatus();
}

PreparedQuery Prepare(const RecoveryQuery& q, const RecoveryIndex::Table& t) {
  PreparedQuery p;
  p.max = q.aggregate_max;
  p.heads = t.heads;
  p.dim = t.dim;
  p.n_query_heads = q.n_query_heads;
  p.raw = q.queries;
  if (!p.max) {
    p.per_kv.assign(static_cast<size_t>(t.heads) * t.dim, 0.0f);
    const uint32_t group = q.n_query_heads / t.heads;
    const float inv = 1.0f / q.n_query_heads;
    for (uint32_t h = 0; h < q.n_query_heads; ++h) {
      float* dst = p.per_kv.data() + (h / group) * t.dim;
      const float* src = q.queries.data() + h * t.dim;
      for (uint32_t d = 0; d < t.dim; ++d) dst[d] += src[d] * inv;
    }
  }
  const absl::Span<const float> scan = p.max ? p.raw : absl::MakeConstSpan(p.per_kv);
  p.scan_vectors = p.max ? q.n_query_heads : t.heads;
  p.scan_group = p.max ? q.n_query_heads / t.heads : 1;
  // |q| <= qmax and |code| <= 127 over dim terms must fit in int32.
  const float qmax = static_cast<float>(
      std::min<int64_t>(32767, ((int64_t{1} << 31) - 1) / (127 * int64_t{std::max(1u, t.dim)})));
  p.q16.resize(scan.size());
  p.q_scale.resize(p.scan_vectors);
  for (uint32_t v = 0; v < p.scan_vectors; ++v) {
    const float* src = scan.data() + static_cast<size_t>(v) * t.dim;
    float maxabs = 0;
    for (uint32_t d = 0; d < t.dim; ++d) maxabs = std::max(maxabs, std::fabs(src[d]));
    const float scale = maxabs > 0 ? maxabs / qmax : 0.0f;
    p.q_scale[v] = scale;
    int16_t* dst = p.q16.data() + static_cast<size_t>(v) * t.dim;
    for (uint32_t d = 0; d < t.dim; ++d) {
      dst[d] = scale > 0 ? static_cast<int16_t>(std::lround(src[d] / scale)) : 0;
    }
  }
  return p;
}

// Rows per scan task: big enough to amortize a task, small enough that the
// score buffer stays in L1/L2.
constexpr size_t kScanChunkRows = 4096;
// Tables below this many rows are scanned on the calling thread.
constexpr size_t kParallelScanRows = 32768;

// Candidates: the best `keep` (score, row) pairs seen, as a min-heap on score.
class Best {
 public:
  explicit Best(size_t keep) : keep_(keep) { heap_.reserve(keep + 1); }
  void Offer(float score, uint32_t row) {
    if (heap_.size() < keep_) {
      heap_.emplace_back(score, row);
      std::push_heap(heap_.begin(), heap_.end(), Greater);
    } else if (keep_ > 0 && Greater(std::pair(score, row), heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), Greater);
      heap_.back() = {score, row};
      std::push_heap(heap_.begin(), heap_.end(), Greater);
    }
  }
  void Merge(const Best& other) {
    for (const auto& [score, row] : other.heap_) Offer(score, row);
  }
  std::vector<std::pair<float, uint32_t>> Take() { return std::move(heap_); }

 private:
  // Higher score first; on ties the lower row (deterministic results).
  static bool Greater(const std::pair<float, uint32_t>& a, const std::pair<float, uint32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  }
  size_t keep_;
  std::vector<std::pair<float, uint32_t>> heap_;
};

// BestHits sorts scored rows best first (ties: lower row) and returns up to
// query.k of them, stopping below query.min_score when set.
template <typename Score>
std::vector<RecoveryHit> BestHits(const RecoveryQuery& query, const RecoveryIndex::Table& t,
                                  std::vector<std::pair<Score, uint32_t>> scored) {
  // A score that is not a number ranks last (the sort needs an ordering).
  for (auto& [score, row] : scored) {
    if (std::isnan(score)) score = -std::numeric_limits<Score>::infinity();
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<RecoveryHit> hits;
  for (const auto& [score, row] : scored) {
    if (hits.size() == query.k) break;
    if (query.has_min_score && score < query.min_score) break;
    hits.push_back(RecoveryHit{t.ids[row], static_cast<float>(score)});
  }
  return hits;
}

}  // namespace

RecoveryIndex::RecoveryIndex(CopyPool* pool) : pool_(pool) {}
RecoveryIndex::~RecoveryIndex() = default;

std::string SessionScopeKey(absl::string_view ns, absl::string_view session_id) {
  return absl::StrCat("s/", ns.size(), ":", ns, session_id);
}

std::string ModelScopeKey(const FingerprintDigest& digest) {
  return absl::StrCat("m/", digest.ToHex());
}

std::string RecoveryIndex::TableKey(absl::string_view scope, v1::SummaryKind kind,
                                    uint32_t layer) {
  return absl::StrCat(scope, "|", static_cast<int>(kind), "|", layer);
}

namespace {

// The scopes a block's summaries are indexed under: its layout, and its
// session when it is a session block.
std::vector<std::string> ScopesOf(const v1::BlockMeta& meta) {
  std::vector<std::string> scopes = {ModelScopeKey(DigestFingerprint(meta.fingerprint()))};
  if (meta.kind() == v1::BLOCK_KIND_SESSION) {
    scopes.push_back(SessionScopeKey(meta.fingerprint().namespace_(), meta.session_id()));
  }
  return scopes;
}

}  // namespace

void RecoveryIndex::Add(const BlockId& id, const v1::BlockMeta& meta) {
  if (meta.summaries().empty()) return;
  const std::vector<std::string> scopes = ScopesOf(meta);
  absl::MutexLock lock(&mu_);
  for (const v1::Summary& s : meta.summaries()) {
    for (const std::string& scope : scopes) {
      AddToTable(TableKey(scope, s.kind(), s.layer()), id, s);
    }
  }
}

void RecoveryIndex::Remove(const BlockId& id, const v1::BlockMeta& meta) {
  if (meta.summaries().empty()) return;
  const std::vector<std::string> scopes = ScopesOf(meta);
  absl::MutexLock lock(&mu_);
  for (const v1::Summary& s : meta.summaries()) {
    for (const std::string& scope : scopes) {
      RemoveFromTable(TableKey(scope, s.kind(), s.layer()), id);
    }
  }
}

void RecoveryIndex::AddToTable(const std::string& key, const BlockId& id,
                               const v1::Summary& s) {
  // Records come from clients and from disk: a summary without a shape, of
  // the wrong size or with a value that is not finite (NaN would rank first
  // and break the sort's ordering) is never indexed.
  const bool finite = std::all_of(s.values().begin(), s.values().end(),
                                  [](float v) { return std::isfinite(v); });
  if (s.heads() == 0 || s.dim() == 0 || !finite ||
      static_cast<uint64_t>(s.values_size()) != uint64_t{s.heads()} * s.dim()) {
    ++rejected_;
    return;
  }
  std::unique_ptr<Table>& slot = tables_[key];
  if (slot == nullptr) {
    slot = std::make_unique<Table>();
    slot->heads = s.heads();
    slot->dim = s.dim();
  }
  Table& t = *slot;
  // A table holds one shape; a summary of another shape (a client mixing
  // embedding sizes in one scope) replaces nothing and is not indexed.
  if (s.heads() != t.heads || s.dim() != t.dim ||
      static_cast<size_t>(s.values_size()) != t.width()) {
    return;
  }
  if (t.row_of.contains(id)) RemoveFromTable(key, id);
  const size_t row = t.rows();
  t.ids.push_back(id);
  t.row_of[id] = row;
  t.exact.insert(t.exact.end(), s.values().begin(), s.values().end());
  t.codes.resize(t.codes.size() + t.width());
  t.scales.resize(t.scales.size() + t.heads);
  for (uint32_t h = 0; h < t.heads; ++h) {
    const float* v = s.values().data() + h * t.dim;
    float maxabs = 0;
    for (uint32_t d = 0; d < t.dim; ++d) maxabs = std::max(maxabs, std::fabs(v[d]));
    const float scale = maxabs > 0 ? maxabs / 127.0f : 0.0f;
    t.scales[row * t.heads + h] = scale;
    int8_t* c = t.codes.data() + row * t.width() + h * t.dim;
    for (uint32_t d = 0; d < t.dim; ++d) {
      c[d] = scale > 0 ? static_cast<int8_t>(std::lround(v[d] / scale)) : 0;
    }
  }
}

void RecoveryIndex::RemoveFromTable(const std::string& key, const BlockId& id) {
  auto it = tables_.find(key);
  if (it == tables_.end()) return;
  Table& t = *it->second;
  auto r = t.row_of.find(id);
  if (r == t.row_of.end()) return;
  const size_t row = r->second;
  const size_t last = t.rows() - 1;
  if (row != last) {  // Swap the last row into the hole.
    t.ids[row] = t.ids[last];
    t.row_of[t.ids[row]] = row;
    std::copy_n(t.codes.begin() + last * t.width(), t.width(), t.codes.begin() + row * t.width());
    std::copy_n(t.exact.begin() + last * t.width(), t.width(), t.exact.begin() + row * t.width());
    std::copy_n(t.scales.begin() + last * t.heads, t.heads, t.scales.begin() + row * t.heads);
  }
  t.ids.pop_back();
  t.codes.resize(last * t.width());
  t.exact.resize(last * t.width());
  t.scales.resize(last * t.heads);
  t.row_of.erase(id);
  if (t.ids.empty()) tables_.erase(it);
}

uint64_t RecoveryIndex::Rows(absl::string_view scope, v1::SummaryKind kind,
                             uint32_t layer) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = tables_.find(TableKey(scope, kind, layer));
  return it == tables_.end() ? 0 : it->second->rows();
}

absl::StatusOr<std::vector<RecoveryHit>> RecoveryIndex::Search(const RecoveryQuery& query,
                                                               uint64_t* candidates) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = tables_.find(TableKey(query.scope, query.kind, query.layer));
  if (it == tables_.end() || it->second->rows() == 0) {
    return absl::NotFoundError(absl::StrCat(
        "scope: no block of this scope has a ", v1::SummaryKind_Name(query.kind),
        " summary", query.kind == v1::SUMMARY_EMBEDDING ? "" : absl::StrCat(" of layer ", query.layer)));
  }
  const Table& t = *it->second;
  if (absl::Status s = CheckShape(query, t); !s.ok()) return s;
  if (candidates != nullptr) *candidates = t.rows();
  const PreparedQuery p = Prepare(query, t);

  // Scan: approximate scores of every row, chunk by chunk, keeping the best
  // k * oversample + 16 per chunk; large tables in parallel on the pool.
  const size_t keep = static_cast<size_t>(query.k) * std::max(1u, query.oversample) + 16;
  const size_t chunks = (t.rows() + kScanChunkRows - 1) / kScanChunkRows;
  std::vector<Best> best(chunks, Best(keep));
  auto scan_chunk = [&](size_t chunk) {
    const size_t begin = chunk * kScanChunkRows;
    const size_t end = std::min(t.rows(), begin + kScanChunkRows);
    float scores[kScanChunkRows];
    ScanRows(p.q16.data(), p.q_scale.data(), p.scan_group, t.codes.data(),
             t.scales.data(), t.heads, t.dim, begin, end, p.max, scores);
    for (size_t row = begin; row < end; ++row) {
      if (query.exclude != nullptr && query.exclude->contains(t.ids[row])) continue;
      best[chunk].Offer(scores[row - begin], static_cast<uint32_t>(row));
    }
  };
  if (pool_ != nullptr && t.rows() >= kParallelScanRows) {
    pool_->ParallelFor(chunks, scan_chunk);
  } else {
    for (size_t c = 0; c < chunks; ++c) scan_chunk(c);
  }
  for (size_t c = 1; c < chunks; ++c) best[0].Merge(best[c]);
  // Rescore the survivors exactly in f32, take the best k.
  std::vector<std::pair<float, uint32_t>> scored = best[0].Take();
  for (auto& [score, row] : scored) score = ScoreExact(p, t, row);
  return BestHits(query, t, std::move(scored));
}

absl::StatusOr<std::vector<RecoveryHit>> RecoveryIndex::SearchExact(
    const RecoveryQuery& query) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = tables_.find(TableKey(query.scope, query.kind, query.layer));
  if (it == tables_.end() || it->second->rows() == 0) {
    return absl::NotFoundError("scope: no such summaries");
  }
  const Table& t = *it->second;
  if (absl::Status s = CheckShape(query, t); !s.ok()) return s;
  std::vector<std::pair<double, uint32_t>> scored;
  for (size_t row = 0; row < t.rows(); ++row) {
    if (query.exclude != nullptr && query.exclude->contains(t.ids[row])) continue;
    scored.emplace_back(ScoreScalar(query, t, row), static_cast<uint32_t>(row));
  }
  return BestHits(query, t, std::move(scored));
}

}  // namespace evoke
