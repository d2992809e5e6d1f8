"""What a step came to at one node, and the outcomes kept for whoever asks late.

Horovod's response cache, for crnet: a decided step's outcome is kept so a training
process (or a child) that asks after the decision gets the same answer. Pure
bookkeeping: no clocks, no sockets.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from ...protocol.messages import Fail, FailKind
from ...schemes.chunks import ChunkLayout
from ..signal import Signal

__all__ = ["Failed", "Kept", "Lost", "Mismatched", "Outcome", "Refused", "Resolved", "fail_of"]


@dataclass(frozen=True)
class Resolved:
    step: int
    layout: ChunkLayout
    vector: np.ndarray
    approx: tuple[float, float] | None = None   # approximate: (coverage, residual)


@dataclass(frozen=True)
class Failed:
    step: int
    reason: str
    tree_wide: bool = True      # decided by the master: every process gets the same


@dataclass(frozen=True)
class Refused:
    """The step is outside the window (here or at an ancestor)."""

    step: int
    reason: str


@dataclass(frozen=True)
class Lost:
    """The step is decided, but its outcome is not held here."""

    step: int
    reason: str


@dataclass(frozen=True)
class Mismatched:
    """This process's vector does not fit the tree's; the step goes on without it."""

    step: int
    reason: str


Outcome = Resolved | Failed | Refused | Lost | Mismatched
Decision = Resolved | Failed | Refused | Lost       # what a step is decided as


def fail_of(outcome: Failed | Refused | Lost | Mismatched) -> Fail:
    """The FAIL a child gets for a decided step that has no result to send."""
    if isinstance(outcome, Failed):
        return Fail(outcome.step, outcome.reason,
                    FailKind.TREE if outcome.tree_wide else FailKind.LOCAL)
    if isinstance(outcome, Refused):
        return Fail(outcome.step, outcome.reason, FailKind.REFUSED)
    return Fail(outcome.step, outcome.reason, FailKind.LOST)


class Kept:
    """The decisions kept, oldest first: the last ``keep`` of them, and every result a
    local training process has not taken yet while the results fit ``memory`` bytes.
    ``consumers`` is polled for the oldest step each process may still ask for."""

    def __init__(self, keep: int, memory: int):
        self.keep = keep
        self.memory = memory
        self.consumers: Signal[None] = Signal()
        self._outcomes: collections.OrderedDict[int, Decision] = collections.OrderedDict()
        self.held = 0                          # bytes of the results kept

    def __len__(self) -> int:
        return len(self._outcomes)

    def get(self, step: int) -> Decision | None:
        return self._outcomes.get(step)

    def put(self, step: int, outcome: Decision) -> None:
        self._outcomes[step] = outcome
        if isinstance(outcome, Resolved):
            self.held += outcome.vector.nbytes
        self._trim()

    def drop(self, step: int) -> None:
        """``step``'s outcome is no longer this node's word (a failure here, reopened)."""
        outcome = self._outcomes.pop(step, None)
        if isinstance(outcome, Resolved):
            self.held -= outcome.vector.nbytes

    def clear(self) -> None:
        self._outcomes.clear()
        self.held = 0

    def _trim(self) -> None:
        floor = min(self.consumers.emit(None), default=None)
        while len(self._outcomes) > self.keep:
            step, oldest = next(iter(self._outcomes.items()))
            if floor is not None and step >= floor and self.held <= self.memory:
                return
            self._outcomes.popitem(last=False)
            if isinstance(oldest, Resolved):
                self.held -= oldest.vector.nbytes
