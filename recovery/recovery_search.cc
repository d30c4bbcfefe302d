// RecoveryIndex's search: the scan kernels (integer dot products turned into
// score bounds), pass 1 (every row's bounds, the survivors) and pass 2 (exact
// scores of the survivors), Search and SearchExact. The index's maintenance
// is in recovery_index.cc.
#include "recovery/recovery_index.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fingerprint.h"
#include "recovery/bounds.h"
#include "recovery/recovery_index_impl.h"


namespace evoke {

using recovery::HeadCode;
using recovery_internal::kScanChunkRows;
using recovery_internal::kExactBatch;
using recovery_internal::kParallelScanRows;
using Table = RecoveryIndex::Table;
using View = RecoveryIndex::View;

namespace {

// The scan's kernel: for rows [0, n), the integer dot products of the
// query's int16 codes with each row's int8 codes (exact in int32: the bound
// on the query's range keeps dim * 127 * qmax below 2^31), turned into each
// row's score bounds [lo, hi] (recovery::RowBounds, in f64). The compiler
// builds the kernel for x86-64-v4 (AVX-512BW), v3 (AVX2) and the baseline
// and picks one at run time.
//
// Query vectors come `group` per KV head, in head order: MEAN has one per KV
// head (group 1), summed; MAX has every query head, best one wins.
#if defined(__x86_64__)
#define EVOKE_SCAN_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define EVOKE_SCAN_CLONES
#endif

// Integer dot product; GCC turns this loop into pmaddwd (int16 pairs summed
// into int32) for every clone. No `omp simd` here: integer sums reassociate
// freely, and the pragma makes GCC pick a worse pattern.
__attribute__((always_inline)) inline int32_t DotI16I8(const int16_t* __restrict q,
                                                       const int8_t* __restrict c,
                                                       uint32_t n) {
  int32_t acc = 0;
  for (uint32_t d = 0; d < n; ++d) {
    acc += static_cast<int32_t>(q[d]) * static_cast<int32_t>(static_cast<int16_t>(c[d]));
  }
  return acc;
}

// One row's bounds (inlined into each clone of the kernels).
__attribute__((always_inline)) inline void BoundRow(const recovery::ScanQuery& sq,
                                                    const int8_t* c, const HeadCode* hc,
                                                    int32_t* dots, double* lo, double* hi) {
  const int16_t* qv = sq.u.data();
  if (sq.dim == 128) {  // The common head_dim: a fixed trip count unrolls.
    for (uint32_t h = 0, g = 0; h < sq.heads; ++h) {
      for (uint32_t j = 0; j < sq.group; ++j, ++g, qv += 128) {
        dots[g] = DotI16I8(qv, c + static_cast<size_t>(h) * 128, 128);
      }
    }
  } else {
    for (uint32_t h = 0, g = 0; h < sq.heads; ++h) {
      for (uint32_t j = 0; j < sq.group; ++j, ++g, qv += sq.dim) {
        dots[g] = DotI16I8(qv, c + static_cast<size_t>(h) * sq.dim, sq.dim);
      }
    }
  }
  recovery::RowBounds(sq, dots, hc, lo, hi);
}

// n rows of a table chunk, in place.
EVOKE_SCAN_CLONES
void BoundRows(const recovery::ScanQuery& sq, const int8_t* codes, const HeadCode* hc,
               size_t n, int32_t* dots, double* lo, double* hi) {
  const size_t width = static_cast<size_t>(sq.heads) * sq.dim;
  for (size_t row = 0; row < n; ++row) {
    BoundRow(sq, codes + row * width, hc + row * sq.heads, dots, lo + row, hi + row);
  }
}

// n rows of a view, through their references (each with its table's query).
EVOKE_SCAN_CLONES
void BoundRefs(const recovery::ScanQuery* const* sq, const int8_t* const* codes,
               const HeadCode* const* hc, size_t n, int32_t* dots, double* lo, double* hi) {
  for (size_t i = 0; i < n; ++i) {
    // The next rows are elsewhere in memory: start loading them now.
    if (i + 2 < n) __builtin_prefetch(codes[i + 2]);
    BoundRow(*sq[i], codes[i], hc[i], dots, lo + i, hi + i);
  }
}

absl::Status CheckShape(const RecoveryQuery& q, const RecoveryIndex::Scan& t) {
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

recovery::ExactQuery PrepareExact(const RecoveryQuery& q, const RecoveryIndex::Scan& t) {
  return recovery::MakeExactQuery(q.aggregate_max, t.heads, t.dim, q.n_query_heads,
                                  q.queries.data());
}

// The answer's order: score descending, then BlockId ascending.
struct Scored {
  double score;
  BlockId id;
};
bool Better(const Scored& a, const Scored& b) {
  return a.score != b.score ? a.score > b.score : a.id < b.id;
}

// TopK keeps the best k Scored (a heap whose front is the worst kept).
class TopK {
 public:
  explicit TopK(size_t k) : k_(k) { heap_.reserve(std::min<size_t>(k, 4096) + 1); }
  bool full() const { return k_ > 0 && heap_.size() == k_; }
  const Scored& worst() const { return heap_.front(); }
  void Offer(const Scored& s) {
    if (k_ == 0) return;
    if (heap_.size() < k_) {
      heap_.push_back(s);
      std::push_heap(heap_.begin(), heap_.end(), Better);
    } else if (Better(s, heap_.front())) {
      std::pop_heap(heap_.begin(), heap_.end(), Better);
      heap_.back() = s;
      std::push_heap(heap_.begin(), heap_.end(), Better);
    }
  }
  std::vector<RecoveryHit> Hits() {
    std::sort(heap_.begin(), heap_.end(), Better);
    std::vector<RecoveryHit> hits;
    hits.reserve(heap_.size());
    for (const Scored& s : heap_) hits.push_back(RecoveryHit{s.id, static_cast<float>(s.score)});
    return hits;
  }

 private:
  size_t k_;
  std::vector<Scored> heap_;
};

// LowerK keeps the `keep` largest lower bounds seen: tau(), the smallest of
// them once `keep` were seen, is then a lower bound of the keep-th best
// exact score.
class LowerK {
 public:
  explicit LowerK(size_t keep) : keep_(keep) {}
  double tau() const {
    return keep_ > 0 && heap_.size() == keep_ ? heap_.front() : -INFINITY;
  }
  void Offer(double lo) {
    if (keep_ == 0) return;
    if (heap_.size() < keep_) {
      heap_.push_back(lo);
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    } else if (lo > heap_.front()) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
      heap_.back() = lo;
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    }
  }
  void Merge(const LowerK& other) {
    for (double lo : other.heap_) Offer(lo);
  }

 private:
  size_t keep_;
  std::vector<double> heap_;  // Min-heap.
};

// A row that survived the bounds: its upper bound and its row in the scan.
struct Candidate {
  double hi;
  uint32_t row;
};

}  // namespace

namespace {

// Pass 1 of Search: every row's bounds; returns the rows that may be in the
// answer (U >= tau, U >= min_score), by U descending. Excluded rows are not
// looked up here (a hash lookup per row would cost more than its bounds):
// tau is the (k + |exclude|)-th largest L, a lower bound of the k-th best
// score among the rows not excluded, and the exact pass skips them.
std::vector<Candidate> Survivors(const RecoveryQuery& query, const RecoveryIndex::Scan& t,
                                 const recovery::ExactQuery& eq, CopyPool* pool) {
  const size_t rows = t.rows();
  const size_t chunks = (rows + kScanChunkRows - 1) / kScanChunkRows;
  const size_t keep =
      static_cast<size_t>(query.k) + (query.exclude != nullptr ? query.exclude->size() : 0);
  // A scan query per table the rows are in (a view's may span layouts).
  std::vector<std::pair<const Table*, std::unique_ptr<recovery::ScanQuery>>> queries;
  auto query_of = [&](const Table* table) -> const recovery::ScanQuery* {
    for (const auto& [tb, sq] : queries) {
      if (tb == table) return sq.get();
    }
    queries.emplace_back(table, std::make_unique<recovery::ScanQuery>(
                                    recovery::MakeScanQuery(eq, table->sigma.data())));
    return queries.back().second.get();
  };
  std::vector<const recovery::ScanQuery*> ref_queries;
  if (t.table != nullptr) {
    query_of(t.table);
  } else {
    ref_queries.resize(rows);
    const Table* last = nullptr;
    const recovery::ScanQuery* last_q = nullptr;
    for (size_t i = 0; i < rows; ++i) {
      const Table* tb = t.view->table[i];
      if (tb != last) {
        last = tb;
        last_q = query_of(tb);
      }
      ref_queries[i] = last_q;
    }
  }
  const bool parallel = pool != nullptr && rows >= kParallelScanRows;
  struct Part {
    explicit Part(size_t keep) : lower(keep) {}
    LowerK lower;
    std::vector<Candidate> out;
  };
  std::vector<Part> parts(parallel ? chunks : 1, Part(keep));
  const double min_score =
      query.has_min_score ? static_cast<double>(query.min_score) : -INFINITY;
  auto scan_chunk = [&](size_t chunk) {
    Part& part = parts[parallel ? chunk : 0];
    const size_t begin = chunk * kScanChunkRows;
    const size_t n = std::min(rows, begin + kScanChunkRows) - begin;
    // On the heap: a server thread's stack may be small.
    std::vector<double> lo(n), hi(n);
    std::vector<int32_t> dots(eq.vectors());
    if (t.table != nullptr) {
      const Table::Chunk& c = t.table->chunks[chunk];
      BoundRows(*queries[0].second, c.codes.data(), c.hc.data(), n, dots.data(), lo.data(),
                hi.data());
    } else {
      std::vector<const int8_t*> codes(n);
      std::vector<const HeadCode*> hc(n);
      for (size_t i = 0; i < n; ++i) {
        codes[i] = t.codes(begin + i);
        hc[i] = t.hc(begin + i);
      }
      BoundRefs(ref_queries.data() + begin, codes.data(), hc.data(), n, dots.data(), lo.data(),
                hi.data());
    }
    for (size_t i = 0; i < n; ++i) {
      part.lower.Offer(lo[i]);
      if (hi[i] >= part.lower.tau() && hi[i] >= min_score) {
        part.out.push_back(Candidate{hi[i], static_cast<uint32_t>(begin + i)});
      }
    }
  };
  if (parallel) {
    pool->ParallelFor(chunks, scan_chunk);
  } else {
    for (size_t c = 0; c < chunks; ++c) scan_chunk(c);
  }
  for (size_t p = 1; p < parts.size(); ++p) parts[0].lower.Merge(parts[p].lower);
  const double tau = parts[0].lower.tau();
  std::vector<Candidate> out;
  for (const Part& part : parts) {
    for (const Candidate& c : part.out) {
      if (c.hi >= tau) out.push_back(c);
    }
  }
  std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return a.hi != b.hi ? a.hi > b.hi : a.row < b.row;
  });
  return out;
}

bool Excluded(const RecoveryQuery& query, const BlockId& id) {
  return query.exclude != nullptr && query.exclude->contains(id);
}

// Scores `ids` (in that order) with values from `source`, kExactBatch at a
// time, into `top`, until `stop(i)` says that row i and every later one
// cannot enter the answer. Returns the rows scored.
template <typename Stop>
uint64_t ScoreThroughSource(const ExactSource& source, const RecoveryQuery& query,
                            const recovery::ExactQuery& eq, absl::Span<const BlockId> ids,
                            Stop stop, TopK* top) {
  const size_t width = static_cast<size_t>(eq.heads) * eq.dim;
  std::vector<float> values(kExactBatch * width);
  uint8_t found[kExactBatch];
  uint64_t scored = 0;
  for (size_t i = 0; i < ids.size() && !stop(i); i += kExactBatch) {
    const size_t n = std::min(kExactBatch, ids.size() - i);
    std::fill(found, found + n, uint8_t{0});
    source(ExactRows{query.kind, query.layer, eq.heads, eq.dim, ids.subspan(i, n),
                     values.data(), found});
    for (size_t j = 0; j < n; ++j) {
      if (found[j] == 0) continue;  // Gone since the scan.
      const float* v = values.data() + j * width;
      // Values from outside: the same rule as Add (a NaN would break the order).
      if (!std::all_of(v, v + width, [](float x) { return std::isfinite(x); })) continue;
      const double score = recovery::ExactScore(eq, v);
      ++scored;
      if (query.has_min_score && score < query.min_score) continue;
      top->Offer(Scored{score, ids[i + j]});
    }
  }
  return scored;
}

absl::Status NoSuchScope(const RecoveryQuery& query) {
  return absl::NotFoundError(absl::StrCat(
      "scope: no block of this scope has a ", v1::SummaryKind_Name(query.kind), " summary",
      query.kind == v1::SUMMARY_EMBEDDING ? "" : absl::StrCat(" of layer ", query.layer)));
}

}  // namespace

absl::StatusOr<std::vector<RecoveryHit>> RecoveryIndex::Search(const RecoveryQuery& query,
                                                               uint64_t* candidates,
                                                               uint64_t* rescored) const {
  TopK top(query.k);
  recovery::ExactQuery eq;
  // The exact pass's rows, in U-descending order (with a source).
  std::vector<double> hi;
  std::vector<BlockId> ids;
  uint64_t scored = 0;
  {
    absl::ReaderMutexLock lock(&mu_);
    Scan t;
    if (!Find(query, &t)) return NoSuchScope(query);
    if (absl::Status s = CheckShape(query, t); !s.ok()) return s;
    if (candidates != nullptr) *candidates = t.rows();
    if (rescored != nullptr) *rescored = 0;
    if (query.k == 0) return std::vector<RecoveryHit>();
    eq = PrepareExact(query, t);
    const std::vector<Candidate> survivors = Survivors(query, t, eq, pool_);
    if (exact_ == nullptr) {
      // The index's own copy: the exact pass under the lock.
      for (const Candidate& c : survivors) {
        // Every later row has S <= U < the k-th exact score (or min_score).
        if (top.full() && c.hi < top.worst().score) break;
        if (query.has_min_score && c.hi < query.min_score) break;
        const BlockId& id = t.id(c.row);
        if (Excluded(query, id)) continue;
        const double score = recovery::ExactScore(eq, t.exact(c.row));
        ++scored;
        if (query.has_min_score && score < query.min_score) continue;
        top.Offer(Scored{score, id});
      }
      if (rescored != nullptr) *rescored = scored;
      return top.Hits();
    }
    hi.reserve(survivors.size());
    ids.reserve(survivors.size());
    for (const Candidate& c : survivors) {
      const BlockId& id = t.id(c.row);
      if (Excluded(query, id)) continue;
      hi.push_back(c.hi);
      ids.push_back(id);
    }
  }
  // The lock is released: the source may take the engine's lock, under
  // which the engine calls Add and Remove.
  scored = ScoreThroughSource(
      exact_, query, eq, ids,
      [&](size_t i) {
        return (top.full() && hi[i] < top.worst().score) ||
               (query.has_min_score && hi[i] < query.min_score);
      },
      &top);
  if (rescored != nullptr) *rescored = scored;
  return top.Hits();
}

absl::StatusOr<std::vector<RecoveryHit>> RecoveryIndex::SearchExact(
    const RecoveryQuery& query) const {
  TopK top(query.k);
  recovery::ExactQuery eq;
  std::vector<BlockId> ids;
  {
    absl::ReaderMutexLock lock(&mu_);
    Scan t;
    if (!Find(query, &t)) return absl::NotFoundError("scope: no such summaries");
    if (absl::Status s = CheckShape(query, t); !s.ok()) return s;
    eq = PrepareExact(query, t);
    for (size_t row = 0; row < t.rows(); ++row) {
      const BlockId& id = t.id(row);
      if (Excluded(query, id)) continue;
      if (exact_ != nullptr) {
        ids.push_back(id);
        continue;
      }
      const double score = recovery::ExactScore(eq, t.exact(row));
      if (query.has_min_score && score < query.min_score) continue;
      top.Offer(Scored{score, id});
    }
  }
  if (exact_ != nullptr) {
    ScoreThroughSource(exact_, query, eq, ids, [](size_t) { return false; }, &top);
  }
  return top.Hits();
}

}  // namespace evoke
