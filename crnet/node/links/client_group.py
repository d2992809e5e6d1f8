"""What a training process does with the rest of its job: broadcasts (PUBLISH, RECEIVE,
WANT_STATE and the state requests it is told of) and barriers. ``ClientLink`` hands
it those messages; ``close`` takes back all it waits for when the process leaves."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...dtypes import DTYPES
from ...errors import ErrorKind
from ...messages import Barrier, Delivered, Publish, Receive, WantState
from ..barriers import Barriers
from ..broadcasts import STATE, Broadcasts, Held
from .process import Process


def _nothing() -> None:
    """Stops waiting for nothing."""


class ClientGroup:
    def __init__(self, process: Process, broadcasts: Broadcasts, barriers: Barriers,
                 per_host: int = 1, answered: Callable[[], None] = _nothing):
        self.process = process
        self.answered = answered            # it has a broadcast it waited for (crnet tune)
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
        problem = self.broadcasts.publish(msg.key, msg.step, vector)
        if problem:
            self.process.error(f"broadcast {msg.key!r}: {problem}", ErrorKind.REQUEST)
        else:
            conn.send(Delivered(msg.key, msg.step))

    def receive(self, msg: Receive) -> None:
        if self.process.job_over():
            return
        root = None
        if msg.root is not None:
            root = self.broadcasts.host_of(msg.root, self.per_host)
            if root is None:
                self.process.error(f"broadcast {msg.key!r}: no process of the tree has rank "
                                   f"{msg.root}", ErrorKind.REQUEST)
                return
        self.receiving = (msg.key, msg.length, DTYPES[msg.dtype])
        self._stop_receiving()                        # a request it gave up on
        self._stop_receiving = self.broadcasts.receive(msg.key, root, self._delivered)

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
            conn.send(Delivered(key, held.step))
            self.answered()

    def want_state(self, msg: WantState) -> None:
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
        leave = self.barriers.arrive(key, msg.processes, release)
        if not released:
            self._leave.add(leave)
