"""CodedReduce under PyTorch DDP: a communication hook that makes DDP's gradient the
global batch's mean through the coded tree, one crnet step per training step.

::

    dist.init_process_group("crnet")                      # was "gloo" or "nccl"
    model = DDP(net)
    opt = register_crnet_hook(model, torch.optim.SGD(model.parameters(), lr=0.1))
    sampler = CodedSampler(dataset, opt.client, seed=0)   # was a DistributedSampler
    while opt.step_index < steps:
        indices, weights = sampler.local(opt.step_index)
        opt.zero_grad()
        for idx, w in opt.micro_batches(indices, weights, size=32):
            weighted_loss(loss_fn(model(x[idx]), y[idx]), w).backward()   # reduction="none"
        opt.step()

**One step per training step.** DDP hands the hook its gradient in buckets, as each
fills during backward. The hook copies each into its place in the client's shared
input (a fixed layout, the parameters in ``module.named_parameters()`` order, the same
on every process whatever DDP's buckets) and returns a pending future; when the last
bucket of the backward is in, it submits the whole vector as one crnet step and
resolves every bucket's future from the one result, divided by the global batch size.
So however many buckets DDP makes, there is one round trip per training step; and as
the weighted loss makes each process's gradient its coded share, the result is the
exact mean gradient of the global batch.

**Micro-batches and stragglers.** ``micro_batches`` runs all but the last piece of the
share under ``model.no_sync()`` (DDP accumulates them locally), the last one
synchronised. Before each piece it reads ``client.finished(step)``; once the tree has
decided the step without this process it stops computing and yields one *empty* piece,
synchronised: a forward and backward of no samples, so that every process makes the same
synchronised backward (and with it the same DDP bookkeeping: bucket rebuilds and buffer
broadcasts are collectives), and the hook takes the tree's result at once. A process
with an empty share (the master's) gets the same empty piece. The model's forward must
accept a batch of no samples (BatchNorm in training mode does not).

**Outcomes** are ``DistributedOptimizer``'s (``ReplicaSteps``): ``step()`` applies the
update when the tree gave the sum; after a tree-wide failure it skips the step on every
replica; after a lost step it takes the parameters and optimizer state from a peer,
inside ``step()``, never inside backward. Loop on ``opt.step_index``, not a step count.

**Copies.** DDP owns the gradients (its buckets), so unlike ``DistributedOptimizer`` the
gradient is copied into the shared input and the result out of the shared output: two
copies of the gradient per step, on the CPU. A CUDA model's buckets go through a pinned
host mirror of the vector (crnet.torch.staging): each bucket's copy down is queued as
DDP hands it over, the last bucket waits for them all; the result goes up by queued
copies, which the futures (made for the device) order before DDP reads the buckets.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..client import Client
from .gradients import SharedGradients
from .process_group import group_client
from .replica_steps import ReplicaSteps


class DDPOptimizer(ReplicaSteps):
    """The optimizer of a DDP model whose gradients go through crnet (``register_crnet_hook``
    builds it). ``step_index``, ``micro_batches``, ``zero_grad``, ``step`` as for
    ``DistributedOptimizer``; ``reductions`` counts the crnet steps it submitted."""

    def __init__(self, model: DistributedDataParallel, optimizer: torch.optim.Optimizer,
                 client: Client | None = None, *, join: bool | None = None,
                 timeout: float | None = None):
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(f"register_crnet_hook takes a DistributedDataParallel model, got "
                            f"{type(model).__name__}")
        client = client if client is not None else group_client(model.process_group)
        super().__init__(optimizer, model.module, client, timeout)
        ignored = set(getattr(model, "parameters_to_ignore", ()))
        params = [p for n, p in model.module.named_parameters() if p.requires_grad and n not in ignored]
        if not params:
            raise ValueError("the model has no parameter that requires grad")
        self.ddp = model
        self.grads = SharedGradients(params, client, views=False)
        # a future holding device tensors must say so: it makes DDP's stream wait for them
        self._devices: list[int | str | torch.device] = (
            [] if self.grads.device.type == "cpu" else [self.grads.device])
        self._slot = {id(p): i for i, p in enumerate(params)}
        # (bucket buffer, [(slot, gradient view)], future) of this backward's buckets so far
        self._pending: list[tuple[torch.Tensor, list[tuple[int, torch.Tensor]], torch.futures.Future]] = []
        self._outcome: bool | None = None      # the hook's reduction of step_index, if any
        self.reductions = 0
        self.buckets = 0          # DDP's buckets in the last synchronised backward
        self.grads.bind()
        # DDP's constructor gave every process rank 0's parameters, so a process that gets
        # here after the tree decided step 0 without it is not behind in parameters, only
        # in steps: it takes their results, which its daemon holds (a StepLost past
        # --result-memory resyncs then). Asking a peer for the state instead could wait
        # for ever: rank 0's peers may be blocked in DDP's bucket rebuild, a collective
        # whose root is rank 0. So by default only a stale client (a restart) asks.
        if self.start(join if join is not None else client.stale):
            self.grads.refresh()
        model.register_comm_hook(self, _hook)

    @property
    def copied_bytes(self) -> int:
        """The gradient into the shared input and the result out, each step (see the module)."""
        return self.grads.copied_bytes

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def micro_batches(self, indices: torch.Tensor, weights: torch.Tensor, size: int
                      ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This step's share in pieces of ``size``: all but the last under ``no_sync``; once
        the tree has finished the step (or for an empty share), one empty piece,
        synchronised (see the module)."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        step = self.step_index
        starts = range(0, len(indices), size)
        for k, start in enumerate(starts):
            if self.client.finished(step):
                self.abandoned += 1
                break
            piece = indices[start:start + size], weights[start:start + size]
            if k == len(starts) - 1:
                yield piece                 # synchronised: the hook reduces the step
                return
            with self.ddp.no_sync():
                yield piece
        yield indices[:0], weights[:0]

    def step(self) -> bool:
        """Apply this step's update if the tree gave its sum; True if applied."""
        outcome, self._outcome = self._outcome, None
        if self.catch_up():
            return False
        if outcome is None:     # no synchronised backward this step: reduce .grad as it is
            self.grads.refresh()
            self.grads.gather()
            self.reductions += 1
            outcome = self.reduce(self.grads.input, self.grads.output)
            if outcome:
                self.grads.scatter(self.samples_in())
        if not outcome:
            self.catch_up()
            return False
        self.optimizer.step()
        self.applied_step()
        return True

    # ---- the hook's side
    def take_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """A bucket of this backward: into the shared input; the step goes when the last
        one is in."""
        if self._outcome is not None:
            raise RuntimeError(f"a second synchronised backward in step {self.step_index}: run "
                               "all but the last micro-batch under model.no_sync() "
                               "(opt.micro_batches does), and call opt.step() after each step")
        if not self._pending:
            self.grads.refresh()       # the shared memory may have grown since the last step
        entries = []
        for p, g in zip(bucket.parameters(), bucket.gradients()):   # views into the bucket
            i = self._slot[id(p)]
            self.grads.take(i, g)
            entries.append((i, g))
        fut: torch.futures.Future = torch.futures.Future(devices=self._devices or None)
        self._pending.append((bucket.buffer(), entries, fut))
        if bucket.is_last():
            self._reduce_pending()
        return fut

    def _reduce_pending(self) -> None:
        """The one crnet step of this backward; every bucket's future from its result."""
        pending, self._pending = self._pending, []    # the next backward starts afresh
        self.buckets = len(pending)
        self.grads.taken()
        ok = False
        if not self.resync_pending:    # a stale replica's gradient would be refused
            self.reductions += 1
            ok = self.reduce(self.grads.input, self.grads.output)
        self._outcome = ok
        if ok:       # else the gradient is left as it is: step() applies nothing
            self.grads.give([e for _, entries, _ in pending for e in entries])
            m = self.samples_in()
            for buffer, _, _ in pending:
                buffer.div_(m)
        for buffer, _, fut in pending:
            fut.set_result(buffer)


def _hook(state, bucket):
    # Unannotated: DDP compares the annotations with its types, and under
    # ``from __future__ import annotations`` they are strings.
    return state.take_bucket(bucket)


def register_crnet_hook(model: DistributedDataParallel, optimizer: torch.optim.Optimizer,
                        client: Client | None = None, **options: Any) -> DDPOptimizer:
    """Reduce ``model``'s gradients through crnet (see the module) and return the optimizer
    to step: ``optimizer`` wrapped in a ``DDPOptimizer``. ``client``: default the crnet
    process group's. ``options``: ``join`` (default: only if the client is stale, as DDP's
    constructor gave every process rank 0's parameters), ``timeout``, as for
    ``DistributedOptimizer``."""
    return DDPOptimizer(model, optimizer, client, **options)
