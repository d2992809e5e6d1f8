"""``AsyncClient``: a training process's connection to its host's crnetd (asyncio).

Requests and their answers, shared memory and the step watches; ``replies.py`` is the
protocol side, ``blocking.py`` the blocking twin.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np

from .. import defaults
from ..dtypes import DTYPES, dtype_name
from ..errors import (
    AssignmentChanged,
    CrnetError,
    CrnetTimeout,
    DaemonNotRunning,
    ProtocolError,
    StaleReplica,
    StepFailed,
    StepLost,
    StepRefused,
)
from ..protocol.local_peer import peer_credentials
from ..protocol.messages import (
    Attach,
    Attached,
    Barrier,
    ClientError,
    ClientHello,
    ClientWelcome,
    Delivered,
    Done,
    Fetch,
    Message,
    Publish,
    Receive,
    StatsReply,
    StatsRequest,
    Submit,
    WantState,
    Watch,
    state_key,
)
from ..protocol.shm import Progress, SharedRegion
from ..protocol.transport import Connection
from ..protocol.wire import Limits
from .assignment import Assignment
from .replies import REPLY_MARGIN, M, Replies
from .result_info import ResultInfo

__all__ = ["AsyncClient", "client_socket_path"]

log = logging.getLogger("crnet.client")

T = TypeVar("T")


def client_socket_path(path) -> str:
    """The daemon's client socket: ``path``, else $CRNET_CLIENT_SOCKET, else the default."""
    return str(path or os.environ.get("CRNET_CLIENT_SOCKET") or defaults.CLIENT_SOCKET)


async def _attach(path: str, job: str, timeout: float | None, daemon_uid: int | None = None
                  ) -> tuple[Connection, Replies, ClientWelcome, int]:
    """A connection to the daemon at ``path``, said hello to as a process of ``job``, its
    welcome (the tree's assignment, within ``timeout``) and the daemon's uid (the kernel's
    word). ``daemon_uid``: the uid the daemon must run as (a reconnect: the first one's),
    checked before this process says or hands over anything."""
    replies = Replies(path)
    loop = asyncio.get_running_loop()
    try:
        _, conn = await loop.create_unix_connection(
            lambda: Connection(replies, Limits(max_payload=0), "crnetd"), path)
    except OSError as e:
        raise DaemonNotRunning(f"no crnetd at {path}: {e.strerror or e}") from None
    try:
        assert conn.transport is not None   # made: create_unix_connection returned it
        _, uid, _ = peer_credentials(conn.transport.get_extra_info("socket"))
        if daemon_uid is not None and uid != daemon_uid:
            # The path is only a name: after the daemon stopped, another user may have
            # bound it (a directory others can write), to be handed this process's memory.
            raise DaemonNotRunning(
                f"what listens at {path} runs as uid {uid}, not as the crnetd this process "
                f"first connected to (uid {daemon_uid}): not a daemon to trust")
        conn.send(ClientHello(os.getpid(), job))
        welcome = await replies.next(ClientWelcome, timeout, "the tree's assignment")
    except BaseException:
        conn.close()
        raise
    return conn, replies, welcome, uid


def _processes(processes: int | None, what: str) -> int | None:
    """How many processes take part in a barrier or vote: ``processes``, else
    $CRNET_WORLD_SIZE (``crnet run`` sets it), else None."""
    world = os.environ.get("CRNET_WORLD_SIZE")
    n = processes if processes is not None else int(world) if world else None
    if n is not None and n < 1:
        raise ValueError(f"{what} of {n} processes")
    return n


class AsyncClient:
    """A training process's connection to its host's crnetd (asyncio).

    ``c = await AsyncClient.connect(path)`` waits until the tree has assigned this
    host its share of the data. ``Client`` is the blocking twin.
    """

    def __init__(self, path: str, conn: Connection, replies: Replies, welcome: ClientWelcome):
        """Use ``connect``."""
        self.path = path
        self.assignment = Assignment.from_wire(welcome.assignment)
        # The daemon answers every request within this; a little more covers the trip.
        self.default_timeout = welcome.answer_within + REPLY_MARGIN
        self._tree_step = welcome.tree_step
        # Why this process's parameters may not be the job's (None: they are): its
        # gradients would corrupt every replica, so allreduce refuses them (StaleReplica).
        self._stale: str | None = None
        if welcome.tree_step >= 0:
            self._stale = (f"this process connected to a job already at step {welcome.tree_step} "
                           f"(its step 0 was decided without it)")
        self._answered_state = 0     # the state request this process answered (or made)
        self._token = welcome.token  # names this process when it hands over shared memory
        self._conn = conn
        self._replies = replies
        self._region: SharedRegion | None = None
        self._progress: Progress | None = None   # the daemon keeps it current
        # (step, length, dtype) of the step request it gave up waiting on (CrnetTimeout):
        # the daemon still answers it, and asking again would be answered twice.
        self._owed: tuple[int, int, str] | None = None
        # Steps whose requests it gave up waiting on, answers maybe still to come. One that
        # comes while it waits for another answer is dropped (_late): it is not that
        # answer, nor that request's error.
        self._abandoned: set[int] = set()
        self._numbered: dict[str, int] = {}   # numbered_key's count per prefix
        self._job = ""                         # the job it said it belongs to (connect)
        self._daemon_uid: int | None = None    # the daemon's uid: a reconnect checks it
        self.reconnect = 0.0
        """Seconds to wait for the daemon to come back when it closed the connection
        (``connect``'s ``reconnect``); 0: DaemonNotRunning at once."""
        self._lost_at: float | None = None     # when the daemon closed the connection (loop time)
        self.reconnects = 0
        """How many times the daemon closed the connection and this process reconnected."""
        self.last_result_info: ResultInfo | None = None
        """What the last step result returned (``allreduce``, ``result``) is: exact, or
        approximate with its coverage and residual (``ResultInfo``); None before any."""

    @classmethod
    async def connect(cls, socket_path=None,
                      timeout: float | None = defaults.CLIENT_CONNECT_TIMEOUT,
                      job: str | None = None,
                      reconnect: float = defaults.CLIENT_RECONNECT) -> AsyncClient:
        """Connect; wait (up to ``timeout``) until the tree has assigned this host its share.

        ``job`` (default ``$CRNET_JOB``, else none) names the training job: the first process
        of a new job makes the daemons drop the previous job's steps and start at step 0,
        once no process of the running job is attached anywhere (until then: DaemonBusy);
        a process that joins a running job sees the job's ``tree_step`` at once and is
        ``stale`` until it takes the job's state (``request_state``). Without a name, a
        process joins whatever job the daemons run: a rerun of a script whose job
        finished joins that finished job, where no process answers ``request_state``
        (it says so): name each run's job.

        ``reconnect``: seconds to wait for the daemon to come back when it closes the
        connection (it died and systemd, or ``crnet run --max-restarts``, starts it
        again): the process reconnects at the same socket and goes on (``_daemon``
        says how each call fares); 0: DaemonNotRunning at once."""
        path = client_socket_path(socket_path)
        job = job if job is not None else os.environ.get("CRNET_JOB", "")
        conn, replies, welcome, uid = await _attach(path, job, timeout)
        try:
            self = cls(path, conn, replies, welcome)
            self._job, self.reconnect, self._daemon_uid = job, reconnect, uid
            await self._ensure(1 << 16)   # shared memory now: the tree's progress is in it
        except BaseException:
            conn.close()
            raise
        return self

    @property
    def tree_step(self) -> int:
        """The newest step the tree decided, as the daemon knows it now: it writes it into
        shared memory the moment it learns, so reading it costs well under a microsecond.

        A training process that fell behind (it straggled and the tree went on
        without it) takes those results with ``result`` instead of computing.
        """
        if self._progress is None:
            return self._tree_step
        return max(self._tree_step, self._progress.tree_step)

    @property
    def stale(self) -> bool:
        """Whether this process may not hold the job's parameters: it connected to a job
        whose step 0 was already decided, or got ``StepLost``. Until ``request_state`` or
        ``mark_current``, ``allreduce`` and ``send_state`` raise ``StaleReplica`` and
        ``state_wanted`` is False."""
        return self._stale is not None

    def mark_current(self) -> None:
        """Say this process's parameters (and optimizer state) are the job's after the
        step it goes on from, e.g. loaded from a checkpoint every replica took or a
        ``broadcast``: it is no longer ``stale``. ``request_state`` does this itself."""
        self._stale = None

    def finished(self, step: int) -> bool:
        """Whether the daemon already has ``step``'s outcome (the tree finished it, or it
        failed): check it between micro-batches and stop computing a step that is done.
        ``allreduce`` or ``result`` then return that outcome at once."""
        return self._progress is not None and self._progress.finished(step)

    async def wait_finished(self, step: int, timeout: float | None = None) -> None:
        """Return once ``step`` is decided (within the daemon's bound): race it against
        the computation of ``step``, and take the outcome with ``allreduce``/``result``."""
        async def watch() -> None:
            if self.finished(step):
                return
            fut, new = self._replies.watch(step)
            if new:
                self._conn.send(Watch(step))
            try:
                await asyncio.wait_for(asyncio.shield(fut),
                                       self.default_timeout if timeout is None else timeout)
            except asyncio.TimeoutError:
                raise CrnetTimeout(f"step {step} was not decided within {timeout} s") from None
        await self._daemon(watch)

    async def buffer(self, length: int, dtype=np.float32) -> np.ndarray:
        """The shared input vector: compute the gradient into it, then allreduce it."""
        dtype = np.dtype(dtype)
        region = await self._ensure(length * dtype.itemsize)
        return region.input(dtype, length)

    async def result_buffer(self, length: int, dtype=np.float32) -> np.ndarray:
        """The shared output vector, where the daemon writes each result: pass it as
        ``out`` and a result costs no copy on this side. Each ``allreduce``, ``result``
        or ``broadcast`` overwrites it."""
        dtype = np.dtype(dtype)
        region = await self._ensure(length * dtype.itemsize)
        return region.output(dtype, length)

    async def allreduce(self, vec, step: int, out: np.ndarray | None = None,
                        timeout: float | None = None) -> np.ndarray:
        """Contribute this process's local gradient to ``step``; return the full sum.

        Answered within the daemon's bound (``default_timeout``, the default): the sum,
        or StepFailed, StepLost, StepRefused or MismatchError, each with the reason and
        the tree's ``tree_step``. CrnetTimeout only if ``timeout`` is shorter than that,
        or the daemon itself is stuck; calling again for the same step then waits for
        the answer the daemon still owes (it asks nothing twice: the daemon may have
        delivered the result straight into the shared output, and keeps no copy of it).
        If the process asks for anything else first, that late answer is dropped when
        it comes (it is not the other request's answer or error), and the step asked
        again later is a new request (StepLost if the daemon kept no copy).

        StaleReplica (before anything is sent) while the process is ``stale``.
        """
        if self._stale is not None:
            raise self._stale_error("allreduce")
        vec = self._flat(vec, "allreduce")

        async def submit() -> np.ndarray:
            await self._stage(vec)
            return await self._request(Submit, step, vec, out, timeout)
        return await self._daemon(submit, step)

    async def result(self, step: int, like, out: np.ndarray | None = None,
                     timeout: float | None = None) -> np.ndarray:
        """A step's full gradient without contributing (``like`` gives length and dtype)."""
        like = np.asarray(like).reshape(-1)

        async def fetch() -> np.ndarray:
            await self._ensure(like.nbytes)
            return await self._request(Fetch, step, like, out, timeout)
        return await self._daemon(fetch, step)

    async def broadcast(self, vec, key: str, root: bool | int, out: np.ndarray | None = None,
                        timeout: float | None = None, processes: int | None = None) -> np.ndarray:
        """One process's vector to every process of the job (e.g. the parameters of a
        checkpoint): every process calls it with the same ``key`` (unique within the job);
        the root gives its vector, the others a vector of the same length and dtype whose
        values do not matter. ``root``: the root's rank (``assignment.rank``), which every
        process gets only from the root's host; or True in the root and False in the
        others: then, like a barrier of ``processes`` (default ``$CRNET_WORLD_SIZE``, else
        every process of the tree), the others wait until all have called it and take the
        copy of the one that said it was the root (MismatchError if none or several did).
        Returns the root's vector (in ``out`` if given; ``out=result_buffer(...)`` costs no
        copy): the root once its daemon has taken it, the others once it is here."""
        vec = self._flat(vec, "broadcast")
        rank = None if isinstance(root, bool) else int(root)
        vote = None if rank is not None else _processes(processes, "broadcast") or 0
        if root is True or (rank is not None and rank == self.assignment.rank):
            await self._daemon(lambda: self._publish(key, -1, vec, timeout, vote))
            if out is None:
                return vec
            np.copyto(out.reshape(-1), vec)
            return out
        received = await self._daemon(
            lambda: self._receive(key, vec, out, timeout, root=rank, vote=vote))
        return received[0]

    def numbered_key(self, prefix: str) -> str:
        """``<prefix>/<k>``, k counting this client's calls with ``prefix`` from 0: a
        ``broadcast`` key the processes of a job agree on when each makes the same calls
        in the same order (crnet.torch's default keys)."""
        k = self._numbered[prefix] = self._numbered.get(prefix, -1) + 1
        return f"{prefix}/{k}"

    async def barrier(self, key: str = "start", processes: int | None = None,
                      timeout: float | None = None) -> None:
        """Wait until all ``processes`` training processes of the job (default
        ``$CRNET_WORLD_SIZE``, which ``crnet run`` sets) have called ``barrier(key)``:
        e.g. before the first step, so that no process starts late. Each key once per
        job. CrnetTimeout if they are not all there within ``timeout``."""
        processes = _processes(processes, "barrier")
        if processes is None:
            raise ValueError("barrier: say how many take part (processes=N) or set CRNET_WORLD_SIZE")

        async def meet() -> None:
            self._ask(Barrier(key, 1, processes))
            await self._delivered(key, timeout)
        await self._daemon(meet)

    async def request_state(self, like, out: np.ndarray | None = None,
                            timeout: float | None = None) -> tuple[np.ndarray, int]:
        """For a process that joins a running job: ask the other processes for their state
        (parameters, optimizer state: a vector like ``like``). Each answers at its next
        step boundary (``state_wanted``, ``send_state``); every asker gets the answer of a
        process on the master's host while one there can answer, else the state (with its
        step) that two of the master's child subtrees agree on (docs/client.md: when one
        is enough). Returns (the state, the step it was taken after): go on with the step
        after it; the process is no longer ``stale``. CrnetTimeout if no state was decided
        within ``timeout`` (default the client's): none of the job is running (e.g. a
        rerun of a finished job's script without a new job name), none reached a step
        boundary, or the answers disagreed twice: ask again."""
        like = self._flat(like, "request_state")
        within = self.default_timeout if timeout is None else timeout

        async def ask() -> tuple[np.ndarray, int]:
            nonce = secrets.randbits(62) + 1
            self._answered_state = nonce           # its own request is not one to answer
            self._ask(WantState(nonce))
            return await self._receive(state_key(nonce), like, out, within)
        try:
            state = await self._daemon(ask)
        except CrnetTimeout:
            raise CrnetTimeout(
                f"no process of the job sent its state within {within:g} s: none is running "
                "(a rerun of a script whose job finished joins that job when it names none: "
                "give each run its own job, Client(job=...) or $CRNET_JOB), or none reached "
                "a step boundary (it answers state_wanted() with send_state), or the states "
                "sent disagreed (the master's log says so): ask again") from None
        self._stale = None
        return state

    def state_wanted(self) -> bool:
        """Whether a process asked for the state and this one has not answered yet: a
        shared-memory read, for a step boundary. Answer with ``send_state``. Always False
        while this process is ``stale``: it has no state to give."""
        if self._progress is None or self._stale is not None:
            return False
        nonce = self._progress.state_request
        return nonce > 0 and nonce != self._answered_state

    async def send_state(self, vec, step: int, timeout: float | None = None) -> None:
        """Answer the newest state request with this process's state after ``step``;
        returns once the daemon has taken it. StaleReplica while this process is ``stale``."""
        if self._stale is not None:
            raise self._stale_error("send_state")
        if self._progress is None or self._progress.state_request <= 0:
            return
        nonce = self._progress.state_request
        self._answered_state = nonce
        # (Not sent again across a restart of the daemon: the asker's request goes up
        # again from its own daemon, and this process answers it at a step boundary.)
        await self._daemon(lambda: self._publish(state_key(nonce), step,
                                                 self._flat(vec, "send_state"), timeout),
                           again=False)

    async def stats(self) -> dict:
        """The daemon's counters (``stats``: steps done and failed, children skipped, bytes,
        times, results delivered without a copy) and where it stands (``name``, join ``state``, ``tree_step``,
        ``open_steps``, and which ``links`` are up)."""

        async def ask() -> StatsReply:
            self._ask(StatsRequest())
            return await self._reply(StatsReply, 10.0, "stats")
        reply = await self._daemon(ask)
        return {"stats": reply.stats, "name": reply.name, "state": reply.state,
                "tree_step": reply.tree_step, "open_steps": list(reply.open_steps),
                "links": reply.links}

    def close(self) -> None:
        self._conn.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()

    # -- a daemon that restarts
    async def _daemon(self, call: Callable[[], Awaitable[T]], step: int | None = None,
                      again: bool = True) -> T:
        """``call()`` (a request and its answer) across a restart of the daemon. A process
        whose daemon closed the connection reconnects at the same socket before its next
        request, and hands the new daemon shared memory; ``reconnect`` s after the
        connection closed, DaemonNotRunning says the daemon did not come back. A step's
        request keeps to the daemon's bound: under way when the connection closed, or made
        while the daemon is away, it fails here (StepFailed, not tree-wide: nothing was
        applied; asked again, the new daemon takes the step up, or answers StepLost once
        the tree is past it): at once, or once the daemon is back, or at the bound if it is
        not (the new daemon's own bound would come on top of the wait). Any other request
        is made again on the new connection (``again``; else it is dropped)."""
        if self._lost_at is not None:
            away = await self._back(step)
            if step is not None and away:
                raise StepFailed(step, f"crnetd at {self.path} was restarting when step {step} "
                                       f"was asked for; it is back now (the tree is at step "
                                       f"{self._tree_step}): ask for the step again",
                                 self._tree_step, tree_wide=False)
        try:
            return await call()
        except DaemonNotRunning:
            if self.reconnect <= 0:
                raise
            self._lost_at = asyncio.get_running_loop().time()
            log.warning("crnetd at %s closed the connection: reconnecting (for up to %g s)",
                        self.path, self.reconnect)
        if step is not None:
            raise StepFailed(step, f"crnetd at {self.path} closed the connection while step "
                                   f"{step} was under way (it died, or restarts): ask for the "
                                   "step again; this process reconnects first",
                             self._tree_step, tree_wide=False)
        await self._back(None)
        if not again:
            return None  # type: ignore[return-value]
        return await call()

    async def _back(self, step: int | None) -> bool:
        """A new connection to the daemon at ``path`` (started again), as the same process
        of the same job: what it knows of the tree (its step, this host's share) comes
        anew; the replica is as it was (``stale`` only if it was). True if the daemon was
        not back at the first try (this waited for it)."""
        assert self._lost_at is not None
        loop = asyncio.get_running_loop()
        deadline = self._lost_at + self.reconnect
        until = deadline if step is None else min(
            deadline, loop.time() + self.default_timeout - REPLY_MARGIN)
        why = "nothing listens there"
        away = False
        while True:
            now = loop.time()
            if now >= until:
                if now >= deadline or step is None:
                    raise DaemonNotRunning(
                        f"crnetd at {self.path} closed the connection and did not come back "
                        f"within {self.reconnect:g} s (last try: {why}); is it running? "
                        "(systemctl status crnetd, or its log)")
                raise StepFailed(step, f"crnetd at {self.path} is not back yet, "
                                       f"{now - self._lost_at:.1f} s after it closed the "
                                       f"connection: ask for step {step} again",
                                 self._tree_step, tree_wide=False)
            try:
                conn, replies, welcome, _ = await _attach(self.path, self._job, until - now,
                                                          self._daemon_uid)
                break
            except (DaemonNotRunning, CrnetTimeout) as e:
                why, away = str(e), True
                await asyncio.sleep(min(defaults.CLIENT_RECONNECT_PAUSE, max(0.0, until - now)))
        self._conn.close()
        self._conn, self._replies, self._token = conn, replies, welcome.token
        self.assignment = Assignment.from_wire(welcome.assignment)
        self.default_timeout = welcome.answer_within + REPLY_MARGIN
        self._tree_step = max(self._tree_step, welcome.tree_step)
        self._owed = None            # the old daemon's owed answers are gone with it
        self._abandoned.clear()
        # New shared memory, as large as the old: arrays the process holds of the old
        # (buffer(), result_buffer()) stay valid, and are copied from and into.
        capacity = 1 << 16 if self._region is None else self._region.capacity
        self._region = self._progress = None
        await self._ensure(capacity)
        self._lost_at = None
        self.reconnects += 1
        log.warning("reconnected to crnetd at %s (the tree is at step %d)", self.path,
                    welcome.tree_step)
        return away

    async def _request(self, kind: type[Submit], step: int, like: np.ndarray,
                       out: np.ndarray | None, timeout: float | None) -> np.ndarray:
        ask = (step, like.size, dtype_name(like.dtype))
        # When it is owed, its answer is still to come, or came late: it is that.
        self._ask(kind(*ask) if ask != self._owed else None)
        self._owed = ask
        try:
            done = await self._reply(Done, timeout, f"step {step}", step)
        except CrnetTimeout:   # the daemon still answers it
            self._abandoned.add(step)
            raise
        except CrnetError:     # answered (an error)
            self._answered()
            raise
        self._answered()
        if done.step != step:   # answers to steps given up on were dropped (_late)
            raise ProtocolError(f"crnetd answered step {done.step} to a request for step {step}")
        self.last_result_info = ResultInfo.of(done.approx)
        return self._take(like, out)

    def _answered(self) -> None:
        """A step request was answered. The daemon answers a process's step requests in
        order, and a new one replaces any it gave up on: none of those is answered now."""
        self._owed = None
        self._abandoned.clear()

    def _late(self, msg: Message, step: int | None) -> bool:
        """Whether ``msg`` answers a step this process gave up waiting on, coming while it
        waits for the answer to another request (about ``step``, or none): then it is
        dropped, and that step asked again is a new request (the daemon answers it from
        what it kept)."""
        if not isinstance(msg, (Done, ClientError)):
            return False
        late = msg.step
        if late is None or late == step or late not in self._abandoned:
            return False
        self._abandoned.discard(late)
        if self._owed is not None and self._owed[0] == late:
            self._owed = None
        return True

    @staticmethod
    def _flat(vec, what: str) -> np.ndarray:
        vec = np.asarray(vec)
        if dtype_name(vec.dtype) not in DTYPES:
            raise TypeError(f"{what} takes float32 or float64 vectors, got {vec.dtype}")
        if vec.size == 0:
            raise ValueError(f"{what} of an empty vector")
        return vec.reshape(-1)

    async def _stage(self, vec: np.ndarray) -> None:
        """``vec`` into the shared input (no copy when it is the shared input itself)."""
        region = await self._ensure(vec.nbytes)
        staged = region.input(vec.dtype, vec.size)
        if not np.shares_memory(staged, vec):
            np.copyto(staged, vec)

    def _take(self, like: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """The result in the shared output, as ``out`` (no copy when it is the shared
        output itself) or a new array."""
        assert self._region is not None
        result = self._region.output(like.dtype, like.size)
        if out is None:
            return result.copy()
        if not np.shares_memory(out, result):
            np.copyto(out.reshape(-1), result)
        return out

    async def _publish(self, key: str, step: int, vec: np.ndarray, timeout: float | None,
                       vote: int | None = None) -> None:
        await self._stage(vec)
        self._ask(Publish(key, step, vec.size, dtype_name(vec.dtype), vote))
        await self._delivered(key, timeout)

    async def _receive(self, key: str, like: np.ndarray, out: np.ndarray | None,
                       timeout: float | None, root: int | None = None,
                       vote: int | None = None) -> tuple[np.ndarray, int]:
        await self._ensure(like.nbytes)
        self._owed = None   # the daemon writes the shared output for this instead
        self._ask(Receive(key, like.size, dtype_name(like.dtype), root, vote))
        step = await self._delivered(key, timeout)
        return self._take(like, out), step

    async def _delivered(self, key: str, timeout: float | None) -> int:
        while True:
            msg = await self._reply(Delivered, timeout, f"broadcast {key!r}")
            if msg.key == key:
                return msg.step   # else: a late reply to a broadcast we gave up waiting on

    async def _reply(self, kind: type[M], timeout: float | None, what: str,
                     step: int | None = None) -> M:
        """The daemon's answer to a request (about ``step``, if it is a step's); what it
        says of the tree (``tree_step``, a new assignment) is kept even when the answer is
        an error."""
        try:
            msg = await self._replies.next(kind, self.default_timeout if timeout is None
                                           else timeout, what,
                                           lambda m: self._late(m, step))
        except (StepFailed, StepLost, StepRefused) as e:
            self._tree_step = max(self._tree_step, e.tree_step)
            # A failure that is not tree-wide leaves the replica as it was: its host was cut
            # off, and asking for the step again gets the tree's verdict (or StepLost).
            if isinstance(e, StepLost):
                self._stale = f"it got {type(e).__name__} ({e}): this replica may have missed an update"
            raise
        except AssignmentChanged as e:
            self.assignment = Assignment.from_wire(e.assignment)
            raise
        if isinstance(msg, Done):
            self._tree_step = max(self._tree_step, msg.tree_step)
        return msg

    def _stale_error(self, what: str) -> StaleReplica:
        return StaleReplica(
            f"{what} refused: {self._stale}, so its parameters may not be the job's and "
            f"its gradient would corrupt every replica. Take the job's state first: "
            f"state, after = c.request_state(like) (the job's other processes answer "
            f"state_wanted() with send_state at a step boundary), then go on at step "
            f"after + 1; or, if its parameters are the job's, say so: c.mark_current()")

    def _ask(self, msg: Message | None) -> None:
        """Send a request (None: wait for one already made). Answers come in order, so
        while another coroutine of this process waits for one, a second asker would take
        its answer: refused instead."""
        if self._replies.waiting:
            raise RuntimeError("a crnet client makes one request at a time (another "
                               "coroutine of this process is waiting for crnetd's answer)")
        if msg is not None:
            self._conn.send(msg)

    async def _hand_over(self, region: SharedRegion) -> None:
        """The region's descriptor to the daemon, on a connection of its own (SCM_RIGHTS:
        a stream transport cannot carry it); the answer comes on the control connection."""
        assert region.fd is not None
        loop = asyncio.get_running_loop()
        frame = b"".join(bytes(part) for part in Attach(self._token, region.capacity).frame())
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.setblocking(False)
            try:
                await loop.sock_connect(s, self.path)
                socket.send_fds(s, [frame], [region.fd])   # a few bytes: taken at once
            except OSError as e:
                raise DaemonNotRunning(f"cannot hand shared memory to crnetd at {self.path}: "
                                       f"{e.strerror or e}") from None

    async def _ensure(self, nbytes: int) -> SharedRegion:
        """Shared memory of at least ``nbytes`` per half, mapped by the daemon."""
        if self._region is not None and self._region.capacity >= nbytes:
            return self._region
        self._ask(None)          # its answer comes on the control connection
        region = SharedRegion.create(max(nbytes, 1 << 16))
        try:
            await self._hand_over(region)
            await self._reply(Attached, 30.0, "shared memory")
        finally:
            region.close_fd()  # both sides have it mapped: nothing to leak if either dies
        self._region, self._progress = region, region.progress
        return region
