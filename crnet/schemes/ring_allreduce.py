"""Ring allreduce at one worker: reduce-scatter, then all-gather (the RAR baseline).

Free of sockets. The vector is cut into N segments. In reduce-scatter round r,
rank k sends segment (k - r) mod N to its successor and adds the segment it
receives from its predecessor into its own copy; after N-1 rounds rank k holds
the full sum of segment (k + 1) mod N. All-gather passes the reduced segments
around the ring for N-1 more rounds. What a rank receives in round r is exactly
what it sends in round r+1, so the schedule is driven by arrivals alone.

Every rank must take part in every round: one straggler stalls the whole ring,
which is the point of the comparison with CodedReduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels import add_into
from .buffers import fresh
from .chunks import ChunkLayout

REDUCE, GATHER = "rs", "ag"


@dataclass(frozen=True)
class Send:
    """Pass ``payload`` (segment ``segment`` of phase/round) to the successor."""

    phase: str
    round: int
    segment: int
    payload: np.ndarray


class RingStep:
    """One step of ring allreduce at rank ``rank`` of ``size``."""

    def __init__(self, step: int, layout: ChunkLayout, rank: int, size: int, alloc=fresh):
        self.step, self.layout, self.rank, self.size = step, layout, rank, size
        edges = np.linspace(0, layout.total, size + 1).round().astype(np.int64)
        self._bounds = list(zip(edges[:-1].tolist(), edges[1:].tolist()))
        # acc is sent segment by segment and each segment is final once sent;
        # all-gather lands in ``result`` so nothing queued for sending is ever
        # overwritten. Neither is last step's, for the same reason (see buffers.py).
        self._alloc = alloc
        self._acc: np.ndarray | None = None
        self._incoming = alloc(layout.total, layout.dtype)   # reduce-scatter arrivals
        self.result = alloc(layout.total, layout.dtype)
        self._early: list[tuple[int, int]] = []                  # arrivals before the local vector
        self._gathered = 0
        self._own_done = size == 1

    @property
    def complete(self) -> bool:
        return self._own_done and self._gathered == self.size - 1

    def check(self, phase, rnd, segment, nbytes) -> str | None:
        """Why an incoming segment header is wrong, or None."""
        if phase not in (REDUCE, GATHER) or not isinstance(rnd, int) or not 0 <= rnd < self.size - 1:
            return f"bad ring round {phase!r}/{rnd!r}"
        expect = self._expected(phase, rnd)
        if segment != expect:
            return f"{phase} round {rnd}: segment {segment!r}, expected {expect}"
        a, b = self._bounds[segment]
        if nbytes != (b - a) * self.layout.dtype.itemsize:
            return f"segment {segment} has {nbytes} bytes, expected {(b - a) * self.layout.dtype.itemsize}"
        return None

    def dest(self, phase: str, segment: int) -> memoryview:
        """Where the predecessor's segment is received."""
        buf = self._incoming if phase == REDUCE else self.result
        a, b = self._bounds[segment]
        return memoryview(buf[a:b]).cast("B")

    def local_arrived(self, vector: np.ndarray) -> list[Send]:
        self._acc = self._alloc(self.layout.total, self.layout.dtype)
        np.copyto(self._acc, vector)
        if self.size == 1:
            self.result = self._acc
            return []
        sends = [self._send(REDUCE, 0, self.rank % self.size, self._acc)]
        for rnd, segment in self._early:
            sends += self._reduce(rnd, segment)
        self._early.clear()
        return sends

    def received(self, phase: str, rnd: int, segment: int) -> list[Send]:
        if phase == GATHER:
            self._gathered += 1
            if rnd + 1 < self.size - 1:
                return [self._send(GATHER, rnd + 1, segment, self.result)]
            return []
        if self._acc is None:
            self._early.append((rnd, segment))
            return []
        return self._reduce(rnd, segment)

    def _reduce(self, rnd: int, segment: int) -> list[Send]:
        a, b = self._bounds[segment]
        add_into(self._acc[a:b], self._incoming[a:b])
        if rnd + 1 < self.size - 1:
            return [self._send(REDUCE, rnd + 1, segment, self._acc)]
        # Fully reduced: this rank owns segment (rank + 1) mod N; start the all-gather.
        self.result[a:b] = self._acc[a:b]
        self._own_done = True
        return [self._send(GATHER, 0, segment, self.result)]

    def _send(self, phase, rnd, segment, source) -> Send:
        a, b = self._bounds[segment]
        return Send(phase, rnd, segment, source[a:b])

    def _expected(self, phase: str, rnd: int) -> int:
        """The segment the predecessor (rank - 1) sends in this phase and round."""
        pred = self.rank - 1
        if phase == REDUCE:
            return (pred - rnd) % self.size
        return (pred + 1 - rnd) % self.size
