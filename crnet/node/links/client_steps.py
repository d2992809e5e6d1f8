"""A training process's steps: its requests (SUBMIT, FETCH, WATCH), their answers
(DONE or an ERROR of the outcome's kind), and the progress written into its shared
memory as steps are decided. ``ClientLink`` hands it those messages."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...dtypes import DTYPES
from ...errors import ErrorKind
from ...measure.stats import Stats
from ...protocol.messages import Decided, Done, Fetch, Submit, Watch
from ...schemes.chunks import ChunkLayout
from ..local import LocalProcesses, Process
from ..steps import Failed, Lost, Mismatched, Outcome, Refused, Resolved, StepEngine


class ClientSteps:
    def __init__(self, process: Process, local: LocalProcesses, engine: StepEngine,
                 stats: Stats, state_request: Callable[[], int]):
        self.process = process
        self.local = local
        self.engine = engine
        self.stats = stats
        self.state_request = state_request     # the newest state request (broadcasts.py)
        self.taken = -1                        # the newest step it was answered about
        self.taking_state = False              # it waits for a peer's state
        self.waiting: tuple[int, int, np.dtype] | None = None  # step, length, dtype
        # What it asked the engine and was not answered yet: (step, contributes) for SUBMIT
        # and FETCH, steps for WATCH. The same again adds nothing (the open request
        # answers it), so a process that repeats itself holds at most one of each per
        # step the engine has not decided: those in the window, a bounded few.
        self.asked: set[tuple[int, bool]] = set()
        self.watching: set[int] = set()

    def start(self) -> list[Callable[[], None]]:
        """The process is attached: it hears of decisions from now on. The disconnects."""
        self.taken = self.engine.tree_step
        self.stats.measured.attached(self.process.index)
        return [self.engine.decided.connect(self.progress),
                self.engine.consumers.connect(lambda _: self.next_step())]

    def caught_up(self) -> None:
        """It was told where the tree is: it asks for nothing older."""
        if not self.taking_state:
            self.taken = max(self.taken, self.engine.tree_step)

    def asks_state(self) -> None:
        """It asks for a peer's state: it will go on after the step that state was taken
        after, which is about where the tree is now (the answers come at the peers' next
        step boundaries): the results from here on are kept for it, as far as they fit."""
        self.taking_state = True
        self.taken = min(self.taken, self.engine.tree_step)

    def took_state(self, after: int) -> None:
        """It has a state taken after step ``after``: it goes on from the step after."""
        self.taking_state = False
        self.taken = after

    # ---------------------------------------------------------------- requests
    def submit(self, msg: Submit) -> None:
        """SUBMIT: its vector for a step; FETCH (a SUBMIT that contributes nothing): the
        step's result only."""
        if self.process.job_over(msg.step):
            return
        dtype = DTYPES[msg.dtype]
        vector = self.process.vector(msg.length, dtype, "input")
        if vector is None:
            return
        self.waiting = (msg.step, msg.length, dtype)
        asked = (msg.step, not isinstance(msg, Fetch))
        if asked in self.asked:
            return                   # asked again: the request still open answers it
        self.asked.add(asked)
        if isinstance(msg, Fetch):
            self.engine.request(msg.step, None, self.answer)
        else:
            self.stats.measured.submitted(self.process.index, msg.step)   # crnet tune's compute time
            self.local.submit(self.process, msg.step, vector)

    def watch(self, msg: Watch) -> None:
        if msg.step in self.watching:
            return                   # it is told once, when the step is decided
        self.watching.add(msg.step)
        self.engine.request(msg.step, None, lambda outcome: self._decided(outcome.step))

    def _decided(self, step: int) -> None:
        self.watching.discard(step)
        conn = self.process.conn
        if conn is not None:
            conn.send(Decided(step, self.engine.tree_step))

    # ---------------------------------------------------------------- answers
    def answer(self, outcome: Outcome) -> None:
        """The outcome of the step this process waits on (anything else is ignored)."""
        self.asked.discard((outcome.step, True))
        self.asked.discard((outcome.step, False))
        conn = self.process.conn
        if self.waiting is None or self.waiting[0] != outcome.step or conn is None:
            return
        self.taken = max(self.taken, outcome.step)
        step, length, dtype = self.waiting
        error = self.process.error
        if isinstance(outcome, Resolved):
            # Only length and dtype are compared: the chunk size does not matter here.
            problem = outcome.layout.mismatch(ChunkLayout.of(length, dtype, 1), step)
            if problem:
                error(problem, ErrorKind.MISMATCH, step)
                return
            out = self.process.vector(length, dtype, "output", step)   # the region attached now
            if out is None:
                return
            if np.shares_memory(out, outcome.vector):   # received straight into it (lent)
                self.stats.results_direct += 1
            else:   # the pool's, another process's output, or a region it handed over since
                np.copyto(out, outcome.vector)
            self.waiting = None
            conn.send(Done(step, self.engine.tree_step, outcome.approx))
            self.stats.measured.answered(self.process.index)
        elif isinstance(outcome, Failed):
            error(outcome.reason, ErrorKind.FAILED, step, outcome.tree_wide)
        elif isinstance(outcome, Mismatched):
            error(outcome.reason, ErrorKind.MISMATCH, step)
        elif isinstance(outcome, Refused):
            error(outcome.reason, ErrorKind.REFUSED, step)
        else:
            assert isinstance(outcome, Lost)
            error(outcome.reason, ErrorKind.LOST, step)

    # ---------------------------------------------------------------- progress
    def next_step(self) -> int:
        """The oldest step this process may still ask for: results from it on are kept."""
        return self.taken + 1

    def progress(self, step: int | None) -> None:
        """A decision (or news of the tree's step, or a new job): written where the process
        reads it."""
        region = self.process.region
        if region is None:
            return
        if step is None:
            self.progress_from_scratch()
        else:
            # A step failed here only is not finished: the process asks for it again.
            region.progress.decided(None if self.engine.failed_here(step) else step,
                                    self.engine.tree_step, self.engine.newest_decided)

    def progress_from_scratch(self) -> None:
        """All of it again (new shared memory)."""
        assert self.process.region is not None
        progress = self.process.region.progress
        progress.reset()
        for step in self.engine.decided_steps():
            if not self.engine.failed_here(step):
                progress.decided(step, self.engine.tree_step, self.engine.newest_decided)
        progress.decided(None, self.engine.tree_step, self.engine.newest_decided)
        progress.state_request = self.state_request()
