"""Shared memory between a training process and its daemon.

The client creates a file in /dev/shm, both sides map it, and the client unlinks
the name as soon as the daemon has mapped it: the memory lives exactly as long as
the two mappings, so a crash on either side leaks nothing. Vectors never travel
through the client socket; only step numbers and lengths do.

Layout: ``[input | output]``, each half ``capacity`` bytes: the client writes its
local gradient into the input half, the daemon writes the step's result into the
output half.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets

import numpy as np

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


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
            os.ftruncate(fd, 2 * capacity)
            mapping = mmap.mmap(fd, 2 * capacity)
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
            if os.fstat(fd).st_size != 2 * capacity:
                raise ValueError(f"{path} has {os.fstat(fd).st_size} bytes, expected {2 * capacity}")
            mapping = mmap.mmap(fd, 2 * capacity)
        finally:
            os.close(fd)
        return cls(mapping, capacity, None)

    def unlink(self) -> None:
        """Remove the name; the mappings stay valid."""
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None

    def input(self, dtype, count: int) -> np.ndarray:
        return self._half(0, dtype, count)

    def output(self, dtype, count: int) -> np.ndarray:
        return self._half(self.capacity, dtype, count)

    def _half(self, offset: int, dtype, count: int) -> np.ndarray:
        dtype = np.dtype(dtype)
        if count * dtype.itemsize > self.capacity:
            raise ValueError(f"{count} x {dtype} does not fit in {self.capacity} bytes")
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset)
