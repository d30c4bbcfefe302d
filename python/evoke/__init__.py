"""evoke: the Python client of evoked, the KV-cache tier daemon.

    import evoke
    with evoke.Client("/run/evoke/evoked.sock") as client:
        fp = evoke.make_fingerprint("ns", "my-model", n_layers=32, n_kv_heads=8,
                                    head_dim=128, dtype="f16", rope="neox",
                                    freq_base=500000.0)
        block = client.block_array(fp, n_tokens=64)   # numpy, in shared memory
        block[:, 0] = k; block[:, 1] = v              # K and V of 64 tokens
        meta = evoke.session_meta(fp, "session-1", sequence=0, n_tokens=64,
                                  first_position=1024)
        client.save(meta, block)                      # copied once, by evoked
        client.load_into(meta.id, fp, block, first_position=0)  # re-anchored

See README.md ("Python client") for the whole API, and
python/examples/ for an engine-side example.
"""

from ._proto import pb, enum_name, runtime
from .errors import (EvokeError, InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
                     ResourceExhausted, FailedPrecondition, Unavailable, DeadlineExceeded,
                     DataLoss)
from .ids import (fingerprint_digest, prefix_block_id, prefix_chain, session_block_id, id_hex,
                  id_from_hex)
from .layout import (make_fingerprint, fingerprint_like, block_shape, block_nbytes, pack_kv,
                     session_meta,
                     prefix_metas, positions_of, unrotated_keys, mean_keys_summary,
                     repr_keys_summary, default_summary_layer)
from .client import Client, SaveResult, LoadResult, Recovered

__version__ = "0.15.0"

__all__ = [
    "pb", "enum_name", "runtime",
    "EvokeError", "InvalidArgument", "NotFound", "AlreadyExists", "PermissionDenied",
    "ResourceExhausted", "FailedPrecondition", "Unavailable", "DeadlineExceeded", "DataLoss",
    "fingerprint_digest", "prefix_block_id", "prefix_chain", "session_block_id", "id_hex",
    "id_from_hex",
    "make_fingerprint", "fingerprint_like", "block_shape", "block_nbytes", "pack_kv", "session_meta",
    "prefix_metas", "positions_of", "unrotated_keys", "mean_keys_summary",
    "repr_keys_summary", "default_summary_layer",
    "Client", "SaveResult", "LoadResult", "Recovered",
]
