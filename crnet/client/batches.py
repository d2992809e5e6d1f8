"""Which data set samples form each step's global batch: the same answer on every host.

CodedReduce allocates *batch positions* 0..m-1 (``crnet.coding.plan``). For SGD over a
data set larger than the batch, every host must agree which sample sits at each
position in each step, without talking: positions walk through a fresh seeded
permutation of the data set every epoch.
"""

from __future__ import annotations

import numpy as np

from . import Assignment


class BatchSampler:
    """Step t's batch is positions t*m .. (t+1)*m - 1 of the epochs' permutations, laid end to end.

    Every epoch visits every sample exactly once; a batch that straddles two
    epochs takes the end of one and the start of the next.
    """

    def __init__(self, dataset_size: int, batch_size: int, seed: int = 0):
        if dataset_size < 1 or batch_size < 1:
            raise ValueError(f"dataset_size and batch_size must be >= 1, got {dataset_size}, {batch_size}")
        self.dataset_size = dataset_size
        self.batch_size = batch_size
        self.seed = seed
        self._cache: dict[int, np.ndarray] = {}

    def epoch(self, e: int) -> np.ndarray:
        """The permutation of the data set for epoch ``e``."""
        if e not in self._cache:
            if len(self._cache) > 2:
                self._cache.clear()
            self._cache[e] = np.random.default_rng([self.seed, e]).permutation(self.dataset_size)
        return self._cache[e]

    def indices(self, step: int) -> np.ndarray:
        """Data set index of every batch position of ``step`` (length batch_size)."""
        return self.positions(step, np.arange(self.batch_size))

    def positions(self, step: int, positions: np.ndarray) -> np.ndarray:
        """Data set indices of the given batch positions of ``step``."""
        n = self.dataset_size
        flat = step * self.batch_size + np.asarray(positions, dtype=np.int64)
        epochs, offsets = np.divmod(flat, n)
        out = np.empty(len(flat), dtype=np.int64)
        for e in np.unique(epochs):
            mask = epochs == e
            out[mask] = self.epoch(int(e))[offsets[mask]]
        return out

    def local(self, step: int, assignment: Assignment) -> tuple[np.ndarray, np.ndarray]:
        """(data set indices, weights) of this host's share of ``step``'s batch."""
        pos, weights = assignment.positions()
        return self.positions(step, pos), weights
