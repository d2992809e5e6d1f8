"""``crnetd --role master --plan auto``: between jobs, the master re-plans the tree from what
the last job measured.

When a new job is to start (``jobs.py``: no process of the running one is attached
anywhere), the master asks its tree for every node's measured windows (the status request
``crnet tune`` makes, answered in-process: ``StatusService.subtree``), fits and ranks them
(``crnet.tune``: the same functions, I/O-free) and takes the best choice that keeps every
host in its place (``tune.replan_choice``: cr, gc or tree on the running fanout, with any
stragglers per layer) if it is predicted more than 5% faster. ``Membership.replan`` then
sends every child its WELCOME and ASSIGN of the new plan, and the JOB that starts the job
follows on the same links: the new job's processes get their assignment the normal way.
A job under way never changes. What was measured, old -> new and the predictions are
logged; every node's ``measured`` status section says what the tree runs.

Not re-planned: the fanout and depth (hosts would move between parents: they join again,
``crnet tune --write`` and a restart), rar and spread (their rings and meshes are made as
hosts join), the chunk size and the code (ranked as they run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from ..errors import CrnetError
from ..peer_text import shown
from ..plan import Tree
from ..schemes import Place
from ..tune import Tuning, measurements, replan_choice, tune
from ..units import format_rate, format_seconds
from .dial import supervised
from .membership import Membership
from .status import StatusService

log = logging.getLogger("crnet.node")

GATHER_DEADLINE = 2.0   # seconds the tree has to answer (the new job's processes wait meanwhile)
TRIALS = 500            # simulated steps per candidate


class AutoPlan:
    def __init__(self, membership: Membership, status: StatusService, window: int):
        self.membership = membership
        self.status = status
        self.window = window
        self._starting: str | None = None    # the job being started (the tree asked meanwhile)
        membership.before_job = self.before_job

    def before_job(self, name: str) -> None:
        """``name`` is to start: re-plan first (once its measurements are in), then run it."""
        if self._starting is not None:
            return
        if self.membership.engine.window.tree_step < 0:   # no step ran: the configured plan
            self.membership.run_job(name)
            return
        self._starting = name
        supervised(self._replan_then_run(name), "re-plan")

    async def _replan_then_run(self, name: str) -> None:
        m = self.membership
        place = None
        try:
            try:
                place = await self._choose(name)
            except (CrnetError, ValueError, asyncio.TimeoutError) as e:
                log.info("plan auto: job %s starts on the running plan: %s", shown(name), e)
        finally:
            self._starting = None
        if m.jobs.busy(m.job):   # a process of the running job came back meanwhile: it
            log.info("plan auto: processes of job %s are attached again: job %s waits, nothing "
                     "is re-planned", shown(m.job), shown(name))
            m.jobs.ask(name)     # keeps its job and plan (the new job waits, or is refused)
            return
        if place is not None:
            m.replan(place)
        m.run_job(name)

    async def _choose(self, name: str) -> Place | None:
        """The plan job ``name`` is to run, if not the running one (logged either way)."""
        tree = await self.status.subtree(GATHER_DEADLINE, self.window)
        t = await asyncio.get_running_loop().run_in_executor(
            None, lambda: tune(measurements(tree), trials=TRIALS))
        choice = replan_choice(t)
        said = _said(t)
        old = f"{t.running.scheme} {t.running.shape} (predicted {format_seconds(t.running.mean)})"
        if choice is None or choice.tree is None:
            log.info("plan auto: job %s keeps %s: %s", shown(name), old, said)
            return None
        place = self.membership.place
        assert place is not None
        new = f"{choice.scheme} {choice.shape} (predicted {format_seconds(choice.mean)})"
        best = t.ranking[0]
        log.info("plan auto: job %s: %s -> %s: %s; best of every shape: %s %s (predicted %s)",
                 shown(name), old, new, said, best.scheme, best.shape, format_seconds(best.mean))
        return dataclasses.replace(place, tree=Tree(choice.tree.fanout, choice.tree.stragglers),
                                   scheme=choice.scheme)


def _said(t: Tuning) -> str:
    mean = "-" if t.measured_mean is None else format_seconds(t.measured_mean)
    return (f"measured mean step {mean} over {len(t.measurements.periods)} steps, compute "
            f"{t.compute.model.describe()} per sample, links {format_rate(t.links.bandwidth)}, "
            f"latency {format_seconds(t.links.latency)}")
