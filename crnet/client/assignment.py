"""This process's place in the tree and its share of every global batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Assignment"]


@dataclass(frozen=True)
class Assignment:
    """This process's place in the tree and its share of every global batch.

    ``ranges`` are ``(start, stop, weight)`` over batch positions 0..samples-1: the
    process must return sum over them of weight * (gradient of that sample).
    The master's training process (if any) has an empty share.
    """

    name: str
    layer: int
    samples: int
    workers: int
    ranges: tuple[tuple[int, int, float], ...]
    process: int = 0            # which of this host's training processes (--local-processes)
    processes: int = 1
    # Its place among every process of the tree: host by host (master first, then layer by
    # layer, as ``crnet run`` ranks them: $CRNET_RANK), ``processes`` per host.
    rank: int = 0

    @classmethod
    def from_wire(cls, doc: dict) -> Assignment:
        return cls(doc["name"], doc["layer"], doc["samples"], doc["workers"],
                   tuple((int(a), int(b), float(w)) for a, b, w in doc["ranges"]),
                   doc.get("process", 0), doc.get("processes", 1), doc.get("rank", 0))

    @property
    def local_samples(self) -> int:
        return sum(b - a for a, b, _ in self.ranges)

    def positions(self) -> tuple[np.ndarray, np.ndarray]:
        """(batch positions, weight of each): this process's samples, flattened."""
        if not self.ranges:
            return np.zeros(0, np.int64), np.zeros(0)
        pos = np.concatenate([np.arange(a, b) for a, b, _ in self.ranges])
        w = np.concatenate([np.full(b - a, w) for a, b, w in self.ranges])
        return pos, w
