"""Which host decodes which chunks of a step's vector (``spread``): the one rule.

``spread`` runs CodedReduce's decoding for each chunk of the vector at one host, the
chunk's *owner*, instead of at every parent of the tree. Every host ranks the tree's
nodes in ``Tree.names()`` order (the master is rank 0) and computes the same owners
from the step's layout, so nothing but the ranks' addresses travels in the assignment.

How many owners: every owner takes one piece of every host's vector and sends its
decoded chunks to every host, so a step moves ~2 k N frames. An owner's share is kept at
least ``MIN_SHARE_BYTES``, which leaves small vectors (latency-bound: 20 kB) with one owner
(the master, whose uplink is otherwise idle: it computes nothing) and gives a 4 MB vector on
21 hosts 21 owners of 190 kB each, every host's traffic then the ring's 2N/(N+1) of the
vector each way.

Which ranks: ``k`` owners spread evenly over the hosts that are not excluded (the master
excludes a host that failed as an owner, ``driver.py``), the master first; owner i takes
the i-th k-th of the chunks, contiguous. The chunk size is the tree's (``--chunk-bytes``),
cut down so that every owner has at least one chunk.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from ...dtypes import dtype_name
from ..chunks import ChunkLayout, chunk_bytes_for

__all__ = ["MIN_SHARE_BYTES", "OwnerMap", "Owners", "owner_count", "owners"]

MIN_SHARE_BYTES = 64 << 10


def owner_count(vector_bytes: int, hosts: int) -> int:
    """How many owners a ``vector_bytes`` vector has on ``hosts`` hosts (none excluded)."""
    return max(1, min(hosts, vector_bytes // MIN_SHARE_BYTES))


@dataclass(frozen=True)
class Owners:
    """A step's chunks and who owns each: ``ranks[i]`` owns chunks ``[starts[i], starts[i+1])``."""

    layout: ChunkLayout
    ranks: tuple[int, ...]
    starts: tuple[int, ...]

    def owner(self, chunk: int) -> int:
        """The rank that decodes ``chunk``."""
        for i in range(len(self.ranks) - 1, -1, -1):
            if chunk >= self.starts[i]:
                return self.ranks[i]
        raise ValueError(f"chunk {chunk} out of range")

    def chunks_of(self, rank: int) -> range:
        """The chunks ``rank`` owns (empty if none)."""
        if rank not in self.ranks:
            return range(0)
        i = self.ranks.index(rank)
        return range(self.starts[i], self.starts[i + 1] if i + 1 < len(self.ranks)
                     else self.layout.chunks)

    @property
    def share_bytes(self) -> float:
        """An owner's share of the vector, on average."""
        return self.layout.total * self.layout.dtype.itemsize / len(self.ranks)

    def elements_of(self, rank: int) -> tuple[int, int]:
        """The element range ``rank``'s chunks cover (empty if none)."""
        chunks = self.chunks_of(rank)
        if not chunks:
            return (0, 0)
        return self.layout.bounds(chunks[0])[0], self.layout.bounds(chunks[-1])[1]


def owners(total: int, dtype, chunk_bytes: int, hosts: int,
           excluded: Collection[int] = ()) -> Owners:
    """The owners of a ``total`` x ``dtype`` vector's chunks on ``hosts`` hosts, none of them
    in ``excluded`` (the master's verdict; rank 0, the master, is never excluded)."""
    return _owners(int(total), dtype_name(np.dtype(dtype)), int(chunk_bytes), int(hosts),
                   frozenset(excluded))


@functools.lru_cache(maxsize=256)
def _owners(total: int, dtype: str, chunk_bytes: int, hosts: int,
            excluded: frozenset[int]) -> Owners:
    if hosts < 1:
        raise ValueError(f"hosts must be >= 1, got {hosts}")
    dt = np.dtype(dtype)
    live = [r for r in range(hosts) if r not in excluded or r == 0]
    k = min(len(live), owner_count(total * dt.itemsize, hosts), total)
    ranks = tuple(live[i * len(live) // k] for i in range(k))
    chunk = chunk_bytes_for(total * dt.itemsize, chunk_bytes)
    elems = max(1, min(chunk // dt.itemsize, -(-total // k)))
    layout = ChunkLayout(total, dt, elems, dtype)
    starts = tuple(i * layout.chunks // k for i in range(k))
    return Owners(layout, ranks, starts)


class OwnerMap:
    """Which hosts own no chunks, by step: the master's verdicts (OWNERS), each from a step on."""

    def __init__(self) -> None:
        self._maps: list[tuple[int, frozenset[int]]] = [(0, frozenset())]   # (from step, excluded)
        self.epoch = 0

    def excluded(self, step: int) -> frozenset[int]:
        for start, excluded in reversed(self._maps):
            if step >= start:
                return excluded
        return frozenset()

    @property
    def latest(self) -> frozenset[int]:
        return self._maps[-1][1]

    def replace(self, epoch: int, start: int, excluded: Collection[int]) -> None:
        """From step ``start`` on, ``excluded`` own no chunks (whatever was said of them
        before); maps of steps before ``start`` stay (steps under way keep their owners)."""
        self.epoch = epoch
        kept = [m for m in self._maps if m[0] < start][-2:] or [(0, frozenset())]
        self._maps = [*kept, (start, frozenset(excluded))]
