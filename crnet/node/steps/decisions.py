"""Decisions, one step at a time, and the answers to whoever waits on them.

A step resolves (its full gradient) or fails; deciding one step never decides
another. The master decides for the whole tree; a node decides alone only when it is
cut off from the master (then its processes learn that the failure is local). Such a
failure here is provisional: it answers whoever waits, so that no call outlives the
bound, but it is not the tree's word. The master may still decide the step either way
(it was cut off, not the step), so the node takes the master's verdict when it comes
(a parent's result or FAIL: ``reopen``), and a process that asks for the step again
reopens it: it takes part anew, or gets the tree's verdict (the README's loop asks
again). The step's record says which (``record.py``: FAILED_HERE, reopened to NEW, or
DECIDED). A scheme with peers (rar, spread) sends its pieces to its peers, not up: its
steps stay open instead (PAUSED), without a clock, for the sum and the master's word
that may still come (``keep_open_here``: the scheme's ``SUMS_OVER_PEERS``); a process
that asks again waits for them, on a clock of its own. A decision stops the step's
clocks, tells the subtree (a result went down chunk by chunk already; a failure goes
now), drops the scheme's state, keeps the outcome for whoever asks late, and answers
every process waiting on the step. This is also what a scheme
sees of its step (``schemes.Steps``): whether a step is decided or open, and its verdicts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

import numpy as np

from ...measure.stats import Stats
from ...schemes.chunks import ChunkLayout
from ..neighbours import Neighbours
from ..signal import Signal
from .deadlines import Deadlines
from .lending import Lending
from .outcomes import Decision, Failed, Kept, Lost, Mismatched, Outcome, Refused, Resolved, fail_of
from .record import Answer, Event, StepState
from .settings import EngineSettings
from .window import StepWindow

log = logging.getLogger("crnet.node")

__all__ = ["Answer", "Decisions"]



class Decisions:
    def __init__(self, settings: EngineSettings, stats: Stats, window: StepWindow,
                 deadlines: Deadlines, kept: Kept, lending: Lending, neighbours: Neighbours,
                 forget: Callable[[int, bool], None]):
        self.settings = settings
        self.stats = stats
        self.window = window
        self.deadlines = deadlines
        self.kept = kept
        self.lending = lending
        self.neighbours = neighbours
        self._forget = forget                   # the scheme drops a decided step's state
        # Told of every decision, and of a tree_step learned from a peer (step None):
        # the training processes' shared progress (links/client_steps.py).
        self.decided: Signal[int | None] = Signal()
        self.records = window.steps             # every step's record (record.py)
        self.keep_open_here = False   # a failure here answers, and leaves the step open
        # The master, restarted: steps up to this one its predecessor may have decided (the
        # children's claims): one of them that cannot finish now is lost, not failed.
        self.settled_before = -1

    # -- what a scheme sees of its steps (schemes.Steps)
    @property
    def tree_vector(self) -> tuple[int, str] | None:
        return self.window.tree_vector

    def is_decided(self, step: int) -> bool:
        return self.window.is_decided(step)

    def is_open(self, step: int) -> bool:
        return self.deadlines.is_open(step)

    def stall(self, step: int, reason: str, here: bool = False) -> None:
        self.deadlines.stall(step, reason, here)

    def settle(self, step: int) -> None:
        self.records.make(step).settled = True

    def is_settled(self, step: int) -> bool:
        record = self.records.get(step)
        return record is not None and record.settled

    def failed_here(self, step: int) -> bool:
        """Whether ``step`` is decided here only as a failure of this node's alone."""
        return self.records.state(step) is StepState.FAILED_HERE

    def waiting(self, step: int, answer: Answer) -> None:
        """``answer`` waits on ``step`` (open here) for its decision."""
        self.records.make(step).waiters.append(answer)

    def _answers(self, step: int) -> list[Answer]:
        record = self.records.get(step)
        if record is None:
            return []
        answers, record.waiters = record.waiters, []
        return answers

    @property
    def timeout(self) -> float:
        return self.settings.timeout

    def resolved(self, step: int, layout: ChunkLayout, vector: np.ndarray,
                 approx: tuple[float, float] | None = None) -> None:
        """The scheme's result for ``step``; it has dropped its own state of the step.
        ``approx``: it is approximate, (coverage, residual)."""
        if self.decide(step, Resolved(step, layout, vector, approx), by_scheme=True):
            self.stats.steps_done += 1
            if approx is not None:
                self.stats.steps_approximate += 1
                self.stats.approximate_coverage += approx[0]
                log.info("step %d done approximately: coverage %.6g, residual %.3g", step,
                         *approx, extra={"step": step})
            else:
                log.debug("step %d done", step, extra={"step": step})

    def fail(self, step: int, reason: str, tree_wide: bool = True) -> None:
        """``step`` failed: for the whole tree (the master decided), or for this subtree."""
        if tree_wide and self.deadlines.is_master and step <= self.settled_before:
            # Some host may have applied it (the master before the restart settled it):
            # failing it would make replicas differ. Every host that lacks it takes the
            # others' state instead.
            if self.decide(step, Lost(step, f"{reason}; the master restarted after it may "
                                            f"have decided step {step}: take the others' state")):
                log.error("step %d is lost: %s (the master before its restart may have decided it)",
                          step, reason, extra={"step": step})
                self.window.advance(step)
            return
        # (Not a step whose sum goes straight into a process's shared memory: the process's
        # next requests wait until that memory is given back, at the step's decision.)
        if (not tree_wide and self.keep_open_here and self.deadlines.is_open(step)
                and self.lending.owner(step) is None):
            self._answer_here(step, reason)
            return
        here = not tree_wide and not self.window.is_decided(step)
        if not self.decide(step, Failed(step, reason, tree_wide), here=here):
            return
        log.error("step %d failed%s: %s", step, "" if tree_wide else " here", reason,
                  extra={"step": step})
        self.stats.steps_failed += 1
        if not tree_wide:
            self.stats.steps_failed_here += 1

    def _answer_here(self, step: int, reason: str) -> None:
        """Whoever waits on ``step`` is told it failed here; the step stays open, its clock
        stopped until a process asks for it again."""
        log.error("step %d failed here: %s (it stays open for the master's verdict)", step,
                  reason, extra={"step": step})
        self.stats.steps_failed += 1
        self.stats.steps_failed_here += 1
        self.deadlines.pause(step)
        for answer in self._answers(step):
            answer(Failed(step, reason, tree_wide=False))

    def lose(self, step: int, reason: str) -> None:
        """The master decided ``step``, and what it lacks here will not come (``Stall.lost``):
        its processes get ``Lost`` and take the others' state. Its children are not told:
        they may have the step's outcome themselves."""
        record = self.records.get(step)
        if record is not None and record.state is StepState.FAILED_HERE:
            record.move(Event.REOPEN)   # (the failure here is no longer its word)
        if self.decide(step, Lost(step, f"{reason}; the master decided step {step} without "
                                        "it reaching this host: take the others' state"),
                       tell=False):
            log.error("step %d is lost here: %s", step, reason, extra={"step": step})
            self.window.advance(step)

    def reopen(self, step: int) -> bool:
        """A step this node failed alone is open again (a process asks for it again, or
        the master's verdict comes): the failure here is forgotten, as if the step had
        not begun here. False if the step is not one this node failed alone (it stays as
        decided)."""
        record = self.records.get(step)
        if record is None or record.state is not StepState.FAILED_HERE:
            return False
        record.move(Event.REOPEN)
        log.info("step %d is open again here (its failure here was not the tree's word)", step,
                 extra={"step": step})
        return True

    def refuse_local(self, step: int, reason: str) -> None:
        """This host's vector for ``step`` does not fit: its processes are told; the step
        goes on without it."""
        for answer in self._answers(step):
            answer(Mismatched(step, reason))

    # -- the outcome of a decided step
    def outcome(self, step: int) -> Outcome:
        record = self.records.get(step)
        if record is not None and record.failure is not None:   # (FAILED_HERE)
            return record.failure
        found = self.kept.get(step)
        if found is not None:
            return found
        return Lost(step, f"the outcome of step {step} is not held by this daemon (it keeps the "
                          f"last {self.settings.keep_results}, and those its training processes "
                          f"have not taken within --result-memory); the tree is at step "
                          f"{self.window.tree_step}: reload the parameters (e.g. the newest "
                          "checkpoint) and go on after it")

    def decide(self, step: int, outcome: Decision, by_scheme: bool = False,
               tell: bool = True, here: bool = False) -> bool:
        """``step`` is decided here: stop its clocks, tell the subtree (unless not ``tell``),
        drop the scheme's state (unless the scheme decided it: ``by_scheme``, it did that
        itself), answer whoever waits. ``here``: a failure of this node's alone
        (``FAILED_HERE``). False if it already was decided."""
        window = self.window
        record = self.records.get(step)
        if record is not None and record.is_decided:
            return False
        if step <= window.low and (record is None or not (record.is_open or record.waiters)):
            return False   # behind the window: decided (as Lost) already
        record = self.records.make(step)
        window.decided_here(step)   # (first: the next step's peers' vouchers count at close)
        took = self.deadlines.took(record)
        began = self.deadlines.close(record)
        record.move(Event.FAIL_HERE if here else Event.DECIDE)
        if took is not None and isinstance(outcome, (Resolved, Failed)):   # once per step
            self.stats.times.step_seconds.observe(took)
            if isinstance(outcome, Resolved) and outcome.approx is None:
                self.stats.times.recent_seconds.append(took)   # the patience's measure
        if isinstance(outcome, Resolved):
            self.stats.measured.decided(step)                  # crnet tune's step period
        record.contributed = None
        if isinstance(outcome, Resolved):
            if step >= window.tree_step:   # the newest result's layout is the tree's
                window.tree_vector = (outcome.layout.total, outcome.layout.dtype_name)
        elif tell:  # a result went down chunk by chunk already; anything else goes now
            for slot in self.neighbours.slots:
                if slot.link is not None:
                    slot.link.send(fail_of(outcome))
        owner = self.lending.owner(step)
        if here:
            # (A failure of this node's alone: ``fail``, or the parent's refusal.)
            assert isinstance(outcome, (Failed, Refused))
            record.failure = outcome   # not the tree's word: not kept past a reopening
        elif not isinstance(outcome, Lost):
            kept: Decision = outcome
            if owner is not None and isinstance(outcome, Resolved):
                # Its vector is the owner's memory, which it changes once answered.
                kept = Lost(step, f"the result of step {step} was received straight into a "
                                  "training process's shared memory, where it was delivered; "
                                  "this daemon does not keep it")
            self.kept.put(step, kept)
        if not by_scheme:
            self._forget(step, isinstance(outcome, Resolved))
        self.neighbours.forget(step)
        by_master = isinstance(outcome, Resolved) or (isinstance(outcome, Failed)
                                                      and outcome.tree_wide)
        if by_master and window.advance(step):   # before the answers: they say where the tree is
            self.prune()
        self.decided.emit(step)
        answers, record.waiters = record.waiters, []
        # The host's other processes copy a result from the owner's memory now, while the
        # owner waits; the owner is answered last (Lending.give_back).
        owners = [] if owner is None else [a for a in answers if a == owner.answer]
        for answer in answers:
            if answer not in owners:
                answer(outcome)
        if owner is not None:
            loop = asyncio.get_running_loop()
            until = (loop.time() if began is None else began) + self.settings.answer_within
            then: list[Callable[[], None]] = [functools.partial(a, outcome) for a in owners]
            loop.call_soon(self.lending.give_back, step, then, until)
        return True

    def prune(self) -> None:
        """The window moved: forget what lies behind it; steps still open there were
        passed over by the tree."""
        low = self.window.low
        for record in self.records.unsettled(low):
            step = record.step
            self.decide(step, Lost(step, f"step {step} was passed over: the tree went on to "
                                         f"step {self.window.tree_step} before it was decided here"))
        self.window.forget_behind()
        for slot in self.neighbours.slots:
            slot.told = {s for s in slot.told if s > low}

    def reset(self) -> dict[int, list[Answer]]:
        """A new job: nothing is decided or waited on any more; returns who waited."""
        waiting = {r.step: r.waiters for r in self.records.clear() if r.waiters}
        self.kept.clear()
        self.settled_before = -1
        return waiting
