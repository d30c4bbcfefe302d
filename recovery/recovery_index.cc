#include "recovery/recovery_index.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fingerprint.h"

namespace evoke {

namespace {

// Rows per scan task and per storage chunk: big enough to amortize a task,
// small enough that the score buffer stays in L1/L2. Storing rows in chunks
// of this size bounds the spare capacity of a table to one chunk, and a
// growing table never copies (or briefly holds twice) all of its rows.
constexpr size_t kScanChunkRows = 4096;
// Tables below this many rows are scanned on the calling thread.
constexpr size_t kParallelScanRows = 32768;

}  // namespace

// A layout scope's rows of one kind and layer: the only copy of each
// summary. Row r is row r % kScanChunkRows of chunk r / kScanChunkRows.
struct RecoveryIndex::Table {
  struct Chunk {
    std::vector<int8_t> codes;  // rows x heads x dim
    std::vector<float> scales;  // rows x heads
    std::vector<float> exact;   // rows x heads x dim
  };
  std::string key;  // In tables_.
  uint32_t heads = 0;
  uint32_t dim = 0;
  std::vector<BlockId> ids;
  std::vector<Chunk> chunks;
  // Per row: the session view that lists it too (null if none) and where.
  std::vector<View*> view;
  std::vector<uint32_t> view_pos;

  size_t rows() const { return ids.size(); }
  size_t width() const { return static_cast<size_t>(heads) * dim; }
  const Chunk& chunk_of(size_t r) const { return chunks[r / kScanChunkRows]; }
  Chunk& chunk_of(size_t r) { return chunks[r / kScanChunkRows]; }
  const int8_t* codes(size_t r) const {
    return chunk_of(r).codes.data() + (r % kScanChunkRows) * width();
  }
  const float* scales(size_t r) const {
    return chunk_of(r).scales.data() + (r % kScanChunkRows) * heads;
  }
  const float* exact(size_t r) const {
    return chunk_of(r).exact.data() + (r % kScanChunkRows) * width();
  }
};

// A session scope's rows of one kind and layer: references to the rows of
// its blocks' layout tables (a session's blocks may span layouts of one
// shape).
struct RecoveryIndex::View {
  std::string key;  // In views_.
  uint32_t heads = 0;
  uint32_t dim = 0;
  std::vector<Table*> table;
  std::vector<uint32_t> row;

  size_t rows() const { return row.size(); }
};

// What a search scans: a table's rows in place, or a view's through their
// references.
struct RecoveryIndex::Scan {
  const Table* table = nullptr;
  const View* view = nullptr;
  uint32_t heads = 0;
  uint32_t dim = 0;

  size_t rows() const { return table != nullptr ? table->rows() : view->rows(); }
  size_t width() const { return static_cast<size_t>(heads) * dim; }
  const BlockId& id(size_t i) const {
    return table != nullptr ? table->ids[i] : view->table[i]->ids[view->row[i]];
  }
  const float* exact(size_t i) const {
    return table != nullptr ? table->exact(i) : view->table[i]->exact(view->row[i]);
  }
  // A view's row i.
  const int8_t* codes(size_t i) const { return view->table[i]->codes(view->row[i]); }
  const float* scales(size_t i) const { return view->table[i]->scales(view->row[i]); }
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

// One row's approximate score (inlined into each clone of the kernels).
__attribute__((always_inline)) inline float ScanRow(const int16_t* q, const float* q_scale,
                                                    uint32_t group, const int8_t* c,
                                                    const float* sc, uint32_t heads,
                                                    uint32_t dim, bool max) {
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
  return max ? best : total;
}

// Rows [begin, end) of a table, in place.
EVOKE_SCAN_CLONES
void ScanRows(const int16_t* q, const float* q_scale, uint32_t group,
              const int8_t* codes, const float* scales, uint32_t heads, uint32_t dim,
              size_t begin, size_t end, bool max, float* out) {
  const size_t width = static_cast<size_t>(heads) * dim;
  for (size_t row = begin; row < end; ++row) {
    out[row - begin] = ScanRow(q, q_scale, group, codes + row * width, scales + row * heads,
                               heads, dim, max);
  }
}

// n rows of a view, through their references.
EVOKE_SCAN_CLONES
void ScanRefs(const int16_t* q, const float* q_scale, uint32_t group,
              const int8_t* const* codes, const float* const* scales, uint32_t heads,
              uint32_t dim, size_t n, bool max, float* out) {
  for (size_t i = 0; i < n; ++i) {
    // The next rows are elsewhere in memory: start loading them now.
    if (i + 2 < n) __builtin_prefetch(codes[i + 2]);
    out[i] = ScanRow(q, q_scale, group, codes[i], scales[i], heads, dim, max);
  }
}

EVOKE_DOT_CLONES
float DotF32(const float* q, const float* v, uint32_t n) {
  float acc = 0;
#pragma omp simd reduction(+ : acc)
  for (uint32_t i = 0; i < n; ++i) acc += q[i] * v[i];
  return acc;
}

// The plain scalar loop the benchmarks compare with (no vectorization;
// GCC's attribute; clang has no equivalent and vectorizes as it likes).
#if !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
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

float ScoreExact(const PreparedQuery& p, const float* v) {
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

double ScoreScalar(const RecoveryQuery& query, const RecoveryIndex::Scan& t, size_t row) {
  const float* v = t.exact(row);
  const uint32_t group = query.n_query_heads / t.heads;
  double total = 0, best = -INFINITY;
  for (uint32_t q = 0; q < query.n_query_heads; ++q) {
    const double d = DotScalar(query.queries.data() + q * t.dim, v + (q / group) * t.dim, t.dim);
    total += d;
    best = std::max(best, d);
  }
  return query.aggregate_max ? best : total / query.n_query_heads;
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

PreparedQuery Prepare(const RecoveryQuery& q, const RecoveryIndex::Scan& t) {
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
std::vector<RecoveryHit> BestHits(const RecoveryQuery& query, const RecoveryIndex::Scan& t,
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
    hits.push_back(RecoveryHit{t.id(row), static_cast<float>(score)});
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

using Table = RecoveryIndex::Table;
using View = RecoveryIndex::View;
using BlockSlots = absl::InlinedVector<RecoveryIndex::Slot, 1>;

// What memory_bytes() counts is what the index has allocated: every
// vector's capacity (summary values, codes and scales in the tables'
// chunks; ids and view references per row; a view's references), the
// blocks_ map's slots and the slot lists that do not fit inline, and per
// table or view its struct, key and map entry. Only malloc's own headers
// and the small tables_/views_ maps' spare slots are left out.
template <typename T>
uint64_t Cap(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

uint64_t ChunkBytes(const Table::Chunk& c) {
  return Cap(c.codes) + Cap(c.scales) + Cap(c.exact);
}

// A table's per-row vectors (its chunks are counted as they change).
uint64_t RowVectorBytes(const Table& t) {
  return Cap(t.ids) + Cap(t.chunks) + Cap(t.view) + Cap(t.view_pos);
}

uint64_t ViewBytes(const View& v) { return Cap(v.table) + Cap(v.row); }

template <typename T>
uint64_t ScopeBytes(const T& scope) {
  // The struct, its key if not inline, and its entry in tables_ / views_.
  return sizeof(T) + (scope.key.capacity() > 15 ? scope.key.capacity() + 1 : 0) +
         sizeof(std::pair<const std::string, std::unique_ptr<T>>) + 1;
}

uint64_t SlotHeapBytes(const BlockSlots& slots) {
  return slots.capacity() > 1 ? slots.capacity() * sizeof(RecoveryIndex::Slot) : 0;
}

// A map's slots and control bytes.
template <typename Map>
uint64_t MapBytes(const Map& m) {
  return m.capacity() * (sizeof(typename Map::value_type) + 1);
}

// Records come from clients and from disk: a summary without a shape, of
// the wrong size or with a value that is not finite (NaN would rank first
// and break the sort's ordering) is never indexed.
bool Indexable(const v1::Summary& s) {
  const bool finite = std::all_of(s.values().begin(), s.values().end(),
                                  [](float v) { return std::isfinite(v); });
  return s.heads() != 0 && s.dim() != 0 && finite &&
         static_cast<uint64_t>(s.values_size()) == uint64_t{s.heads()} * s.dim();
}

// The summaries Add indexes: of those that repeat a kind and layer, the last.
std::vector<int> LastOfEachKindAndLayer(const v1::BlockMeta& meta) {
  std::vector<int> keep;
  keep.reserve(meta.summaries_size());
  if (meta.summaries_size() <= 1) {
    if (meta.summaries_size() == 1) keep.push_back(0);
    return keep;
  }
  absl::flat_hash_map<std::pair<int, uint32_t>, int> last;
  for (int i = 0; i < meta.summaries_size(); ++i) {
    const v1::Summary& s = meta.summaries(i);
    last[{static_cast<int>(s.kind()), s.layer()}] = i;
  }
  for (int i = 0; i < meta.summaries_size(); ++i) {
    const v1::Summary& s = meta.summaries(i);
    if (last[{static_cast<int>(s.kind()), s.layer()}] == i) keep.push_back(i);
  }
  return keep;
}

// Vectors that shrank to a quarter of their capacity give the rest back.
template <typename T>
void MaybeShrink(std::vector<T>& v) {
  if (v.capacity() >= 64 && v.size() < v.capacity() / 4) v.shrink_to_fit();
}

// Makes room for one more row in chunk `c` that holds `rows` rows: its
// capacity grows by half (not double: summaries can be large), up to a
// whole chunk.
void ReserveRow(Table::Chunk& c, size_t rows, size_t width, uint32_t heads) {
  if ((rows + 1) * width <= c.exact.capacity()) return;
  const size_t want = std::min(kScanChunkRows, std::max(rows + 1, rows + rows / 2));
  c.codes.reserve(want * width);
  c.exact.reserve(want * width);
  c.scales.reserve(want * heads);
}

}  // namespace

uint64_t RecoveryIndex::AccountedBytes(const v1::BlockMeta& meta) {
  const bool session = meta.kind() == v1::BLOCK_KIND_SESSION;
  const uint64_t n = static_cast<uint64_t>(meta.summaries_size());
  uint64_t bytes = sizeof(std::pair<const BlockId, BlockSlots>) + 1 +
                   (n > 1 ? n * sizeof(Slot) : 0);
  for (const v1::Summary& s : meta.summaries()) {
    const uint64_t values = static_cast<uint64_t>(s.values_size());
    bytes += values * (sizeof(float) + sizeof(int8_t)) +
             std::min<uint64_t>(s.heads(), values) * sizeof(float) + sizeof(BlockId) +
             sizeof(View*) + sizeof(uint32_t);
    if (session) bytes += sizeof(Table*) + sizeof(uint32_t);
  }
  return bytes;
}

void RecoveryIndex::Add(const BlockId& id, const v1::BlockMeta& meta) {
  const std::vector<int> keep = LastOfEachKindAndLayer(meta);
  const bool session = meta.kind() == v1::BLOCK_KIND_SESSION;
  const std::string model_scope =
      keep.empty() ? std::string() : ModelScopeKey(DigestFingerprint(meta.fingerprint()));
  const std::string session_scope =
      keep.empty() || !session
          ? std::string()
          : SessionScopeKey(meta.fingerprint().namespace_(), meta.session_id());
  absl::MutexLock lock(&mu_);
  // The meta is the block's whole truth: what the id indexed before goes,
  // including kinds, layers or scopes this meta no longer has.
  RemoveLocked(id);
  BlockSlots slots;
  for (int i : keep) {
    const v1::Summary& s = meta.summaries(i);
    if (!Indexable(s)) {
      rejected_ += session ? 2 : 1;  // Per scope it would have gone to.
      continue;
    }
    std::unique_ptr<Table>& t_slot = tables_[TableKey(model_scope, s.kind(), s.layer())];
    if (t_slot == nullptr) {
      t_slot = std::make_unique<Table>();
      t_slot->key = TableKey(model_scope, s.kind(), s.layer());
      t_slot->heads = s.heads();
      t_slot->dim = s.dim();
      bytes_ += ScopeBytes(*t_slot);
    }
    Table* t = t_slot.get();
    // A table holds one shape; a summary of another shape (a client mixing
    // embedding sizes in one scope) is not indexed.
    if (s.heads() != t->heads || s.dim() != t->dim) continue;
    const uint64_t vectors_before = RowVectorBytes(*t);
    const uint32_t row = static_cast<uint32_t>(t->rows());
    const size_t in_chunk = row % kScanChunkRows;
    if (in_chunk == 0) t->chunks.emplace_back();
    Table::Chunk& c = t->chunks.back();
    const uint64_t chunk_before = ChunkBytes(c);
    ReserveRow(c, in_chunk, t->width(), t->heads);
    c.exact.insert(c.exact.end(), s.values().begin(), s.values().end());
    c.codes.resize(c.codes.size() + t->width());
    c.scales.resize(c.scales.size() + t->heads);
    for (uint32_t h = 0; h < t->heads; ++h) {
      const float* v = s.values().data() + h * t->dim;
      float maxabs = 0;
      for (uint32_t d = 0; d < t->dim; ++d) maxabs = std::max(maxabs, std::fabs(v[d]));
      const float scale = maxabs > 0 ? maxabs / 127.0f : 0.0f;
      c.scales[in_chunk * t->heads + h] = scale;
      int8_t* code = c.codes.data() + in_chunk * t->width() + h * t->dim;
      for (uint32_t d = 0; d < t->dim; ++d) {
        code[d] = scale > 0 ? static_cast<int8_t>(std::lround(v[d] / scale)) : 0;
      }
    }
    t->ids.push_back(id);
    t->view.push_back(nullptr);
    t->view_pos.push_back(0);
    // Unsigned deltas: the sum comes out right even when a term shrinks.
    bytes_ += ChunkBytes(c) - chunk_before;
    bytes_ += RowVectorBytes(*t) - vectors_before;
    slots.push_back(Slot{t, row});
    if (!session) continue;
    std::unique_ptr<View>& v_slot = views_[TableKey(session_scope, s.kind(), s.layer())];
    if (v_slot == nullptr) {
      v_slot = std::make_unique<View>();
      v_slot->key = TableKey(session_scope, s.kind(), s.layer());
      v_slot->heads = s.heads();
      v_slot->dim = s.dim();
      bytes_ += ScopeBytes(*v_slot);
    }
    View* v = v_slot.get();
    // A session whose blocks span layouts of different summary shapes:
    // its view keeps the first shape.
    if (s.heads() != v->heads || s.dim() != v->dim) continue;
    const uint64_t view_before = ViewBytes(*v);
    t->view[row] = v;
    t->view_pos[row] = static_cast<uint32_t>(v->rows());
    v->table.push_back(t);
    v->row.push_back(row);
    bytes_ += ViewBytes(*v) - view_before;
  }
  if (!slots.empty()) {
    const uint64_t map_before = MapBytes(blocks_);
    auto [it, inserted] = blocks_.emplace(id, std::move(slots));
    bytes_ += MapBytes(blocks_) - map_before + SlotHeapBytes(it->second);
  }
}

void RecoveryIndex::Remove(const BlockId& id, const v1::BlockMeta& /*meta*/) {
  absl::MutexLock lock(&mu_);
  RemoveLocked(id);
}

void RecoveryIndex::RemoveLocked(const BlockId& id) {
  auto it = blocks_.find(id);
  if (it == blocks_.end()) return;
  const BlockSlots slots = std::move(it->second);
  bytes_ -= SlotHeapBytes(slots);
  blocks_.erase(it);
  if (blocks_.empty()) {  // Give the map's slots back too.
    bytes_ -= MapBytes(blocks_);
    blocks_ = {};
    bytes_ += MapBytes(blocks_);
  }
  // One slot per table: removing one row moves only other blocks' rows.
  for (const Slot& s : slots) RemoveRow(s.table, s.row);
}

void RecoveryIndex::RemoveRow(Table* t, uint32_t row) {
  if (t->view[row] != nullptr) RemoveFromView(t->view[row], t->view_pos[row]);
  const uint64_t vectors_before = RowVectorBytes(*t);
  const size_t width = t->width();
  const uint32_t last = static_cast<uint32_t>(t->rows() - 1);
  if (row != last) {  // Move the last row into the hole.
    Table::Chunk& to = t->chunk_of(row);
    const Table::Chunk& from = t->chunk_of(last);
    const size_t r = row % kScanChunkRows, l = last % kScanChunkRows;
    std::copy_n(from.codes.begin() + l * width, width, to.codes.begin() + r * width);
    std::copy_n(from.exact.begin() + l * width, width, to.exact.begin() + r * width);
    std::copy_n(from.scales.begin() + l * t->heads, t->heads, to.scales.begin() + r * t->heads);
    t->ids[row] = t->ids[last];
    t->view[row] = t->view[last];
    t->view_pos[row] = t->view_pos[last];
    if (t->view[row] != nullptr) t->view[row]->row[t->view_pos[row]] = row;
    auto moved = blocks_.find(t->ids[row]);
    if (moved != blocks_.end()) {
      for (Slot& s : moved->second) {
        if (s.table == t) s.row = row;
      }
    }
  }
  // The last row is in the last chunk.
  Table::Chunk& c = t->chunks.back();
  const uint64_t chunk_before = ChunkBytes(c);
  const size_t left = last % kScanChunkRows;
  if (left == 0) {
    bytes_ -= chunk_before;
    t->chunks.pop_back();
  } else {
    c.codes.resize(left * width);
    c.exact.resize(left * width);
    c.scales.resize(left * t->heads);
    MaybeShrink(c.codes);
    MaybeShrink(c.exact);
    MaybeShrink(c.scales);
    bytes_ += ChunkBytes(c) - chunk_before;
  }
  t->ids.pop_back();
  t->view.pop_back();
  t->view_pos.pop_back();
  MaybeShrink(t->ids);
  MaybeShrink(t->view);
  MaybeShrink(t->view_pos);
  bytes_ += RowVectorBytes(*t) - vectors_before;
  if (t->ids.empty()) {
    bytes_ -= RowVectorBytes(*t) + ScopeBytes(*t);
    tables_.erase(tables_.find(t->key));  // Destroys *t.
  }
}

void RecoveryIndex::RemoveFromView(View* v, uint32_t pos) {
  const uint64_t before = ViewBytes(*v);
  const uint32_t last = static_cast<uint32_t>(v->rows() - 1);
  if (pos != last) {  // Move the last reference into the hole.
    v->table[pos] = v->table[last];
    v->row[pos] = v->row[last];
    v->table[pos]->view_pos[v->row[pos]] = pos;
  }
  v->table.pop_back();
  v->row.pop_back();
  MaybeShrink(v->table);
  MaybeShrink(v->row);
  bytes_ += ViewBytes(*v) - before;
  if (v->row.empty()) {
    bytes_ -= ViewBytes(*v) + ScopeBytes(*v);
    views_.erase(views_.find(v->key));  // Destroys *v.
  }
}

bool RecoveryIndex::Find(const RecoveryQuery& query, Scan* scan) const {
  const std::string key = TableKey(query.scope, query.kind, query.layer);
  if (auto it = tables_.find(key); it != tables_.end()) {
    scan->table = it->second.get();
    scan->heads = scan->table->heads;
    scan->dim = scan->table->dim;
  } else if (auto vit = views_.find(key); vit != views_.end()) {
    scan->view = vit->second.get();
    scan->heads = scan->view->heads;
    scan->dim = scan->view->dim;
  } else {
    return false;
  }
  return scan->rows() > 0;
}

uint64_t RecoveryIndex::Rows(absl::string_view scope, v1::SummaryKind kind,
                             uint32_t layer) const {
  absl::ReaderMutexLock lock(&mu_);
  RecoveryQuery query;
  query.scope = std::string(scope);
  query.kind = kind;
  query.layer = layer;
  Scan scan;
  return Find(query, &scan) ? scan.rows() : 0;
}

absl::StatusOr<std::vector<RecoveryHit>> RecoveryIndex::Search(const RecoveryQuery& query,
                                                               uint64_t* candidates) const {
  absl::ReaderMutexLock lock(&mu_);
  Scan t;
  if (!Find(query, &t)) {
    return absl::NotFoundError(absl::StrCat(
        "scope: no block of this scope has a ", v1::SummaryKind_Name(query.kind),
        " summary", query.kind == v1::SUMMARY_EMBEDDING ? "" : absl::StrCat(" of layer ", query.layer)));
  }
  if (absl::Status s = CheckShape(query, t); !s.ok()) return s;
  const size_t rows = t.rows();
  if (candidates != nullptr) *candidates = rows;
  const PreparedQuery p = Prepare(query, t);

  // Scan: approximate scores of every row, chunk by chunk, keeping the best
  // k * oversample + 16 per chunk; large tables in parallel on the pool.
  const size_t keep = static_cast<size_t>(query.k) * std::max(1u, query.oversample) + 16;
  const size_t chunks = (rows + kScanChunkRows - 1) / kScanChunkRows;
  std::vector<Best> best(chunks, Best(keep));
  auto scan_chunk = [&](size_t chunk) {
    const size_t begin = chunk * kScanChunkRows;
    const size_t end = std::min(rows, begin + kScanChunkRows);
    float scores[kScanChunkRows];
    if (t.table != nullptr) {
      const Table::Chunk& c = t.table->chunks[chunk];
      ScanRows(p.q16.data(), p.q_scale.data(), p.scan_group, c.codes.data(), c.scales.data(),
               t.heads, t.dim, 0, end - begin, p.max, scores);
    } else {
      // The rows' addresses first (on the heap: a server thread's stack
      // may be small), then the kernel.
      std::vector<const int8_t*> codes(end - begin);
      std::vector<const float*> scales(end - begin);
      for (size_t i = begin; i < end; ++i) {
        codes[i - begin] = t.codes(i);
        scales[i - begin] = t.scales(i);
      }
      ScanRefs(p.q16.data(), p.q_scale.data(), p.scan_group, codes.data(), scales.data(),
               t.heads, t.dim, end - begin, p.max, scores);
    }
    for (size_t row = begin; row < end; ++row) {
      if (query.exclude != nullptr && query.exclude->contains(t.id(row))) continue;
      best[chunk].Offer(scores[row - begin], static_cast<uint32_t>(row));
    }
  };
  if (pool_ != nullptr && rows >= kParallelScanRows) {
    pool_->ParallelFor(chunks, scan_chunk);
  } else {
    for (size_t c = 0; c < chunks; ++c) scan_chunk(c);
  }
  for (size_t c = 1; c < chunks; ++c) best[0].Merge(best[c]);
  // Rescore the survivors exactly in f32, take the best k.
  std::vector<std::pair<float, uint32_t>> scored = best[0].Take();
  for (auto& [score, row] : scored) score = ScoreExact(p, t.exact(row));
  return BestHits(query, t, std::move(scored));
}

absl::StatusOr<std::vector<RecoveryHit>> RecoveryIndex::SearchExact(
    const RecoveryQuery& query) const {
  absl::ReaderMutexLock lock(&mu_);
  Scan t;
  if (!Find(query, &t)) return absl::NotFoundError("scope: no such summaries");
  if (absl::Status s = CheckShape(query, t); !s.ok()) return s;
  std::vector<std::pair<double, uint32_t>> scored;
  for (size_t row = 0; row < t.rows(); ++row) {
    if (query.exclude != nullptr && query.exclude->contains(t.id(row))) continue;
    scored.emplace_back(ScoreScalar(query, t, row), static_cast<uint32_t>(row));
  }
  return BestHits(query, t, std::move(scored));
}

}  // namespace evoke
