"""The optimizer that trains every replica on the global batch's gradient: the steps and
their outcomes, and the state it gives to and takes from peers."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from ..client import Client
from .gradients import SharedGradients
from .replica_steps import ReplicaSteps


class DistributedOptimizer(ReplicaSteps):
    """``optimizer`` with the gradient of the whole global batch, the same on every replica.

    Per step: ``zero_grad()``, backward over this process's coded share (``CodedSampler``,
    ``weighted_loss``, ``micro_batches``), ``step()``. ``step_index`` is the step the next
    ``step()`` takes part in (0 for a fresh job); pick the batch with it.

    **No copies on the CPU.** The gradients of the parameters (those of the optimizer that
    require grad, one dtype, float32 or float64) are views into one flat vector, the
    client's shared input (``client.buffer``): backward accumulates into it in place, the
    daemon reads it from there. The sum lands in the shared output
    (``client.result_buffer``, passed as ``out``); it is divided by the global batch size
    ``m`` in place (an approximate result, ``--beyond-s approximate``: by ``m`` times its
    coverage, unless that is below ``MIN_SCALED_COVERAGE``; ``approximate`` counts them)
    and ``.grad`` views it for ``optimizer.step()`` (until the next
    ``zero_grad``). Copies happen only when a ``.grad`` is not the view (set to None or
    replaced, e.g. by ``model.zero_grad()``: copied into the buffer, counted in
    ``copied_bytes``), and for GPU parameters (see below). The client copies nothing: its
    input *is* the buffer, its ``out`` *is* the output.

    **GPU parameters** keep their ``.grad`` on the device: ``step()`` copies them down
    into a pinned mirror of the vector (queued copies, one wait) and from there into the
    shared input, and the result back the same way (crnet.torch.staging), all counted in
    ``copied_bytes``.

    **Outcomes.** ``step()`` returns True when it applied an update. The tree finished
    the step without this process: ``allreduce`` returns the tree's result at once and it
    is applied, like everyone else's. ``StepFailed`` with ``tree_wide``: every replica
    skips the step (no update; False). ``StepLost``, or a ``StepFailed`` that is not
    tree-wide (this replica may have missed an update): it takes the parameters,
    buffers and optimizer state from a peer (``Client.request_state``) and goes on after
    the step they were taken at (False). ``AssignmentChanged``: this step's gradient
    used the old share; False, and the same ``step_index`` again (``CodedSampler``
    follows the new share). Other errors propagate; if the state could not be fetched,
    the next ``step()`` tries again before anything else.

    **Peers.** At every step boundary (inside ``step()``, after the update) a replica in
    sync answers a pending state request (``Client.state_wanted``/``send_state``), so a
    process that (re)starts in the middle of a job (``client.tree_step >= 0`` when this
    is built, or ``join=True``) gets the current state at the next boundary and trains
    in lockstep from there; the constructor waits for it.

    Its parts: ``grads`` (``SharedGradients``: the flat vector and the views) and
    ``replica`` (``ReplicaState``: the vector a peer sends, and the optimizer's layout);
    the steps' outcomes, ``micro_batches`` and the state for peers are ``ReplicaSteps``'s,
    shared with the DDP hook (``crnet.torch.ddp``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 model: torch.nn.Module | Mapping[str, torch.Tensor], client: Client, *,
                 join: bool | None = None, timeout: float | None = None):
        """``join``: fetch the state from a peer now (default: if the job is running, i.e.
        ``client.tree_step >= 0``, or the client is ``stale``); False says this process's
        parameters are the job's (``client.mark_current()``: e.g. a fresh job, after a
        start barrier and a broadcast). ``timeout``: for the client's calls (default
        theirs)."""
        super().__init__(optimizer, model, client, timeout)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if not params:
            raise ValueError("the optimizer has no parameter that requires grad")
        self.grads = SharedGradients(params, client)
        g = self.grads
        self.params, self.dtype, self.np_dtype = g.params, g.dtype, g.np_dtype
        self.device, self.on_host, self.numel = g.device, g.on_host, g.numel
        g.bind()
        if self.start(join):
            g.refresh()

    @property
    def input(self) -> np.ndarray:
        """The shared input: the gradients' flat vector until the allreduce."""
        return self.grads.input

    @property
    def output(self) -> np.ndarray:
        """The shared output: the reduced gradient, viewed by ``.grad`` for the update."""
        return self.grads.output

    @property
    def copied_bytes(self) -> int:
        """Client-side copies between backward and the network (see the class)."""
        return self.grads.copied_bytes

    def zero_grad(self) -> None:
        """Zero the gradients where backward will accumulate them: the shared input."""
        self.grads.zero()

    # ---- one step
    def step(self) -> bool:
        """Reduce this step's gradient over the tree and apply the update; True if applied."""
        if self.catch_up():               # the last attempt failed: this gradient is stale
            return False
        self.grads.gather()
        if not self.reduce(self.grads.input, self.grads.output):
            self.catch_up()
            return False
        self.grads.scatter(self.samples_in())
        self.optimizer.step()
        self.applied_step()
        return True
