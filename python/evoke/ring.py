"""The client side of evoked's command ring, in Python.

The layout is common/ring_format.h's: a 4096-byte header, a submission queue
(64-byte entries), a completion queue (64-byte entries), a message area per
completion and an argument area per submission. Blocks are saved and loaded
through it without an RPC each; gRPC stays for control.

Memory ordering. CPython has no atomics, so this relies on what x86-64 (and
the kernel) give: aligned 4- and 8-byte stores through ctypes are single
instructions, stores become visible in program order (TSO), and a futex
system call is a full barrier. After publishing submissions the client
always clears sq_need_wake and calls FUTEX_WAKE (one system call per batch,
not per block), so a daemon about to sleep never misses them. A client
waiting for completions polls cq_tail for a window learned from its recent
waits (AdaptiveSpin), then sets cq_need_wake, issues the same barrier,
re-reads cq_tail and only then sleeps, for at most 20 ms at a time. On other
architectures the module refuses to run the ring (the client then uses the
RPCs).
"""

import ctypes
import os
import platform
import struct
import threading
import time

from .errors import error_for, Unavailable, DeadlineExceeded, InvalidArgument

MAGIC = 0x31474E524B4F5645
VERSION = 1
HEADER_BYTES = 4096
OP_SAVE, OP_LOAD = 1, 2
SAVE_PIN, SAVE_DURABLE = 1, 2
LOAD_REANCHOR, LOAD_WANT_META = 1, 2
CQE_DEDUPLICATED, CQE_META_OMITTED = 1, 2
MAX_SLICES = 4096

# RingHeader: fixed fields, then one 64-byte line per index word.
_HEADER_FIXED = struct.Struct("<QIIIIII")
_SQ_TAIL, _SQ_HEAD, _CQ_TAIL, _CQ_HEAD, _SQ_NEED_WAKE, _CQ_NEED_WAKE, _BROKEN = (
    64 * (i + 1) for i in range(7))
_SQE = struct.Struct("<QBBHIIiQQQ16s")
_CQE = struct.Struct("<QiIQQII24x")
_SLICE = struct.Struct("<QQQ")
assert _SQE.size == 64 and _CQE.size == 64

_SYS_FUTEX = {"x86_64": 202}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class AdaptiveSpin:
    """How long a waiter polls for a completion before it sleeps on the
    futex, from how long its recent waits took (the C++ client's
    common/adaptive_spin.h): twice the recent mean wait while that is under
    half of `max_s`, `base_s` otherwise. A daemon that answers within a few
    hundred microseconds is then polled for, not slept on (a futex sleep and
    wake-up each cost tens of microseconds); a slow one costs one short
    poll. Not thread-safe (the ring's lock guards it)."""

    def __init__(self, base_s, max_s):
        self.base = base_s
        self.max = max(base_s, max_s)
        self.mean = self.max  # Starts slow: the first waits poll for `base`.

    def window(self):
        w = 2 * self.mean
        return max(self.base, w) if w <= self.max else self.base

    def record(self, waited_s):
        """A wait that took `waited_s`, counted as at most `max_s`, weighted
        1/8 against the past."""
        self.mean += (min(max(waited_s, 0.0), self.max) - self.mean) / 8


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def supported():
    """Whether this machine can drive a ring from Python (see above)."""
    return _SYS_FUTEX is not None


def geometry(entries):
    """(sq_entries, cq_entries, arg_bytes, msg_bytes, total_bytes) as the
    C++ client chooses them for `entries` submissions."""
    sq = entries
    cq = min(entries * 2, 4096)
    arg, msg = 16 << 10, 4 << 10
    cq_off = HEADER_BYTES + sq * 64
    msg_off = cq_off + cq * 64
    arg_off = msg_off + cq * msg
    return sq, cq, arg, msg, arg_off + sq * arg


class Completion:
    """What the daemon answered for one ring entry."""
    __slots__ = ("status", "message", "checksum", "payload_bytes", "tier",
                 "deduplicated", "meta")

    def __init__(self, status, message, checksum, payload_bytes, tier, deduplicated, meta):
        self.status = status
        self.message = message
        self.checksum = checksum
        self.payload_bytes = payload_bytes
        self.tier = tier
        self.deduplicated = deduplicated
        self.meta = meta  # Serialized BlockMeta (load with want_meta) or None.

    def raise_for_status(self):
        if self.status != 0:
            raise error_for(self.status, self.message)
        return self


class Ring:
    """Drives one ring in `region` (a shm.Region the daemon attached).
    Thread-safe: one lock around submission and reaping."""

    def __init__(self, region, entries):
        if not supported():
            raise Unavailable(f"ring: not supported on {platform.machine()} from Python")
        self.region = region
        self.sq_entries, self.cq_entries, self.arg_bytes, self.msg_bytes, total = geometry(
            entries)
        if region.size < total:
            raise InvalidArgument(f"ring: region of {region.size} bytes, need {total}")
        self._mem = region.mem
        self._base = region.address
        self._cq_off = HEADER_BYTES + self.sq_entries * 64
        self._msg_off = self._cq_off + self.cq_entries * 64
        self._arg_off = self._msg_off + self.cq_entries * self.msg_bytes
        self._words = {
            off: ctypes.c_uint32.from_address(self._base + off)
            for off in (_SQ_TAIL, _SQ_HEAD, _CQ_TAIL, _CQ_HEAD, _SQ_NEED_WAKE, _CQ_NEED_WAKE,
                        _BROKEN)
        }
        self._lock = threading.Lock()
        self._reaped = threading.Condition(self._lock)
        self._sq_tail = 0
        self._cq_head = 0
        self._next_ticket = 1
        self._pending = {}   # ticket -> want_meta
        self._done = {}      # ticket -> Completion
        self._dead = False
        self._sleeper = False
        self._spin = AdaptiveSpin(0.00002, 0.0005)

    @staticmethod
    def init_header(region, entries):
        """Writes a fresh ring header into `region` (before AttachRing)."""
        sq, cq, arg, msg, _ = geometry(entries)
        region.mem[0:_HEADER_FIXED.size] = _HEADER_FIXED.pack(MAGIC, VERSION, sq, cq, arg, msg, 0)

    def _load(self, off):
        return self._words[off].value

    def _store(self, off, value):
        self._words[off].value = value & 0xFFFFFFFF

    def _futex(self, off, op, val, timeout=None):
        ts = None
        if timeout is not None:
            sec = int(timeout)
            ts = ctypes.byref(_Timespec(sec, int((timeout - sec) * 1e9)))
        _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self._base + off), op, val, ts, None, 0)

    def alive(self):
        return not self._dead and self._load(_BROKEN) == 0

    def mark_dead(self):
        """Fails every waiting and later call (the lease ended)."""
        with self._lock:
            self._dead = True
            self._reaped.notify_all()

    def _dead_error(self):
        return Unavailable("ring: the lease ended (the daemon went away or stopped serving it)")

    def submit(self, entries, deadline):
        """Queues `entries`, a list of (opcode, flags, first_position, slice,
        id16, proto_bytes, slices, want_meta) tuples, and returns their
        tickets. One wake-up for the whole batch."""
        tickets = []
        with self._lock:
            for opcode, flags, first_position, slc, id16, proto, slices, want_meta in entries:
                slices_at = (len(proto) + 7) & ~7
                arg_len = slices_at + len(slices) * _SLICE.size if (proto or slices) else 0
                if arg_len > self.arg_bytes:
                    raise InvalidArgument(
                        f"meta: {arg_len} bytes of arguments exceed the ring's {self.arg_bytes}")
                if len(slices) > MAX_SLICES:
                    raise InvalidArgument(f"slices: {len(slices)}, the most is {MAX_SLICES}")
                while (self._sq_tail - self._load(_SQ_HEAD)) & 0xFFFFFFFF >= self.sq_entries \
                        or len(self._pending) >= self.cq_entries:
                    if not self.alive():
                        raise self._dead_error()
                    self._wake_daemon()
                    if self._reap() > 0:
                        self._reaped.notify_all()
                        continue
                    if time.monotonic() >= deadline:
                        raise DeadlineExceeded("ring: the submission queue stayed full")
                    self._lock.release()
                    try:
                        time.sleep(0.00002)
                    finally:
                        self._lock.acquire()
                if not self.alive():
                    raise self._dead_error()
                ticket = self._next_ticket
                self._next_ticket += 1
                slot = self._sq_tail & (self.sq_entries - 1)
                if arg_len:
                    at = self._arg_off + slot * self.arg_bytes
                    self._mem[at:at + len(proto)] = proto
                    for i, s in enumerate(slices):
                        o = at + slices_at + i * _SLICE.size
                        self._mem[o:o + _SLICE.size] = _SLICE.pack(*s)
                region_id, offset, length = slc if slc is not None else (0, 0, 0)
                at = HEADER_BYTES + slot * 64
                self._mem[at:at + 64] = _SQE.pack(
                    ticket, opcode, flags, len(slices), arg_len, len(proto), first_position,
                    region_id, offset, length, id16 or bytes(16))
                self._sq_tail = (self._sq_tail + 1) & 0xFFFFFFFF
                self._store(_SQ_TAIL, self._sq_tail)
                self._pending[ticket] = want_meta
                tickets.append(ticket)
            self._wake_daemon()
        return tickets

    def _wake_daemon(self):
        # Always (see the module comment): clear the word, then FUTEX_WAKE,
        # which is also the full barrier the publication needs.
        self._store(_SQ_NEED_WAKE, 0)
        self._futex(_SQ_NEED_WAKE, _FUTEX_WAKE, 0x7FFFFFFF)

    def _reap(self):
        tail = self._load(_CQ_TAIL)
        if ((tail - self._cq_head) & 0xFFFFFFFF) > self.cq_entries:
            return 0  # Not believed (see ring_format.h).
        n = 0
        mem = self._mem
        while self._cq_head != tail:
            slot = self._cq_head & (self.cq_entries - 1)
            at = self._cq_off + slot * 64
            user_data, status, flags, checksum, payload_bytes, tier, msg_len = _CQE.unpack(
                mem[at:at + 64])
            msg_len = min(msg_len, self.msg_bytes)
            mat = self._msg_off + slot * self.msg_bytes
            want_meta = self._pending.pop(user_data, None)
            if want_meta is not None:
                message, meta = "", None
                if status != 0:
                    message = mem[mat:mat + msg_len].decode(errors="replace")
                elif want_meta and not flags & CQE_META_OMITTED:
                    meta = mem[mat:mat + msg_len]
                self._done[user_data] = Completion(status, message, checksum, payload_bytes,
                                                   tier, bool(flags & CQE_DEDUPLICATED), meta)
            self._cq_head = (self._cq_head + 1) & 0xFFFFFFFF
            n += 1
        self._store(_CQ_HEAD, self._cq_head)
        return n

    def wait(self, ticket, deadline):
        """The Completion of `ticket`."""
        with self._lock:
            while True:
                done = self._done.pop(ticket, None)
                if done is not None:
                    return done
                if ticket not in self._pending:
                    raise InvalidArgument(f"ticket: {ticket} is unknown or was already waited for")
                if self._reap() > 0:
                    self._reaped.notify_all()
                    continue
                if not self.alive():
                    raise self._dead_error()
                now = time.monotonic()
                if now >= deadline:
                    raise DeadlineExceeded("ring: no completion in time")
                if self._sleeper:
                    self._reaped.wait(min(deadline - now, 0.05))
                    continue
                self._sleeper = True
                seen = self._cq_head
                window = self._spin.window()
                self._lock.release()
                start = time.monotonic()
                try:
                    self._sleep_until_posted(seen, deadline, window)
                finally:
                    self._lock.acquire()
                    if self._load(_CQ_TAIL) != seen:
                        self._spin.record(time.monotonic() - start)
                    self._sleeper = False
                    self._reaped.notify_all()

    def take_completions(self, timeout):
        """Reaps and returns {ticket: Completion} of everything completed,
        sleeping up to `timeout` seconds when nothing is (for a reaper
        thread that serves many waiters, e.g. the asyncio client). Tickets
        taken here are not seen by wait()."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                self._reap()
                if self._done:
                    done, self._done = self._done, {}
                    return done
                if not self.alive():
                    raise self._dead_error()
                if time.monotonic() >= deadline:
                    return {}
                seen = self._cq_head
                self._lock.release()
                try:
                    self._sleep_until_posted(seen, deadline, 0.00002)
                finally:
                    self._lock.acquire()

    def _sleep_until_posted(self, seen, deadline, spin):
        spin_until = time.monotonic() + spin
        polls = 0
        while time.monotonic() < spin_until:
            if self._load(_CQ_TAIL) != seen:
                return
            polls += 1
            if polls % 16 == 0:
                # Every few microseconds, let the threads doing the work run
                # (the daemon's ring thread, on a machine with few cores);
                # returns at once when nothing else is runnable.
                os.sched_yield()
        self._store(_CQ_NEED_WAKE, 1)
        # A barrier between the store above and the load below (a FUTEX_WAKE
        # on a word nobody sleeps on: the kernel's full fence).
        self._futex(_BROKEN, _FUTEX_WAKE, 0)
        if self._load(_CQ_TAIL) == seen and self.alive():
            self._futex(_CQ_NEED_WAKE, _FUTEX_WAIT, 1,
                        max(0.0, min(deadline - time.monotonic(), 0.02)))
