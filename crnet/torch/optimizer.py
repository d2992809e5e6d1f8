"""The optimizer that trains every replica on the global batch's gradient: the steps and
their outcomes, and the state it gives to and takes from peers."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping

import numpy as np
import torch

from ..approximate import MIN_SCALED_COVERAGE
from ..client import Client
from ..errors import (
    AssignmentChanged,
    CrnetError,
    DaemonNotRunning,
    JobEnded,
    StepFailed,
    StepLost,
    StepRefused,
)
from .gradients import SharedGradients
from .replica_state import ReplicaState

log = logging.getLogger(__name__)


class DistributedOptimizer:
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

    **GPU parameters** keep their ``.grad`` on the device: ``step()`` copies them to the
    shared input (one device-to-host copy per parameter) and the result back (host to
    device), both counted in ``copied_bytes``.

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
    ``replica`` (``ReplicaState``: the vector a peer sends, and the optimizer's layout).
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 model: torch.nn.Module | Mapping[str, torch.Tensor], client: Client, *,
                 join: bool | None = None, timeout: float | None = None):
        """``join``: fetch the state from a peer now (default: if the job is running, i.e.
        ``client.tree_step >= 0``, or the client is ``stale``); False says this process's
        parameters are the job's (``client.mark_current()``: e.g. a fresh job, after a
        start barrier and a broadcast). ``timeout``: for the client's calls (default
        theirs)."""
        self.optimizer = optimizer
        self.model = model
        self.client = client
        self.timeout = timeout
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if not params:
            raise ValueError("the optimizer has no parameter that requires grad")
        self.grads = SharedGradients(params, client)
        g = self.grads
        self.params, self.dtype, self.np_dtype = g.params, g.dtype, g.np_dtype
        self.device, self.on_host, self.numel = g.device, g.on_host, g.numel
        self.replica = ReplicaState(model, optimizer)
        self.step_index = 0
        self.applied = self.skipped = self.resyncs = self.answered = self.abandoned = 0
        self.approximate = 0          # of applied: approximate results (rescaled by coverage)
        self._needs_resync = False
        g.bind()
        if join if join is not None else (client.stale or client.tree_step >= 0):
            self._resync()            # request_state: the client is current from here
            g.refresh()
        else:
            client.mark_current()

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

    def micro_batches(self, indices: torch.Tensor, weights: torch.Tensor, size: int
                      ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This step's share in pieces of ``size`` samples, until the tree has finished the
        step: a process that fell behind stops computing a step the others already
        decided (``client.finished``, a shared-memory read, before each piece), and
        ``step()`` then takes the tree's result at once. ``abandoned`` counts such steps."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        step = self.step_index
        for start in range(0, len(indices), size):
            if self.client.finished(step):
                self.abandoned += 1
                return
            yield indices[start:start + size], weights[start:start + size]

    # ---- one step
    def step(self) -> bool:
        """Reduce this step's gradient over the tree and apply the update; True if applied."""
        step = self.step_index
        if self._needs_resync:            # the last attempt failed: this gradient is stale
            self._resync()
            return False
        try:
            self.grads.gather()
            self.client.allreduce(self.grads.input, step, out=self.grads.output,
                                  timeout=self.timeout)
        except AssignmentChanged:
            log.info("step %d: the tree re-assigned this host's share; redo the step", step)
            return False
        except StepFailed as e:
            if not e.tree_wide:
                log.warning("step %d failed here only (%s): resynchronising", step, e.reason)
                self._resync()
                return False
            # Every replica skips it and stays identical. The next step is step + 1, not
            # tree_step + 1: steps the tree decided since return at once (or StepLost),
            # and jumping over them would leave their updates out of this replica.
            self.skipped += 1
            self.step_index = step + 1
            self._answer(step)
            return False
        except StepLost as e:
            log.warning("step %d lost (%s): resynchronising", step, e)
            self._resync()
            return False
        except StepRefused as e:
            # Far ahead of what this host's daemon knows of the tree (it restarted, or
            # lost its parent): it learns where the tree is when it is back. Ask again.
            log.warning("step %d refused (%s): asking again shortly", step, e)
            time.sleep(0.1)
            return False
        self.grads.scatter(self._samples_in(step))
        self.optimizer.step()
        self.applied += 1
        self.step_index = step + 1
        self._answer(step)
        return True

    def _samples_in(self, step: int) -> float:
        """What the result sums over: the global batch m, or for an approximate result
        (``--beyond-s approximate``) m x its coverage, so the update is the mean over what
        it covers (unbiased in expectation when batches are shuffled: crnet.approximate)."""
        m = self.client.assignment.samples
        info = getattr(self.client, "last_result_info", None)
        if info is None or info.exact:
            return m
        self.approximate += 1
        if info.coverage < MIN_SCALED_COVERAGE:
            log.warning("step %d: approximate result covering %.3g of the batch: not rescaled",
                        step, info.coverage)
            return m
        return m * info.coverage

    # ---- the state, for peers
    def state_size(self) -> int:
        """Elements of the float64 state vector: model tensors, then the optimizer's."""
        return self.replica.size()

    def pack_state(self, dest: np.ndarray) -> None:
        self.replica.pack(dest)

    def load_state(self, src: np.ndarray) -> None:
        self.replica.load(src)

    def _resync(self) -> None:
        """Take a peer's state (after its step ``t``) and continue at ``t + 1``."""
        self._needs_resync = True
        size = self.state_size()
        out = self.client.result_buffer(size, np.float64)
        vec, taken = self.client.request_state(out, out=out, timeout=self.timeout)
        self.load_state(vec)
        self._needs_resync = False
        self.resyncs += 1
        log.info("took a peer's state after step %d; going on at step %d", taken, taken + 1)
        self.step_index = taken + 1

    def _answer(self, step: int) -> None:
        """Send this replica's state (after ``step``) to a process that asked for it."""
        if self._needs_resync or not self.client.state_wanted():
            return
        vec = self.client.buffer(self.state_size(), np.float64)
        self.pack_state(vec)
        try:
            self.client.send_state(vec, step)
        except (DaemonNotRunning, JobEnded):
            raise
        except CrnetError as e:       # a service to a peer: it asks again if it must
            log.warning("could not send the state after step %d to a peer: %s", step, e)
            return
        self.answered += 1
