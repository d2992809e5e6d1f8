"""Shared memory between a training process and its daemon.

The client creates a file in /dev/shm, both sides map it, and the client unlinks
the name as soon as the daemon has mapped it: the memory lives exactly as long as
the two mappings, so a crash on either side leaks nothing. Vectors never travel
through the client socket; only step numbers and lengths do.

Layout: ``[progress | input | output]``. ``progress`` (``Progress``, one page) is
written by the daemon the moment a step is decided, so the training process knows
the tree's progress between two micro-batches without asking. The two halves are
``capacity`` bytes each: the client writes its local gradient into the input half,
the daemon writes the step's result into the output half.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets

import numpy as np

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
PROGRESS_BYTES = 4096


class SharedRegion:
    """Two halves of ``capacity`` bytes in one shared mapping."""

    def __init__(self, mapping: mmap.mmap, capacity: int, path: str | None):
        self._map = mapping
        self.capacity = capacity
        self.path = path

    @classmethod
    def create(cls, capacity: int) -> SharedRegion:
        import tempfile

        capacity = max(int(capacity), 1)
        name = f"crnet-{os.getpid()}-{secrets.token_hex(6)}"
        path = os.path.join(SHM_DIR or tempfile.gettempdir(), name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, PROGRESS_BYTES + 2 * capacity)
            mapping = mmap.mmap(fd, PROGRESS_BYTES + 2 * capacity)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(mapping, capacity, path)

    @classmethod
    def attach(cls, path: str, capacity: int) -> SharedRegion:
        """Map a region the client created (the daemon's side)."""
        fd = os.open(path, os.O_RDWR)
        try:
            size = PROGRESS_BYTES + 2 * capacity
            if os.fstat(fd).st_size != size:
                raise ValueError(f"{path} has {os.fstat(fd).st_size} bytes, expected {size}")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(mapping, capacity, None)

    def unlink(self) -> None:
        """Remove the name; the mappings stay valid."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None

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
