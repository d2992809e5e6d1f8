"""``ClientLink``: a local training process, on the Unix socket. Its vectors are in
shared memory; the socket carries step numbers and names.

============  ==========================================================================
state         the process may send
============  ==========================================================================
HELLO         CLIENT_HELLO (a seat, its job: it is welcomed once its host has a share)
ATTACHED      SUBMIT, FETCH, WATCH (``ClientSteps``); PUBLISH, RECEIVE, WANT_STATE,
              BARRIER (``ClientGroup``); STATS
============  ==========================================================================

While a step's result is received straight into its shared output (``engine.lends``),
what would write there too (SUBMIT, FETCH, RECEIVE) waits, in order (``given_back``).
"""

from __future__ import annotations

import enum
import logging
import secrets
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from ...errors import ErrorKind
from ...measure.stats import Stats
from ...peer_text import shown
from ...protocol.messages import (
    Attached,
    Barrier,
    ClientError,
    ClientHello,
    ClientWelcome,
    Fetch,
    Message,
    Publish,
    Receive,
    StatsReply,
    StatsRequest,
    Submit,
    WantState,
    Watch,
)
from ...protocol.shm import SharedRegion
from ...protocol.transport import Connection
from ..collectives.barriers import Barriers
from ..collectives.broadcasts import Broadcasts
from ..collectives.jobs import busy_reason
from ..join.membership import Membership
from ..local import LocalProcesses
from ..steps import Outcome, StepEngine
from .client_group import ClientGroup
from .client_steps import ClientSteps
from .machine import Handler, Receives, StateMachine

log = logging.getLogger("crnet.node")


class ClientState(enum.Enum):
    HELLO = "hello"          # connected: it says who it is first
    ATTACHED = "attached"    # it has a seat


# A process asks one thing at a time and waits for its answer: a few requests held while
# its output is lent, and a few answers it has not read yet, are all it ever has. Past
# these it is told so (RequestRejected) and cut off: a local process bounds its own cost.
MAX_HELD = 64                  # requests held while its output is lent
MAX_UNREAD = 1 << 20           # bytes of answers queued for it, unread


def _unless_lent(handler: Handler) -> Handler:
    """``handler``, or, while the engine receives a step's result into this process's
    output (it gave up waiting, or was told an error early), held until given back."""
    def held_while_lent(link: ClientLink, conn: Connection, msg: Message, payload) -> None:
        if link.engine.lends(link):
            if len(link.held) >= MAX_HELD:
                link.cut_off(f"more than {MAX_HELD} requests while the daemon receives a result "
                             "into its shared memory: a process waits for each answer")
                return
            link.held.append(msg)
        else:
            handler(link, conn, msg, payload)
    return held_while_lent


class ClientLink(StateMachine):
    """The local training process: control messages on a Unix socket, vectors in shm."""

    def __init__(self, local: LocalProcesses, membership: Membership, engine: StepEngine,
                 stats: Stats, broadcasts: Broadcasts, barriers: Barriers):
        self.state = ClientState.HELLO
        self.local = local
        self.membership = membership
        self.engine = engine
        self.stats = stats
        self.index: int | None = None          # its seat among this host's processes
        self.job = ""                          # the training job it belongs to ("": any)
        self.conn: Connection | None = None
        self.region: SharedRegion | None = None
        self.pid: int | None = None
        self.assignment: dict | None = None   # as the process was last told it
        self.token = secrets.token_hex(16)     # names it when it hands over shared memory
        self.held: list[Message] = []          # its requests while its output is lent
        self.steps = ClientSteps(self, local, engine, stats, lambda: broadcasts.states.state_request)
        self.group = ClientGroup(self, broadcasts, barriers, per_host=local.k,
                                 answered=lambda: stats.measured.answered(self.index),
                                 steps=self.steps)
        self._disconnect: list[Callable[[], None]] = []   # from membership's and the engine's

    def unexpected(self, msg: Message, payload: bool) -> str:
        if payload:   # no state has a PAYLOAD table: vectors are in shared memory
            return "the client link carries no payloads"
        if self.state is ClientState.HELLO:
            return f"{msg.TYPE.name} before CLIENT_HELLO"
        return f"unexpected {msg.TYPE.name} from the training process"

    def received(self, conn: Connection, msg: Message, payload) -> None:
        if self.conn is not None and conn.is_closing:
            return                                # cut off (below): the rest is dropped
        if conn.write_buffer_size > MAX_UNREAD:   # it does not read what it asks for
            conn.abort(f"training process {self.pid} reads none of its answers "
                       f"({conn.write_buffer_size} bytes of them wait)")
            return
        super().received(conn, msg, payload)

    def cut_off(self, reason: str) -> None:
        """It asked more than a process ever has to: it is told so and disconnected."""
        if self.conn is not None and not self.conn.is_closing:
            log.warning("training process %s: %s; disconnecting it", self.pid, reason)
            self.conn.send(ClientError(reason, ErrorKind.REQUEST))
            self.conn.close()

    # ---------------------------------------------------------------- HELLO
    def _hello(self, conn: Connection, msg: ClientHello, payload) -> None:
        self.pid = msg.pid
        self.index = self.local.sit(self)
        if self.index is None:
            what = ("another training process is" if self.local.k == 1 else
                    f"{self.local.k} training processes are")
            conn.send(ClientError(f"{what} attached to this daemon ({self.local.holders()}; "
                                  "--local-processes)", ErrorKind.BUSY))
            conn.close()
            return
        self.state = ClientState.ATTACHED
        self.conn = conn
        self.job = msg.job
        log.info("training process %s attached (%d of %d)%s", self.pid, self.index + 1,
                 self.local.k, f" for job {shown(msg.job)}" if msg.job else "")
        jobs = self.membership.jobs
        self._disconnect += [self.membership.on_assigned.connect(lambda _: self._welcome()),
                             self.membership.on_job.connect(lambda _: self._welcome()),
                             jobs.on_refused.connect(self._job_refused),
                             lambda: jobs.left(self), *self.steps.start()]
        self.group.start()
        jobs.attached(self, self.job)
        if self.membership.join_job(self.job):
            self._welcome()   # else once the master has started this job

    def _job_refused(self, refusal: tuple[str, str]) -> None:
        """Its job cannot start while another one's processes are attached: it is told
        which (DaemonBusy), and let go."""
        job, running = refusal
        if job != self.job or self.conn is None or self.assignment is not None:
            return
        log.warning("training process %s of job %s turned away: job %s runs", self.pid,
                    shown(job), shown(running))
        self.conn.send(ClientError(busy_reason(job, running), ErrorKind.BUSY))
        self.conn.close()

    def _welcome(self) -> None:
        """This host's share: once the tree assigned it (the process waits for it), and
        again only if a re-assignment changed it (the process gets AssignmentChanged)."""
        assert self.index is not None
        if self.job and self.job != self.membership.job:
            return   # its job does not run (yet, or any more)
        self.steps.caught_up()
        assignment = self.membership.assignment(self.index, self.local.k)
        if self.conn is None or assignment is None or assignment == self.assignment:
            return
        if self.assignment is not None:
            log.warning("this host's share of the data changed; telling training process %s",
                        self.pid)
        self.assignment = assignment
        self.conn.send(ClientWelcome(assignment, self.engine.tree_step,
                                     self.engine.settings.answer_within, self.token))

    # ---------------------------------------------------------------- ATTACHED
    def _submit(self, conn: Connection, msg: Submit, payload) -> None:
        self.steps.submit(msg)

    def _watch(self, conn: Connection, msg: Watch, payload) -> None:
        self.steps.watch(msg)

    def _publish(self, conn: Connection, msg: Publish, payload) -> None:
        self.group.publish(msg)

    def _receive(self, conn: Connection, msg: Receive, payload) -> None:
        self.group.receive(msg)

    def _want_state(self, conn: Connection, msg: WantState, payload) -> None:
        self.group.want_state(msg)

    def _barrier(self, conn: Connection, msg: Barrier, payload) -> None:
        self.group.barrier(msg)

    def _stats(self, conn: Connection, msg: StatsRequest, payload) -> None:
        m = self.membership
        stats = {**self.stats.as_dict(), **self.engine.bookkeeping()}
        conn.send(StatsReply(stats, None if m.place is None else m.place.name, m.state.value,
                             self.engine.tree_step, tuple(self.engine.open_steps),
                             m.neighbours.summary()))

    RECEIVE: ClassVar[Receives] = {
        ClientState.HELLO: {ClientHello: _hello},
        ClientState.ATTACHED: {Submit: _unless_lent(_submit), Fetch: _unless_lent(_submit),
                               Receive: _unless_lent(_receive), Watch: _watch,
                               Publish: _publish, WantState: _want_state, Barrier: _barrier,
                               StatsRequest: _stats},
    }

    # ---------------------------------------------------------------- the process
    @property
    def waiting(self) -> tuple[int, int, np.dtype] | None:
        """The step it waits on: (step, length, dtype)."""
        return self.steps.waiting

    def answer(self, outcome: Outcome) -> None:
        """The outcome of the step this process waits on (anything else is ignored)."""
        self.steps.answer(outcome)

    def given_back(self) -> None:
        """The engine no longer receives a step's result into its shared output: the
        requests it held meanwhile go on, in order."""
        held, self.held = self.held, []
        for msg in held:
            if self.conn is not None:
                self.received(self.conn, msg, None)

    def attach(self, region: SharedRegion) -> None:
        """The process handed over (new) shared memory (node/client_socket.py). A step it
        waits on keeps its vector where it was read: in the old region, still mapped
        until the step lets go of it. Its result goes to the region attached when it
        comes: if it does not fit there (the new region is smaller), the process gets an
        ERROR for that step instead (``answer``); nothing else is affected. A result being
        received straight into the old region's output (``LocalProcesses.lend``) still
        lands there (the daemon's mapping of it lives as long as that array) and is copied
        into the new one when it is answered."""
        self.region = region
        self.steps.progress_from_scratch()
        if self.conn is not None:
            self.conn.send(Attached())

    def attach_failed(self, reason: str) -> None:
        self.error(reason, ErrorKind.SHM)

    def job_over(self, step: int | None = None) -> bool:
        """This process's job is not the one the tree runs: it was told so (JobEnded)."""
        if not self.job or self.job == self.membership.job:
            return False
        self.error(f"the daemons now run job {self.membership.job!r}; job {self.job!r} "
                   "is over for them", ErrorKind.JOB, step)
        return True

    def vector(self, length: int, dtype: np.dtype, half: str,
               step: int | None = None) -> np.ndarray | None:
        """The process's shared ``half`` (input, output) as ``length`` x ``dtype``, or None
        (it was told why, about ``step``)."""
        if self.region is None or length * dtype.itemsize > self.region.capacity:
            self.error("vector does not fit the attached shared memory", ErrorKind.REQUEST, step)
            return None
        return getattr(self.region, half)(dtype, length)

    def error(self, reason: str, kind: ErrorKind, step: int | None = None,
              tree_wide: bool = True) -> None:
        self.steps.waiting = None
        if self.conn is not None:
            self.conn.send(ClientError(reason, kind, step, self.engine.tree_step, tree_wide))

    def lost(self, conn, exc):
        self.held.clear()
        if self.conn is not None:
            log.info("training process %s detached", self.pid)
            self.local.leave(self)
        for disconnect in self._disconnect:
            disconnect()
        self._disconnect.clear()
        self.group.close()
