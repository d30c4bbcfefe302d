/*
 * c_example: uses evoke from C through evoke.h only. Saves the evicted spans
 * of a session, loads one back at its original positions and at new ones
 * (the splice), asks which blocks match a query, shares a prefix, and shows
 * the errors an engine must handle. Exit status 0 when every step behaved.
 *
 *   c_example [SOCKET]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "evoke/evoke.h"

#define CHECK(cond, what)                                   \
  do {                                                      \
    if (!(cond)) {                                          \
      fprintf(stderr, "c_example: FAILED: %s (%s)\n", what, \
              evoke_last_error(client));                    \
      evoke_close(client);                                  \
      return 1;                                             \
    }                                                       \
  } while (0)

enum { kTokens = 16, kLayers = 2, kHeads = 2, kDim = 64 };

/* f16 values in [0.5, 1): a different pattern per block. */
static void fill_block(unsigned short* data, size_t n, unsigned seed) {
  size_t i;
  for (i = 0; i < n; ++i) data[i] = (unsigned short)(0x3800 + ((i * 7 + seed * 131) % 1024));
}

int main(int argc, char** argv) {
  evoke_client* client = NULL;
  evoke_layout layout;
  size_t block_bytes, row_bytes, written = 0, n_out = 0, n_prefix = 0, i;
  unsigned short *blocks[4], *back;
  unsigned seq;
  uint32_t n_deleted = 0;
  float queries[4 * kDim];
  evoke_recovered found[3];
  int32_t tokens[64];
  evoke_status st;

  if (evoke_connect(argc > 1 ? argv[1] : NULL, &client) != EVOKE_OK) {
    fprintf(stderr, "c_example: cannot connect to evoked\n");
    return 1;
  }
  memset(&layout, 0, sizeof(layout));
  layout.ns = "c-example";
  layout.model_id = "tiny-f16";
  layout.model_revision = "r1";
  layout.k_dtype = EVOKE_DTYPE_F16;
  layout.v_dtype = EVOKE_DTYPE_F16;
  layout.n_layers = kLayers;
  layout.n_kv_heads = kHeads;
  layout.head_dim = kDim;
  layout.rope_type = EVOKE_ROPE_NEOX;
  layout.freq_base = 10000.0;

  block_bytes = evoke_block_bytes(&layout, kTokens, 0, kLayers);
  row_bytes = (size_t)kTokens * kHeads * kDim * 2; /* one layer's K (or V) */
  CHECK(block_bytes == (size_t)kLayers * 2 * row_bytes, "evoke_block_bytes");
  printf("block of %d tokens x %d layers: %zu bytes\n", kTokens, kLayers, block_bytes);

  /* 1. Evict four spans of the session. */
  for (seq = 0; seq < 4; ++seq) {
    blocks[seq] = malloc(block_bytes);
    fill_block(blocks[seq], block_bytes / 2, seq);
    st = evoke_block_save(client, &layout, "session-1", seq, kTokens, 0, kLayers,
                          (int32_t)(seq * kTokens), blocks[seq], block_bytes);
    CHECK(st == EVOKE_OK, "evoke_block_save");
  }
  printf("saved 4 blocks\n");

  /* 2. Load block 2 at its original positions: byte-identical. */
  back = malloc(block_bytes);
  st = evoke_block_load(client, &layout, "session-1", 2, EVOKE_KEEP_POSITIONS, back,
                        block_bytes, &written);
  CHECK(st == EVOKE_OK && written == block_bytes, "evoke_block_load");
  CHECK(memcmp(back, blocks[2], block_bytes) == 0, "byte-identical load");
  printf("loaded block 2 at its positions: byte-identical\n");

  /* 3. The splice: block 2 at position 100. V is byte-identical, K rotated. */
  st = evoke_block_load(client, &layout, "session-1", 2, 100, back, block_bytes, &written);
  CHECK(st == EVOKE_OK, "evoke_block_load at a new position");
  for (i = 0; i < kLayers; ++i) {
    const char* k_new = (const char*)back + i * 2 * row_bytes;
    const char* k_old = (const char*)blocks[2] + i * 2 * row_bytes;
    CHECK(memcmp(k_new + row_bytes, k_old + row_bytes, row_bytes) == 0, "V byte-identical");
    CHECK(memcmp(k_new, k_old, row_bytes) != 0, "K re-anchored");
  }
  printf("loaded block 2 at position 100: V byte-identical, K rotated\n");

  /* 3b. Shared buffers: the same calls on memory evoked maps too; the bytes
   * travel through the command ring and are copied once, by the daemon. */
  {
    unsigned char* shared = NULL;
    st = evoke_buffer_alloc(client, 2 * block_bytes, (void**)&shared);
    CHECK(st == EVOKE_OK && shared != NULL, "evoke_buffer_alloc");
    fill_block((unsigned short*)shared, block_bytes / 2, 4);
    st = evoke_block_save(client, &layout, "session-1", 4, kTokens, 0, kLayers,
                          (int32_t)(4 * kTokens), shared, block_bytes);
    CHECK(st == EVOKE_OK, "evoke_block_save from a shared buffer");
    st = evoke_block_load(client, &layout, "session-1", 2, 100, shared + block_bytes,
                          block_bytes, &written);
    CHECK(st == EVOKE_OK && written == block_bytes, "evoke_block_load into a shared buffer");
    CHECK(memcmp(shared + block_bytes, back, block_bytes) == 0, "same bytes as the inline load");
    st = evoke_block_load(client, &layout, "session-1", 2, EVOKE_KEEP_POSITIONS,
                          shared + block_bytes, 16, &written);
    CHECK(st == EVOKE_RESOURCE_EXHAUSTED && written == block_bytes, "small shared buffer");
    CHECK(evoke_block_delete(client, &layout, "session-1", 4) == EVOKE_OK, "delete block 4");
    evoke_buffer_free(client, shared);
    printf("shared buffer: saved and loaded through the ring, same bytes\n");
  }

  /* 4. Which evicted blocks match the current queries (4 query heads, GQA)? */
  for (i = 0; i < 4 * kDim; ++i) queries[i] = 1.0f;
  st = evoke_recover(client, &layout, "session-1", 1, queries, 4, 3, NULL, found, &n_out);
  CHECK(st == EVOKE_OK && n_out == 3, "evoke_recover");
  CHECK(found[0].score >= found[1].score && found[1].score >= found[2].score, "ranked");
  for (i = 0; i < n_out; ++i) {
    printf("recovered block %llu (positions %d..%d) score %.3f bytes %s\n",
           (unsigned long long)found[i].seq, found[i].first_pos,
           found[i].first_pos + (int)found[i].n_tokens - 1, found[i].score,
           found[i].bytes_available ? "held" : "dropped");
  }

  /* 5. A shared prefix: two blocks of 32 tokens. */
  for (i = 0; i < 64; ++i) tokens[i] = (int32_t)(1000 + i);
  {
    size_t prefix_bytes = evoke_block_bytes(&layout, 32, 0, kLayers);
    unsigned short* p = malloc(prefix_bytes);
    fill_block(p, prefix_bytes / 2, 9);
    CHECK(evoke_prefix_save(client, &layout, tokens, 64, 32, 0, 0, kLayers, p, prefix_bytes) ==
              EVOKE_OK,
          "evoke_prefix_save 0");
    CHECK(evoke_prefix_save(client, &layout, tokens, 64, 32, 1, 0, kLayers, p, prefix_bytes) ==
              EVOKE_OK,
          "evoke_prefix_save 1");
    free(p);
  }
  CHECK(evoke_prefix_lookup(client, &layout, tokens, 64, 32, &n_prefix) == EVOKE_OK &&
            n_prefix == 2,
        "evoke_prefix_lookup");
  {
    /* Held: the two blocks stay loadable until released. */
    uint64_t handle = 0;
    uint32_t n_released = 0;
    CHECK(evoke_prefix_acquire(client, &layout, tokens, 64, 32, &handle, &n_prefix) ==
                  EVOKE_OK &&
              n_prefix == 2 && handle != 0,
          "evoke_prefix_acquire");
    CHECK(evoke_release(client, handle, &n_released) == EVOKE_OK && n_released == 2,
          "evoke_release");
    CHECK(evoke_release(client, handle, NULL) == EVOKE_NOT_FOUND, "evoke_release twice");
  }
  tokens[40] = 7; /* Another second block: only the first is shared. */
  CHECK(evoke_prefix_lookup(client, &layout, tokens, 64, 32, &n_prefix) == EVOKE_OK &&
            n_prefix == 1,
        "evoke_prefix_lookup after divergence");
  printf("prefix lookup: 2 blocks shared (held and released), 1 after the tokens diverge\n");

  /* 6. Errors an engine handles. */
  st = evoke_block_load(client, &layout, "session-1", 99, EVOKE_KEEP_POSITIONS, back,
                        block_bytes, &written);
  CHECK(st == EVOKE_NOT_FOUND && strlen(evoke_last_error(client)) > 0, "missing block");
  printf("missing block: NOT_FOUND (%s)\n", evoke_last_error(client));
  layout.model_revision = "r2";
  st = evoke_block_load(client, &layout, "session-1", 2, EVOKE_KEEP_POSITIONS, back,
                        block_bytes, &written);
  CHECK(st == EVOKE_FAILED_PRECONDITION, "other model revision");
  printf("other model revision: FAILED_PRECONDITION (%s)\n", evoke_last_error(client));
  layout.model_revision = "r1";
  st = evoke_block_load(client, &layout, "session-1", 2, EVOKE_KEEP_POSITIONS, back, 16,
                        &written);
  CHECK(st == EVOKE_RESOURCE_EXHAUSTED && written == block_bytes, "small buffer");

  /* 7. Release. */
  CHECK(evoke_block_delete(client, &layout, "session-1", 3) == EVOKE_OK, "evoke_block_delete");
  CHECK(evoke_session_drop(client, "c-example", "session-1", &n_deleted) == EVOKE_OK &&
            n_deleted == 3,
        "evoke_session_drop");
  printf("dropped the session (%u blocks)\n", n_deleted);
  for (seq = 0; seq < 4; ++seq) free(blocks[seq]);
  free(back);
  evoke_close(client);
  printf("c_example: OK\n");
  return 0;
}
