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

}  // namespace evoke
