"""One step at one node: a record with an explicit state, and the table of its moves.

As a link's state says what its peer may send now (``links/machine.py``), a step's state
says what may happen to it next. Everything this node holds of a step under way lives in
its ``StepRecord``: its clocks and who began it (``deadlines.py``), the training
processes waiting on it and the vector this host put in (``decisions.py``, ``engine.py``),
a failure that was this node's alone, and whether the master said the step is whole
(spread's SETTLED). ``StepTable`` holds the records of the window; one prune drops
whole records behind it. The policies stay in their rooms: when a clock starts and what
a deadline does (deadlines), who is answered and how (decisions), which outcomes are
kept for late askers (``outcomes.Kept``, which outlives the window), whose memory a
result is received into (``lending.py``, which outlives a job).

The states (``MOVES`` is the table; ``StepRecord.move`` refuses anything else):

=============  ==================================================================
NEW            nothing began here, or a failure here was reopened
WAITING        open: children or peers began it, too few to start its clock
RUNNING        open: its deadline runs
OVERDUE        open: its deadline passed; a node waits the grace for the master's word
PAUSED         open, its waiters told it failed here (cut off), no clock: a scheme that
               sums over peers keeps it for the sum and the master's word
FAILED_HERE    decided by this node alone (cut off from the master, or refused by the
               parent as beyond its window): asked again, or the master's verdict
               coming, reopens it (NEW)
DECIDED        the tree's word (a result, a failure, Lost): final here
=============  ==================================================================

Pure state: no clocks, no sockets (a record holds its timer handles; ``deadlines.py``
makes and cancels them).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from .outcomes import Failed, Outcome, Refused

__all__ = ["MOVES", "Answer", "Event", "IllegalMove", "StepRecord", "StepState", "StepTable"]


class StepState(enum.Enum):
    NEW = "new"
    WAITING = "waiting"
    RUNNING = "running"
    OVERDUE = "overdue"
    PAUSED = "paused"
    FAILED_HERE = "failed here"
    DECIDED = "decided"

    # is_open, is_decided: plain attributes of each member (set below), read on every piece
    is_open: bool
    is_decided: bool


class Event(enum.Enum):
    BEGIN = "begin"          # its first sign here: a piece, an OPEN, a process's request
    START = "start"          # its clock starts (a process asks, or enough children or peers)
    DEADLINE = "deadline"    # its deadline passed at a node (the master decides instead)
    PAUSE = "pause"          # failed here, answered, kept open (Scheme.SUMS_OVER_PEERS)
    FAIL_HERE = "fail here"  # failed by this node alone (cut off, or the parent refused it)
    REOPEN = "reopen"        # a failure here is not the tree's word: as if it never began
    DECIDE = "decide"        # decided: a result, the tree's failure, Lost


S, E = StepState, Event
_OPEN = frozenset({S.WAITING, S.RUNNING, S.OVERDUE, S.PAUSED})
for _state in StepState:
    _state.is_open = _state in _OPEN
    _state.is_decided = _state in (S.FAILED_HERE, S.DECIDED)
_ENDS = {E.PAUSE: S.PAUSED, E.FAIL_HERE: S.FAILED_HERE, E.DECIDE: S.DECIDED}

# state -> event -> the state it moves to. A step is decided from any state it can be in
# when its verdict comes; a failure here is final until it is reopened.
MOVES: dict[StepState, dict[Event, StepState]] = {
    S.NEW: {E.BEGIN: S.WAITING, E.FAIL_HERE: S.FAILED_HERE, E.DECIDE: S.DECIDED},
    S.WAITING: {E.START: S.RUNNING, **_ENDS},
    S.RUNNING: {E.DEADLINE: S.OVERDUE, **_ENDS},
    S.OVERDUE: dict(_ENDS),
    S.PAUSED: {E.START: S.RUNNING, **_ENDS},
    S.FAILED_HERE: {E.REOPEN: S.NEW},   # (the master's verdict reopens it first)
    S.DECIDED: {},
}


class IllegalMove(AssertionError):
    """A step was moved along an edge ``MOVES`` does not have: a bug in the step core."""


# Whoever waits on a step (a training process's request): called once with its outcome.
Answer = Callable[[Outcome], None]


@dataclass(eq=False)
class StepRecord:
    step: int
    state: StepState = StepState.NEW
    # -- its clocks (deadlines.py)
    handles: list[asyncio.TimerHandle] = field(default_factory=list)   # deadline, grace, OPEN
    openers: set[int | tuple[str, int]] = field(default_factory=set)   # children k, ("peer", rank)
    began: float | None = None       # loop time of its first sign here
    clock: float | None = None       # the same by a fine clock (perf_counter)
    reported: bool = False           # this node told its parent the step stalled here
    sent_up: bool = False            # a chunk of it went to the parent
    # -- its answers (decisions.py)
    waiters: list[Answer] = field(default_factory=list)
    contributed: tuple[int, np.dtype] | None = None   # this host's vector: its length, dtype
    failure: Failed | Refused | None = None   # FAILED_HERE: what this node's processes got
    # The master said every host has the step's sum (spread's SETTLED): it stands whatever
    # becomes of the scheme's own state of the step (begun again with new owners, say).
    settled: bool = False

    def move(self, event: Event) -> StepState:
        """Take ``event``: the new state, or IllegalMove if the table has no such edge."""
        after = MOVES[self.state].get(event)
        if after is None:
            raise IllegalMove(f"step {self.step}: {event.value} while {self.state.value}")
        self.state = after
        if after is StepState.NEW:   # reopened: as if it had not begun here
            self.failure = None
        return after

    @property
    def is_open(self) -> bool:
        return self.state.is_open

    @property
    def is_decided(self) -> bool:
        return self.state.is_decided

    def cancel_clocks(self) -> None:
        for handle in self.handles:
            handle.cancel()
        self.handles = []


class StepTable:
    """The records of the steps this node holds, by step number."""

    def __init__(self) -> None:
        self._records: dict[int, StepRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(self._records.values())

    def get(self, step: int) -> StepRecord | None:
        return self._records.get(step)

    def make(self, step: int) -> StepRecord:
        """``step``'s record, a NEW one if there is none."""
        record = self._records.get(step)
        if record is None:
            record = self._records[step] = StepRecord(step)
        return record

    def state(self, step: int) -> StepState:
        record = self._records.get(step)
        return StepState.NEW if record is None else record.state

    def is_decided(self, step: int) -> bool:
        record = self._records.get(step)
        return record is not None and record.state.is_decided

    def open_steps(self) -> list[int]:
        return sorted(s for s, r in self._records.items() if r.is_open)

    def decided_steps(self) -> list[int]:
        return sorted(s for s, r in self._records.items() if r.is_decided)

    def unsettled(self, through: int | None = None) -> list[StepRecord]:
        """The records (up to step ``through``) open or with processes waiting, in order."""
        return [r for s, r in sorted(self._records.items())
                if (through is None or s <= through) and (r.is_open or r.waiters)]

    def drop(self, step: int) -> None:
        """Forget ``step``'s record (a step far ahead that took no part here)."""
        self._records.pop(step, None)

    def drop_through(self, low: int) -> None:
        """Forget every record of a step at or below ``low`` (behind the window)."""
        self._records = {s: r for s, r in self._records.items() if s > low}

    def clear(self) -> list[StepRecord]:
        """Forget every record; returns them."""
        records = list(self._records.values())
        self._records.clear()
        return records
