"""A model's tensors copied into one flat vector, one after the other, and back (CUDA
tensors through a ``HostStaging``'s pinned buffer, when given one)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch

from .staging import HostStaging


def model_tensors(model: torch.nn.Module | Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """The model's state (parameters and persistent buffers), in ``state_dict`` order."""
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    return [t for t in state.values() if isinstance(t, torch.Tensor)]


def pack(tensors: Iterable[torch.Tensor], dest: np.ndarray, staging: HostStaging | None = None) -> int:
    """Copy ``tensors`` into ``dest`` one after the other (converting the dtype); returns
    how many elements were written."""
    if staging is not None:
        tensors = staging.down(list(tensors))      # CPU tensors: themselves
    flat = torch.from_numpy(dest)
    at = 0
    for t in tensors:
        n = t.numel()
        flat[at:at + n].copy_(t.detach().reshape(-1))
        at += n
    return at


def unpack(tensors: Iterable[torch.Tensor], src: np.ndarray, staging: HostStaging | None = None) -> int:
    """Overwrite ``tensors`` in place from ``src`` (the inverse of ``pack``)."""
    tensors = list(tensors)
    host = tensors if staging is None else staging.room(tensors)     # CPU tensors: themselves
    flat = torch.from_numpy(src)
    at = 0
    with torch.no_grad():
        for t in host:
            n = t.numel()
            t.copy_(flat[at:at + n].view(t.shape))
            at += n
    if staging is not None:
        staging.up(tensors, host)
    return at
