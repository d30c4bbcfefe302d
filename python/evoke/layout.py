"""Canonical-layout helpers: fingerprints, block metadata and key summaries
from numpy arrays.

Canonical layout v1 (proto/evoke/v1/block.proto): for each layer of the
block, the K rows, then the V rows; a row is one token across all KV heads,
[n_tokens][n_kv_heads][head_dim]. When K and V have the same dtype, that is
exactly a C-contiguous numpy array of shape

    (n_layers_in_block, 2, n_tokens, n_kv_heads, head_dim)

with K at [:, 0] and V at [:, 1]: `block_array` allocates one, `pack_kv`
fills one from separate K and V arrays.

Summaries (MEAN_KEYS, REPR_KEYS) are computed as the C++ library computes
them (common/summaries.cc): keys widened to float32, RoPE undone with the
block's parameters and original positions, means accumulated in float64.
RoPE with YaRN ramps or dynamic NTK is left to the daemon (it computes
MEAN_KEYS itself for canonical blocks saved without a summary).
"""

import numpy as np

from ._proto import pb
from . import ids as _ids

__all__ = [
    "DTYPES",
    "make_fingerprint",
    "fingerprint_like",
    "block_shape",
    "block_nbytes",
    "pack_kv",
    "session_meta",
    "prefix_metas",
    "positions_of",
    "unrotated_keys",
    "mean_keys_summary",
    "repr_keys_summary",
    "default_summary_layer",
]

# numpy dtype <-> evoke DType. bfloat16 has no numpy dtype: pass "bf16" and
# arrays of uint16 holding the bits.
DTYPES = {
    "f16": pb.DTYPE_F16,
    "bf16": pb.DTYPE_BF16,
    "f32": pb.DTYPE_F32,
}
_ROPE_TYPES = {"none": pb.ROPE_NONE, "norm": pb.ROPE_NORM, "neox": pb.ROPE_NEOX}
_NP = {pb.DTYPE_F16: np.float16, pb.DTYPE_BF16: np.uint16, pb.DTYPE_F32: np.float32}


def _dtype_code(dtype):
    if isinstance(dtype, int):
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    dt = np.dtype(dtype)
    if dt == np.float16:
        return pb.DTYPE_F16
    if dt == np.float32:
        return pb.DTYPE_F32
    raise ValueError(f"dtype: {dtype!r} is not f16, bf16 or f32")


def make_fingerprint(namespace, model_id, n_layers, n_kv_heads, head_dim, dtype="f16",
                     v_dtype=None, rope="none", freq_base=10000.0, freq_scale=1.0,
                     rotary_dim=0, freq_factors=(), model_revision="", tp_rank=0, tp_size=1):
    """A LayoutFingerprint for a canonical-v1 cache. `dtype` is K's (and V's
    unless `v_dtype` is given): "f16", "bf16", "f32" or a numpy dtype.
    `rope` is "none", "norm" (adjacent pairs) or "neox" (half split)."""
    fp = pb.LayoutFingerprint(
        namespace=namespace, model_id=model_id, model_revision=model_revision,
        k_dtype=_dtype_code(dtype), v_dtype=_dtype_code(v_dtype if v_dtype is not None else dtype),
        n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim,
        layout=pb.LAYOUT_CANONICAL_V1, tp_rank=tp_rank, tp_size=tp_size)
    fp.rope.type = _ROPE_TYPES[rope] if isinstance(rope, str) else rope
    if fp.rope.type != pb.ROPE_NONE:
        fp.rope.freq_base = freq_base
        fp.rope.freq_scale = freq_scale
        fp.rope.rotary_dim = rotary_dim
        fp.rope.freq_factors.extend(freq_factors)
    return fp


def fingerprint_like(k, namespace, model_id, n_layers=None, **rope_and_more):
    """A fingerprint for K (and V) arrays shaped (layers, n_tokens,
    n_kv_heads, head_dim): heads, head_dim and dtype are read off `k`;
    `n_layers` is the model's (default: k's first dimension). Other keyword
    arguments as make_fingerprint (rope, freq_base, ...)."""
    k = np.asarray(k)
    if k.ndim != 4:
        raise ValueError(f"k: want (layers, n_tokens, n_kv_heads, head_dim), got {k.shape}")
    return make_fingerprint(namespace, model_id, n_layers=n_layers or k.shape[0],
                            n_kv_heads=k.shape[2], head_dim=k.shape[3], dtype=k.dtype,
                            **rope_and_more)


def _elem_bytes(dtype_code):
    return 4 if dtype_code == pb.DTYPE_F32 else 2


def block_shape(fp, n_tokens, n_layers=None):
    """The numpy shape of a canonical block of `n_tokens` tokens over
    `n_layers` layers (default: all of the model's):
    (layers, 2, n_tokens, n_kv_heads, head_dim). K and V must share a
    dtype for this view."""
    layers = fp.n_layers if n_layers is None else n_layers
    return (layers, 2, n_tokens, fp.n_kv_heads, fp.head_dim)


def block_nbytes(fp, n_tokens, n_layers=None):
    """Payload bytes of such a block (K and V dtypes may differ)."""
    layers = fp.n_layers if n_layers is None else n_layers
    row = fp.n_kv_heads * fp.head_dim
    return layers * n_tokens * row * (_elem_bytes(fp.k_dtype) + _elem_bytes(fp.v_dtype))


def numpy_dtype(fp):
    """The numpy dtype of the block's elements (K's; uint16 bits for bf16)."""
    if fp.k_dtype != fp.v_dtype:
        raise ValueError("fingerprint: K and V dtypes differ; use raw bytes")
    return np.dtype(_NP[fp.k_dtype])


def pack_kv(k, v, out):
    """Writes K and V, each (layers, n_tokens, n_kv_heads, head_dim), into
    `out`, a canonical block array (layers, 2, n_tokens, n_kv_heads,
    head_dim), e.g. one from Client.block_array(). Returns `out`."""
    k = np.asarray(k)
    v = np.asarray(v)
    if k.shape != v.shape or k.ndim != 4:
        raise ValueError(f"k, v: want equal 4-d shapes, got {k.shape} and {v.shape}")
    if out.shape != (k.shape[0], 2) + k.shape[1:]:
        raise ValueError(f"out: shape {out.shape} does not hold K and V of {k.shape}")
    out[:, 0] = k
    out[:, 1] = v
    return out


def session_meta(fp, session_id, sequence, n_tokens, first_position=0, positions=None,
                 layer_begin=0, layer_end=None, token_offset=0, tokens=None, summaries=()):
    """BlockMeta of block `sequence` of a session (its id computed here)."""
    meta = pb.BlockMeta(
        id=_ids.session_block_id(fp.namespace, session_id, sequence),
        kind=pb.BLOCK_KIND_SESSION, session_id=session_id, sequence=sequence,
        n_tokens=n_tokens, token_offset=token_offset, layer_begin=layer_begin,
        layer_end=fp.n_layers if layer_end is None else layer_end,
        first_position=first_position)
    meta.fingerprint.CopyFrom(fp)
    if positions is not None:
        meta.positions.extend(int(p) for p in positions)
    if tokens is not None:
        meta.tokens.extend(int(t) for t in tokens)
    meta.summaries.extend(summaries)
    return meta


def prefix_metas(fp, tokens, block_tokens, first_position=0, layer_begin=0, layer_end=None):
    """BlockMeta of each full block of a token prefix, chained: block i holds
    tokens [i*block_tokens, (i+1)*block_tokens) at positions first_position +
    i*block_tokens onward."""
    digest = _ids.fingerprint_digest(fp)
    tokens = [int(t) for t in tokens]
    metas, parent = [], b""
    for i, block_id in enumerate(_ids.prefix_chain(tokens, block_tokens, digest)):
        meta = pb.BlockMeta(
            id=block_id, kind=pb.BLOCK_KIND_PREFIX, parent_id=parent,
            n_tokens=block_tokens, token_offset=i * block_tokens, layer_begin=layer_begin,
            layer_end=fp.n_layers if layer_end is None else layer_end,
            first_position=first_position + i * block_tokens)
        meta.fingerprint.CopyFrom(fp)
        meta.tokens.extend(tokens[i * block_tokens:(i + 1) * block_tokens])
        metas.append(meta)
        parent = block_id
    return metas


def positions_of(meta):
    """The original positions of the block's tokens (int64 array)."""
    if len(meta.positions):
        return np.asarray(meta.positions, dtype=np.int64)
    return meta.first_position + np.arange(meta.n_tokens, dtype=np.int64)


def default_summary_layer(meta):
    """The layer the daemon summarizes: the middle of the block's layers."""
    return meta.layer_begin + (meta.layer_end - meta.layer_begin) // 2


def _omega(fp):
    """Per rotated pair, the angle per position (common/rope.cc's plan)."""
    fp = _ids.normalize_fingerprint(fp)
    r = fp.rope
    if r.scaling == pb.ROPE_SCALING_DYNAMIC_NTK:
        raise ValueError("fingerprint.rope.scaling: dynamic NTK angles depend on the "
                         "sequence length; cannot be undone")
    if r.scaling == pb.ROPE_SCALING_YARN and r.yarn_ext_factor != 0:
        raise NotImplementedError("fingerprint.rope: YaRN ramps are not computed in Python; "
                                  "let the daemon compute MEAN_KEYS")
    n_pairs = r.rotary_dim // 2
    i = np.arange(n_pairs, dtype=np.float64)
    base = np.power(r.freq_base, -2.0 * i / r.rotary_dim)
    if len(r.freq_factors):
        base = base / np.asarray(r.freq_factors, dtype=np.float32).astype(np.float64)
    return r.freq_scale * base, r.type == pb.ROPE_NEOX, r.rotary_dim


def _widen(raw, dtype_code):
    if dtype_code == pb.DTYPE_F32:
        return raw.view(np.float32).astype(np.float32)
    if dtype_code == pb.DTYPE_F16:
        return raw.view(np.float16).astype(np.float32)
    bits = raw.view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)


def unrotated_keys(meta, payload, layer):
    """Layer `layer`'s keys of a canonical block as float32 (n_tokens,
    n_kv_heads, head_dim), RoPE removed (rotated back by minus each
    token's original position). `payload` is the block's bytes (any buffer
    or array)."""
    fp = meta.fingerprint
    if fp.layout != pb.LAYOUT_CANONICAL_V1:
        raise ValueError("fingerprint.layout: summaries need LAYOUT_CANONICAL_V1")
    if not meta.layer_begin <= layer < meta.layer_end:
        raise ValueError(f"layer: {layer} is outside [{meta.layer_begin}, {meta.layer_end})")
    raw = np.frombuffer(payload, dtype=np.uint8) if not isinstance(payload, np.ndarray) \
        else payload.reshape(-1).view(np.uint8)
    row = fp.n_kv_heads * fp.head_dim
    kb, vb = _elem_bytes(fp.k_dtype), _elem_bytes(fp.v_dtype)
    per_layer = meta.n_tokens * row * (kb + vb)
    n_layers = meta.layer_end - meta.layer_begin
    if raw.size != per_layer * n_layers:
        raise ValueError(f"payload: {raw.size} bytes, want {per_layer * n_layers}")
    start = (layer - meta.layer_begin) * per_layer
    keys = _widen(raw[start:start + meta.n_tokens * row * kb].copy(), fp.k_dtype)
    keys = keys.reshape(meta.n_tokens, fp.n_kv_heads, fp.head_dim)
    nfp = _ids.normalize_fingerprint(fp)
    if nfp.rope.type == pb.ROPE_NONE:
        return keys
    omega, neox, rotary_dim = _omega(fp)
    n_pairs = rotary_dim // 2
    angle = (-positions_of(meta)).astype(np.float64)[:, None] * omega[None, :]
    c = np.cos(angle).astype(np.float32)[:, None, :]
    s = np.sin(angle).astype(np.float32)[:, None, :]
    if neox:
        j0 = np.arange(n_pairs)
        j1 = j0 + n_pairs
    else:
        j0 = 2 * np.arange(n_pairs)
        j1 = j0 + 1
    x0 = keys[:, :, j0]
    x1 = keys[:, :, j1]
    out = keys.copy()
    out[:, :, j0] = x0 * c - x1 * s
    out[:, :, j1] = x0 * s + x1 * c
    return out


def _summary(kind, layer, values, r=0):
    heads, dim = values.shape
    s = pb.Summary(kind=kind, layer=layer, heads=heads, dim=dim, r=r)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"summary of layer {layer}: not all finite")
    s.values.extend(values.astype(np.float32).reshape(-1).tolist())
    return s


def mean_keys_summary(meta, payload, layer=None):
    """A SUMMARY_MEAN_KEYS Summary: per KV head, the mean un-rotated key of
    `layer` (default: the middle layer, as the daemon chooses)."""
    layer = default_summary_layer(meta) if layer is None else layer
    keys = unrotated_keys(meta, payload, layer)
    return _summary(pb.SUMMARY_MEAN_KEYS, layer, keys.astype(np.float64).mean(axis=0))


def repr_keys_summary(meta, payload, attention, r, layer=None):
    """A SUMMARY_REPR_KEYS Summary (InfLLM's representative keys): per KV
    head, the mean un-rotated key of the `r` tokens that received the most
    attention. `attention` is (n_tokens, n_kv_heads): the mass each token
    received per KV head. Ties go to the earlier token."""
    layer = default_summary_layer(meta) if layer is None else layer
    att = np.asarray(attention, dtype=np.float32)
    n, heads = meta.n_tokens, meta.fingerprint.n_kv_heads
    if att.shape != (n, heads):
        raise ValueError(f"attention: shape {att.shape}, want (n_tokens, n_kv_heads) = "
                         f"({n}, {heads})")
    if not 1 <= r <= n:
        raise ValueError(f"r: {r} must be in [1, {n}]")
    if not np.all(np.isfinite(att)):
        raise ValueError("attention: not all finite")
    keys = unrotated_keys(meta, payload, layer)
    # Stable sort of -mass: the earlier token wins a tie.
    top = np.argsort(-att, axis=0, kind="stable")[:r]          # (r, heads)
    chosen = keys[top, np.arange(heads)[None, :], :]           # (r, heads, dim)
    return _summary(pb.SUMMARY_REPR_KEYS, layer, chosen.astype(np.float64).mean(axis=0), r=r)
