"""What a training process does with the rest of its job: broadcasts (PUBLISH, RECEIVE,
WANT_STATE and the state requests it is told of) and barriers. ``ClientLink`` hands
it those messages; ``close`` takes back all it waits for when the process leaves.

A broadcast whose processes do not name the root's rank (``root=True``/``False``) waits
for their vote (``node/collectives/barriers.py``): the receivers, and the root once its copy is on its way,
arrive at ``vote_key(key)``, and each receiver then takes the copy of the host the vote
names, never merely the first copy to reach the master."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from ...dtypes import DTYPES
from ...errors import ErrorKind
from ...peer_text import shown
from ...protocol.messages import Barrier, Delivered, Publish, Receive, WantState, vote_key
from ..collectives.barriers import Barriers, Roots
from ..collectives.broadcasts import STATE, Broadcasts, Held
from ..local import Process
from .client_steps import ClientSteps

log = logging.getLogger("crnet.node")


def _nothing() -> None:
    """Stops waiting for nothing."""


def _ignore(roots: Roots) -> None:
    """The root's vote is released: it has nothing to wait for."""


class ClientGroup:
    def __init__(self, process: Process, broadcasts: Broadcasts, barriers: Barriers,
                 per_host: int = 1, answered: Callable[[], None] = _nothing,
                 steps: ClientSteps | None = None):
        self.process = process
        self.answered = answered            # it has a broadcast it waited for (crnet tune)
        self.steps = steps                  # its steps: which results are kept for it
        self.per_host = per_host            # processes on every host: ranks go host by host
        self.broadcasts = broadcasts
        self.barriers = barriers
        self.receiving: tuple[str, int, np.dtype] | None = None  # broadcast key, length, dtype
        self._stop_receiving: Callable[[], None] = _nothing
        self._leave: set[Callable[[], None]] = set()   # one per barrier it waits at
        self._stop_state_requests: Callable[[], None] = _nothing

    def start(self) -> None:
        """The process is attached: it hears of state requests (in its shared memory)."""
        self._stop_state_requests = self.broadcasts.states.on_state_request.connect(self._state_request)

    def close(self) -> None:
        """The process left: it waits for nothing any more."""
        self._stop_state_requests()
        self._stop_receiving()
        self.broadcasts.states.left(self.process)
        for leave in list(self._leave):
            leave()
        self._leave.clear()

    # ---------------------------------------------------------------- broadcasts
    def publish(self, msg: Publish) -> None:
        if self.process.job_over():
            return
        vector = self.process.vector(msg.length, DTYPES[msg.dtype], "input")
        conn = self.process.conn
        if vector is None or conn is None:
            return
        if msg.key.startswith(STATE) and not self.broadcasts.states.may_answer(self.process):
            log.info("state answer %s of a training process here left out: it names no job, "
                     "and the tree runs one by name", shown(msg.key))
            conn.send(Delivered(msg.key, msg.step))
            return
        vote = None if msg.vote is None else self._vote(msg.key, msg.vote)
        problem = "this node has not joined the tree yet" if msg.vote is not None and \
            vote is None else self.broadcasts.publish(msg.key, msg.step, vector)
        if problem:
            self.process.error(f"broadcast {msg.key!r}: {problem}", ErrorKind.REQUEST)
            return
        if vote and self.barriers.decided(*vote) is None:
            # As the root: the vote names this host. It counts even if the process leaves
            # before the vote fills: its copy is already on its way up.
            self.barriers.arrive(*vote, release=_ignore, root=True)
        conn.send(Delivered(msg.key, msg.step))

    def receive(self, msg: Receive) -> None:
        if self.process.job_over():
            return
        self._stop_receiving()                        # a request it gave up on
        self._stop_receiving = _nothing
        if msg.root is not None:
            root = self.broadcasts.host_of(msg.root, self.per_host)
            if root is None:
                self.process.error(f"broadcast {msg.key!r}: no process of the tree has rank "
                                   f"{msg.root}", ErrorKind.REQUEST)
                return
            self._take(msg, root)
        elif msg.key.startswith(STATE):
            self._take(msg, None)                     # any process's (state_answers.py)
        else:
            self._await_vote(msg)

    def _take(self, msg: Receive, root: str | None) -> None:
        """Wait for host ``root``'s copy of the broadcast (None: a state answer)."""
        self.receiving = (msg.key, msg.length, DTYPES[msg.dtype])
        self._stop_receiving = self.broadcasts.receive(msg.key, root, self._delivered)

    def _vote(self, key: str, processes: int) -> tuple[str, int] | None:
        """Vote ``key`` of ``processes`` (0: every process of the tree); None before this
        node has joined the tree."""
        if not processes:
            processes = self.broadcasts.tree_processes(self.per_host)
        return (vote_key(key), processes) if processes else None

    def _await_vote(self, msg: Receive) -> None:
        vote = self._vote(msg.key, msg.vote or 0)
        if vote is None:
            self.process.error(f"broadcast {msg.key!r}: this node has not joined the tree yet",
                               ErrorKind.REQUEST)
            return
        roots = self.barriers.decided(*vote)
        if roots is not None:
            self._named(msg, roots)
            return
        released = False

        def release(roots: Roots) -> None:
            nonlocal released
            released = True
            self._named(msg, roots)
        leave = self.barriers.arrive(*vote, release=release)
        if not released:
            self._stop_receiving = leave

    def _named(self, msg: Receive, roots: Roots) -> None:
        """The vote named ``roots``: one is the root, whose copy this process takes."""
        if len(roots) == 1:
            self._take(msg, roots[0])
            return
        why = ("no process sent it with root=True" if not roots else
               "processes on hosts " + " and ".join(repr(r) for r in roots) + " each sent it "
               "with root=True")
        self.process.error(f"broadcast {msg.key!r}: {why}: every process must call it, one "
                           "of them as the root, or all must name the root's rank (root=N)",
                           ErrorKind.MISMATCH)

    def _delivered(self, held: Held) -> None:
        conn = self.process.conn
        if self.receiving is None or conn is None:
            return
        key, length, dtype = self.receiving
        if (held.vector.size, held.vector.dtype) != (length, dtype):
            self.receiving = None
            self.process.error(f"broadcast {key!r} is {held.vector.size} x {held.vector.dtype}; "
                               f"this process expects {length} x {dtype}", ErrorKind.MISMATCH)
            return
        out = self.process.vector(length, dtype, "output")
        self.receiving = None
        if out is not None:
            np.copyto(out, held.vector)
            if key.startswith(STATE):
                self.broadcasts.states.answers.served(self.process)
                if self.steps is not None:
                    self.steps.took_state(held.step)
            conn.send(Delivered(key, held.step))
            self.answered()

    def want_state(self, msg: WantState) -> None:
        if self.steps is not None:
            self.steps.asks_state()
        self.broadcasts.states.want_state(msg.nonce, asker=self.process)

    def _state_request(self, nonce: int) -> None:
        region = self.process.region
        if region is not None:
            region.progress.state_request = nonce

    # ---------------------------------------------------------------- barriers
    def barrier(self, msg: Barrier) -> None:
        if self.process.job_over():
            return
        key = msg.key
        released = False

        def release() -> None:
            nonlocal released
            released = True
            self._leave.discard(leave)
            conn = self.process.conn
            if conn is not None:
                conn.send(Delivered(key, -1))
        leave = _nothing     # released within arrive (the last one there, at the master)
        leave = self.barriers.arrive(key, msg.processes, lambda roots: release())
        if not released:
            self._leave.add(leave)
