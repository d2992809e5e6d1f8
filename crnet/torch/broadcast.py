"""One process's model or optimizer state to every process of the job (a checkpoint)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from ..client import Client
from .dtypes import WIRE_DTYPES
from .optimizer_layout import OptimizerLayout
from .packing import model_tensors, pack, unpack
from .staging import HostStaging


def broadcast_parameters(model: torch.nn.Module | Mapping[str, torch.Tensor], client: Client,
                         root: bool | int, key: str | None = None,
                         timeout: float | None = None) -> None:
    """Give every process the root's parameters and buffers (``model.state_dict()``).

    Collective: every process of the job calls it with the root's rank (``root=0``: the
    process of ``client.assignment.rank`` 0, e.g. the one that loaded the checkpoint;
    every process then takes that process's copy only), or one with ``root=True`` and the
    others with False (then every process of the job calls it before the others take the
    root's copy: ``Client.broadcast``). ``key``
    names the broadcast within the job; by default ``crnet.torch/parameters/<k>`` with k
    counting this process's calls
    (``Client.numbered_key``), so give it explicitly if the processes might not make the
    same calls in the same order.

    One vector of the model's dtype goes through the daemons (float64 if the model mixes
    dtypes, or uses one crnet does not carry: exact for float16/bfloat16/float32 and for
    integers up to 2**53). The root copies its tensors into its shared input, the others
    copy the result from their shared output into theirs; that is all that is copied.
    It reuses the client's shared memory, so call it at a step boundary: it overwrites the
    gradient buffer of a ``DistributedOptimizer``. CUDA tensors go through a pinned
    buffer (crnet.torch.staging), allocated for the call.
    """
    tensors = model_tensors(model)
    if not tensors:
        raise ValueError("broadcast_parameters: the model has no tensors")
    dtypes = {t.dtype for t in tensors}
    np_dtype = np.dtype(np.float64)    # carries every real dtype a model mixes, exactly
    if len(dtypes) == 1:
        np_dtype = WIRE_DTYPES.get(dtypes.pop(), np_dtype)
    n = sum(t.numel() for t in tensors)
    key = key or client.numbered_key("crnet.torch/parameters")
    vec = client.buffer(n, np_dtype)
    staging = HostStaging()
    if is_root(client, root):
        pack(tensors, vec, staging)
        client.broadcast(vec, key, root=root, timeout=timeout)
    else:
        unpack(tensors, client.broadcast(vec, key, root=root, out=client.result_buffer(n, np_dtype),
                                         timeout=timeout), staging)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, client: Client, root: bool | int,
                              key: str | None = None, timeout: float | None = None) -> None:
    """Give every process the root's optimizer state and numeric group options.

    Collective, like ``broadcast_parameters`` (keys ``crnet.torch/optimizer/<k>``). A
    process whose optimizer has no state yet gets the root's anyway (see
    ``OptimizerLayout``: the state's shape is learned on a probe, nothing real is
    stepped); a parameter without state at the root has none anywhere afterwards. Sent
    as one float64 vector (exact for float32 state and counters up to 2**53); CUDA state
    as ``broadcast_parameters``'s tensors.
    """
    layout = OptimizerLayout(optimizer)
    key = key or client.numbered_key("crnet.torch/optimizer")
    vec = client.buffer(layout.size, np.float64)
    staging = HostStaging()
    if is_root(client, root):
        layout.pack(optimizer, vec, staging)
        client.broadcast(vec, key, root=root, timeout=timeout)
    else:
        out = client.result_buffer(layout.size, np.float64)
        layout.unpack(optimizer, client.broadcast(vec, key, root=root, out=out, timeout=timeout),
                      staging)


def is_root(client: Client, root: bool | int) -> bool:
    """Whether this process gives the broadcast: ``root`` is True, or its rank."""
    if isinstance(root, bool):
        return root
    return root == client.assignment.rank
