"""A replica's steps on the tree: numbering them, what each outcome means for the replica,
and the state it gives to and takes from peers. Shared by ``DistributedOptimizer`` (which
reduces in ``step()``) and the DDP hook (which reduces in DDP's backward)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping

import numpy as np
import torch

from ..client import Client
from ..coding.approximate import MIN_SCALED_COVERAGE
from ..errors import (
    AssignmentChanged,
    CrnetError,
    DaemonNotRunning,
    JobEnded,
    StepFailed,
    StepLost,
    StepRefused,
)
from .replica_state import ReplicaState

log = logging.getLogger(__name__)


class ReplicaSteps:
    """``step_index`` (the step the next reduction takes part in), the outcomes of a
    reduction (``reduce``), and the replica's state for peers (``ReplicaState``)."""

    def __init__(self, optimizer: torch.optim.Optimizer,
                 model: torch.nn.Module | Mapping[str, torch.Tensor], client: Client,
                 timeout: float | None):
        self.optimizer = optimizer
        self.model = model
        self.client = client
        self.timeout = timeout
        self.replica = ReplicaState(model, optimizer)
        self.step_index = 0
        self.applied = self.skipped = self.resyncs = self.answered = self.abandoned = 0
        self.approximate = 0          # of applied: approximate results (rescaled by coverage)
        self._needs_resync = False

    def start(self, join: bool | None) -> bool:
        """Fetch a peer's state now if ``join`` (default: the job is running or the client
        is stale), else say this replica's parameters are the job's. True if fetched."""
        c = self.client
        if join if join is not None else (c.stale or c.tree_step >= 0):
            self._resync()            # request_state: the client is current from here
            return True
        c.mark_current()
        return False

    def micro_batches(self, indices: torch.Tensor, weights: torch.Tensor, size: int
                      ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This step's share in pieces of ``size`` samples, until the tree has finished the
        step: a process that fell behind stops computing a step the others already
        decided (``client.finished``, a shared-memory read, before each piece), and the
        reduction then takes the tree's result at once. ``abandoned`` counts such steps."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        step = self.step_index
        for start in range(0, len(indices), size):
            if self.client.finished(step):
                self.abandoned += 1
                return
            yield indices[start:start + size], weights[start:start + size]

    def reduce(self, vec: np.ndarray, out: np.ndarray) -> bool:
        """Allreduce ``vec`` as step ``step_index``; True: the sum is in ``out``. Otherwise
        the outcome is dealt with: a tree-wide failure skips the step (``step_index`` + 1);
        a lost step marks the replica for a resync (``resync_pending``; ``catch_up`` does
        it); a new assignment, a refusal or a failure here only (this host was cut off
        from the master) leaves the same step to redo."""
        step = self.step_index
        try:
            self.client.allreduce(vec, step, out=out, timeout=self.timeout)
            return True
        except AssignmentChanged:
            log.info("step %d: the tree re-assigned this host's share; redo the step", step)
        except StepFailed as e:
            if not e.tree_wide:
                log.warning("step %d failed here only (%s): asking again", step, e.reason)
                return False
            # Every replica skips it and stays identical. The next step is step + 1, not
            # tree_step + 1: steps the tree decided since return at once (or StepLost),
            # and jumping over them would leave their updates out of this replica.
            self.skipped += 1
            self.step_index = step + 1
            self._answer(step)
        except StepLost as e:
            log.warning("step %d lost (%s): resynchronising", step, e)
            self._needs_resync = True
        except StepRefused as e:
            # Far ahead of what this host's daemon knows of the tree (it restarted, or
            # lost its parent): it learns where the tree is when it is back. Ask again.
            log.warning("step %d refused (%s): asking again shortly", step, e)
            time.sleep(0.1)
        return False

    @property
    def resync_pending(self) -> bool:
        """This replica may have missed an update: ``catch_up`` takes a peer's state."""
        return self._needs_resync

    def catch_up(self) -> bool:
        """Take a peer's state if this replica must (True if it did)."""
        if not self._needs_resync:
            return False
        self._resync()
        return True

    def samples_in(self) -> float:
        """What the last result sums over: the global batch m, or for an approximate result
        (``--beyond-s approximate``) m x its coverage, so the update is the mean over what
        it covers (unbiased in expectation when batches are shuffled: crnet.coding.approximate),
        unless that is below ``MIN_SCALED_COVERAGE``; ``approximate`` counts them."""
        m = self.client.assignment.samples
        info = self.client.last_result_info
        if info is None or info.exact:
            return m
        self.approximate += 1
        if info.coverage < MIN_SCALED_COVERAGE:
            log.warning("step %d: approximate result covering %.3g of the batch: not rescaled",
                        self.step_index, info.coverage)
            return m
        return m * info.coverage

    def applied_step(self) -> None:
        """The update of step ``step_index`` was applied: on to the next, answering a peer
        that asked for the state at this boundary."""
        step = self.step_index
        self.applied += 1
        self.step_index = step + 1
        self._answer(step)

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
