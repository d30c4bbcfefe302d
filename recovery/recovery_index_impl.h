// The recovery index's private parts, shared by its maintenance
// (recovery_index.cc: Add, Remove, accounting) and its search
// (recovery_search.cc: the scan kernels, Search, SearchExact).
#ifndef EVOKE_RECOVERY_RECOVERY_INDEX_IMPL_H_
#define EVOKE_RECOVERY_RECOVERY_INDEX_IMPL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "recovery/bounds.h"
#include "recovery/recovery_index.h"

namespace evoke {
namespace recovery_internal {

// Rows per scan task and per storage chunk: big enough to amortize a task,
// small enough that the score buffer stays in L1/L2. Storing rows in chunks
// of this size bounds the spare capacity of a table to one chunk, and a
// growing table never copies (or briefly holds twice) all of its rows.
constexpr size_t kScanChunkRows = 4096;
// Tables below this many rows are scanned on the calling thread.
constexpr size_t kParallelScanRows = 32768;
// Rows asked of an ExactSource per call.
constexpr size_t kExactBatch = 64;

}  // namespace recovery_internal

// A layout scope's rows of one kind and layer: the only copy of each
// summary. Row r is row r % kScanChunkRows of chunk r / kScanChunkRows.
struct RecoveryIndex::Table {
  struct Chunk {
    std::vector<int8_t> codes;   // rows x heads x dim
    std::vector<recovery::HeadCode> hc;    // rows x heads
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
  const Chunk& chunk_of(size_t r) const { return chunks[r / recovery_internal::kScanChunkRows]; }
  Chunk& chunk_of(size_t r) { return chunks[r / recovery_internal::kScanChunkRows]; }
  const int8_t* codes(size_t r) const {
    return chunk_of(r).codes.data() + (r % recovery_internal::kScanChunkRows) * width();
  }
  const recovery::HeadCode* hc(size_t r) const {
    return chunk_of(r).hc.data() + (r % recovery_internal::kScanChunkRows) * heads;
  }
  const float* exact(size_t r) const {
    return chunk_of(r).exact.data() + (r % recovery_internal::kScanChunkRows) * width();
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
  const recovery::HeadCode* hc(size_t i) const { return view->table[i]->hc(view->row[i]); }
};

}  // namespace evoke

#endif  // EVOKE_RECOVERY_RECOVERY_INDEX_IMPL_H_
