"""``crnetd --role master --plan auto``: between jobs, the master re-plans the tree from what
the last job measured.

When a new job is to start (``node/collectives/jobs.py``: no process of the running one is attached
anywhere), the master asks its tree for every node's measured windows (the status request
``crnet tune`` makes, answered in-process: ``StatusService.subtree``), fits and ranks them
(``crnet.tune.tuning``: the same functions, I/O-free) and takes the best choice
(``tune.replan_choice``) if it is predicted more than 5% faster:

- cr, gc or tree on the running fanout, with any stragglers per layer (``Membership.replan``);
- any other shape, or rar or spread, if it is also more than 5% faster than the best of
  those (``Membership.move``: every host moves to its place in the new tree). If the hosts
  cannot move (too few listen), the best on the running fanout is taken instead.

Either way the new job's processes get their assignment the normal way. A job under way
never changes. What was measured, old -> new and the predictions are logged; every node's
``measured`` status section says what the tree runs. Not re-planned: the chunk size and
the code (ranked as they run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from ...errors import CrnetError
from ...peer_text import shown
from ...schemes import Place
from ...tune.tuning import Prediction, Tuning, measurements, placed_tree, tune
from ...units import format_rate, format_seconds
from ..observe.status import StatusService
from .dial import supervised
from .membership import Membership
from .welcome import not_in_place

log = logging.getLogger("crnet.node")

GATHER_DEADLINE = 2.0   # seconds the tree has to answer (the new job's processes wait meanwhile)


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
        if self.membership.engine.tree_step < 0:   # no step ran: the configured plan
            self.membership.run_job(name)
            return
        self._starting = name
        supervised(self._replan_then_run(name), "re-plan")

    async def _replan_then_run(self, name: str) -> None:
        m = self.membership
        places: list[Place] = []
        try:
            try:
                places = await self._choose(name)
            except (CrnetError, ValueError, asyncio.TimeoutError) as e:
                log.info("plan auto: job %s starts on the running plan: %s", shown(name), e)
        finally:
            self._starting = None
        if m.jobs.busy(m.job):   # a process of the running job came back meanwhile: it
            log.info("plan auto: processes of job %s are attached again: job %s waits, nothing "
                     "is re-planned", shown(m.job), shown(name))
            m.jobs.ask(name)     # keeps its job and plan (the new job waits, or is refused)
            return
        for place in places:
            assert m.place is not None
            if not not_in_place(m.place, place.tree, place.scheme):
                m.replan(place)
                break
            if m.move(place):
                break
        m.run_job(name)

    async def _choose(self, name: str) -> list[Place]:
        """The plans job ``name`` may run, best first (none: the running one), logged."""
        tree = await self.status.subtree(GATHER_DEADLINE, self.window)
        t = await asyncio.get_running_loop().run_in_executor(
            None, lambda: tune(measurements(tree)))   # as crnet tune ranks by default
        choices = t.replan_choices()
        said = _said(t)
        old = f"{t.running.scheme} {t.running.shape} (predicted {format_seconds(t.running.mean)})"
        if not choices:
            log.info("plan auto: job %s keeps %s: %s", shown(name), old, said)
            return []
        place = self.membership.place
        assert place is not None
        best = t.ranking[0]
        log.info("plan auto: job %s: %s -> %s: %s; best of every shape: %s %s (predicted %s)",
                 shown(name), old, " or else ".join(map(_label, choices)), said, best.scheme,
                 best.shape, format_seconds(best.mean))
        plans = [dataclasses.replace(place, tree=placed_tree(c), scheme=c.scheme, ring=None)
                 for c in choices]
        return plans[:1] if len(plans) == 2 and plans[0] == plans[1] else plans


def _label(c: Prediction) -> str:
    return f"{c.scheme} {c.shape} (predicted {format_seconds(c.mean)})"


def _said(t: Tuning) -> str:
    mean = "-" if t.measured_mean is None else format_seconds(t.measured_mean)
    return (f"measured mean step {mean} over {len(t.measurements.periods)} steps, compute "
            f"{t.compute.model.describe()} per sample, links {format_rate(t.links.bandwidth)}, "
            f"latency {format_seconds(t.links.latency)}")
