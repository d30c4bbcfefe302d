"""Shared memory: sealed memfd regions handed to evoked, and an arena that
hands out numpy arrays living in them.

A region is a memfd (os.memfd_create), sized, sealed against shrinking and
growing (fcntl F_ADD_SEALS), mapped here, and sent to the daemon over its fd
channel (socket.send_fds, SCM_RIGHTS). The daemon maps the same pages, so a
block saved from, or loaded into, an array of the arena is copied once, by
the daemon, and never by Python.
"""

import fcntl
import mmap
import os
import socket
import struct
import threading
import weakref

from .errors import error_for, Unavailable

__all__ = ["Region", "Arena", "register_fd"]

_FD_MAGIC = b"EVKFD001"
_REPLY_HEAD = struct.Struct("<IQI")

# fcntl constants (Linux); Python 3.11 has most of them in fcntl.
_F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
_F_SEAL_SEAL = getattr(fcntl, "F_SEAL_SEAL", 0x1)
_F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x2)
_F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 0x4)


def _recv_exact(sock, n):
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise Unavailable(f"fd channel: peer closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def register_fd(fd_socket, lease_id, fd, size, timeout=5.0):
    """Registers memfd `fd` of `size` bytes with lease `lease_id` through the
    daemon's fd channel at `fd_socket`. Returns the region id."""
    request = _FD_MAGIC + bytes(lease_id) + struct.pack("<Q", size)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(fd_socket)
            socket.send_fds(s, [request], [fd])
            code, region_id, msg_len = _REPLY_HEAD.unpack(_recv_exact(s, _REPLY_HEAD.size))
            message = _recv_exact(s, msg_len).decode(errors="replace") if msg_len else ""
        except OSError as e:
            raise Unavailable(f"fd channel {fd_socket}: {e}") from None
    if code != 0:
        raise error_for(code, message)
    return region_id


class Region:
    """One sealed memfd region, mapped read-write here.

    `id` is the daemon's region id under the current lease (it changes when
    the client re-registers the region with a new lease, e.g. after the
    daemon restarted); `mem` is the mmap; `address` its base address."""

    def __init__(self, size, name="evoke-region"):
        if size <= 0:
            raise ValueError("size: must be > 0")
        self.size = size
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, _F_ADD_SEALS, _F_SEAL_SHRINK | _F_SEAL_GROW | _F_SEAL_SEAL)
            self.mem = mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        import ctypes
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
        self.id = None        # Region id under `lease`.
        self.lease = None     # The lease it is registered with.
        self._closed = False

    def register(self, fd_socket, lease_id):
        """Registers the region with `lease_id` (no-op when it already is)."""
        if self.lease == lease_id and self.id is not None:
            return self.id
        self.id = register_fd(fd_socket, lease_id, self.fd, self.size)
        self.lease = lease_id
        return self.id

    def contains(self, address, nbytes):
        return self.address <= address and address + nbytes <= self.address + self.size

    def close(self):
        """Unmaps and closes (the daemon drops its mapping when the lease
        ends or the region is unregistered)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.mem.close()
        except BufferError:
            # Arrays still view it: leave the mapping to the garbage collector.
            pass
        os.close(self.fd)


class Arena:
    """Hands out byte ranges of a Region as numpy arrays.

    First-fit over a sorted free list, every allocation aligned to 64 bytes
    (4096 for 1 MiB and more, so that large blocks start on a page). An
    allocation is returned to the arena when the last numpy view of it is
    garbage collected. Thread-safe."""

    def __init__(self, region):
        self.region = region
        self._lock = threading.Lock()
        self._free = [(0, region.size)]  # (offset, length), sorted, coalesced.
        self.used = 0

    def _alloc(self, nbytes):
        align = 4096 if nbytes >= (1 << 20) else 64
        with self._lock:
            for i, (off, length) in enumerate(self._free):
                start = (off + align - 1) // align * align
                end = start + nbytes
                if end <= off + length:
                    pieces = []
                    if start > off:
                        pieces.append((off, start - off))
                    if end < off + length:
                        pieces.append((end, off + length - end))
                    self._free[i:i + 1] = pieces
                    self.used += nbytes
                    return start
        return None

    def _release(self, offset, nbytes):
        with self._lock:
            self.used -= nbytes
            free = self._free
            lo, hi = 0, len(free)
            while lo < hi:
                mid = (lo + hi) // 2
                if free[mid][0] < offset:
                    lo = mid + 1
                else:
                    hi = mid
            free.insert(lo, (offset, nbytes))
            # Coalesce with the neighbours.
            if lo + 1 < len(free) and free[lo][0] + free[lo][1] == free[lo + 1][0]:
                free[lo] = (free[lo][0], free[lo][1] + free[lo + 1][1])
                del free[lo + 1]
            if lo > 0 and free[lo - 1][0] + free[lo - 1][1] == free[lo][0]:
                free[lo - 1] = (free[lo - 1][0], free[lo - 1][1] + free[lo][1])
                del free[lo]

    def allocate(self, nbytes):
        """A writable numpy uint8 array of `nbytes` bytes of the region, or
        None when no free range is large enough. Views of it (reshape,
        .view(dtype), slices) all keep it alive (numpy makes it their .base);
        the range returns to the arena once it and every view are gone."""
        import numpy as np
        if nbytes <= 0:
            raise ValueError("nbytes: must be > 0")
        offset = self._alloc(nbytes)
        if offset is None:
            return None
        root = np.frombuffer(self.region.mem, dtype=np.uint8, count=nbytes, offset=offset)
        weakref.finalize(root, self._release, offset, nbytes)
        return root

    def free_bytes(self):
        with self._lock:
            return sum(length for _, length in self._free)
