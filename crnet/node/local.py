"""This host's training processes: their seats, their vectors summed, their outputs lent.

``--local-processes K`` training processes share one daemon; each is a ``Seat`` here
(``links.client.ClientLink``). Imports go one way: the client link knows this module,
this one knows a seat only by what ``Seat`` says (and the link's handlers a process by
what ``Process`` adds).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..coding.kernels import coded_sum
from ..errors import ErrorKind
from ..protocol.shm import SharedRegion
from ..protocol.transport import Connection
from .steps import Failed, Mismatched, Outcome, Refused, StepEngine


class Seat(Protocol):
    """A training process as its host's seats see it (``links.client.ClientLink``)."""

    index: int | None                  # its seat, once it has one
    pid: int | None
    conn: Connection | None
    region: SharedRegion | None        # its shared memory, once handed over

    @property
    def waiting(self) -> tuple[int, int, np.dtype] | None:
        """The step it waits on: (step, length, dtype)."""

    def answer(self, outcome: Outcome) -> None:
        """The outcome of the step it waits on (or of another, which it ignores)."""

    def given_back(self) -> None:
        """Its output receives a step's result no more (``engine.Lender``)."""


class Process(Seat, Protocol):
    """A training process as the handlers of its requests see it (``links.client_steps``,
    ``links.client_group``): its seat, and how it is told of an error."""

    def error(self, reason: str, kind: ErrorKind, step: int | None = None,
              tree_wide: bool = True) -> None:
        """Tell it ``reason`` (an ERROR); it waits on no step any more."""

    def vector(self, length: int, dtype: np.dtype, half: str,
               step: int | None = None) -> np.ndarray | None:
        """Its shared ``half`` (input, output) as ``length`` x ``dtype``, or None (it was
        told why, about ``step``)."""

    def job_over(self, step: int | None = None) -> bool:
        """Its job is not the one the tree runs: it was told so (JobEnded)."""


class LocalProcesses:
    """This host's training processes (``--local-processes K``): K seats, one share of the
    data each, and their vectors summed into the host's local vector, per step.

    Each process waits on the step itself (the tree may finish it before all K have
    computed); the sum goes to the step engine once all K have submitted, added in one
    ``coded_sum`` pass straight from their shared memory. A process that leaves fails,
    for the others, the steps it had not submitted yet. A step's result may be received
    straight into one process's shared output (``lend``: the engine's ``Lend``, which
    ``lifecycle.Node`` hands it when it builds the engine).
    """

    def __init__(self, k: int, engine: StepEngine):
        self.k = k
        self.engine = engine
        self.seats: list[Seat | None] = [None] * k
        self._parts: dict[int, dict[int, tuple[Seat, np.ndarray]]] = {}  # step -> seat
        if k > 1:
            engine.decided.connect(self._decided)

    def lend(self, step: int, total: int, dtype: np.dtype) -> tuple[Seat, np.ndarray] | None:
        """Where ``step``'s result may be received (``StepEngine.alloc_result``), and whose
        memory that is: the shared output of a process waiting on it with a ``total`` x
        ``dtype`` vector, if all K of this host's processes wait on it. They are all
        answered when it is decided, so none asks for it later, when the daemon has no
        copy of it. None otherwise, or if no output can take it."""
        waiting = (step, total, dtype)
        links = [link for link in self.seats if link is not None and link.waiting == waiting]
        if len(links) < self.k:
            return None
        for link in links:
            region = link.region
            if (region is not None and total * dtype.itemsize <= region.capacity
                    and link.conn is not None and not link.conn.is_closing
                    and not self.engine.lends(link)):
                return link, region.output(dtype, total)
        return None

    def sit(self, link: Seat) -> int | None:
        """A free seat for ``link`` (its index), or None: all K are taken."""
        for i, holder in enumerate(self.seats):
            if holder is None or holder.conn is None or holder.conn.is_closing:
                self.seats[i] = link
                return i
        return None

    def holders(self) -> str:
        return ", ".join(f"pid {h.pid}" for h in self.seats if h is not None)

    def leave(self, link: Seat) -> None:
        if link.index is None or self.seats[link.index] is not link:
            return
        self.seats[link.index] = None
        for step, parts in sorted(self._parts.items()):
            if link.index in parts:
                continue
            del self._parts[step]
            why = (f"training process {link.index + 1} of {self.k} on this host (pid "
                   f"{link.pid}) left before it submitted step {step}")
            for other, _ in parts.values():
                other.answer(Failed(step, why, tree_wide=False))

    def submit(self, link: Seat, step: int, vector: np.ndarray) -> None:
        """``link``'s vector for ``step``; its answer comes through ``link.answer``."""
        if self.k == 1:
            self.engine.request(step, vector, link.answer)
            return
        assert link.index is not None
        refusal = None if self.engine.is_decided(step) else self.engine.refusal(step)
        if refusal is not None:   # kept nowhere: a process naming far steps adds nothing
            link.answer(Refused(step, refusal))
            return
        parts = self._parts.setdefault(step, {})
        first = next(iter(parts.values()), None)
        if first is not None and (first[1].size, first[1].dtype) != (vector.size, vector.dtype):
            link.answer(Mismatched(step, f"this process's vector is {vector.size} x "
                                         f"{vector.dtype} but this host's others' are "
                                         f"{first[1].size} x {first[1].dtype}"))
            return
        parts[link.index] = (link, vector)
        self.engine.request(step, None, link.answer)   # the tree may finish it without us
        if len(parts) < self.k or step not in self._parts:
            return
        del self._parts[step]
        total = self.engine.alloc(vector.size, vector.dtype)
        coded_sum(total, [1.0] * self.k, [v for _, v in parts.values()])
        links = [other for other, _ in parts.values()]

        def refused(outcome: Outcome) -> None:   # other outcomes reach each process directly
            if isinstance(outcome, Mismatched):
                for other in links:
                    other.answer(outcome)
        self.engine.request(step, total, refused)

    def _decided(self, step: int | None) -> None:
        if step is not None:
            self._parts.pop(step, None)   # its processes were answered; the sum is moot
