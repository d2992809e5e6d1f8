"""The scheme's memory: arrays from the pool, and results received straight into a
training process's shared output.

Where a step's result is received into an array that nothing reads after the step but
its own sends (a leaf, a ring member), it is the shared output of the local training
process waiting on the step (``lend``, the local processes'), so no copy puts it there.
That memory is the process's again once it is answered (it may change it in place at
once), so: the host's other processes waiting on the step copy it first; its owner is
answered last, once no link of this node holds a send that reads it (``give_back``:
within the step's bound, after which a link still holding one is cut off); until then
its requests that would write there wait; and this daemon keeps no result of that step
(asked again, it says Lost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import numpy as np

from ...schemes.buffers import BufferPool
from ..neighbours import Neighbours
from .outcomes import Outcome

__all__ = ["GIVE_BACK_POLL", "Lend", "Lender", "Lending"]

GIVE_BACK_POLL = 0.001   # seconds between looks at the links' send queues (give_back)


class Lender(Protocol):
    """A local training process whose shared output a step's result is received into."""

    def answer(self, outcome: Outcome) -> None:
        """The outcome of the step it waits on (or of another, which it ignores)."""

    def given_back(self) -> None:
        """Its output receives that result no more: the requests it made meanwhile go on."""


# Finds the shared output of a local training process waiting on (step, length, dtype)
# for a step's result, or None (the local processes' ``lend``).
Lend = Callable[[int, int, np.dtype], tuple[Lender, np.ndarray] | None]


class Lending:
    """``alloc`` and ``alloc_result``: the memory a scheme works in (``schemes.Memory``)."""

    def __init__(self, neighbours: Neighbours, is_open: Callable[[int], bool],
                 lend: Lend | None = None):
        self.neighbours = neighbours
        self._is_open = is_open
        self._lend = lend
        self.pool = BufferPool(keep=16)         # outputs, receive buffers, results
        # step -> the process whose shared output its result goes into, until given back, and
        # whether sends read that memory too (alloc_result's ``sent``)
        self._lent: dict[int, tuple[Lender, bool]] = {}

    def alloc(self, total: int, dtype) -> np.ndarray:
        return self.pool.get(total, dtype)

    def alloc_result(self, step: int, total: int, dtype, sent: bool = False) -> np.ndarray:
        # Only for an open step: its deadline runs, so it is decided, and the memory given back.
        found = (None if self._lend is None or step in self._lent or not self._is_open(step)
                 else self._lend(step, total, np.dtype(dtype)))
        if found is None:
            return self.alloc(total, dtype)
        owner, vector = found
        self._lent[step] = (owner, sent)
        return vector

    def lends(self, owner: Lender) -> bool:
        """Does a step's result go into ``owner``'s shared output (until it is given back)?"""
        return any(lender is owner for lender, _ in self._lent.values())

    def owner(self, step: int) -> Lender | None:
        return self._lent[step][0] if step in self._lent else None

    @property
    def steps(self) -> list[int]:
        return list(self._lent)

    def give_back(self, step: int, answers: list[Callable[[], None]], until: float) -> None:
        """``step``'s result went into a training process's shared output, which is its own
        again once it is answered (``answers``): first every link of this node must have
        sent what it queued, which may read that memory (a ring member's parts). Checked
        every ``GIVE_BACK_POLL`` s until the step's bound (``until``); a link that still
        holds data then is cut off (its queue dropped) rather than read memory the
        process may be changing."""
        loop = asyncio.get_running_loop()
        owner, sent = self._lent[step]
        busy = ([link for link in self.neighbours.sending() if link.write_buffer_size]
                if sent else [])   # else no send reads it: a leaf's
        if busy and loop.time() < until:
            loop.call_later(GIVE_BACK_POLL, self.give_back, step, answers, until)
            return
        for link in busy:
            link.abort(f"it did not send step {step}'s result within the step's bound, and the "
                       "training process whose memory holds it is due its answer")
        del self._lent[step]
        for answer in answers:
            answer()
        owner.given_back()
