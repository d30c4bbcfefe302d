/*
 * evoke_policy.h: the C API of evoke's eviction and recovery policies
 * (library evoke_policy_c), for engines written in C or reached through a
 * C FFI. It wraps the C++ evoke::policy library: a policy decides which
 * resident KV blocks leave the cache and which stored blocks come back; the
 * engine does the moving (evoke_block_save / evoke_block_load of evoke.h).
 *
 *   evoke_policy* p;
 *   if (evoke_policy_create("evoke", "block_tokens=64,evoke_topk=4", &p) != EVOKE_OK)
 *     fprintf(stderr, "%s\n", evoke_policy_last_error());
 *   evoke_recovery_source* src;
 *   evoke_recovery_source_connect(NULL, "default", "session-1", 20, &src);
 *   ... after saving block seq 7 of the session as the engine's handle 7:
 *   evoke_recovery_source_register(src, 7, 7, 64);
 *   ... before each decoded token:
 *   evoke_policy_choose_evictions(p, &view, 1, victims, cap, &n_victims);
 *   ... at a recovery point (a new user turn):
 *   evoke_policy_choose_recoveries(p, &view, q, 32, 128, src, picks, cap, &n_picks);
 *   evoke_recovery_source_destroy(src);
 *   evoke_policy_destroy(p);
 *
 * Policies: "recency", "streaming_llm", "h2o", "snapkv", "infllm", "evoke"
 * (docs/policies.md describes each, its parameters and defaults).
 *
 * Threading: objects are not thread-safe; use each from one thread at a
 * time. Errors: every call returns an evoke_status (evoke.h) and keeps a
 * message, naming the field at fault, for evoke_policy_last_error() of the
 * calling thread.
 */
#ifndef EVOKE_EVOKE_POLICY_H_
#define EVOKE_EVOKE_POLICY_H_

#include <stddef.h>
#include <stdint.h>

#include "evoke/evoke.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Layer or head of a cache view that covers every layer (head). */
#define EVOKE_POLICY_ALL (-1)
/* A key token that belongs to no block (pending tokens). */
#define EVOKE_POLICY_NO_BLOCK UINT64_MAX

typedef struct evoke_policy evoke_policy;
typedef struct evoke_attention_stats evoke_attention_stats;
typedef struct evoke_recovery_source evoke_recovery_source;

/* A block the engine holds. */
typedef struct evoke_resident_block {
  uint64_t handle;         /* the engine's name for the block, unique in the session */
  uint64_t first_token;    /* index of its first token in the session's stream */
  uint32_t n_tokens;
  int64_t first_position;  /* where its first token sits in the cache now */
  int recovered;           /* non-zero: brought back from evoked (a copy is stored) */
  /* Pre-RoPE mean keys of the recovery layer (n_kv_heads x head_dim), or
   * NULL; the evoke policy's resident gate scores blocks with them. */
  const float* summary;
  size_t summary_len;
} evoke_resident_block;

/* One cache at a decision point. Zero-initialize, then fill every field:
 * layer and head in particular, since 0 means layer 0 and KV head 0, not
 * EVOKE_POLICY_ALL (a cache shared by all layers and heads sets both to
 * EVOKE_POLICY_ALL). */
typedef struct evoke_cache_view {
  int32_t layer;             /* EVOKE_POLICY_ALL or a layer */
  int32_t head;              /* EVOKE_POLICY_ALL or a KV head */
  uint64_t budget_tokens;    /* tokens the cache may hold */
  uint64_t pending_tokens;   /* decoded tokens not yet in a block (never evicted) */
  uint64_t session_tokens;   /* tokens decoded so far */
  const evoke_resident_block* resident;  /* any order; n_resident entries */
  size_t n_resident;
  const evoke_attention_stats* attention; /* NULL: h2o and snapkv evict by recency */
} evoke_cache_view;

/* A stored block and how well it matches a query. */
typedef struct evoke_candidate {
  uint64_t handle;
  float score;
  uint32_t n_tokens;
} evoke_candidate;

/* The message of this thread's last evoke_policy / evoke_attention /
 * evoke_recovery_source call: its error, or "" when it succeeded. Valid
 * until this thread's next such call. */
const char* evoke_policy_last_error(void);

/* ---------------------------------------------------------------- policies */

/* Creates policy `name` with parameters `spec` ("key=value,key=value", keys
 * as in docs/policies.md; NULL or "" for the defaults). On success *out is a
 * policy to evoke_policy_destroy(). EVOKE_INVALID_ARGUMENT for an unknown
 * name (the message lists the known ones), an unknown key or a value out of
 * range (the message names the key). */
evoke_status evoke_policy_create(const char* name, const char* spec, evoke_policy** out);

/* Destroys a policy (NULL is allowed). */
void evoke_policy_destroy(evoke_policy* policy);

/* Whether the policy ever recovers blocks and whether it reads attention
 * statistics (either pointer may be NULL). */
void evoke_policy_describe(const evoke_policy* policy, int* recovers, int* needs_attention);

/* Checks that `budget_tokens` can hold what policy `name` with `spec`
 * protects plus one block (e.g. streaming_llm: sinks + one block).
 * EVOKE_INVALID_ARGUMENT naming budget_tokens otherwise (or as
 * evoke_policy_create for a bad name or spec). */
evoke_status evoke_policy_validate_budget(const char* name, const char* spec,
                                          uint64_t budget_tokens);

/* Chooses resident blocks to evict so that pending + incoming + the tokens
 * of the blocks kept fit view->budget_tokens; writes their handles, in the
 * order to evict, to `out` (`cap` entries; view->n_resident always suffice)
 * and their count to *n_out (0 when it fits). EVOKE_RESOURCE_EXHAUSTED when
 * even evicting every evictable block cannot make room, or when `cap` is
 * too small (then *n_out is the count needed). EVOKE_INVALID_ARGUMENT for a
 * NULL argument. */
evoke_status evoke_policy_choose_evictions(evoke_policy* policy, const evoke_cache_view* view,
                                           uint64_t incoming_tokens, uint64_t* out, size_t cap,
                                           size_t* n_out);

/* Chooses stored blocks to bring back now for the engine's next queries
 * (`queries`: n_query_heads x head_dim floats of the recovery layer, taken
 * before RoPE), asking `source`. Writes them to `out` (`cap` entries) in the
 * order to load them (the last lands nearest the tail) and their count to
 * *n_out; recovery-less policies write none and do not ask the source.
 * Errors of the source come back unchanged (EVOKE_UNAVAILABLE: the daemon
 * is down; decode on without recovery). EVOKE_RESOURCE_EXHAUSTED when `cap`
 * is too small (*n_out is the count needed; the policy's state has moved
 * on, so size `cap` to the policy's top-k). EVOKE_INVALID_ARGUMENT for a
 * NULL argument or a zero n_query_heads or head_dim. */
evoke_status evoke_policy_choose_recoveries(evoke_policy* policy, const evoke_cache_view* view,
                                            const float* queries, uint32_t n_query_heads,
                                            uint32_t head_dim, evoke_recovery_source* source,
                                            evoke_candidate* out, size_t cap, size_t* n_out);

/* ------------------------------------------------------- attention stats */

/* Creates the attention statistics of a cache: n_layers x n_heads (KV
 * heads) rows per decode step; SnapKV's observation window of `window`
 * steps, each row max-pooled over `pool_kernel` tokens (odd; 1: none);
 * per-token mass kept for `token_layer`. Counts of 0 are taken as 1, an
 * even kernel as the next odd one. EVOKE_INVALID_ARGUMENT when n_layers x
 * n_heads is above 2^20 rows.
 * Configure window and pool_kernel as the snapkv policy's snapkv_window and
 * snapkv_pool_kernel (defaults 32 and 5). */
evoke_status evoke_attention_stats_create(uint32_t n_layers, uint32_t n_heads, uint32_t window,
                                          uint32_t pool_kernel, uint32_t token_layer,
                                          evoke_attention_stats** out);

void evoke_attention_stats_destroy(evoke_attention_stats* stats);

/* Adds one (layer, head) row of the current decode step: weights[i] is the
 * softmax mass on cached key token i (summed over the query heads of the
 * KV head's group), which belongs to block block_of_token[i]
 * (EVOKE_POLICY_NO_BLOCK for pending tokens) as its token token_in_block[i]
 * (token_in_block may be NULL when per-token mass is not wanted).
 * EVOKE_INVALID_ARGUMENT for a layer or head out of range, or a
 * token_in_block of 65536 or more. */
evoke_status evoke_attention_stats_observe(evoke_attention_stats* stats, uint32_t layer,
                                           uint32_t head, const uint64_t* block_of_token,
                                           const uint32_t* token_in_block, const float* weights,
                                           size_t n_tokens);

/* Closes the current decode step (the observation window slides). */
void evoke_attention_stats_end_step(evoke_attention_stats* stats);

/* Drops a block's statistics (it left the cache). */
void evoke_attention_stats_forget(evoke_attention_stats* stats, uint64_t block);

/* Cumulative (H2O) and windowed (SnapKV) mass of a block at a layer and
 * head (EVOKE_POLICY_ALL sums); 0 for an unknown block. */
double evoke_attention_stats_cumulative(const evoke_attention_stats* stats, uint64_t block,
                                        int32_t layer, int32_t head);
double evoke_attention_stats_window(const evoke_attention_stats* stats, uint64_t block,
                                    int32_t layer, int32_t head);

/* ------------------------------------------------------- recovery sources */

/* A source the engine implements: rank up to `k` stored, non-resident
 * blocks of the session for the queries (n_query_heads x head_dim floats),
 * best first, each scoring at least *min_score when min_score is not NULL;
 * write them to `out` (room for `k`) and their count to *n_out; return
 * EVOKE_OK or an error (EVOKE_UNAVAILABLE when the store is down). */
typedef evoke_status (*evoke_rank_fn)(void* user, const float* queries, uint32_t n_query_heads,
                                      uint32_t head_dim, uint32_t k, const float* min_score,
                                      evoke_candidate* out, size_t* n_out);

/* Wraps a callback (`user` is passed back as is) as a source. */
evoke_status evoke_recovery_source_from_callback(evoke_rank_fn rank, void* user,
                                                 evoke_recovery_source** out);

/* Connects a source to evoked at `socket` (a path; NULL: $EVOKE_SOCKET,
 * else ./evoked.sock) for session `session` of namespace `ns`, ranking the
 * mean-keys summaries of `layer` (those the daemon computes for blocks
 * saved with evoke_block_save). EVOKE_UNAVAILABLE when evoked does not
 * answer; EVOKE_INVALID_ARGUMENT for a NULL or empty ns or session. */
evoke_status evoke_recovery_source_connect(const char* socket, const char* ns,
                                           const char* session, uint32_t layer,
                                           evoke_recovery_source** out);

/* Connected sources only (EVOKE_FAILED_PRECONDITION for a callback source):
 * register maps the engine's `handle` to block `seq` of the session (as
 * saved with evoke_block_save) of `n_tokens` tokens, not resident;
 * set_resident marks it resident (excluded from ranking) or not; forget
 * drops it. Unknown handles are ignored by set_resident and forget. */
evoke_status evoke_recovery_source_register(evoke_recovery_source* source, uint64_t handle,
                                            uint64_t seq, uint32_t n_tokens);
evoke_status evoke_recovery_source_set_resident(evoke_recovery_source* source, uint64_t handle,
                                                int resident);
evoke_status evoke_recovery_source_forget(evoke_recovery_source* source, uint64_t handle);

/* Destroys a source (NULL is allowed); a connected one closes its
 * connection. */
void evoke_recovery_source_destroy(evoke_recovery_source* source);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* EVOKE_EVOKE_POLICY_H_ */
