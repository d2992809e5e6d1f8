"""PyTorch training on a crnet tree: ``pip install 'crnet[torch]'``.

::

    from crnet import Client
    from crnet.torch import CodedSampler, DistributedOptimizer, weighted_loss

    c = Client()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, c)
    sampler = CodedSampler(dataset, c, seed=0)
    while opt.step_index < steps:
        indices, weights = sampler.local(opt.step_index)    # this process's coded share
        opt.zero_grad()
        for idx, w in opt.micro_batches(indices, weights, size=32):   # stops once the tree is done
            x, y = dataset[idx]
            weighted_loss(loss_fn(model(x), y), w).backward()    # loss_fn(..., reduction="none")
        opt.step()     # the global batch's mean gradient, the same on every replica

The pieces, and why each is there:

- ``CodedSampler``: CodedReduce gives every process *batch positions* with coding
  weights (``Assignment.ranges``); ``crnet.client.batches.BatchSampler`` maps positions to
  data set indices the same way on every host. The sampler hands out both.
- ``weighted_loss``: the process must contribute ``sum_i w_i * grad(loss_i)`` (weights
  may be negative or above 1: the share is coded); the gradient of ``sum_i w_i loss_i``
  is exactly that, so one ``backward`` computes it.
- ``DistributedOptimizer``: the parameters' ``.grad`` are views into the client's
  shared input (``Client.buffer``), so backward writes straight into memory the daemon
  reads, and the result lands in the shared output (``Client.result_buffer``), which
  ``.grad`` views for the update: no copy on this side (see the class for the
  exceptions). It numbers the steps, takes the tree's result for a step the tree
  finished without this process, skips a step that failed tree-wide, and resynchronises
  a replica that may have missed an update from a peer.
- ``broadcast_parameters`` / ``broadcast_optimizer_state``: one process's tensors to
  all (a checkpoint), and the state a process that starts mid-job takes from a peer.
- ``allreduce`` / ``result``: the client's calls, with tensors in and out.
- ``dist.init_process_group("crnet")`` (registered on import) and
  ``register_crnet_hook(ddp_model, optimizer)``: a DDP script on crnet, its gradient one
  crnet step per training step (docs/torch.md, "DDP and torch.distributed").

crnet carries float32 and float64 vectors; other dtypes get a TypeError that says what
to do. The core package never imports this package (torch is an optional extra).

One module per job: ``sampler`` (``CodedSampler``), ``loss`` (``weighted_loss``),
``optimizer`` (``DistributedOptimizer``: the steps and their outcomes), ``gradients``
(``.grad`` as views into the shared memory), ``replica_state`` (a replica's state as one
vector, for peers), ``optimizer_layout`` (the optimizer's part of it), ``packing``
(tensors into a flat vector and back), ``broadcast``, ``collectives`` (``allreduce``,
``result``), ``dtypes`` (what the wire carries), ``replica_steps`` (the steps' outcomes,
shared by ``DistributedOptimizer`` and the DDP hook), ``ddp`` (the hook), ``process_group``
(the backend), ``exact_collectives`` (its collectives over broadcasts and barriers) and
``staging`` (CUDA tensors through pinned host memory, for every path).
"""

from __future__ import annotations

from .broadcast import broadcast_optimizer_state, broadcast_parameters
from .collectives import allreduce, result
from .ddp import DDPOptimizer, register_crnet_hook
from .dtypes import WIRE_DTYPES as WIRE_DTYPES  # public in the former module (not in __all__)
from .dtypes import wire_dtype as wire_dtype
from .loss import weighted_loss
from .optimizer import DistributedOptimizer
from .process_group import CrnetProcessGroup, group_client
from .process_group import register as _register_backend
from .sampler import CodedSampler

_register_backend()     # dist.init_process_group("crnet")

__all__ = [
    "CodedSampler",
    "CrnetProcessGroup",
    "DDPOptimizer",
    "DistributedOptimizer",
    "allreduce",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "group_client",
    "register_crnet_hook",
    "result",
    "weighted_loss",
]
