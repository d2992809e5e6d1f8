"""The client's step calls with tensors in and out: ``allreduce`` and ``result``."""

from __future__ import annotations

import numpy as np
import torch

from ..client import Client
from .dtypes import WIRE_DTYPES, wire_dtype
from .staging import HostStaging


def allreduce(client: Client, tensor: torch.Tensor, step: int, out: torch.Tensor | None = None,
              timeout: float | None = None) -> torch.Tensor:
    """``client.allreduce`` with a tensor: the sum over the tree, shaped like ``tensor``.

    A CPU tensor is handed over as a numpy view (``Client.allreduce`` copies it into the
    shared input, unless it *is* the shared input: ``torch.from_numpy(client.buffer(n,
    dtype))``). The result is a new CPU tensor, or lands in ``out`` (a CPU tensor; pass
    ``torch.from_numpy(client.result_buffer(n, dtype))`` and nothing is copied). A GPU
    tensor goes through pinned host memory (crnet.torch.staging): one copy down, the
    result copied back up to its device (into ``out`` if given).
    """
    wire_dtype(tensor.dtype)
    staging = HostStaging()
    host = staging.down([tensor.detach()])[0]          # a CPU tensor: itself
    got = client.allreduce(_host_array(host), step, out=_out_array(out, tensor), timeout=timeout)
    return _returned(got, out, tensor, staging)


def result(client: Client, step: int, like: torch.Tensor, out: torch.Tensor | None = None,
           timeout: float | None = None) -> torch.Tensor:
    """``client.result``: a step's sum without contributing, shaped like ``like`` (its
    values are not used). ``out`` and devices as for ``allreduce``."""
    wire_dtype(like.dtype)
    template = np.empty(like.numel(), dtype=WIRE_DTYPES[like.dtype])
    got = client.result(step, template, out=_out_array(out, like), timeout=timeout)
    return _returned(got, out, like, HostStaging())


def _host_array(t: torch.Tensor) -> np.ndarray:
    """A flat numpy view of a CPU tensor (a copy only if it is not contiguous)."""
    return t.detach().contiguous().numpy().reshape(-1)


def _out_array(out: torch.Tensor | None, like: torch.Tensor) -> np.ndarray | None:
    if out is None or out.device.type != "cpu":
        return None
    if out.dtype != like.dtype or out.numel() != like.numel() or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {like.dtype} tensor of {like.numel()} elements")
    return out.detach().numpy().reshape(-1)


def _returned(got: np.ndarray, out: torch.Tensor | None, like: torch.Tensor,
              staging: HostStaging) -> torch.Tensor:
    result = torch.from_numpy(got)
    if not staging.staged(out if out is not None else like):
        return result.view(like.shape) if out is None else out   # out: the client wrote it
    dest = out if out is not None else torch.empty(like.shape, dtype=like.dtype, device=like.device)
    host = staging.room([dest])
    host[0].copy_(result.view(dest.shape))
    staging.up([dest], host)                          # host -> device
    return dest
