"""Vector-sized arrays reused across steps once nothing references them any more.

A fresh 64 MiB ``np.empty`` per step costs 16,384 page faults (tens of ms) the
first time it is written. But a step's output can't simply be reused next step:
the transport may still hold views of it (queued sends) and the daemon keeps
recent results for training processes that fell behind. CPython's reference
count says exactly when all of those are gone, so a buffer is handed out again
only then.
"""

from __future__ import annotations

import sys

import numpy as np


class BufferPool:
    """Arrays of one size, recycled when unreferenced; at most ``keep`` idle ones."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self._arrays: list[np.ndarray] = []

    def get(self, total: int, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        for a in self._arrays:
            # References: the list, ``a``, getrefcount's argument. Any view, memoryview,
            # queued send or kept result adds to that.
            if a.size == total and a.dtype == dtype and sys.getrefcount(a) == 3:
                return a
        fresh = np.empty(total, dtype)
        self._arrays.append(fresh)
        self._trim()
        return fresh

    def _trim(self) -> None:
        idle = [a for a in self._arrays if sys.getrefcount(a) == 3]
        # Drop the oldest idle ones beyond ``keep``; busy ones stay until freed.
        while len(idle) > self.keep:
            victim = idle.pop(0)
            self._arrays = [a for a in self._arrays if a is not victim]


def fresh(total: int, dtype) -> np.ndarray:
    """The allocator for callers without a pool."""
    return np.empty(total, dtype)
