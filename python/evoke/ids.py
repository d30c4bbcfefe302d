"""Block ids and fingerprint digests, byte for byte as the C++ library
computes them (include/evoke/chain_hash.h and fingerprint.h).

All three are xxHash3-128 over a documented byte encoding. The hash comes
from the system's libxxhash (Debian package libxxhash0) through ctypes, or
from the `xxhash` module when one is installed.
"""

import ctypes
import ctypes.util
import struct

from ._proto import pb

__all__ = [
    "xxh3_128",
    "fingerprint_digest",
    "normalize_fingerprint",
    "prefix_block_id",
    "prefix_chain",
    "session_block_id",
    "id_hex",
    "id_from_hex",
]


class _XXH128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


def _load_xxh3():
    names = ["libxxhash.so.0", ctypes.util.find_library("xxhash")]
    for name in names:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            fn = lib.XXH3_128bits
        except (OSError, AttributeError):
            continue
        fn.restype = _XXH128
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

        def digest(data, fn=fn):
            h = fn(data, len(data))
            return struct.pack(">QQ", h.high64, h.low64)

        return digest
    try:
        import xxhash  # type: ignore
    except ImportError:
        raise ImportError(
            "evoke: xxHash3 is needed for block ids: install libxxhash0 "
            "(Debian) or the xxhash module") from None
    return lambda data: xxhash.xxh3_128_digest(data)


_digest = _load_xxh3()


def xxh3_128(data):
    """xxHash3-128 of `data` as 16 bytes, big endian (hi then lo), the
    encoding of evoke's Hash128.ToBytes()."""
    return _digest(bytes(data))


def _u64(v):
    return struct.pack("<Q", v)


def _f64(v):
    v = float(v)
    if v == 0:
        v = 0.0  # Folds -0.0 into +0.0.
    return struct.pack("<d", v)


def _f32_as_f64(v):
    # The C++ side widens the stored float32 to double.
    return _f64(struct.unpack("<f", struct.pack("<f", float(v)))[0])


def normalize_fingerprint(fp):
    """A copy of LayoutFingerprint `fp` with implied defaults made explicit
    (as NormalizeFingerprint in C++)."""
    out = pb.LayoutFingerprint()
    out.CopyFrom(fp)
    r = out.rope
    if r.type == pb.ROPE_TYPE_UNSPECIFIED:
        r.type = pb.ROPE_NONE
    if r.type == pb.ROPE_NONE:
        r.Clear()
        r.type = pb.ROPE_NONE
    else:
        if r.freq_scale == 0:
            r.freq_scale = 1.0
        if r.rotary_dim == 0:
            r.rotary_dim = out.head_dim
    if out.tp_size == 0:
        out.tp_size = 1
    return out


def _canonical_fields(fp):
    fp = normalize_fingerprint(fp)
    r = fp.rope
    yield "namespace", fp.namespace.encode()
    yield "model_id", fp.model_id.encode()
    yield "model_revision", fp.model_revision.encode()
    yield "k_dtype", _u64(fp.k_dtype)
    yield "v_dtype", _u64(fp.v_dtype)
    yield "n_layers", _u64(fp.n_layers)
    yield "n_kv_heads", _u64(fp.n_kv_heads)
    yield "head_dim", _u64(fp.head_dim)
    yield "layout", _u64(fp.layout)
    yield "rope.type", _u64(r.type)
    yield "rope.rotary_dim", _u64(r.rotary_dim)
    yield "rope.freq_base", _f64(r.freq_base)
    yield "rope.freq_scale", _f64(r.freq_scale)
    yield "rope.scaling", _u64(r.scaling)
    yield "rope.freq_factors", b"".join(_f32_as_f64(x) for x in r.freq_factors)
    yield "rope.yarn_ext_factor", _f32_as_f64(r.yarn_ext_factor)
    yield "rope.yarn_attn_factor", _f32_as_f64(r.yarn_attn_factor)
    yield "rope.yarn_beta_fast", _f32_as_f64(r.yarn_beta_fast)
    yield "rope.yarn_beta_slow", _f32_as_f64(r.yarn_beta_slow)
    yield "rope.n_ctx_orig", _u64(r.n_ctx_orig)
    yield "tp_rank", _u64(fp.tp_rank)
    yield "tp_size", _u64(fp.tp_size)
    # Hashed only when set (ids without a group are unchanged).
    group = getattr(fp, "trust_group", "")
    if group:
        yield "trust_group", group.encode()


def fingerprint_digest(fp):
    """The 16-byte digest of LayoutFingerprint `fp` (normalized)."""
    parts = [b"evoke/fingerprint/v1"]
    for name, value in _canonical_fields(fp):
        name = name.encode()
        parts += [_u64(len(name)), name, _u64(len(value)), value]
    return xxh3_128(b"".join(parts))


def _tokens_bytes(tokens):
    try:
        import numpy as np
        arr = np.asarray(tokens, dtype="<i4")
        return arr.tobytes()
    except ImportError:  # pragma: no cover - numpy is a dependency
        return struct.pack(f"<{len(tokens)}i", *tokens)


def prefix_block_id(parent, tokens, digest):
    """id_i = H(id_{i-1}, tokens_i, fingerprint). `parent` is the previous
    block's 16-byte id, or b"" / None for the first block; `digest` is
    fingerprint_digest(fp)."""
    parent = bytes(parent or bytes(16))
    if len(parent) != 16 or len(digest) != 16:
        raise ValueError("parent and digest must be 16 bytes")
    tok = _tokens_bytes(tokens)
    return xxh3_128(b"evoke/prefix/v1" + parent + bytes(digest) + _u64(len(tok) // 4) + tok)


def prefix_chain(tokens, block_tokens, digest, root=None):
    """The ids of consecutive blocks of `block_tokens` tokens covering
    `tokens`; a trailing partial block is left out (not shareable yet)."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be > 0")
    ids, parent = [], root
    for begin in range(0, len(tokens) - block_tokens + 1, block_tokens):
        parent = prefix_block_id(parent, tokens[begin:begin + block_tokens], digest)
        ids.append(parent)
    return ids


def session_block_id(namespace, session_id, sequence):
    """The id of block `sequence` of `session_id` in `namespace`."""
    ns, sid = namespace.encode(), session_id.encode()
    return xxh3_128(b"evoke/session/v1" + _u64(len(ns)) + ns + _u64(len(sid)) + sid +
                    _u64(sequence))


def id_hex(block_id):
    """32 lowercase hex digits of a 16-byte id (as evokectl prints it)."""
    return bytes(block_id).hex()


def id_from_hex(text):
    """The 16-byte id of 32 hex digits."""
    b = bytes.fromhex(text)
    if len(b) != 16:
        raise ValueError(f"id: want 32 hex digits, got {len(text)}")
    return b
