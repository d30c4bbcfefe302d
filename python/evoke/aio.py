"""evoke.aio.AsyncClient: the asyncio client, for engines with an event loop.

Control calls use grpc.aio. Shared-memory saves and loads go through the
command ring: submitting is a few memory writes (done on the loop), and one
reaper thread per client collects completions and resolves the awaiting
futures, so thousands of requests can be in flight without a thread each.
The lease, arena and ring are the synchronous Client's (`.sync`), so arrays
from either can be used with both.
"""

import asyncio
import threading
import time

import grpc

from . import errors
from ._proto import pb
from .client import (Client, SaveResult, LoadResult, _METHODS, _SERVICE, _ids_list,
                     channel_options, load_entries, recover_request, recovered, save_entries,
                     target_of)

__all__ = ["AsyncClient"]


class AsyncClient:
    """Like evoke.Client, with coroutine methods. Create it inside the
    running loop; `await client.close()` (or `async with`) ends it."""

    def __init__(self, socket_path, timeout=60.0, shm_bytes=64 << 20, ring_entries=256,
                 max_reconnect_backoff=1.0, client_name=None, wait_for_ready=False):
        self.timeout = timeout
        self.wait_for_ready = wait_for_ready
        self.sync = Client(socket_path, timeout=timeout, shm_bytes=shm_bytes,
                           ring_entries=ring_entries,
                           max_reconnect_backoff=max_reconnect_backoff,
                           client_name=client_name, wait_for_ready=wait_for_ready)
        self._channel = grpc.aio.insecure_channel(target_of(socket_path),
                                                  options=channel_options(max_reconnect_backoff))
        self._calls = {
            name: self._channel.unary_unary(_SERVICE + name,
                                            request_serializer=lambda m: m.SerializeToString(),
                                            response_deserializer=getattr(pb, resp).FromString)
            for name, (_, resp) in _METHODS.items()
        }
        self._loop = asyncio.get_running_loop()
        self._waiters = {}   # (ring id, ticket) -> future
        self._early = {}     # Completions reaped before their future was registered.
        self._lock = threading.Lock()
        self._reaper = None
        self._reaper_ring = None
        self._stop = threading.Event()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self):
        self._stop.set()
        if self._reaper is not None:
            await asyncio.to_thread(self._reaper.join, 2.0)
        await self._channel.close()
        await asyncio.to_thread(self.sync.close)

    async def _call(self, name, request, timeout=None):
        try:
            return await self._calls[name](request, timeout=timeout or self.timeout,
                                           wait_for_ready=self.wait_for_ready)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    # ---------------------------------------------------------- the ring

    async def _lease(self):
        lease = self.sync._lease
        if lease is None or lease.ended.is_set():
            lease = await asyncio.to_thread(self.sync._ensure_lease)
        return lease

    def _ensure_reaper(self, ring):
        with self._lock:
            if self._reaper is not None and self._reaper_ring is ring and self._reaper.is_alive():
                return
            self._reaper_ring = ring
            self._reaper = threading.Thread(target=self._reap_loop, args=(ring,),
                                            name="evoke-aio-reaper", daemon=True)
            self._reaper.start()

    def _reap_loop(self, ring):
        while not self._stop.is_set():
            try:
                done = ring.take_completions(0.05)
            except errors.EvokeError as e:
                # The lease ended: fail everyone waiting on this ring.
                with self._lock:
                    waiting = [(k, f) for k, f in self._waiters.items() if k[0] == id(ring)]
                    for k, _ in waiting:
                        del self._waiters[k]
                for _, f in waiting:
                    self._loop.call_soon_threadsafe(_fail, f, e)
                return
            for ticket, completion in done.items():
                key = (id(ring), ticket)
                with self._lock:
                    f = self._waiters.pop(key, None)
                    if f is None:
                        self._early[key] = completion
                        continue
                self._loop.call_soon_threadsafe(_resolve, f, completion)

    async def _run(self, entries):
        lease = await self._lease()
        ring = lease.ring
        if ring is None or not ring.alive():
            return None
        self._ensure_reaper(ring)
        deadline = time.monotonic() + self.timeout
        tickets = ring.submit(entries, deadline)
        futures = []
        with self._lock:
            for t in tickets:
                key = (id(ring), t)
                f = self._loop.create_future()
                if key in self._early:
                    f.set_result(self._early.pop(key))
                else:
                    self._waiters[key] = f
                futures.append(f)
        try:
            done = await asyncio.wait_for(asyncio.gather(*futures),
                                          max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise errors.DeadlineExceeded("ring: no completion in time") from None
        return [c.raise_for_status() for c in done]

    # ------------------------------------------------------- data calls

    def block_array(self, fp, n_tokens, n_layers=None):
        """As Client.block_array (shared-memory arena)."""
        return self.sync.block_array(fp, n_tokens, n_layers)

    def buffer(self, nbytes):
        return self.sync.buffer(nbytes)

    async def save(self, meta, data, pin=False, durable=False):
        return (await self.save_many([(meta, data)], pin, durable))[0]

    async def save_many(self, blocks, pin=False, durable=False):
        """As Client.save_many; arena arrays go through the ring."""
        blocks = list(blocks)
        await self._lease()
        spans = [self.sync._span_of(d) for _, d in blocks]
        if blocks and all(s is not None for s in spans):
            slices = [self.sync._slice(s) for s in spans]
            done = await self._run(save_entries([m for m, _ in blocks], slices, pin, durable))
            if done is not None:
                return [SaveResult(bytes(m.id), c.deduplicated, c.checksum, c.tier)
                        for (m, _), c in zip(blocks, done)]
        return await asyncio.to_thread(self.sync.save_many, blocks, pin, durable)

    async def load_into(self, block_id, fingerprint, out, first_position=None):
        return (await self.load_many_into([block_id], fingerprint, [out],
                                          first_position))[0]

    async def load_many_into(self, ids, fingerprint, outs, first_positions=None):
        """As Client.load_many_into; through the ring."""
        ids = _ids_list(ids)
        await self._lease()
        spans, first_positions = self.sync._load_args(ids, outs, first_positions)
        slices = [self.sync._slice(s) for s in spans]
        done = await self._run(load_entries(ids, fingerprint, slices, first_positions, False))
        if done is None:
            return await asyncio.to_thread(self.sync.load_many_into, ids, fingerprint, outs,
                                           first_positions)
        return [LoadResult(i, c.tier, c.checksum, c.payload_bytes) for i, c in zip(ids, done)]

    async def load(self, ids, fingerprint, first_positions=None):
        return await asyncio.to_thread(self.sync.load, ids, fingerprint, first_positions)

    # ---------------------------------------------------------- control

    async def lookup(self, ids, namespace="", trust_group=""):
        r = await self._call("Lookup", pb.LookupRequest(ids=_ids_list(ids), namespace=namespace,
                                                        trust_group=trust_group))
        return list(r.tiers[:r.n_present])

    async def recover(self, namespace, session_id, queries, layer, k=8, kind=None,
                      min_score=None, aggregation=None, exclude_ids=(), require_bytes=False):
        """As Client.recover."""
        request = recover_request(namespace, session_id, queries, layer, k, kind, min_score,
                                  aggregation, exclude_ids, require_bytes)
        return recovered(await self._call("Recover", request))

    async def stat(self):
        return await self._call("Stat", pb.StatRequest())

    async def delete(self, ids):
        return (await self._call("Delete", pb.DeleteRequest(ids=_ids_list(ids)))).n_deleted

    async def describe(self, block_id):
        return await self._call("Describe", pb.DescribeRequest(id=bytes(block_id)))


def _resolve(f, completion):
    if not f.done():
        f.set_result(completion)


def _fail(f, e):
    if not f.done():
        f.set_exception(e)
