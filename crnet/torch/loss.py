"""The loss whose gradient is this process's coded share of the global batch's gradient."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def weighted_loss(losses: torch.Tensor, weights: torch.Tensor | np.ndarray | Sequence[float]
                  ) -> torch.Tensor:
    """``sum_i weights[i] * losses[i]``: its gradient is this process's coded share.

    ``losses`` holds one loss per sample, as a loss function computes it with
    ``reduction="none"`` (reduce any further dimensions per sample yourself, e.g.
    ``.mean(dim=1)``, so that the mean over the batch is the loss you mean to train on).
    Sum, not mean: the tree adds the shares up to the global batch's *sum*, and
    ``DistributedOptimizer.step`` divides by the global batch size, so the update is
    that of the mean loss over the global batch.
    """
    if losses.dim() != 1:
        raise ValueError(f"weighted_loss takes one loss per sample (shape (B,)), got shape "
                         f"{tuple(losses.shape)}: compute the loss with reduction='none' and "
                         "reduce each sample's further dimensions first (e.g. .mean(dim=1))")
    w = torch.as_tensor(weights).to(dtype=losses.dtype, device=losses.device)
    if w.shape != losses.shape:
        raise ValueError(f"{losses.shape[0]} losses but {w.numel()} weights")
    return (losses * w).sum()
