"""evoke.Client: the synchronous client of evoked.

Control calls (Lookup, Recover, Stat, Delete, ...) are gRPC over the
daemon's Unix socket. Block payloads move through shared memory: the client
holds a lease, registers one arena region (a sealed memfd) whose numpy
arrays it hands out, and a command ring beside it; Save and Load of arena
arrays are ring entries (no RPC per block) and the daemon copies the bytes
once. Payloads that are not arena arrays go inline in the RPC.
"""

import os
import threading
import time
from dataclasses import dataclass
from typing import Optional

import grpc
import numpy as np

from . import _proto
from ._proto import pb
from . import errors
from .errors import EvokeError, FailedPrecondition, InvalidArgument, Unavailable
from . import ring as _ring
from .shm import Arena, Region

__all__ = ["Client", "SaveResult", "LoadResult", "Recovered", "channel_options", "target_of"]

_SERVICE = "/" + _proto.SERVICE + "/"


def target_of(socket_path):
    """The gRPC target of a daemon socket: a path becomes unix:<absolute
    path>; "unix:..." and "host:port" are kept."""
    if socket_path.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")):
        return socket_path
    if "/" not in socket_path and ":" in socket_path:
        return socket_path
    return "unix:" + os.path.abspath(socket_path)


def channel_options(max_reconnect_backoff=1.0):
    """Channel arguments: reconnect within a second of the daemon coming
    back (gRPC's default backoff grows to minutes, its first retry ~1 s
    plus jitter), and messages as large as evoked's."""
    ms = max(100, int(max_reconnect_backoff * 1000))
    return [
        ("grpc.initial_reconnect_backoff_ms", 100),
        # gRPC takes this as the shortest deadline of one connection attempt
        # (handshake included): left at its default, since at 100 ms a daemon
        # slow to send its first SETTINGS frame (starting, or on a loaded
        # host) timed every attempt out. Refused connections fail at once,
        # so the two backoffs govern an absent daemon.
        ("grpc.min_reconnect_backoff_ms", 20000),
        ("grpc.max_reconnect_backoff_ms", ms),
        ("grpc.max_receive_message_length", 1 << 30),
        ("grpc.max_send_message_length", 1 << 30),
    ]


@dataclass
class SaveResult:
    id: bytes
    deduplicated: bool
    checksum: int
    tier: int  # pb.TIER_*


@dataclass
class LoadResult:
    id: bytes
    tier: int                 # Served from (pb.TIER_*).
    checksum: int
    payload_bytes: int
    meta: Optional[object] = None   # pb.BlockMeta when asked for / inline.
    data: Optional[np.ndarray] = None  # Inline loads: the bytes (uint8).


@dataclass
class Recovered:
    id: bytes
    score: float
    tier: int
    bytes_available: bool
    meta: object


_METHODS = {
    # name: (request, response, streaming response)
    "Save": ("SaveRequest", "SaveResponse"),
    "Load": ("LoadRequest", "LoadResponse"),
    "Lookup": ("LookupRequest", "LookupResponse"),
    "Delete": ("DeleteRequest", "DeleteResponse"),
    "DropSession": ("DropSessionRequest", "DropSessionResponse"),
    "Pin": ("PinRequest", "PinResponse"),
    "Unpin": ("PinRequest", "PinResponse"),
    "Acquire": ("AcquireRequest", "AcquireResponse"),
    "Release": ("ReleaseRequest", "ReleaseResponse"),
    "KeepSession": ("KeepSessionRequest", "KeepSessionResponse"),
    "Prefetch": ("PrefetchRequest", "PrefetchResponse"),
    "SetRetention": ("SetRetentionRequest", "SetRetentionResponse"),
    "List": ("ListRequest", "ListResponse"),
    "Describe": ("DescribeRequest", "BlockInfo"),
    "Stat": ("StatRequest", "StatResponse"),
    "Recover": ("RecoverRequest", "RecoverResponse"),
    "RegisterCudaRegion": ("RegisterCudaRegionRequest", "RegisterRegionResponse"),
    "UnregisterRegion": ("UnregisterRegionRequest", "UnregisterRegionResponse"),
    "AttachRing": ("AttachRingRequest", "AttachRingResponse"),
    "Verify": ("VerifyRequest", "VerifyResponse"),
    "Flush": ("FlushRequest", "FlushResponse"),
}


def _ids_list(ids):
    if isinstance(ids, (bytes, bytearray)):
        return [bytes(ids)]
    return [bytes(i) for i in ids]


class _Lease:
    """One lease: the OpenLease stream held open by a thread."""

    def __init__(self, call, grant):
        self.call = call
        self.id = grant.lease_id
        self.fd_socket = grant.fd_socket
        self.max_region_bytes = grant.max_region_bytes
        self.ended = threading.Event()
        self.ring = None
        self.ring_region = None
        self.ring_error = ""


class Client:
    """A connection to evoked.

    Args:
      socket_path: the daemon's socket (e.g. /run/evoke/evoked.sock), or any
        gRPC target.
      timeout: deadline of each call, in seconds.
      shm_bytes: size of the shared-memory arena that block_array() and
        buffer() allocate from (created on first use); 0 turns shared
        memory off (payloads then go inline).
      ring_entries: submissions the command ring holds (power of two);
        0 turns the ring off (shared-memory payloads then go by RPC).
      max_reconnect_backoff: the longest wait between reconnection
        attempts after the daemon went away, in seconds.
      client_name: shown by the daemon for the lease.
      wait_for_ready: False (default): a call made while the daemon is
        unreachable fails at once with Unavailable, so that an engine can
        fall back (recompute) instead of stalling; True: it waits for the
        daemon until its deadline.

    Thread-safe. Close it (or use `with`) to end the lease.
    """

    def __init__(self, socket_path, timeout=60.0, shm_bytes=64 << 20, ring_entries=256,
                 max_reconnect_backoff=1.0, client_name=None, channel=None,
                 wait_for_ready=False):
        self.wait_for_ready = wait_for_ready
        self.target = target_of(socket_path)
        self.timeout = timeout
        self.shm_bytes = shm_bytes
        self.ring_entries = ring_entries
        self.client_name = client_name or f"python-pid-{os.getpid()}"
        self._channel = channel or grpc.insecure_channel(
            self.target, options=channel_options(max_reconnect_backoff))
        self._calls = {}
        for name, (req, resp) in _METHODS.items():
            self._calls[name] = self._channel.unary_unary(
                _SERVICE + name,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=getattr(pb, resp).FromString)
        self._open_lease = self._channel.unary_stream(
            _SERVICE + "OpenLease",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.LeaseEvent.FromString)
        self._watch_blocks = self._channel.unary_stream(
            _SERVICE + "WatchBlocks",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.BlockEvents.FromString)
        self._lease_lock = threading.Lock()
        self._lease = None
        self._region = None   # The arena's region (kept across leases).
        self._arena = None
        self._closed = False

    # ------------------------------------------------------------ plumbing

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Ends the lease and closes the channel."""
        if self._closed:
            return
        self._closed = True
        with self._lease_lock:
            lease, self._lease = self._lease, None
        if lease is not None:
            lease.call.cancel()
            lease.ended.wait(2.0)
            if lease.ring_region is not None:
                lease.ring_region.close()
        if self._region is not None:
            # Closes the memfd; the mapping stays while arrays still view it.
            self._region.close()
        self._channel.close()

    def _call(self, name, request, timeout=None, wait_for_ready=None):
        if wait_for_ready is None:
            wait_for_ready = self.wait_for_ready
        try:
            return self._calls[name](request, timeout=timeout or self.timeout,
                                     wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    def _deadline(self, timeout=None):
        return time.monotonic() + (timeout or self.timeout)

    # ------------------------------------------------------ shared memory

    def _lease_thread(self, lease, stream):
        try:
            for _ in stream:
                pass
        except grpc.RpcError:
            pass
        finally:
            lease.ended.set()
            if lease.ring is not None:
                lease.ring.mark_dead()

    def _ensure_lease(self):
        """The live lease, with the arena region registered and the ring
        attached; opens a new one when there is none or the last ended
        (the daemon restarted: regions are registered again)."""
        with self._lease_lock:
            if self._closed:
                raise FailedPrecondition("client: closed")
            lease = self._lease
            if lease is not None and not lease.ended.is_set():
                return lease
            stream = self._open_lease(pb.OpenLeaseRequest(client_name=self.client_name),
                                      timeout=None, wait_for_ready=self.wait_for_ready)
            try:
                event = next(stream)
            except grpc.RpcError as e:
                raise errors.from_rpc_error(e) from None
            except StopIteration:
                raise Unavailable("lease stream ended before the grant") from None
            if not event.HasField("grant"):
                raise Unavailable("lease stream: first message is not a grant")
            lease = _Lease(stream, event.grant)
            threading.Thread(target=self._lease_thread, args=(lease, stream),
                             name="evoke-lease", daemon=True).start()
            if self.shm_bytes > 0:
                if self._region is None:
                    size = self.shm_bytes
                    if lease.max_region_bytes and size > lease.max_region_bytes:
                        raise InvalidArgument(
                            f"shm_bytes: {size} exceeds the daemon's max region "
                            f"{lease.max_region_bytes}")
                    self._region = Region(size, "evoke-arena")
                    self._arena = Arena(self._region)
                self._region.register(lease.fd_socket, lease.id)
            if self.ring_entries > 0 and _ring.supported():
                try:
                    self._attach_ring(lease)
                except EvokeError as e:
                    lease.ring_error = str(e)
            self._lease = lease
            return lease

    def _attach_ring(self, lease):
        total = _ring.geometry(self.ring_entries)[4]
        region = Region(total, "evoke-ring")
        try:
            _ring.Ring.init_header(region, self.ring_entries)
            region.register(lease.fd_socket, lease.id)
            self._call("AttachRing", pb.AttachRingRequest(lease_id=lease.id,
                                                          region_id=region.id))
            lease.ring = _ring.Ring(region, self.ring_entries)
            lease.ring_region = region
        except BaseException:
            region.close()
            raise

    def open_lease(self):
        """Opens the lease now (it is otherwise opened on first use).
        Returns the lease id."""
        return self._ensure_lease().id

    @property
    def has_ring(self):
        lease = self._lease
        return lease is not None and lease.ring is not None and lease.ring.alive()

    def buffer(self, nbytes):
        """A uint8 numpy array of `nbytes` in the shared-memory arena. Saves
        from it and loads into it are copied once, by the daemon."""
        self._ensure_lease()
        if self._arena is None:
            raise FailedPrecondition("shm_bytes: shared memory is off (0)")
        arr = self._arena.allocate(nbytes)
        if arr is None:
            raise errors.ResourceExhausted(
                f"arena: no free range of {nbytes} bytes ({self._arena.free_bytes()} free "
                f"of {self._region.size}); free arrays or raise shm_bytes")
        return arr

    def block_array(self, fp, n_tokens, n_layers=None):
        """A canonical block array (layers, 2, n_tokens, n_kv_heads,
        head_dim) of the fingerprint's dtype in the arena: K at [:, 0], V at
        [:, 1]. uint16 holds bf16 bits."""
        from . import layout
        shape = layout.block_shape(fp, n_tokens, n_layers)
        dtype = layout.numpy_dtype(fp)
        return self.buffer(int(np.prod(shape)) * dtype.itemsize).view(dtype).reshape(shape)

    def _span_of(self, arr):
        """(offset, length) of an arena array in the arena's region, or None.
        Region ids change with the lease (a restart registers the arena
        again), so they are added when a request is made (_slice)."""
        if self._region is None or not isinstance(arr, np.ndarray):
            return None
        if not arr.flags.c_contiguous:
            return None
        address = arr.__array_interface__["data"][0]
        if not self._region.contains(address, arr.nbytes):
            return None
        return (address - self._region.address, arr.nbytes)

    def _slice(self, span):
        """(region_id, offset, length) of a span under the current lease."""
        return (self._region.id,) + span

    # ----------------------------------------------------------------- Save

    def save(self, meta, data, pin=False, durable=False):
        """Stores one block: `meta` (pb.BlockMeta), `data` its payload (an
        arena array: copied once by the daemon; any other array or bytes:
        sent inline). Returns a SaveResult."""
        return self.save_many([(meta, data)], pin=pin, durable=durable)[0]

    def save_many(self, blocks, pin=False, durable=False):
        """Stores several blocks, [(meta, data), ...], in one ring batch (or
        one RPC). Returns their SaveResults in order; the first failure
        raises (blocks before it are stored)."""
        blocks = list(blocks)
        if not blocks:
            return []
        spans = [self._span_of(d) for _, d in blocks]
        if all(s is not None for s in spans):
            return self._with_lease_retry(lambda: self._save_shm(blocks, spans, pin, durable))
        request = pb.SaveRequest(durable=durable)
        if any(s is not None for s in spans) or pin:
            request.lease_id = self._ensure_lease().id
        for (meta, data), s in zip(blocks, spans):
            b = request.blocks.add(pin=pin)
            b.meta.CopyFrom(meta)
            if s is not None:
                b.region.region_id, b.region.offset, b.region.length = self._slice(s)
            else:
                b.inline_bytes = _as_bytes(data)
        response = self._call("Save", request)
        return [SaveResult(r.id, r.deduplicated, r.checksum, r.tier) for r in response.results]

    def _with_lease_retry(self, fn):
        # A lease that ends under a call (the daemon restarted) fails it with
        # UNAVAILABLE; Save and Load are idempotent, so one retry on a new
        # lease is safe.
        try:
            return fn()
        except Unavailable:
            lease = self._lease
            if lease is None or not lease.ended.wait(0.5):
                raise
            return fn()

    def _save_shm(self, blocks, spans, pin, durable):
        lease = self._ensure_lease()
        ring = lease.ring
        slices = [self._slice(s) for s in spans]
        if ring is None or not ring.alive():
            request = pb.SaveRequest(durable=durable, lease_id=lease.id)
            for (meta, _), slc in zip(blocks, slices):
                b = request.blocks.add(pin=pin)
                b.meta.CopyFrom(meta)
                b.region.region_id, b.region.offset, b.region.length = slc
            response = self._call("Save", request)
            return [SaveResult(r.id, r.deduplicated, r.checksum, r.tier)
                    for r in response.results]
        deadline = self._deadline()
        tickets = ring.submit(save_entries([m for m, _ in blocks], slices, pin, durable),
                              deadline)
        results = []
        for (meta, _), t in zip(blocks, tickets):
            c = ring.wait(t, deadline).raise_for_status()
            results.append(SaveResult(bytes(meta.id), c.deduplicated, c.checksum, c.tier))
        return results

    # ----------------------------------------------------------------- Load

    def load_into(self, block_id, fingerprint, out, first_position=None, want_meta=False):
        """Loads one block into `out`, an arena array of its payload's size.
        With `first_position`, K is re-anchored so that the block's first
        token sits there (one RoPE rotation by new - old position; V is
        returned byte-identical). Returns a LoadResult."""
        return self.load_many_into([block_id], fingerprint, [out], first_position,
                                   want_meta)[0]

    def load_many_into(self, ids, fingerprint, outs, first_positions=None, want_meta=False):
        """Loads blocks ids[i] into outs[i] (arena arrays) in one ring batch.
        `first_positions`: None, one int for the run (block i at
        first + sum of the previous blocks' sizes is the caller's job: pass a
        list), or a list with one int or None per block."""
        ids = _ids_list(ids)
        self._ensure_lease()
        spans, first_positions = self._load_args(ids, outs, first_positions)
        return self._with_lease_retry(
            lambda: self._load_shm(ids, fingerprint, spans, first_positions, want_meta))

    def _load_args(self, ids, outs, first_positions):
        """The arena spans of `outs` and one first position (or None) per id;
        INVALID_ARGUMENT naming the argument otherwise."""
        if len(outs) != len(ids):
            raise InvalidArgument(f"outs: {len(outs)} arrays for {len(ids)} ids")
        if first_positions is None or isinstance(first_positions, int):
            first_positions = [first_positions] * len(ids)
        spans = [self._span_of(o) for o in outs]
        for i, s in enumerate(spans):
            if s is None:
                raise InvalidArgument(
                    f"outs[{i}]: not a C-contiguous array of this client's arena "
                    "(use block_array() / buffer(), or load() for a copy)")
        return spans, first_positions

    def _load_shm(self, ids, fingerprint, spans, first_positions, want_meta):
        lease = self._ensure_lease()
        ring = lease.ring
        slices = [self._slice(s) for s in spans]
        if ring is None or not ring.alive():
            request = pb.LoadRequest(ids=ids, lease_id=lease.id)
            request.fingerprint.CopyFrom(fingerprint)
            for slc in slices:
                request.destinations.add(region_id=slc[0], offset=slc[1], length=slc[2])
            _add_reanchor(request, first_positions)
            response = self._call("Load", request)
            return [LoadResult(bytes(b.meta.id), b.served_from, b.meta.checksum,
                               b.meta.payload_bytes, b.meta) for b in response.blocks]
        deadline = self._deadline()
        tickets = ring.submit(load_entries(ids, fingerprint, slices, first_positions, want_meta),
                              deadline)
        results = []
        for i, (block_id, t) in enumerate(zip(ids, tickets)):
            c = ring.wait(t, deadline).raise_for_status()
            meta = pb.BlockMeta.FromString(c.meta) if c.meta is not None else None
            if want_meta and meta is None:
                meta = self._meta_of_loaded(block_id, c, first_positions[i], lease, fingerprint,
                                            slices[i])
            results.append(LoadResult(block_id, c.tier, c.checksum, c.payload_bytes, meta))
        return results

    def _meta_of_loaded(self, block_id, completion, first_position, lease, fingerprint, slc):
        """The meta of a block the ring loaded whose meta did not fit in its
        completion (thousands of tokens): Describe's, when it names the
        checksum and length the completion reported, shaped as a Load returns
        it (no summaries, the new first position); otherwise (the block was
        replaced meanwhile) the block is loaded again through the RPC, which
        returns its meta with it (the same bytes land in the same place)."""
        info = self._call("Describe", pb.DescribeRequest(id=bytes(block_id)))
        if (info.meta.checksum == completion.checksum
                and info.meta.payload_bytes == completion.payload_bytes):
            meta = pb.BlockMeta()
            meta.CopyFrom(info.meta)
            meta.ClearField("summaries")
            if first_position is not None:
                meta.ClearField("positions")
                meta.first_position = first_position
            return meta
        request = pb.LoadRequest(ids=[block_id], lease_id=lease.id)
        request.fingerprint.CopyFrom(fingerprint)
        request.destinations.add(region_id=slc[0], offset=slc[1], length=slc[2])
        _add_reanchor(request, [first_position])
        return self._call("Load", request).blocks[0].meta

    def load(self, ids, fingerprint, first_positions=None):
        """Loads blocks inline (a copy in the RPC reply): a LoadResult per
        id with `data` (a uint8 array) and `meta`. For one id pass bytes
        (and get one LoadResult). `first_positions`: None, or per id the new
        first position (an int for one id) to re-anchor K to."""
        single = isinstance(ids, (bytes, bytearray))
        ids = _ids_list(ids)
        request = pb.LoadRequest(ids=ids)
        request.fingerprint.CopyFrom(fingerprint)
        if first_positions is not None:
            if isinstance(first_positions, int):
                first_positions = [first_positions]
            if len(first_positions) != len(ids):
                raise InvalidArgument(
                    f"first_positions: {len(first_positions)} for {len(ids)} ids")
            _add_reanchor(request, first_positions)
        response = self._call("Load", request)
        out = [LoadResult(bytes(b.meta.id), b.served_from, b.meta.checksum,
                          b.meta.payload_bytes, b.meta,
                          np.frombuffer(b.inline_bytes, dtype=np.uint8))
               for b in response.blocks]
        return out[0] if single else out

    # ------------------------------------------------------------- control

    def lookup(self, ids, namespace="", trust_group=""):
        """The tiers of the longest run of leading `ids` whose bytes are
        held (a prefix chain's hit): a list of pb.TIER_* as long as the
        run. With `namespace`, fleet-wide (tier 3) for the copies of
        `trust_group` (required in a shared namespace)."""
        response = self._call("Lookup", pb.LookupRequest(ids=_ids_list(ids),
                                                         namespace=namespace,
                                                         trust_group=trust_group))
        return list(response.tiers[:response.n_present])

    def longest_prefix(self, ids, namespace="", trust_group=""):
        """How many leading `ids` are held (len(lookup(...)))."""
        return len(self.lookup(ids, namespace, trust_group))

    def recover(self, namespace, session_id, queries, layer, k=8, kind=None,
                min_score=None, aggregation=None, exclude_ids=(), require_bytes=False):
        """The `k` evicted blocks of a session that matter most to `queries`
        (n_query_heads x head_dim floats, the engine's current queries of
        `layer`), best first: a list of Recovered; `.candidates` on the list
        says how many blocks were scored."""
        request = recover_request(namespace, session_id, queries, layer, k, kind, min_score,
                                  aggregation, exclude_ids, require_bytes)
        return recovered(self._call("Recover", request))

    def stat(self):
        """The daemon's StatResponse (tiers, counters, leases, ...)."""
        return self._call("Stat", pb.StatRequest())

    def delete(self, ids):
        """Deletes blocks from every tier; returns how many were deleted."""
        return self._call("Delete", pb.DeleteRequest(ids=_ids_list(ids))).n_deleted

    def drop_session(self, namespace, session_id):
        """Deletes every block of a session; returns how many."""
        return self._call("DropSession", pb.DropSessionRequest(
            namespace=namespace, session_id=session_id)).n_deleted

    def describe(self, block_id):
        """pb.BlockInfo of one block (meta with summaries, tier, pins)."""
        return self._call("Describe", pb.DescribeRequest(id=bytes(block_id)))

    def list(self, namespace="", session_id="", page_size=0, page_token=""):
        """One page of pb.BlockInfo (a pb.ListResponse)."""
        return self._call("List", pb.ListRequest(namespace=namespace, session_id=session_id,
                                                 page_size=page_size, page_token=page_token))

    def pin(self, ids):
        self._call("Pin", pb.PinRequest(ids=_ids_list(ids), lease_id=self._ensure_lease().id))

    def unpin(self, ids):
        self._call("Unpin", pb.PinRequest(ids=_ids_list(ids), lease_id=self._ensure_lease().id))

    def acquire(self, ids, mode=None):
        """Looks up `ids` and holds what it finds loadable, in one step: the
        longest run of leading ids whose bytes are held (mode
        pb.ACQUIRE_MODE_PREFIX, the default) or every id
        (pb.ACQUIRE_MODE_ALL: NOT_FOUND otherwise). Returns (handle, tiers):
        handle 0 when nothing is held; the holds last until release(handle)
        or the end of this client's lease."""
        response = self._call("Acquire", pb.AcquireRequest(
            ids=_ids_list(ids), lease_id=self._ensure_lease().id,
            mode=pb.ACQUIRE_MODE_PREFIX if mode is None else mode))
        return response.handle, list(response.tiers)

    def release(self, handle):
        """Ends a handle from acquire(); returns how many holds it had."""
        return self._call("Release", pb.ReleaseRequest(
            lease_id=self._ensure_lease().id, handle=handle)).n_released

    def keep_session(self, namespace, session_id, seconds):
        """Keeps a session's blocks where they are for `seconds` (an agent's
        tool call): neither tier evicts them while anything else can go.
        0 ends the keep. Returns how many blocks the session has."""
        return self._call("KeepSession", pb.KeepSessionRequest(
            namespace=namespace, session_id=session_id, seconds=seconds)).n_blocks

    def prefetch(self, ids, wait=False, fingerprint=None, room_wait_ms=0):
        """Brings `ids` (the likeliest first) into tier 1 ahead of the loads
        that will want them. Returns at once (done False; poll with lookup)
        or, with `wait`, when done, with what it did (PrefetchResponse:
        in_tier1, promoted, fetched, missing, no_room, failed). With a
        fingerprint and a remote tier, blocks this host lacks come from it."""
        request = pb.PrefetchRequest(ids=_ids_list(ids), wait=wait,
                                     room_wait_ms=room_wait_ms)
        if fingerprint is not None:
            request.fingerprint.CopyFrom(fingerprint)
        return self._call("Prefetch", request)

    def set_retention(self, ids, retention, ttl_seconds=0):
        """Gives `ids` a retention class (pb.RETENTION_LOW: evicted first,
        pb.RETENTION_HIGH: last, pb.RETENTION_NORMAL: by recency) for
        `ttl_seconds` (0: until changed)."""
        self._call("SetRetention", pb.SetRetentionRequest(
            ids=_ids_list(ids), retention=retention, ttl_seconds=ttl_seconds))

    def watch_blocks(self, namespace="", resume_token=b"", kinds=()):
        """A stream of block events (an iterator of pb.BlockEvents; cancel()
        ends it): the first message at once, with a resume_token to pass
        back after a reconnect; then batches as blocks are stored, spilled,
        demoted, promoted, evicted or removed, or their retention class
        expires."""
        return self._watch_blocks(pb.WatchBlocksRequest(
            namespace=namespace, resume_token=resume_token, kinds=list(kinds)))

    def verify(self, ids=()):
        return self._call("Verify", pb.VerifyRequest(ids=_ids_list(ids)))

    def flush(self, evict=False):
        return self._call("Flush", pb.FlushRequest(evict=evict))

    def wait_ready(self, timeout=10.0):
        """Waits until the daemon answers (e.g. after a restart)."""
        self._call("Stat", pb.StatRequest(), timeout=timeout, wait_for_ready=True)


class _RecoveredList(list):
    candidates = 0


# Requests and ring entries, shared by Client and aio.AsyncClient.

def save_entries(metas, slices, pin, durable):
    """Ring entries saving block i (metas[i]) from slices[i]."""
    flags = (_ring.SAVE_PIN if pin else 0) | (_ring.SAVE_DURABLE if durable else 0)
    return [(_ring.OP_SAVE, flags, 0, slc, None, meta.SerializeToString(), (), False)
            for meta, slc in zip(metas, slices)]


def load_entries(ids, fingerprint, slices, first_positions, want_meta):
    """Ring entries loading ids[i] into slices[i], re-anchored to
    first_positions[i] unless it is None."""
    fp = fingerprint.SerializeToString()
    want = _ring.LOAD_WANT_META if want_meta else 0
    return [(_ring.OP_LOAD, (_ring.LOAD_REANCHOR if p is not None else 0) | want, p or 0, slc,
             block_id, fp, (), want_meta)
            for block_id, slc, p in zip(ids, slices, first_positions)]


def _add_reanchor(request, first_positions):
    # LoadRequest.reanchor: empty, or one entry per id (unset: keep).
    if all(p is None for p in first_positions):
        return
    for p in first_positions:
        r = request.reanchor.add()
        if p is not None:
            r.first_position = p


def recover_request(namespace, session_id, queries, layer, k=8, kind=None, min_score=None,
                    aggregation=None, exclude_ids=(), require_bytes=False):
    """The RecoverRequest of Client.recover's arguments."""
    q = np.asarray(queries, dtype=np.float32)
    if q.ndim != 2:
        raise InvalidArgument(f"queries: want (n_query_heads, head_dim), got {q.shape}")
    request = pb.RecoverRequest(
        kind=pb.SUMMARY_MEAN_KEYS if kind is None else kind, layer=layer,
        n_query_heads=q.shape[0], k=k, require_bytes=require_bytes,
        exclude_ids=_ids_list(exclude_ids))
    request.session.namespace = namespace
    request.session.session_id = session_id
    request.queries.extend(q.reshape(-1).tolist())
    if min_score is not None:
        request.min_score = min_score
    if aggregation is not None:
        request.aggregation = aggregation
    return request


def recovered(response):
    """Client.recover's answer: Recovered blocks, best first, with
    `.candidates`."""
    out = _RecoveredList(Recovered(b.id, b.score, b.tier, b.bytes_available, b.meta)
                         for b in response.blocks)
    out.candidates = response.candidates
    return out


def _as_bytes(data):
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    arr = np.ascontiguousarray(data)
    return arr.tobytes()
