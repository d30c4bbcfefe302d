#include "recovery/recovery_index.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fingerprint.h"
#include "recovery/bounds.h"

namespace evoke {

namespace {

// Rows per scan task and per storage chunk: big enough to amortize a task,
// small enough that the score buffer stays in L1/L2. Storing rows in chunks
// of this size bounds the spare capacity of a table to one chunk, and a
// growing table never copies (or briefly holds twice) all of its rows.
constexpr size_t kScanChunkRows = 4096;
// Tables below this many rows are scanned on the calling thread.
constexpr size_t kParallelScanRows = 32768;
// Rows asked of an ExactSource per call.
constexpr size_t kExactBatch = 64;

using recovery::HeadCode;

}  // namespace

// A layout scope's rows of one kind and layer: the only copy of each
// summary. Row r is row r % kScanChunkRows of chunk r / kScanChunkRows.
struct RecoveryIndex::Table {
  struct Chunk {
    std::vector<int8_t> codes;   // rows x heads x dim
    std::vector<HeadCode> hc;    // rows x heads
    std::vector<float> exact;    // rows x heads x dim; only without a source.
  };
  std::string key;  // In tables_.
  uint32_t heads = 0;
  uint32_t dim = 0;
  // Channel scales (heads x dim powers of two), from the table's first row.
  std::vector<float> sigma;
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
  const HeadCode* hc(size_t r) const {
    return chunk_of(r).hc.data() + (r % kScanChunkRows) * heads;
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
  const Table* table_of(size_t i) const { return table != nullptr ? table : view->table[i]; }
  // A view's row i.
  const int8_t* codes(size_t i) const { return view->table[i]->codes(view->row[i]); }
  const HeadCode* hc(size_t i) const { return view->table[i]->hc(view->row[i]); }
};

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

RecoveryIndex::RecoveryIndex(CopyPool* pool, ExactSource exact)
    : pool_(pool), exact_(std::move(exact)) {}
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
  return Cap(c.codes) + Cap(c.hc) + Cap(c.exact);
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
void ReserveRow(Table::Chunk& c, size_t rows, size_t width, uint32_t heads, bool exact) {
  if ((rows + 1) * width <= c.codes.capacity()) return;
  const size_t want = std::min(kScanChunkRows, std::max(rows + 1, rows + rows / 2));
  c.codes.reserve(want * width);
  if (exact) c.exact.reserve(want * width);
  c.hc.reserve(want * heads);
}

}  // namespace

bool RecoveryIndex::CopySummary(const v1::BlockMeta& meta, v1::SummaryKind kind,
                                uint32_t layer, uint32_t heads, uint32_t dim, float* out) {
  // The last summary of that kind and layer is the one Add indexed.
  for (int i = meta.summaries_size() - 1; i >= 0; --i) {
    const v1::Summary& s = meta.summaries(i);
    if (s.kind() != kind || s.layer() != layer) continue;
    if (!Indexable(s) || s.heads() != heads || s.dim() != dim) return false;
    std::copy(s.values().begin(), s.values().end(), out);
    return true;
  }
  return false;
}

uint64_t RecoveryIndex::AccountedBytes(const v1::BlockMeta& meta, bool f32_copy) {
  const bool session = meta.kind() == v1::BLOCK_KIND_SESSION;
  const uint64_t n = static_cast<uint64_t>(meta.summaries_size());
  uint64_t bytes = sizeof(std::pair<const BlockId, BlockSlots>) + 1 +
                   (n > 1 ? n * sizeof(Slot) : 0);
  for (const v1::Summary& s : meta.summaries()) {
    const uint64_t values = static_cast<uint64_t>(s.values_size());
    bytes += values * ((f32_copy ? sizeof(float) : 0) + sizeof(int8_t)) +
             std::min<uint64_t>(s.heads(), values) * sizeof(HeadCode) + sizeof(BlockId) +
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
      if (s.values_size() == static_cast<int>(t_slot->width())) {
        t_slot->sigma.resize(t_slot->width());
        recovery::ChannelScales(s.values().data(), s.heads(), s.dim(), t_slot->sigma.data());
      }
      bytes_ += ScopeBytes(*t_slot) + Cap(t_slot->sigma);
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
    ReserveRow(c, in_chunk, t->width(), t->heads, exact_ == nullptr);
    if (exact_ == nullptr) c.exact.insert(c.exact.end(), s.values().begin(), s.values().end());
    c.codes.resize(c.codes.size() + t->width());
    c.hc.resize(c.hc.size() + t->heads);
    for (uint32_t h = 0; h < t->heads; ++h) {
      const size_t off = static_cast<size_t>(h) * t->dim;
      recovery::EncodeHead(s.values().data() + off, t->sigma.data() + off, t->dim,
                           c.codes.data() + in_chunk * t->width() + off,
                           &c.hc[in_chunk * t->heads + h]);
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
    if (!from.exact.empty()) {
      std::copy_n(from.exact.begin() + l * width, width, to.exact.begin() + r * width);
    }
    std::copy_n(from.hc.begin() + l * t->heads, t->heads, to.hc.begin() + r * t->heads);
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
    if (!c.exact.empty()) c.exact.resize(left * width);
    c.hc.resize(left * t->heads);
    MaybeShrink(c.codes);
    MaybeShrink(c.exact);
    MaybeShrink(c.hc);
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
    bytes_ -= RowVectorBytes(*t) + ScopeBytes(*t) + Cap(t->sigma);
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
