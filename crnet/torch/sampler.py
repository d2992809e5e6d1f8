"""Which samples this process computes each step, and their coding weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..client import Assignment, Client
from ..client.batches import BatchSampler


class CodedSampler:
    """This process's samples of each step, and their coding weights, for a torch data set.

    Built on ``crnet.client.batches.BatchSampler`` (``seed`` shared by every process): step ``t``'s
    global batch is the same on every host, a fresh permutation each epoch. With a
    ``Client`` it follows ``client.assignment``, so a re-formed tree's new share
    (``AssignmentChanged``) is used from the next ``local`` on.
    """

    def __init__(self, dataset: Any, source: Client | Assignment, seed: int = 0):
        """``dataset``: anything with ``len`` (a ``torch.utils.data.Dataset``), or its size."""
        self.dataset_size = dataset if isinstance(dataset, int) else len(dataset)
        self.seed = seed
        self._source = source
        self._batches: BatchSampler | None = None

    @property
    def assignment(self) -> Assignment:
        src = self._source
        return src if isinstance(src, Assignment) else src.assignment

    @property
    def batches(self) -> BatchSampler:
        """The global batches (rebuilt if the tree's batch size changed)."""
        m = self.assignment.samples
        if self._batches is None or self._batches.batch_size != m:
            self._batches = BatchSampler(self.dataset_size, m, self.seed)
        return self._batches

    def local(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(data set indices, weights): this process's coded share of ``step``'s batch.

        The gradient this process contributes is ``sum_i weights[i] * grad(loss of sample
        indices[i])``: see ``weighted_loss``. Weights are float64 (cast to the loss's dtype
        there)."""
        a = self.assignment
        idx, weights = self.batches.local(step, a)
        return torch.from_numpy(idx), torch.from_numpy(np.ascontiguousarray(weights, np.float64))

    def global_batch(self, step: int) -> torch.Tensor:
        """The data set indices of ``step``'s whole global batch (every process agrees)."""
        return torch.from_numpy(self.batches.indices(step))
