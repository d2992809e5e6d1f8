"""A node's links: what each kind of peer may send, and who handles it.

Each class is a ``transport.Handler``: the connection gives it typed, validated
messages (``crnet.messages``); it checks that the message is one this peer may
send at this point and hands it to membership (joining) or the step engine
(steps). A message out of place is a ``ProtocolError``: that connection closes.

- ``ChildLink``: accepted on ``--listen``. Starts with HELLO (a child joining),
  PEER_HELLO (a ring predecessor, rar) or STATUS_HELLO (``crnet status``); then
  CHUNK/JOINED/FAIL/STATUS_REPLY, SEGMENTs, or STATUS questions.
- ``ParentLink``: dialed to the parent. WELCOME or REFUSE, then ASSIGN, RESULT, FAIL,
  STATUS.
- ``SuccessorLink``: dialed to the ring successor; we only send on it.
- ``ClientLink``: the local training process on the Unix socket; its vectors are in
  shared memory, the socket carries step numbers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections.abc import Callable

import numpy as np

from ..dtypes import DTYPES
from ..errors import ErrorKind, JoinRefused, ProtocolError
from ..kernels import coded_sum
from ..messages import (
    Assign,
    Attached,
    Barrier,
    Bcast,
    Chunk,
    ClientError,
    ClientHello,
    ClientWelcome,
    Decided,
    Delivered,
    Done,
    Fail,
    Fetch,
    Hello,
    Job,
    Joined,
    Message,
    Open,
    PeerHello,
    PeerWelcome,
    Publish,
    Receive,
    Refuse,
    Result,
    Segment,
    StatsReply,
    StatsRequest,
    StatusHello,
    StatusReply,
    StatusRequest,
    Submit,
    WantState,
    Watch,
    Welcome,
)
from ..peer_text import Throttle, shown, tamed
from ..schemes.chunks import ChunkLayout
from ..shm import SharedRegion
from ..stats import Stats
from ..transport import Connection
from .broadcasts import Held
from .membership import Membership
from .steps import Failed, Lost, Mismatched, Outcome, Refused, Resolved, StepEngine

log = logging.getLogger("crnet.node")

RECENT_FAILS = 64   # the steps a child's FAILs are remembered for (each step is reported once)


class ChildLink:
    """A connection accepted on ``--listen``: a child, or (rar) the ring predecessor."""

    def __init__(self, membership: Membership, engine: StepEngine,
                 warnings: Throttle | None = None):
        self.membership = membership
        self.engine = engine
        self.warnings = warnings or Throttle(log)   # the node's: shared by every connection
        self.slot: int | None = None     # the child's slot, once it said HELLO
        self.peer = False                # the ring predecessor, once it said PEER_HELLO
        self.status = False              # crnet status, once it said STATUS_HELLO
        self.refused = False             # REFUSE sent: what it sent before reading it is moot
        self._failed: dict[tuple[str, int], None] = {}   # (job, step) of its latest FAILs

    def payload_dest(self, conn, msg, nbytes):
        if self.refused:
            return None
        if self.slot is not None:
            if isinstance(msg, Chunk):
                return self.engine.child_chunk_dest(self.slot, msg, nbytes)
            if isinstance(msg, Bcast):
                return self.membership.broadcasts.child_dest(self.slot, msg, nbytes)
        elif self.peer and isinstance(msg, Segment):
            return self.engine.segment_dest(msg, nbytes)
        raise ProtocolError(self._unexpected(msg))

    def received(self, conn, msg, payload):
        if self.refused:
            return
        if self.slot is not None:
            if isinstance(msg, Chunk):
                self.engine.child_chunk(self.slot, msg)
            elif isinstance(msg, Joined):
                self.membership.child_joined(self.slot, msg)
            elif isinstance(msg, Fail):
                self._child_failed(conn, self.slot, msg)
            elif isinstance(msg, Open):
                self.engine.child_opened(self.slot, msg)
            elif isinstance(msg, Job):
                self.membership.join_job(msg.name)
            elif isinstance(msg, Bcast):
                self.membership.broadcasts.from_child(self.slot, msg, payload)
            elif isinstance(msg, WantState):
                self.membership.broadcasts.want_state(msg.nonce)
            elif isinstance(msg, Barrier):
                self.membership.barriers.from_child(self.slot, msg)
            elif isinstance(msg, StatusReply):
                self.membership.status.child_reply(self.slot, msg)
            else:
                raise ProtocolError(self._unexpected(msg))
        elif self.status:
            if not isinstance(msg, StatusRequest):
                raise ProtocolError(self._unexpected(msg))
            self.membership.status.asked(conn, msg.id, msg.deadline)
        elif self.peer:
            if not isinstance(msg, Segment):
                raise ProtocolError(self._unexpected(msg))
            if payload is None and self.engine.segment_dest(msg, 0) is None:
                return    # an empty segment (checked like any other): nothing was received
            self.engine.segment(msg)
        elif isinstance(msg, Hello):
            try:
                self.slot = self.membership.child_hello(conn, msg)
            except JoinRefused as e:
                self.refused = True
                self._refuse(conn, e)
        elif isinstance(msg, StatusHello):   # answered at once; it may ask again (--watch)
            self.status = True
            self.membership.status.asked(conn, 0)
        elif isinstance(msg, PeerHello):
            try:
                self.membership.peer_hello(conn, msg)
                self.peer = True
            except JoinRefused as e:
                self.refused = True
                self._refuse(conn, e)
        else:
            raise ProtocolError(self._unexpected(msg))

    def _child_failed(self, conn: Connection, k: int, msg: Fail) -> None:
        """A child reports each step's failure once: a repeat would change nothing but
        the log (a flood of them, or one reason forged into many lines). Its reason goes
        on, printable, into the step's failure reason."""
        key = (self.membership.job, msg.step)
        if key in self._failed:
            self.warnings.warning((conn.label, "FAIL again"),
                                  "%s (child slot %d) reported step %d's failure again; ignored",
                                  conn.label, k, msg.step)
            return
        self._failed[key] = None
        if len(self._failed) > RECENT_FAILS:
            del self._failed[next(iter(self._failed))]
        self.engine.child_failed(k, dataclasses.replace(msg, reason=tamed(msg.reason)))

    def _refuse(self, conn: Connection, e: JoinRefused) -> None:
        # One line per peer address every few seconds: a peer may try again and again.
        self.warnings.warning((conn.label.rpartition(":")[0], "refused"), "refusing %s: %s",
                              conn.label, e.reason)
        conn.send(Refuse(e.reason, e.retry))
        conn.close()

    def lost(self, conn, exc):
        if self.peer:
            log.warning("ring predecessor disconnected")
        elif self.slot is not None:
            self.membership.child_lost(self.slot, conn)

    def _unexpected(self, msg: Message) -> str:
        who = ("a child" if self.slot is not None else "the ring predecessor" if self.peer
               else "crnet status" if self.status else "a peer before HELLO")
        return f"unexpected {msg.TYPE.name} from {who}"


class DialedLink:
    """A link this node dialed (to its parent, or its ring successor): ``welcome``
    resolves when the peer welcomes this node, or fails with why not. ``dial.py``
    dials again after a ``ProtocolError`` or a ``JoinRefused`` with ``retry``; any
    other ``JoinRefused`` is the tree saying this node's configuration is wrong."""

    def __init__(self) -> None:
        self.welcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def reject(self, conn: Connection, reason: str) -> None:
        """The peer did, before its welcome, what no parent or successor of this node does
        (a WELCOME to a place this node cannot take, no proof of the cluster secret): the
        link is no good. It closes; the dialer logs why and dials again after a pause."""
        if not self.welcome.done():
            self.welcome.set_exception(ProtocolError(reason))
        conn.close()


class ParentLink(DialedLink):
    """This node's connection to its parent."""

    def __init__(self, membership: Membership, engine: StepEngine):
        super().__init__()
        self.membership = membership
        self.engine = engine

    def payload_dest(self, conn, msg, nbytes):
        if self.welcome.done():
            if isinstance(msg, Result):
                return self.engine.parent_result_dest(msg, nbytes)
            if isinstance(msg, Bcast):
                return self.membership.broadcasts.parent_dest(msg, nbytes)
            if isinstance(msg, Assign):
                return memoryview(bytearray(nbytes))  # Limits capped it at MAX_CONTROL_PAYLOAD
        raise ProtocolError(f"unexpected {msg.TYPE.name} from the parent")

    def received(self, conn, msg, payload):
        if not self.welcome.done():
            if isinstance(msg, Welcome):
                try:
                    self.membership.welcomed(msg)
                except ProtocolError as e:
                    self.reject(conn, f"a WELCOME this node cannot take: {e}")
                    return
                self.welcome.set_result(None)
            elif isinstance(msg, Refuse):
                self.welcome.set_exception(JoinRefused(msg.reason, msg.retry))
            else:
                raise ProtocolError(f"{msg.TYPE.name} from the parent before WELCOME")
        elif isinstance(msg, Result):
            self.engine.parent_result(msg)
        elif isinstance(msg, Fail):   # its reason goes on to this subtree's processes
            self.engine.parent_failed(dataclasses.replace(msg, reason=tamed(msg.reason)))
        elif isinstance(msg, Assign):
            self.membership.assigned(msg, payload)
        elif isinstance(msg, Job):
            self.membership.run_job(msg.name)
        elif isinstance(msg, Bcast):
            self.membership.broadcasts.from_parent(msg, payload)
        elif isinstance(msg, WantState):
            self.membership.broadcasts.state_requested(msg.nonce)
        elif isinstance(msg, Barrier):
            self.membership.barriers.released(msg)
        elif isinstance(msg, StatusRequest):
            self.membership.status.asked(conn, msg.id, msg.deadline)
        else:
            raise ProtocolError(f"unexpected {msg.TYPE.name} from the parent")

    def lost(self, conn, exc):
        if not self.welcome.done():
            self.welcome.set_exception(ConnectionResetError("the parent closed the connection"))


class SuccessorLink(DialedLink):
    """A ring member's link to its successor: segments go out, only the welcome comes in."""

    def payload_dest(self, conn, msg, nbytes):
        raise ProtocolError(f"unexpected {msg.TYPE.name} from the ring successor")

    def received(self, conn, msg, payload):
        if isinstance(msg, PeerWelcome) and not self.welcome.done():
            self.welcome.set_result(None)
        elif isinstance(msg, Refuse) and not self.welcome.done():
            self.welcome.set_exception(JoinRefused(msg.reason, msg.retry))
        else:
            raise ProtocolError(f"unexpected {msg.TYPE.name} from the ring successor")

    def lost(self, conn, exc):
        if not self.welcome.done():
            self.welcome.set_exception(ConnectionResetError("the ring successor hung up"))


class LocalProcesses:
    """This host's training processes (``--local-processes K``): K seats, one share of the
    data each, and their vectors summed into the host's local vector, per step.

    Each process waits on the step itself (the tree may finish it before all K have
    computed); the sum goes to the step engine once all K have submitted, added in one
    ``coded_sum`` pass straight from their shared memory. A process that leaves fails,
    for the others, the steps it had not submitted yet. A step's result may be received
    straight into one process's shared output (``lend``).
    """

    def __init__(self, k: int, engine: StepEngine):
        self.k = k
        self.engine = engine
        self.seats: list[ClientLink | None] = [None] * k
        self._parts: dict[int, dict[int, tuple[ClientLink, np.ndarray]]] = {}  # step -> seat
        if k > 1:
            engine.decided.connect(self._decided)

    def lend(self, step: int, total: int, dtype: np.dtype) -> tuple[ClientLink, np.ndarray] | None:
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

    def sit(self, link: ClientLink) -> int | None:
        """A free seat for ``link`` (its index), or None: all K are taken."""
        for i, holder in enumerate(self.seats):
            if holder is None or holder.conn is None or holder.conn.is_closing:
                self.seats[i] = link
                return i
        return None

    def holders(self) -> str:
        return ", ".join(f"pid {h.pid}" for h in self.seats if h is not None)

    def leave(self, link: ClientLink) -> None:
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

    def submit(self, link: ClientLink, step: int, vector: np.ndarray) -> None:
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


class ClientLink:
    """The local training process: control messages on a Unix socket, vectors in shm."""

    def __init__(self, local: LocalProcesses, membership: Membership, engine: StepEngine,
                 stats: Stats):
        self.local = local
        self.index: int | None = None          # its seat among this host's processes
        self.job = ""                          # the training job it belongs to ("": any)
        self.membership = membership
        self.engine = engine
        self.stats = stats
        self.conn: Connection | None = None
        self.region: SharedRegion | None = None
        self.pid: int | None = None
        self.assignment: dict | None = None   # as the process was last told it
        self.taken = -1                        # the newest step it was answered about
        self.token = secrets.token_hex(16)     # names it when it hands over shared memory
        self.waiting: tuple[int, int, np.dtype] | None = None  # step, length, dtype
        self._disconnect: list[Callable[[], None]] = []   # from the engine's signals
        self.receiving: tuple[str, int, np.dtype] | None = None  # broadcast key, length, dtype
        self._barriers: list = []              # its releases, while it waits at barriers
        self._held: list[Submit | Receive] = []   # its requests while its output is lent

    def payload_dest(self, conn, msg, nbytes):
        raise ProtocolError("the client link carries no payloads")

    def received(self, conn, msg, payload):
        if self.conn is None:
            if not isinstance(msg, ClientHello):
                raise ProtocolError(f"{msg.TYPE.name} before CLIENT_HELLO")
            self._hello(conn, msg)
        elif isinstance(msg, Watch):
            self.engine.request(msg.step, None, lambda outcome: self._decided(outcome.step))
        elif isinstance(msg, (Submit, Receive)) and self.engine.lends(self):
            # A step's result still goes into its shared output (it gave up waiting, or
            # was told an error early): what would write there too waits (given_back).
            self._held.append(msg)
        elif isinstance(msg, Submit):  # Fetch too: a Submit that contributes nothing
            self._request(msg, contribute=not isinstance(msg, Fetch))
        elif isinstance(msg, Publish):
            self._publish(msg)
        elif isinstance(msg, Receive):
            self._receive(msg)
        elif isinstance(msg, WantState):
            self.membership.broadcasts.want_state(msg.nonce)
        elif isinstance(msg, Barrier):
            self._barrier(msg)
        elif isinstance(msg, StatsRequest):
            m = self.membership
            stats = {**self.stats.as_dict(), **self.engine.bookkeeping()}
            conn.send(StatsReply(stats, None if m.place is None else m.place.name, m.state.value,
                                 self.engine.tree_step, tuple(self.engine.open_steps),
                                 m.neighbours.summary()))
        else:
            raise ProtocolError(f"unexpected {msg.TYPE.name} from the training process")

    def _hello(self, conn: Connection, msg: ClientHello) -> None:
        self.pid = msg.pid
        self.index = self.local.sit(self)
        if self.index is None:
            what = ("another training process is" if self.local.k == 1 else
                    f"{self.local.k} training processes are")
            conn.send(ClientError(f"{what} attached to this daemon ({self.local.holders()}; "
                                  "--local-processes)", ErrorKind.BUSY))
            conn.close()
            return
        self.conn = conn
        self.job = msg.job
        log.info("training process %s attached (%d of %d)%s", self.pid, self.index + 1,
                 self.local.k, f" for job {shown(msg.job)}" if msg.job else "")
        self.membership.on_assigned.append(self._welcome)
        self.membership.on_job.append(self._welcome)
        self._disconnect += [self.engine.decided.connect(self._progress),
                             self.engine.consumers.connect(lambda _: self._next_step())]
        self.membership.broadcasts.on_state_request.append(self._state_request)
        self.taken = self.engine.tree_step
        if self.membership.join_job(self.job):
            self._welcome()   # else once the master has started this job

    def _welcome(self) -> None:
        """This host's share: once the tree assigned it (the process waits for it), and
        again only if a re-assignment changed it (the process gets AssignmentChanged)."""
        assert self.index is not None
        if self.job and self.job != self.membership.job:
            return   # its job does not run (yet, or any more)
        self.taken = max(self.taken, self.engine.tree_step)
        assignment = self.membership.assignment(self.index, self.local.k)
        if self.conn is None or assignment is None or assignment == self.assignment:
            return
        if self.assignment is not None:
            log.warning("this host's share of the data changed; telling training process %s",
                        self.pid)
        self.assignment = assignment
        self.conn.send(ClientWelcome(assignment, self.engine.tree_step,
                                     self.engine.settings.answer_within, self.token))

    def _request(self, msg: Submit, contribute: bool) -> None:
        if self._job_over(msg.step):
            return
        dtype = DTYPES[msg.dtype]
        vector = self._vector(msg.length, dtype, "input")
        if vector is None:
            return
        self.waiting = (msg.step, msg.length, dtype)
        if contribute:
            self.local.submit(self, msg.step, vector)
        else:
            self.engine.request(msg.step, None, self.answer)

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
        self._progress_from_scratch()
        if self.conn is not None:
            self.conn.send(Attached())

    def attach_failed(self, reason: str) -> None:
        self._error(reason, ErrorKind.SHM)

    def _job_over(self, step: int | None = None) -> bool:
        """This process's job is not the one the tree runs: it was told so (JobEnded)."""
        if not self.job or self.job == self.membership.job:
            return False
        self._error(f"the daemons now run job {self.membership.job!r}; job {self.job!r} "
                    "is over for them", ErrorKind.JOB, step)
        return True

    def _vector(self, length: int, dtype: np.dtype, half: str,
                step: int | None = None) -> np.ndarray | None:
        """The process's shared ``half`` (input, output) as ``length`` x ``dtype``, or None
        (it was told why, about ``step``)."""
        if self.region is None or length * dtype.itemsize > self.region.capacity:
            self._error("vector does not fit the attached shared memory", ErrorKind.REQUEST, step)
            return None
        return getattr(self.region, half)(dtype, length)

    def _publish(self, msg: Publish) -> None:
        if self._job_over():
            return
        vector = self._vector(msg.length, DTYPES[msg.dtype], "input")
        if vector is None or self.conn is None:
            return
        problem = self.membership.broadcasts.publish(msg.key, msg.step, vector)
        if problem:
            self._error(f"broadcast {msg.key!r}: {problem}", ErrorKind.REQUEST)
        else:
            self.conn.send(Delivered(msg.key, msg.step))

    def _receive(self, msg: Receive) -> None:
        if self._job_over():
            return
        self.receiving = (msg.key, msg.length, DTYPES[msg.dtype])
        self.membership.broadcasts.cancel(self._delivered)   # a request it gave up on
        self.membership.broadcasts.receive(msg.key, self._delivered)

    def _delivered(self, held: Held) -> None:
        if self.receiving is None or self.conn is None:
            return
        key, length, dtype = self.receiving
        if (held.vector.size, held.vector.dtype) != (length, dtype):
            self.receiving = None
            self._error(f"broadcast {key!r} is {held.vector.size} x {held.vector.dtype}; this "
                        f"process expects {length} x {dtype}", ErrorKind.MISMATCH)
            return
        out = self._vector(length, dtype, "output")
        self.receiving = None
        if out is not None:
            np.copyto(out, held.vector)
            self.conn.send(Delivered(key, held.step))

    def _barrier(self, msg: Barrier) -> None:
        if self._job_over():
            return
        key = msg.key

        def release() -> None:
            if release in self._barriers:
                self._barriers.remove(release)
            if self.conn is not None:
                self.conn.send(Delivered(key, -1))
        self._barriers.append(release)
        self.membership.barriers.arrive(key, msg.processes, release)

    def _state_request(self, nonce: int) -> None:
        if self.region is not None:
            self.region.progress.state_request = nonce

    def _next_step(self) -> int:
        """The oldest step this process may still ask for: results from it on are kept."""
        return self.taken + 1

    def given_back(self) -> None:
        """The engine no longer receives a step's result into its shared output: the
        requests it held meanwhile go on, in order."""
        held, self._held = self._held, []
        for msg in held:
            if self.conn is not None:
                self.received(self.conn, msg, None)

    def answer(self, outcome: Outcome) -> None:
        """The outcome of the step this process waits on (anything else is ignored)."""
        if self.waiting is None or self.waiting[0] != outcome.step or self.conn is None:
            return
        self.taken = max(self.taken, outcome.step)
        step, length, dtype = self.waiting
        if isinstance(outcome, Resolved):
            # Only length and dtype are compared: the chunk size does not matter here.
            problem = outcome.layout.mismatch(ChunkLayout.of(length, dtype, 1), step)
            if problem:
                self._error(problem, ErrorKind.MISMATCH, step)
                return
            out = self._vector(length, dtype, "output", step)   # the region attached now
            if out is None:
                return
            if np.shares_memory(out, outcome.vector):   # received straight into it (lent)
                self.stats.results_direct += 1
            else:   # the pool's, another process's output, or a region it handed over since
                np.copyto(out, outcome.vector)
            self.waiting = None
            self.conn.send(Done(step, self.engine.tree_step))
        elif isinstance(outcome, Failed):
            self._error(outcome.reason, ErrorKind.FAILED, step, outcome.tree_wide)
        elif isinstance(outcome, Mismatched):
            self._error(outcome.reason, ErrorKind.MISMATCH, step)
        elif isinstance(outcome, Refused):
            self._error(outcome.reason, ErrorKind.REFUSED, step)
        else:
            assert isinstance(outcome, Lost)
            self._error(outcome.reason, ErrorKind.LOST, step)

    def _error(self, reason: str, kind: ErrorKind, step: int | None = None,
               tree_wide: bool = True) -> None:
        self.waiting = None
        if self.conn is not None:
            self.conn.send(ClientError(reason, kind, step, self.engine.tree_step, tree_wide))

    def _progress(self, step: int | None) -> None:
        """A decision (or news of the tree's step, or a new job): written where the process
        reads it."""
        if self.region is None:
            return
        if step is None:
            self._progress_from_scratch()
        else:
            e = self.engine
            self.region.progress.decided(step, e.tree_step, e.newest_decided)

    def _progress_from_scratch(self) -> None:
        assert self.region is not None
        progress = self.region.progress
        progress.reset()
        for step in self.engine.decided_steps():
            progress.decided(step, self.engine.tree_step, self.engine.newest_decided)
        progress.decided(None, self.engine.tree_step, self.engine.newest_decided)
        progress.state_request = self.membership.broadcasts.state_request

    def _decided(self, step: int) -> None:
        if self.conn is not None:
            self.conn.send(Decided(step, self.engine.tree_step))

    def lost(self, conn, exc):
        self._held.clear()
        if self.conn is not None:
            log.info("training process %s detached", self.pid)
            self.local.leave(self)
        for callbacks in (self.membership.on_assigned, self.membership.on_job):
            if self._welcome in callbacks:
                callbacks.remove(self._welcome)
        for disconnect in self._disconnect:
            disconnect()
        self._disconnect.clear()
        broadcasts = self.membership.broadcasts
        if self._state_request in broadcasts.on_state_request:
            broadcasts.on_state_request.remove(self._state_request)
        broadcasts.cancel(self._delivered)
        for release in self._barriers:
            self.membership.barriers.cancel(release)
