/*
 * evoke.h: the C API of evoke, for inference engines written in C (or any
 * language with a C FFI). A stable C ABI: no C++ types, opaque handles,
 * plain structs, status codes. In the spirit of llama.cpp's block save/load
 * calls, so that an engine integration is a thin adapter:
 *
 *   evoke_client* c;
 *   if (evoke_connect(NULL, &c) != EVOKE_OK) ...;
 *   evoke_block_save(c, &layout, "session-1", seq, n_tokens, 0, n_layers, p0, kv, size);
 *   ...
 *   evoke_block_load(c, &layout, "session-1", seq, new_p0, dst, cap, &written);
 *   evoke_close(c);
 *
 * Blocks use evoke's canonical layout v1: for each layer in
 * [layer_begin, layer_end), the K rows then the V rows; a row is one token
 * across all KV heads ([n_tokens][n_kv_heads][head_dim] of k_dtype or
 * v_dtype), K stored post-RoPE as engines keep it.
 *
 * Threading: one evoke_client may be used from several threads, except that
 * evoke_last_error() reports the last failure of the client as a whole.
 * Errors: every call returns an evoke_status (the gRPC code evoked answered
 * with, or EVOKE_INVALID_ARGUMENT for bad arguments detected here) and keeps
 * a message for evoke_last_error().
 */
#ifndef EVOKE_EVOKE_H_
#define EVOKE_EVOKE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum evoke_status {
  EVOKE_OK = 0,
  EVOKE_CANCELLED = 1,
  EVOKE_UNKNOWN = 2,
  EVOKE_INVALID_ARGUMENT = 3, /* bad request; the message names the field */
  EVOKE_DEADLINE_EXCEEDED = 4,
  EVOKE_NOT_FOUND = 5,        /* no such block (or only a breadcrumb) */
  EVOKE_ALREADY_EXISTS = 6,   /* a session block saved again with other bytes */
  EVOKE_PERMISSION_DENIED = 7,
  EVOKE_RESOURCE_EXHAUSTED = 8, /* tier 1 full of pinned blocks, buffer too small */
  EVOKE_FAILED_PRECONDITION = 9, /* layout fingerprint differs; cannot re-anchor */
  EVOKE_ABORTED = 10,
  EVOKE_OUT_OF_RANGE = 11,
  EVOKE_UNIMPLEMENTED = 12,
  EVOKE_INTERNAL = 13,
  EVOKE_UNAVAILABLE = 14,     /* evoked not reachable, shutting down, disk down */
  EVOKE_DATA_LOSS = 15,       /* a stored copy failed its checksum (never served) */
  EVOKE_UNAUTHENTICATED = 16
} evoke_status;

enum { EVOKE_DTYPE_F16 = 1, EVOKE_DTYPE_BF16 = 2, EVOKE_DTYPE_F32 = 3 };
enum { EVOKE_ROPE_NONE = 1, EVOKE_ROPE_NORM = 2, EVOKE_ROPE_NEOX = 3 };
enum {
  EVOKE_ROPE_SCALING_NONE = 0,
  EVOKE_ROPE_SCALING_LINEAR = 1,
  EVOKE_ROPE_SCALING_LLAMA3 = 2,
  EVOKE_ROPE_SCALING_YARN = 3,
  EVOKE_ROPE_SCALING_DYNAMIC_NTK = 4
};
enum { EVOKE_TIER_PINNED_HOST = 1, EVOKE_TIER_SPILL = 2, EVOKE_TIER_BREADCRUMB = 3 };

/* Keep a block's original positions on load. */
#define EVOKE_KEEP_POSITIONS INT32_MIN

/*
 * The engine's KV cache layout. Everything here is part of a block's
 * identity: a load with another layout is refused (EVOKE_FAILED_PRECONDITION).
 * Zero-initialize, then fill; strings are copied by each call.
 */
typedef struct evoke_layout {
  const char* ns;             /* namespace (tenant), required */
  const char* model_id;       /* required */
  const char* model_revision; /* optional (NULL or "") */
  int k_dtype;                /* EVOKE_DTYPE_* */
  int v_dtype;
  uint32_t n_layers;
  uint32_t n_kv_heads;
  uint32_t head_dim;
  int rope_type;              /* EVOKE_ROPE_*; 0 means none */
  uint32_t rotary_dim;        /* 0 = head_dim */
  double freq_base;           /* e.g. 10000 or 500000 */
  double freq_scale;          /* 0 or 1 = none */
  int rope_scaling;           /* EVOKE_ROPE_SCALING_* */
  const float* freq_factors;  /* rotary_dim / 2 values, or NULL */
  uint32_t n_freq_factors;
  float yarn_ext_factor;
  float yarn_attn_factor;
  float yarn_beta_fast;
  float yarn_beta_slow;
  uint32_t n_ctx_orig;
  uint32_t tp_rank;
  uint32_t tp_size;           /* 0 = 1 */
} evoke_layout;

typedef struct evoke_client evoke_client;

/* Connects to evoked at `socket` (a path; NULL: $EVOKE_SOCKET, else
 * ./evoked.sock). On success *out is a client to evoke_close(). */
evoke_status evoke_connect(const char* socket, evoke_client** out);

/* Closes a client (NULL is allowed). */
void evoke_close(evoke_client* client);

/* The message of the client's last failed call ("" if none). Valid until the
 * next call on the client. */
const char* evoke_last_error(const evoke_client* client);

/* Shared buffers: memory mapped by both this process and evoked. A save
 * whose `data`, or a load whose `dst`, lies inside one travels through the
 * client's command ring and is copied once, by the daemon; other memory
 * travels inside messages. evoke_buffer_alloc opens the client's lease on
 * first use and returns `size` zeroed bytes in *out; evoke_buffer_free gives
 * them back (NULL is allowed). Buffers end with the client. */
evoke_status evoke_buffer_alloc(evoke_client* client, size_t size, void** out);
void evoke_buffer_free(evoke_client* client, void* buffer);

/* Payload bytes of a canonical block of `n_tokens` tokens over layers
 * [layer_begin, layer_end); 0 if the layout or range is invalid. */
size_t evoke_block_bytes(const evoke_layout* layout, uint32_t n_tokens,
                         uint32_t layer_begin, uint32_t layer_end);

/* Saves block `seq` of `session` (the engine's evicted span): `n_tokens`
 * tokens whose original positions are first_pos, first_pos + 1, ...; `data`
 * holds exactly evoke_block_bytes() bytes. The daemon computes the block's
 * key summary itself (for evoke_recover). Saving the same bytes again is a
 * no-op; other bytes under the same (session, seq) are EVOKE_ALREADY_EXISTS. */
evoke_status evoke_block_save(evoke_client* client, const evoke_layout* layout,
                              const char* session, uint64_t seq, uint32_t n_tokens,
                              uint32_t layer_begin, uint32_t layer_end,
                              int32_t first_pos, const void* data, size_t size);

/* Loads block `seq` of `session` into `dst` (`cap` bytes), re-anchored so
 * that its first token sits at `new_first_pos` (its K rotated by the
 * position delta; V byte-identical), or at its original positions with
 * EVOKE_KEEP_POSITIONS. *written receives the payload size.
 * EVOKE_RESOURCE_EXHAUSTED when cap is too small (then *written is the size
 * needed). */
evoke_status evoke_block_load(evoke_client* client, const evoke_layout* layout,
                              const char* session, uint64_t seq, int32_t new_first_pos,
                              void* dst, size_t cap, size_t* written);

/* Deletes block `seq` of `session` (release it). */
evoke_status evoke_block_delete(evoke_client* client, const evoke_layout* layout,
                                const char* session, uint64_t seq);

/* Deletes every block of a session; *n_deleted (may be NULL) gets the count. */
evoke_status evoke_session_drop(evoke_client* client, const char* ns, const char* session,
                                uint32_t* n_deleted);

/* Saves prefix block `block_index` of a token sequence: the block holds
 * tokens [block_index * block_tokens, (block_index + 1) * block_tokens) of
 * `tokens` (which must hold at least that many), at original positions
 * starting at block_index * block_tokens. Shared by every process with the
 * same prefix and layout. */
evoke_status evoke_prefix_save(evoke_client* client, const evoke_layout* layout,
                               const int32_t* tokens, size_t n_tokens, uint32_t block_tokens,
                               uint32_t block_index, uint32_t layer_begin, uint32_t layer_end,
                               const void* data, size_t size);

/* How many leading blocks of `block_tokens` tokens of `tokens` are stored
 * (with their bytes): the longest present prefix, in blocks. */
evoke_status evoke_prefix_lookup(evoke_client* client, const evoke_layout* layout,
                                 const int32_t* tokens, size_t n_tokens,
                                 uint32_t block_tokens, size_t* n_blocks);

/* evoke_prefix_lookup that also holds what it finds: the *n_blocks leading
 * blocks stay loadable (whatever the daemon evicts around them) until
 * evoke_release(*handle) or evoke_close. *handle is 0 when nothing is held
 * (then there is nothing to release). Opens the client's lease if needed. */
evoke_status evoke_prefix_acquire(evoke_client* client, const evoke_layout* layout,
                                  const int32_t* tokens, size_t n_tokens,
                                  uint32_t block_tokens, uint64_t* handle, size_t* n_blocks);

/* Ends a handle of evoke_prefix_acquire; *n_released (may be NULL) gets how
 * many blocks it held. EVOKE_NOT_FOUND for an unknown handle. */
evoke_status evoke_release(evoke_client* client, uint64_t handle, uint32_t* n_released);

/* Loads prefix block `block_index` of `tokens` into dst (as evoke_block_load). */
evoke_status evoke_prefix_load(evoke_client* client, const evoke_layout* layout,
                               const int32_t* tokens, size_t n_tokens, uint32_t block_tokens,
                               uint32_t block_index, int32_t new_first_pos, void* dst,
                               size_t cap, size_t* written);

typedef struct evoke_recovered {
  uint64_t seq;          /* the block's sequence number in its session */
  float score;           /* best first */
  int32_t first_pos;     /* original position of its first token */
  uint32_t n_tokens;
  int bytes_available;   /* 0 for a breadcrumb: re-prefill that span instead */
  int tier;              /* EVOKE_TIER_* */
} evoke_recovered;

/* Recovers the blocks of `session` that best match the engine's current
 * queries: `queries` holds n_query_heads x head_dim floats taken before
 * RoPE; each block is scored by its mean-keys summary of `layer` (query head
 * h against KV head h / (n_query_heads / n_kv_heads)), mean over heads.
 * Writes up to `k` blocks, best first, to `out` and their count to *n_out.
 * With `min_score` non-NULL, only blocks scoring at least *min_score. */
evoke_status evoke_recover(evoke_client* client, const evoke_layout* layout,
                           const char* session, uint32_t layer, const float* queries,
                           uint32_t n_query_heads, uint32_t k, const float* min_score,
                           evoke_recovered* out, size_t* n_out);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* EVOKE_EVOKE_H_ */
