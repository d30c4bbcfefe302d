/* The C side of the consumer: the C API compiles and links as C. */
#include <string.h>

#include <evoke/evoke.h>
#include <evoke/version.h>

/* Bytes of a canonical block of a 4-layer f32 cache (2 KV heads of 8
 * dimensions) holding n_tokens tokens of layers [1, 3). */
size_t consumer_block_bytes_c(uint32_t n_tokens) {
  evoke_layout layout;
  memset(&layout, 0, sizeof layout);
  layout.ns = "ns";
  layout.model_id = "consumer-model";
  layout.k_dtype = EVOKE_DTYPE_F32;
  layout.v_dtype = EVOKE_DTYPE_F32;
  layout.n_layers = 4;
  layout.n_kv_heads = 2;
  layout.head_dim = 8;
  return evoke_block_bytes(&layout, n_tokens, 1, 3);
}

int consumer_version_major_c(void) { return EVOKE_VERSION_MAJOR; }
