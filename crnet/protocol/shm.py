"""Shared memory between a training process and its daemon.

The client creates an anonymous memory file (``memfd_create``), sizes it, seals it
against shrinking and growing, maps it, and hands the daemon the descriptor itself
over the Unix socket (SCM_RIGHTS; ``client/aio.py``, ``node/client_socket.py``). The
daemon checks the seals and the size before it maps it: it never opens a path a
client names, and no client can shrink the memory under the daemon's mapping (which
would kill it with SIGBUS). The memory lives exactly as long as the two mappings, so
a crash on either side leaks nothing. Vectors never travel through the client
socket; only step numbers and lengths do.

Layout: ``[progress | input | output]``. ``progress`` (``Progress``, one page) is
written by the daemon the moment a step is decided, so the training process knows
the tree's progress between two micro-batches without asking. The two halves are
``capacity`` bytes each: the client writes its local gradient into the input half,
the daemon writes the step's result into the output half.
"""

from __future__ import annotations

import fcntl
import mmap
import os

import numpy as np

PROGRESS_BYTES = 4096
# Sealed this way, the memory can be neither shrunk nor grown, nor unsealed, by anyone.
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SharedRegion:
    """Two halves of ``capacity`` bytes in one shared mapping."""

    def __init__(self, mapping: mmap.mmap, capacity: int, fd: int | None = None):
        self._map = mapping
        self.capacity = capacity
        self.fd = fd           # the client's descriptor, until it has been handed over

    @classmethod
    def create(cls, capacity: int) -> SharedRegion:
        """A new sealed region (the client's side); ``fd`` is what the daemon gets."""
        capacity = max(int(capacity), 1)
        size = PROGRESS_BYTES + 2 * capacity
        fd = os.memfd_create("crnet-shm", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            mapping = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(mapping, capacity, fd)

    @classmethod
    def attach(cls, fd: int, capacity: int) -> SharedRegion:
        """Map the region a client handed over (the daemon's side): it must be sealed
        memory of exactly the size announced. Takes ``fd`` over (closes it)."""
        try:
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                raise ValueError("the descriptor is not sealable shared memory (memfd)") from None
            if seals & SEALS != SEALS:
                raise ValueError("the shared memory is not sealed against shrinking and growing")
            size = PROGRESS_BYTES + 2 * capacity
            if os.fstat(fd).st_size != size:
                raise ValueError(f"the shared memory has {os.fstat(fd).st_size} bytes, "
                                 f"expected {size}")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(mapping, capacity)

    def close_fd(self) -> None:
        """The daemon has its own descriptor (or failed): the client's is not needed."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @property
    def progress(self) -> Progress:
        return Progress(memoryview(self._map)[:PROGRESS_BYTES].cast("q"))

    def input(self, dtype, count: int) -> np.ndarray:
        return self._half(PROGRESS_BYTES, dtype, count)

    def output(self, dtype, count: int) -> np.ndarray:
        return self._half(PROGRESS_BYTES + self.capacity, dtype, count)

    def _half(self, offset: int, dtype, count: int) -> np.ndarray:
        dtype = np.dtype(dtype)
        if count * dtype.itemsize > self.capacity:
            raise ValueError(f"{count} x {dtype} does not fit in {self.capacity} bytes")
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset)


class Progress:
    """The tree's progress as the daemon knows it, in shared memory: written by the daemon
    when a step is decided, read by the training process in well under a microsecond.

    Word 0 is ``tree_step`` (the newest step the master decided), word 1 the newest step
    decided at this daemon in any way, and words 2.. a ring of the last ``RING`` decided
    steps (slot ``step % RING`` holds ``step`` once it is decided). The daemon writes a
    slot before the words that point to it, so a reader never sees a step as finished
    before it is. Word ``STATE`` is the newest request for a peer's state (its nonce;
    0: none), so a process notices one between two steps.
    """

    RING = 64
    STATE = 2 + RING

    def __init__(self, words: memoryview):
        self.words = words

    def reset(self) -> None:
        for i in range(2 + self.RING):
            self.words[i] = -1
        self.words[self.STATE] = 0

    def decided(self, step: int | None, tree_step: int, newest: int) -> None:
        """The daemon's side: ``step`` (if any) is decided; the tree is at ``tree_step``."""
        if step is not None:
            self.words[2 + step % self.RING] = step
        self.words[1] = newest
        self.words[0] = tree_step

    @property
    def tree_step(self) -> int:
        return self.words[0]

    @property
    def state_request(self) -> int:
        return self.words[self.STATE]

    @state_request.setter
    def state_request(self, nonce: int) -> None:
        self.words[self.STATE] = nonce

    def finished(self, step: int) -> bool:
        """The daemon has ``step``'s outcome (or the step lies too far behind to matter)."""
        w = self.words
        return w[2 + step % self.RING] == step or step <= w[1] - self.RING
