#!/usr/bin/python3
"""What an engine does with evoke, in numpy: evict a range of its KV cache to
evoked, later find the evicted blocks that matter to the current queries,
and load them back re-anchored at new positions, without recompute.

    PYTHONPATH=<build>/python /usr/bin/python3 evict_recover.py /path/to/evoked.sock

The "engine" here is a toy: a per-layer KV cache held as numpy arrays
(layers, tokens, kv_heads, head_dim) with K already rotated (RoPE NeoX), as
real engines keep it. Replace the random data with your cache's tensors.
"""

import sys

import numpy as np

import evoke

N_LAYERS, N_KV_HEADS, HEAD_DIM = 8, 4, 64
BLOCK = 32  # Tokens per evicted block.


def main(socket_path):
    fp = evoke.make_fingerprint(namespace="example", model_id="toy-llama",
                                n_layers=N_LAYERS, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM,
                                dtype="f16", rope="neox", freq_base=10000.0)
    rng = np.random.default_rng(0)
    session = "agent-42"
    with evoke.Client(socket_path) as client:
        # 1. Evict tokens [0, 256) of the session: 8 blocks of 32 tokens. Each
        #    block is written straight into shared memory (block_array), so
        #    save() moves it once, in the daemon. K at [:, 0], V at [:, 1].
        saved = []
        for seq in range(8):
            block = client.block_array(fp, BLOCK)
            k = rng.standard_normal((N_LAYERS, BLOCK, N_KV_HEADS, HEAD_DIM))
            v = rng.standard_normal((N_LAYERS, BLOCK, N_KV_HEADS, HEAD_DIM))
            evoke.pack_kv(k.astype(np.float16), v.astype(np.float16), out=block)
            meta = evoke.session_meta(fp, session, seq, BLOCK, first_position=seq * BLOCK)
            # The daemon computes the MEAN_KEYS summary itself; engines that
            # see attention add REPR_KEYS: evoke.repr_keys_summary(...).
            client.save(meta, block)
            saved.append((meta, block))
        print(f"evicted {len(saved)} blocks of {BLOCK} tokens "
              f"({saved[0][1].nbytes >> 10} KiB each)")

        # 2. Later, the current queries of layer 4 (n_query_heads x head_dim;
        #    here they point at block 5's keys) ask which evicted blocks
        #    matter most.
        layer = 4
        target_keys = evoke.unrotated_keys(saved[5][0], saved[5][1], layer)
        queries = target_keys.mean(axis=0)  # (kv_heads, head_dim); GQA: repeat per group.
        found = client.recover("example", session, queries, layer=layer, k=2)
        print(f"recover: scored {found.candidates} blocks, best "
              + ", ".join(f"{evoke.id_hex(b.id)[:8]} ({b.score:.2f})" for b in found))

        # 3. Load the best block back at the end of the current context
        #    (position 4096): K is re-anchored with one RoPE rotation, V comes
        #    back byte-identical.
        best = found[0]
        assert best.id == saved[5][0].id, "the queries point at block 5"
        into = client.block_array(fp, BLOCK)
        client.load_into(best.id, fp, into, first_position=4096)
        original = next(block for meta, block in saved if meta.id == best.id)
        assert np.array_equal(into[:, 1], original[:, 1]), "V must be byte-identical"
        print(f"loaded {evoke.id_hex(best.id)[:8]} at position 4096: "
              f"V identical, K rotated by {4096 - best.meta.first_position} positions")
        print("tiers now:", client.stat().pinned.blocks, "blocks in tier 1")
        client.drop_session("example", session)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "evoked.sock")
