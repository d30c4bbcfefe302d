#include "storage/recovery_index.h"

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

// The scan's inner loop. The compiler builds it for AVX-512, AVX2 and the
// baseline and picks one at run time; `omp simd` allows the reassociation
// that vectorizing a float reduction needs (-fopenmp-simd, no OpenMP
// runtime).
__attribute__((target_clones("avx512f", "avx2", "default")))
float DotI8(const float* q, const int8_t* c, uint32_t n) {
  float acc = 0;
#pragma omp simd reduction(+ : acc)
  for (uint32_t i = 0; i < n; ++i) acc += q[i] * static_cast<float>(c[i]);
  return acc;
}

__attribute__((target_clones("avx512f", "avx2", "default")))
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
};

float ScoreApprox(const PreparedQuery& p, const RecoveryIndex::Table& t, size_t row) {
  const int8_t* codes = t.codes.data() + row * t.width();
  const float* scales = t.scales.data() + row * t.heads;
  if (!p.max) {
    float s = 0;
    for (uint32_t h = 0; h < p.heads; ++h) {
      s += scales[h] * DotI8(p.per_kv.data() + h * p.dim, codes + h * p.dim, p.dim);
    }
    return s;
  }
  const uint32_t group = p.n_query_heads / p.heads;
  float best = -INFINITY;
  for (uint32_t q = 0; q < p.n_query_heads; ++q) {
    const uint32_t h = q / group;
    best = std::max(best, scales[h] * DotI8(p.raw.data() + q * p.dim, codes + h * p.dim, p.dim));
  }
  return best;
}

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
  return p;
}

}  // namespace

RecoveryIndex::RecoveryIndex() = default;
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

void RecoveryIndex::Add(const BlockId& id, const v1::BlockMeta& meta) {
  if (meta.summaries().empty()) return;
  std::vector<std::string> scopes = {ModelScopeKey(DigestFingerprint(meta.fingerprint()))};
  if (meta.kind() == v1::BLOCK_KIND_SESSION) {
    scopes.push_back(SessionScopeKey(meta.fingerprint().namespace_(), meta.session_id()));
  }
  absl::MutexLock lock(&mu_);
  for (const v1::Summary& s : meta.summaries()) {
    for (const std::string& scope : scopes) {
      AddToTable(TableKey(scope, s.kind(), s.layer()), id, s);
    }
  }
}

void RecoveryIndex::Remove(const BlockId& id, const v1::BlockMeta& meta) {
  if (meta.summaries().empty()) return;
  std::vector<std::string> scopes = {ModelScopeKey(DigestFingerprint(meta.fingerprint()))};
  if (meta.kind() == v1::BLOCK_KIND_SESSION) {
    scopes.push_back(SessionScopeKey(meta.fingerprint().namespace_(), meta.session_id()));
  }
  absl::MutexLock lock(&mu_);
  for (const v1::Summary& s : meta.summaries()) {
    for (const std::string& scope : scopes) {
      RemoveFromTable(TableKey(scope, s.kind(), s.layer()), id);
    }
  }
}

void RecoveryIndex::AddToTable(const std::string& key, const BlockId& id,
                               const v1::Summary& s) {
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

  // Scan: approximate scores of every row.
  std::vector<std::pair<float, uint32_t>> scored;
  scored.reserve(t.rows());
  for (size_t row = 0; row < t.rows(); ++row) {
    if (query.exclude != nullptr && query.exclude->contains(t.ids[row])) continue;
    scored.emplace_back(ScoreApprox(p, t, row), static_cast<uint32_t>(row));
  }
  // Keep the best few, rescore them exactly, take the best k.
  const size_t keep = std::min<size_t>(
      scored.size(), static_cast<size_t>(query.k) * std::max(1u, query.oversample) + 16);
  std::nth_element(scored.begin(), scored.begin() + keep, scored.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  scored.resize(keep);
  for (auto& [score, row] : scored) score = ScoreExact(p, t, row);
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<RecoveryHit> hits;
  for (const auto& [score, row] : scored) {
    if (hits.size() == query.k) break;
    if (query.has_min_score && score < query.min_score) break;
    hits.push_back(RecoveryHit{t.ids[row], score});
  }
  return hits;
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

}  // namespace evoke
