"""A replica's whole state as one float64 vector: what a peer sends a process that
(re)joins the job."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from .optimizer_layout import OptimizerLayout
from .packing import model_tensors, pack, unpack
from .staging import HostStaging


class ReplicaState:
    """The model's tensors (parameters and persistent buffers), then the optimizer's state.

    It owns the optimizer's ``OptimizerLayout``: learning one runs a probe step, so it is
    learned once and again only if the optimizer's parameters changed.
    """

    def __init__(self, model: torch.nn.Module | Mapping[str, torch.Tensor],
                 optimizer: torch.optim.Optimizer):
        self.model = model
        self.optimizer = optimizer
        self._layout: OptimizerLayout | None = None
        self.staging = HostStaging()      # a CUDA model's tensors to the host and back

    @property
    def layout(self) -> OptimizerLayout:
        """The optimizer's layout, learned once (again if its parameters changed)."""
        if self._layout is None or not self._layout.fits(self.optimizer):
            self._layout = OptimizerLayout(self.optimizer)
        return self._layout

    def size(self) -> int:
        """Elements of the vector."""
        return sum(t.numel() for t in model_tensors(self.model)) + self.layout.size

    def pack(self, dest: np.ndarray) -> None:
        at = pack(model_tensors(self.model), dest, self.staging)
        self.layout.pack(self.optimizer, dest[at:], self.staging)

    def load(self, src: np.ndarray) -> None:
        at = unpack(model_tensors(self.model), src, self.staging)
        self.layout.unpack(self.optimizer, src[at:], self.staging)
