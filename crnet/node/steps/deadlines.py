"""The stall inspector: a deadline for every step under way at one node.

A step that begins here (its first piece, or a process asking for it) must be decided
within ``timeout``: the master fails it then; a node tells its parent it stalled, and
gives up for its own subtree only if no decision came ``grace`` seconds later (its
parent is gone or frozen). So every request a training process makes is answered
within ``answer_within``. A node tells its parent when a step begins below it (OPEN)
unless its own first chunk goes up soon, so the master's clock starts when the step
begins in the tree.

A step's clock at a parent starts when this node's own training process asks for it, or
when s + 1 of its children (all of them, if fewer are connected) say it began below them
(an OPEN, or a first chunk): any s children may straggle, so s + 1 include one that is
not just straggling; or when ``PEER_VOUCHERS`` peers (spread, rar: hosts that send this
one pieces) sent it one, for a step at most one past the newest decided here (the
vouchers of a later one count once the one before it is decided: peers are any hosts,
and a few that send pieces of steps far ahead must not start their clocks before the
tree gets there; an honest host starts a step only once it has the one before, so this
costs a clock at most the time between two decisions here). A child or a peer that
opens every step of the window opens them here (its pieces are taken, the window bounds
them), but starts no clock: one broken or hostile host cannot make honest steps time
out early. The processes below it
still get their answer in time: their own node's clock runs from their request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ... import defaults
from ...protocol.messages import Fail, FailKind, Open
from ...schemes import Place, Stall
from ..neighbours import Neighbours
from .record import Event, StepRecord, StepState
from .settings import EngineSettings
from .window import StepWindow

log = logging.getLogger("crnet.node")

__all__ = ["Deadlines"]

PEER_VOUCHERS = 2    # peers whose pieces of a step start its clock here: one is not enough

FailFn = Callable[[int, str, bool], None]     # (step, reason, tree_wide): decisions.fail
LoseFn = Callable[[int, str], None]           # (step, reason): decisions.lose


class Deadlines:
    """The clocks of the steps this node holds (each in its ``record.StepRecord``)."""

    def __init__(self, settings: EngineSettings, window: StepWindow, neighbours: Neighbours, *,
                 stalled: Callable[[int], Stall | None], fail: FailFn, lose: LoseFn):
        self.settings = settings
        self.window = window
        self.records = window.steps
        self.neighbours = neighbours
        self._stalled = stalled                 # the scheme says what a step lacks
        self._fail = fail
        self._lose = lose
        self.place: Place | None = None
        self._last_stall = ""                   # why, as last logged

    @property
    def label(self) -> str:
        return "node (joining)" if self.place is None else self.place.label

    @property
    def is_master(self) -> bool:
        return self.place is not None and self.place.is_master

    @property
    def steps(self) -> list[int]:
        return self.records.open_steps()

    def is_open(self, step: int) -> bool:
        return self.records.state(step).is_open

    def open(self, step: int, announce: bool, child: int | None = None,
             peer: int | None = None) -> bool:
        """``step`` began here (said so by ``child`` or by ``peer``, a rank; neither: this
        node's own process): its deadline runs from now, or once s + 1 children or
        ``PEER_VOUCHERS`` peers said so (the module's docstring). True the first time (not
        if it is open or decided already)."""
        record = self.records.get(step)
        if record is not None and record.is_open:
            if record.state in (StepState.WAITING, StepState.PAUSED):
                self._began_below(record, announce, child, peer)   # does this one start it?
            return False
        if self.window.is_decided(step):
            return False
        self.window.seen(step)
        record = self.records.make(step)
        record.move(Event.BEGIN)
        # It began here now, clock or not: a parent may decode from n - s children before
        # s + 1 said so (n < 2s + 1), and the step's time is from its first sign here.
        # (uvloop's loop time counts whole milliseconds and stands still within a loop
        # turn, so the step's measured time is on a fine clock too.)
        record.began = asyncio.get_running_loop().time()
        record.clock = time.perf_counter()
        self._began_below(record, announce, child, peer)
        return True

    def _began_below(self, record: StepRecord, announce: bool, child: int | None,
                     peer: int | None) -> None:
        if child is not None or peer is not None:
            who: int | tuple[str, int] = child if child is not None else ("peer", peer or 0)
            if who in record.openers:
                return
            record.openers.add(who)
            if not self._vouched(record):
                return
        self._start(record, announce)

    def _vouched(self, record: StepRecord) -> bool:
        """Do the children and peers that said the step began start its clock here?"""
        openers = record.openers
        peers = sum(1 for o in openers if isinstance(o, tuple))
        if len(openers) - peers >= self._vouchers():
            return True
        return peers >= PEER_VOUCHERS and record.step <= self.window.newest_decided + 1

    def _start(self, record: StepRecord, announce: bool) -> None:
        record.move(Event.START)
        record.openers.clear()
        loop = asyncio.get_running_loop()
        step = record.step
        record.handles.append(loop.call_later(self.settings.timeout, self._deadline, record))
        if announce and not self.is_master:
            # Unless this node's first chunk of the step goes up soon (the usual case,
            # and the parent then knows), tell the parent the step began here.
            record.handles.append(loop.call_later(defaults.OPEN_DELAY, self._announce, step))

    def _vouchers(self) -> int:
        """How many children must say a step began below for its clock to start here."""
        place = self.place
        if place is None or place.is_leaf:
            return 1
        connected = sum(1 for slot in self.neighbours.slots if slot.link is not None)
        return max(1, min(place.tree.stragglers[place.layer] + 1, connected))

    def took(self, record: StepRecord) -> float | None:
        """Seconds since the step began here (a fine clock), if it did (and its clocks
        have not stopped: ``close``)."""
        return None if record.clock is None else time.perf_counter() - record.clock

    def sent_up(self, step: int) -> None:
        """A chunk of ``step`` went to the parent: it knows the step began here."""
        record = self.records.get(step)
        if record is not None:
            record.sent_up = True

    def close(self, record: StepRecord) -> float | None:
        """The step is being decided: its clocks stop. When it began here, if it did."""
        record.cancel_clocks()
        record.reported = record.sent_up = False
        record.openers.clear()
        record.clock = None
        began, record.began = record.began, None
        after = self.records.get(record.step + 1)   # its peers' vouchers may count now
        if (after is not None and after.state in (StepState.WAITING, StepState.PAUSED)
                and after.openers and self._vouched(after)):
            self._start(after, announce=self.place is not None and not self.place.is_leaf)
        return began

    def pause(self, step: int) -> None:
        """``step`` stays open with its clock stopped (whoever waited was answered): the
        next process to ask for it starts it again (``open``)."""
        record = self.records.get(step)
        if record is not None and record.is_open:
            record.move(Event.PAUSE)
            record.cancel_clocks()
            record.reported = False
            record.openers.clear()

    def close_all(self) -> None:
        """Every clock stops (the node closes, or a new job begins)."""
        for record in self.records:
            record.cancel_clocks()

    def _announce(self, step: int) -> None:
        record = self.records.get(step)
        if record is not None and record.is_open and not record.sent_up:
            self.neighbours.to_parent(Open(step))

    def _deadline(self, record: StepRecord) -> None:
        step = record.step
        if record.state is not StepState.RUNNING or self.records.get(step) is not record:
            return
        if not self.is_master:   # the last chance for the master's decision to come
            record.move(Event.DEADLINE)
            record.handles.append(asyncio.get_running_loop().call_later(
                self.settings.grace, self._give_up, record))
        if not self.is_master and self.neighbours.parent is None:
            self._fail(step, f"{self.label} has no parent (it is reconnecting) and could not "
                             f"get step {step} decided within {self.settings.timeout:g} s", False)
            return
        stall = self._stalled(step)
        if stall is not None:
            self.stall(step, f"{self.label} did not get {stall.lacking} within "
                             f"{self.settings.timeout:g} s", stall.here)

    def _give_up(self, record: StepRecord) -> None:
        """No decision reached this node from the master in time: its parent is gone or
        frozen. Its subtree's processes must not wait longer. (Unless the master's word
        came, and what the step lacks here will not: then it is lost here.)"""
        step = record.step
        if record.state is not StepState.OVERDUE or self.records.get(step) is not record:
            return
        stall = self._stalled(step)
        if stall is not None and stall.lost:
            self._lose(step, f"{self.label} did not get {stall.lacking} within "
                             f"{self.settings.answer_within:g} s")
        else:
            self._fail(step, f"{self.label} got no decision about step {step} from the master "
                             f"within {self.settings.answer_within:g} s (its parent is cut off "
                             "or frozen)", False)

    def stall(self, step: int, reason: str, here: bool = False) -> None:
        """``step`` cannot finish here: the master fails it; a node tells its parent (once),
        and fails it for its own subtree if ``here`` or it has no parent."""
        if self.window.is_decided(step):
            return
        if self.is_master:
            self._fail(step, reason, True)
            return
        record = self.records.make(step)
        if not record.reported:
            record.reported = True
            # Said loudly when it changes; a node that stays degraded says it once.
            why = reason.partition(":")[2] or reason
            level = logging.DEBUG if why == self._last_stall else logging.WARNING
            self._last_stall = why
            log.log(level, "step %d: %s; telling the parent (this subtree straggles)", step, reason,
                    extra={"step": step})
            self.neighbours.to_parent(Fail(step, reason, FailKind.STALL))
        if here or self.neighbours.parent is None:
            self._fail(step, reason, False)
