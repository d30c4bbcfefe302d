// RecoveryIndex: block summaries in RAM, scored against an engine's queries.
#ifndef EVOKE_RECOVERY_RECOVERY_INDEX_H_
#define EVOKE_RECOVERY_RECOVERY_INDEX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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
  // Candidates whose approximate scores are rescored exactly: k * oversample
  // plus 16. Default 4.
  uint32_t oversample = 4;
};

struct RecoveryHit {
  BlockId id;
  float score = 0;
};

// RecoveryIndex keeps, per (scope, kind, layer), every summary in one
// contiguous table: int8 codes with a scale per (row, head) for the scan, and
// the f32 values for rescoring. A search quantizes the query to int16, scans
// the codes with integer dot products (SIMD through the compiler's
// multi-versioning: AVX-512BW, AVX2 or baseline at run time) in chunks of
// 4096 rows (in parallel for large tables), keeps the best k * oversample + 16
// rows in a bounded heap per chunk, rescores those exactly in f32, and
// returns the best k. For the mean aggregation the query
// heads of each GQA group are summed first, so a row costs one dot product
// of n_kv_heads * head_dim. Summaries stay indexed while their block exists,
// payload or not (breadcrumbs keep theirs).
//
// Thread-safe: searches run concurrently with each other; Add and Remove
// exclude them briefly.
class RecoveryIndex {
 public:
  // `pool`, when set, scans tables of 32k rows and more in parallel (the
  // caller keeps it alive longer than the index).
  explicit RecoveryIndex(CopyPool* pool = nullptr);
  ~RecoveryIndex();
  RecoveryIndex(const RecoveryIndex&) = delete;
  RecoveryIndex& operator=(const RecoveryIndex&) = delete;

  // Add indexes every summary of a block under its scopes (its session, if
  // a session block, and its layout). Replaces earlier entries of the id.
  // A summary without a shape (heads or dim 0), of the wrong size, or with a
  // value that is not finite is not indexed and is counted in
  // rejected_summaries() (records come from clients and from disk).
  void Add(const BlockId& id, const v1::BlockMeta& meta);
  // Remove drops a block's summaries (no-op if absent).
  void Remove(const BlockId& id, const v1::BlockMeta& meta);

  // Search returns the best blocks for `query`, best first, and the number of
  // rows scored in `*candidates`. Errors: NOT_FOUND when the scope has no
  // summary of that kind and layer; INVALID_ARGUMENT naming the field when
  // the queries' shape does not match the summaries (dim, heads, GQA).
  absl::StatusOr<std::vector<RecoveryHit>> Search(const RecoveryQuery& query,
                                                  uint64_t* candidates) const;

  // Summaries Add refused (per scope they would have gone to).
  uint64_t rejected_summaries() const {
    absl::MutexLock lock(&mu_);
    return rejected_;
  }

  // Rows of one table (tests, Stat).
  uint64_t Rows(absl::string_view scope, v1::SummaryKind kind, uint32_t layer) const;

  // ScoreExact scores every row of a table with plain f32 loops (no
  // quantization, no vectorization pragmas): the reference that tests and
  // benchmarks compare Search against.
  absl::StatusOr<std::vector<RecoveryHit>> SearchExact(const RecoveryQuery& query) const;

  struct Table;

 private:
  static std::string TableKey(absl::string_view scope, v1::SummaryKind kind, uint32_t layer);
  void AddToTable(const std::string& key, const BlockId& id, const v1::Summary& s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveFromTable(const std::string& key, const BlockId& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CopyPool* const pool_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Table>> tables_ ABSL_GUARDED_BY(mu_);
  uint64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace evoke

#endif  // EVOKE_RECOVERY_RECOVERY_INDEX_H_
