// RecoveryIndex: block summaries in RAM, scored against an engine's queries.
#ifndef EVOKE_RECOVERY_RECOVERY_INDEX_H_
#define EVOKE_RECOVERY_RECOVERY_INDEX_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/hash128.h"
#include "common/copy_pool.h"
#include "evoke/v1/kvtier.pb.h"

namespace evoke {

// A scope of candidates: one session, or one layout (namespace + model +
// shape, by fingerprint digest).
std::string SessionScopeKey(absl::string_view ns, absl::string_view session_id);
std::string ModelScopeKey(const FingerprintDigest& digest);

struct RecoveryQuery {
  std::string scope;  // SessionScopeKey or ModelScopeKey.
  v1::SummaryKind kind = v1::SUMMARY_MEAN_KEYS;
  uint32_t layer = 0;
  // n_query_heads x dim floats.
  absl::Span<const float> queries;
  uint32_t n_query_heads = 1;
  uint32_t k = 1;
  bool aggregate_max = false;
  const absl::flat_hash_set<BlockId>* exclude = nullptr;
  // Only return blocks with score >= min_score (when set).
  bool has_min_score = false;
  float min_score = 0;
  // Accepted and ignored (kept for callers): Search rescores exactly every
  // row whose score bound reaches the k-th exact score, however many.
  uint32_t oversample = 4;
};

struct RecoveryHit {
  BlockId id;
  float score = 0;
};

// What Search's exact pass asks an ExactSource for: the current values of
// the summary of `kind` and `layer` (heads x dim floats) of each of `ids`,
// into values[i * heads * dim ...]; found[i] = 1 when written, 0 when the
// block or that summary is gone or has another shape (that row is skipped).
struct ExactRows {
  v1::SummaryKind kind = v1::SUMMARY_MEAN_KEYS;
  uint32_t layer = 0;
  uint32_t heads = 0;
  uint32_t dim = 0;
  absl::Span<const BlockId> ids;
  float* values = nullptr;
  uint8_t* found = nullptr;
};
// Called without the index's lock held, from Search's calling thread, with
// up to 64 rows at a time. RecoveryIndex::CopySummary applies Add's rules
// (last summary of a kind and layer, finite, of that shape) to a meta.
using ExactSource = std::function<void(const ExactRows&)>;

// RecoveryIndex keeps each block's summaries once, compactly, and returns
// the exact best k.
//
// Per (layout scope, kind, layer) a Table holds every row, in chunks of 4096
// contiguous rows: int8 codes plus 8 bytes per (row, head) of error bounds
// (recovery/bounds.h: per-channel power-of-two scales chosen from the
// table's first row, so outlier channels do not swamp the rest; a scale per
// (row, head); the residual's norm and the codes' L1 norm, rounded up). A
// session scope is a View: 12-byte references to rows of its blocks' layout
// tables. The f32 values are not kept when the index has an ExactSource
// (the daemon's reads them from the engine's in-RAM metadata); without one
// the index keeps its own f32 copy (tests, tools).
//
// Search, exact by construction (order: score descending, then BlockId
// ascending; the score is recovery::ExactScore, an f64 computation, the same
// one SearchExact uses):
//  1. Under the lock, every row's integer dot products with the quantized
//     query (SIMD through the compiler's multi-versioning: AVX-512BW, AVX2 or
//     baseline at run time; large tables in parallel on the pool) give an
//     interval [L, U] that provably holds its exact score. tau = the
//     (k + |exclude|)-th largest L is a lower bound of the k-th best score of
//     the rows not excluded; a row with U < tau (or U < min_score) cannot be
//     in the answer and is dropped.
//  2. The survivors are sorted by U descending, their ids copied, and (with
//     an ExactSource) the lock released.
//  3. In that order, rows are scored exactly (values from the source in
//     batches, or from the index's copy) into a k-heap; the pass stops at the
//     first row whose U is below the current k-th exact score (strictly:
//     ties are still examined for the id tie-break). Every row not scored has
//     S <= U < that score, below k scored rows.
// Near-ties and adversarial rows cost speed (more rows rescored), never
// exactness.
//
// Concurrency: Add and Remove may run between steps 2 and 3 (the engine
// calls them holding its own lock, which the ExactSource takes: so Search
// never calls the source holding this index's lock). A block removed
// meanwhile is skipped; one re-added meanwhile is scored with its current
// values, against the bound of its old ones. Without concurrent changes the
// result is exactly the first k of SearchExact.
//
// Summaries stay indexed while their block exists, payload or not:
// breadcrumbs (blocks whose payload was dropped) keep theirs on purpose, so
// that Recover can still name an evicted span for the engine to re-prefill.
// They are counted in memory_bytes() like every other row.
//
// Thread-safe: searches run concurrently with each other; Add and Remove
// exclude their first phase briefly.
class RecoveryIndex {
 public:
  // `pool`, when set, scans tables of 32k rows and more in parallel (the
  // caller keeps it alive longer than the index). `exact`, when set, supplies
  // the exact values Search rescores with, and the index keeps no f32 copy.
  explicit RecoveryIndex(CopyPool* pool = nullptr, ExactSource exact = nullptr);
  ~RecoveryIndex();
  RecoveryIndex(const RecoveryIndex&) = delete;
  RecoveryIndex& operator=(const RecoveryIndex&) = delete;

  // Add indexes every summary of a block under its scopes (its session, if
  // a session block, and its layout), replacing whatever the id had indexed
  // before (the meta is the block's whole current truth). Of summaries that
  // repeat a kind and layer the last one counts.
  // A summary without a shape (heads or dim 0), of the wrong size, or with a
  // value that is not finite is not indexed and is counted in
  // rejected_summaries() (records come from clients and from disk). A
  // summary whose shape differs from the rows already in its layout's table
  // of that kind and layer is not indexed either (nor, then, in its session).
  void Add(const BlockId& id, const v1::BlockMeta& meta);
  // Remove drops every summary indexed for the id (no-op if absent). `meta`
  // is not needed (kept for the BlockObserver's signature).
  void Remove(const BlockId& id, const v1::BlockMeta& meta);

  // Search returns the best blocks for `query`, best first, and the number of
  // rows scored in `*candidates`. Errors: NOT_FOUND when the scope has no
  // summary of that kind and layer; INVALID_ARGUMENT naming the field when
  // the queries' shape does not match the summaries (dim, heads, GQA).
  // `*rescored`, when given: the rows scored exactly.
  absl::StatusOr<std::vector<RecoveryHit>> Search(const RecoveryQuery& query,
                                                  uint64_t* candidates,
                                                  uint64_t* rescored = nullptr) const;

  // Summaries Add refused (per scope they would have gone to).
  uint64_t rejected_summaries() const {
    absl::MutexLock lock(&mu_);
    return rejected_;
  }

  // Bytes the index has allocated for what it holds (for Stat and a
  // metadata budget): each indexed summary once (int8 codes, 8 bytes of
  // bounds a head, f32 values only without an ExactSource), the ids and
  // references per row of the layout tables and
  // session views, the per-block slots, each table's and view's fixed part,
  // and the spare capacity of all of these (rows grow by half up to chunks
  // of 4096 rows, so a table's spare is bounded by a chunk; vectors that
  // fall to a quarter of their capacity give the rest back). Breadcrumbs'
  // summaries are included. Left out: malloc's headers and the scope maps'
  // spare slots.
  uint64_t memory_bytes() const {
    absl::ReaderMutexLock lock(&mu_);
    return bytes_;
  }
  // What a block's rows take in memory_bytes() once indexed, without the
  // tables' spare capacity: an estimate for callers that budget before they
  // save (a byte a value, 8 a head, 4 more a value with `f32_copy`, plus 28
  // bytes a summary, 12 more in a session, and 41 a block).
  static uint64_t AccountedBytes(const v1::BlockMeta& meta, bool f32_copy = true);

  // CopySummary writes the values of `meta`'s summary of `kind` and `layer`
  // to out (heads x dim floats) and returns true, if Add would index one of
  // that shape (the last of that kind and layer, finite values).
  static bool CopySummary(const v1::BlockMeta& meta, v1::SummaryKind kind, uint32_t layer,
                          uint32_t heads, uint32_t dim, float* out);

  // Rows of one table (tests, Stat).
  uint64_t Rows(absl::string_view scope, v1::SummaryKind kind, uint32_t layer) const;

  // SearchExact scores every row with recovery::ExactScore (no codes, no
  // bounds) and sorts: the reference that tests and benchmarks compare
  // Search against. With an ExactSource it reads every row through it.
  absl::StatusOr<std::vector<RecoveryHit>> SearchExact(const RecoveryQuery& query) const;

  struct Table;
  struct View;
  struct Scan;
  // One row of a block: its table and its row there.
  struct Slot {
    Table* table;
    uint32_t row;
  };

 private:
  static std::string TableKey(absl::string_view scope, v1::SummaryKind kind, uint32_t layer);
  // The table or view behind a query's (scope, kind, layer); false if none.
  bool Find(const RecoveryQuery& query, Scan* scan) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void RemoveLocked(const BlockId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes row `row` of `t` (and its view reference); moves the last row
  // into its place. Erases `t` when it empties: the caller must not use it
  // afterwards.
  void RemoveRow(Table* t, uint32_t row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveFromView(View* v, uint32_t pos) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CopyPool* const pool_;
  const ExactSource exact_;
  mutable absl::Mutex mu_;
  // Layout scopes' tables: the only copy of every summary.
  absl::flat_hash_map<std::string, std::unique_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);
  // Session scopes' views of those rows.
  absl::flat_hash_map<std::string, std::unique_ptr<View>> views_ ABSL_GUARDED_BY(mu_);
  // Per block: its rows (one per kind and layer), so that Add replaces and
  // Remove drops exactly what the id holds, whatever meta it is given.
  absl::flat_hash_map<BlockId, absl::InlinedVector<Slot, 1>> blocks_ ABSL_GUARDED_BY(mu_);
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace evoke

#endif  // EVOKE_RECOVERY_RECOVERY_INDEX_H_
