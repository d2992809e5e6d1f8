"""Jobs: which training processes of which job are attached in a node's subtree.

The master decides which job the tree runs (``Membership.run_job``); a new job begins
only when no process of the running one is attached anywhere in the tree (and, once
that job is under way, every child link has said what it holds), so that
neither a newcomer of another job nor a forged JOB frame ends a job under way. Each
node counts the processes attached in its subtree (its own, plus what each child
reported) and reports up whenever the count changes: JOB(name, attached), the running
job's processes, or else those of a job they wait for (a request: the master starts it
once the running job has none, waiting ``JOB_GRACE`` for its last processes to go; else
it refuses it down the tree, JOB ``refused``, and its processes get DaemonBusy naming the
running job). A process without a job name counts
for whichever job runs (while the tree runs none by name and has decided no step of it,
it keeps no named job from starting: it joins that one; once the unnamed job is under
way, its processes keep it running like a named job's).

A job that has decided no step and whose processes are on one host alone (one child
slot's subtree, or the master's own host) holds the tree only **provisionally**: another
job with processes on two or more of them starts over it, and until then the other job's
processes wait instead of being turned away. One host holding the secret could otherwise
claim a job of its own on an idle tree (JOB, within its seats) and keep every other job
out for as long as it kept the claim, without ever running a step (issue 39, row 7).
Two jobs of honest users keep the rule they had wherever each spans two hosts: the first
to ask runs.

A child's count is bounded by what its subtree can seat (its daemons times the processes
every host of the tree runs, the master's ``--local-processes``): a larger one closes its
link. Within that bound a broken child
can only claim processes of its own, which keep the running job from ending: what it
contributes, nothing more. The same counts bound what a child may say of the processes
below it elsewhere (barriers, broadcasts, state requests).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ...errors import ProtocolError
from ...peer_text import shown
from ...protocol.messages import Job
from ..neighbours import Neighbours
from ..signal import Signal

log = logging.getLogger("crnet.node")

JOB_GRACE = 2.0    # seconds the master holds a new job while the running one's processes go


def busy_reason(wanted: str, running: str) -> str:
    """What a process of job ``wanted`` is told while job ``running`` has processes."""
    return (f"the daemons run job {shown(running)}, and processes of it are attached: job "
            f"{shown(wanted)} can start only once none is (stop them, or wait for that job "
            "to finish; a job ends when its last process disconnects)")


class JobCounts:
    """This node's attached processes by job, and each child's last report; what goes
    up and down about them. ``running()`` is the job the tree runs (as this node knows);
    at the master, ``start(job)`` makes the tree run another."""

    def __init__(self, neighbours: Neighbours, running: Callable[[], str],
                 is_master: Callable[[], bool], start: Callable[[str], None],
                 underway: Callable[[], bool] = lambda: False,
                 planned: Callable[[], bool] = lambda: True) -> None:
        """``underway()``: the running job has decided a step (its processes are mid-job).
        ``planned()``: the master has planned the tree (a restarted one: and learned from
        its children where the tree is and which job it runs)."""
        self.neighbours = neighbours
        self.running = running
        self._underway = underway
        self._planned = planned
        self._is_master = is_master
        self._start = start
        self.local: dict[object, str] = {}                  # process -> its job ("": any)
        self.children: dict[int, tuple[str, int]] = {}      # slot -> (job, processes)
        self.reported: tuple[str, int] | None = None        # the last report sent up
        self._asked: dict[str, asyncio.TimerHandle] = {}    # the master: jobs waiting to start
        self.on_refused: Signal[tuple[str, str]] = Signal()   # (job, the one running)
        self.on_counts: Signal[None] = Signal()               # a child's count changed

    # ---------------------------------------------------------------- what happens
    def attached(self, process: object, job: str) -> None:
        """A training process of ``job`` ("": whichever runs) is attached here."""
        self.local[process] = job
        self.report()

    def left(self, process: object) -> None:
        if self.local.pop(process, None) is not None:
            self.report()

    def child_lost(self, k: int) -> None:
        if self.children.pop(k, None) is not None:
            self.on_counts.emit(None)
            self.report()

    def parent_up(self) -> None:
        """A (new) parent has heard nothing of this subtree's processes yet."""
        self.reported = None
        self.report()

    def from_child(self, k: int, msg: Job, seats: int) -> None:
        """Child ``k`` (its subtree: ``seats`` training processes at most) reports: more
        processes than that is a ``ProtocolError`` (that link closes). Processes of another job than
        the running one ask for it: the count goes up, and the master decides (``ask``)."""
        if msg.attached > seats:
            raise ProtocolError(f"JOB: a child counts {msg.attached} processes attached, but its "
                                f"subtree seats at most {seats}")
        if self.children.get(k) != (msg.name, msg.attached):
            self.children[k] = (msg.name, msg.attached)
            self.on_counts.emit(None)
        if (self._is_master() and self._planned() and msg.attached and msg.name
                and msg.name != self.running()):
            self.ask(msg.name)   # (before the plan: ``review`` asks, once it is made)
        self.report()

    def review(self) -> None:
        """The master, planned: the jobs its children asked for before. Not at once: a
        restarted master knows neither where the tree is nor which job it runs until its
        children joined again, and a JOB that came first (a child holding the secret)
        started its job there, which every host then began at step 0, refusing the
        running job's processes from then on (the authenticated fuzzer)."""
        running = self.running()
        for job, attached in list(self.children.values()):
            if attached and job and job != running:
                self.ask(job)

    def ask(self, job: str) -> None:
        """The master: processes of ``job`` wait for it. It starts now if no process of the
        running job is attached (or that job holds the tree only provisionally and this one
        is on two hosts: the module's docstring); else as soon as that is so, within
        ``JOB_GRACE`` seconds (the running job's last processes may be disconnecting just
        now); else it is refused, unless the running job is provisional: then it waits on."""
        if self._may_start(job):
            self._begin(job)
        elif job not in self._asked:
            self._wait(job)

    def _wait(self, job: str) -> None:
        self._asked[job] = asyncio.get_running_loop().call_later(JOB_GRACE, self._turn_away, job)

    def _may_start(self, job: str) -> bool:
        """The master: may ``job`` start now? If no process of the running job is attached,
        or if the running job holds the tree only provisionally (no step decided, its
        processes on one host) and ``job``'s are on two hosts or more."""
        running = self.running()
        if not self.busy(running):
            return True
        return self._provisional(running) and self.hosts(job, running) >= 2

    def _provisional(self, running: str) -> bool:
        return not self._underway() and self.hosts(running, running) + self._unheard() <= 1

    def refused(self, msg: Job) -> None:
        """The parent refused job ``msg.refused``: tell the children that asked for it, and
        this host's processes of it."""
        for k, (job, _) in self.children.items():
            link = self.neighbours.slots[k].link
            if job == msg.refused and link is not None:
                link.send(msg)
        self.on_refused.emit((msg.refused, msg.name))

    def report(self) -> None:
        """Tell the parent this subtree's attached processes, when that changed; at the
        master, start a job waiting to once the running one has no process any more."""
        if self._is_master():
            ready = [job for job in self._asked if self._may_start(job)]
            if ready:
                self._begin(ready[0])
            return
        now = self.counted(self.running())
        if now != self.reported and self.neighbours.to_parent(Job(*now)):
            self.reported = now

    def _begin(self, job: str) -> None:
        timer = self._asked.pop(job, None)
        if timer is not None:
            timer.cancel()
        self._start(job)

    def _turn_away(self, job: str) -> None:
        if self._asked.pop(job, None) is None:
            return
        running = self.running()
        if self._may_start(job):
            self._start(job)
            return
        if self._provisional(running):
            self._wait(job)   # it may start yet, once it has processes on another host
            return
        log.info("job %s turned away: job %s runs", shown(job), shown(running))
        self.refused(Job(running, refused=job))

    # ---------------------------------------------------------------- counts
    def subtree(self, job: str, running: str) -> int:
        """Processes of ``job`` attached here and below (unnamed ones: the running job's)."""
        here = sum(1 for j in self.local.values() if j == job or (not j and job == running))
        return here + sum(n for j, n in self.children.values() if j == job)

    def busy(self, running: str) -> int:
        """Processes of the running job attached here and below. A process without a job
        name joins whatever runs: while the tree runs no job by name and has decided no step,
        it keeps no named job from starting (it joins that one); once a step is decided it is
        mid-job and keeps the job running as named processes do (a new job counts its steps
        from 0 again, so every later step of theirs would be refused for good). A child whose
        link has not reported its processes yet counts as one: a master that restarted mid-job
        hears its children's counts only after they joined again, and a JOB frame of another
        job that came first (a child holding the secret) started that job over the running
        one's processes (the authenticated fuzzer, with master restarts)."""
        if not (running or self._underway()):
            return 0
        return self.subtree(running, running) + self._unheard()

    def _unheard(self) -> int:
        """Child links that have not reported their processes yet."""
        return sum(1 for k, slot in enumerate(self.neighbours.slots)
                   if slot.link is not None and k not in self.children)

    def hosts(self, job: str, running: str) -> int:
        """On how many of this node's own host and its child slots' subtrees processes of
        ``job`` are attached (unnamed ones: the running job's)."""
        here = any(j == job or (not j and job == running) for j in self.local.values())
        return here + sum(1 for j, n in self.children.values() if n and j == job)

    def here(self) -> list[object]:
        """This host's processes that vouch for the running job: at the master, whose
        state answers are taken at once (``state_answers.py``). Those that named it; a
        process that names no job joins whatever runs, but vouches only for a job without
        a name: it could be anyone's, and on the master's host its answer used to win at
        once over every process of the named job (issue 39, row 14)."""
        running = self.running()
        return [p for p, job in self.local.items() if job == running]

    def any_attached(self) -> tuple[str, int] | None:
        """A job with processes attached here or below, of any job (the running one first),
        and how many; None if none is (``crnet tune --probe`` runs only then)."""
        running = self.running()
        jobs = [running, *self.local.values(), *(j for j, n in self.children.values() if n)]
        for job in dict.fromkeys(jobs):
            n = self.subtree(job, running)
            if n:
                return job, n
        return None

    def below(self, k: int) -> int:
        """Processes of the running job attached in child ``k``'s subtree (as it reported)."""
        job, n = self.children.get(k, ("", 0))
        return n if job == self.running() else 0

    def counted(self, running: str) -> tuple[str, int]:
        """What to report up: the running job's processes, if any; else those of a job
        they wait for (the parent takes that as a request to start it)."""
        n = self.subtree(running, running)
        if n:
            return running, n
        waiting = [j for j in (*self.local.values(), *(j for j, c in self.children.values() if c))
                   if j and j != running]
        if waiting:
            return waiting[0], self.subtree(waiting[0], running)
        return running, 0
