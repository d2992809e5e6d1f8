"""The protocol side of a client: the daemon's answers, in order, one request at a time,
and the watches on steps (DECIDED). A ``transport.Handler``; no request logic."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TypeVar

from ..errors import (
    AssignmentChanged,
    CrnetError,
    CrnetTimeout,
    DaemonNotRunning,
    InternalError,
    ProtocolError,
)
from ..protocol.messages import ClientError, ClientWelcome, Decided, Message

__all__ = ["REPLY_MARGIN", "M", "Replies"]

log = logging.getLogger("crnet.client")

M = TypeVar("M", bound=Message)

REPLY_MARGIN = 5.0   # seconds a request may take beyond the daemon's own bound (the trip)


class Replies:
    """The protocol side of a client (a ``transport.Handler``): the daemon's messages, in order."""

    def __init__(self, path: str):
        self.path = path
        # The daemon's answers in order (None: the connection is gone), and the one
        # request waiting for the next (a client asks one thing at a time). Not an
        # asyncio.Queue under wait_for: that costs two tasks per answer, a fifth of a
        # small allreduce's CPU.
        self._answers: collections.deque[Message | None] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._watches: dict[int, asyncio.Future[None]] = {}   # step -> DECIDED came
        # The bug on this side (in reading or handling the daemon's messages) that closed
        # the connection: every request then raises it, not DaemonNotRunning.
        self.failure: Exception | None = None
        self.gone = False   # the daemon closed the connection (it died, or restarts)

    def watch(self, step: int) -> tuple[asyncio.Future[None], bool]:
        """The future DECIDED for ``step`` resolves, and whether it is new (to ask for)."""
        fut = self._watches.get(step)
        if fut is not None:
            return fut, False
        fut = self._watches[step] = asyncio.get_running_loop().create_future()
        return fut, True

    async def next(self, kind: type[M], timeout: float | None, what: str,
                   late: Callable[[Message], bool] | None = None) -> M:
        """The daemon's next message, which must be a ``kind``; an ERROR raises its exception.
        Messages ``late`` takes (answers to requests given up on) are passed over."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if not self._answers:
                await self._arrival(None if deadline is None else max(0.0, deadline - loop.time()),
                                    what, timeout)
            msg = self._answers.popleft()
            if msg is None or late is None or not late(msg):
                break
        if msg is None:
            self._answers.appendleft(None)  # every later call fails the same way
            raise self._gone()
        if isinstance(msg, ClientError):
            raise msg.exception()
        if isinstance(msg, ClientWelcome) and kind is not ClientWelcome:
            raise AssignmentChanged("the tree re-assigned this host a different share of the "
                                    "data (the new one is in Client.assignment)", msg.assignment)
        if not isinstance(msg, kind):
            raise ProtocolError(f"crnetd answered {msg.TYPE.name} to a request for {what}")
        return msg

    async def _arrival(self, timeout: float | None, what: str, bound: float | None) -> None:
        """Wait until an answer is in ``_answers``, at most ``timeout`` seconds (of the
        request's ``bound``, which the error names)."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = None if timeout is None else loop.call_later(timeout, time_out, waiter)
        try:
            await waiter
        except asyncio.TimeoutError:
            raise CrnetTimeout(f"no answer from crnetd for {what} within {bound} s") from None
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    @property
    def waiting(self) -> bool:
        """A request is waiting for its answer."""
        return self._waiter is not None

    def _answer(self, msg: Message | None) -> None:
        self._answers.append(msg)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def payload_dest(self, conn, msg, nbytes):
        raise ProtocolError(f"unexpected payload on {msg.TYPE.name} from crnetd")

    def received(self, conn, msg, payload):
        if isinstance(msg, Decided):   # not an answer to a request: a watch came true
            fut = self._watches.pop(msg.step, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        self._answer(msg)

    def lost(self, conn, exc):
        if conn.failure is not None:
            self.failure = conn.failure
            log.error("crnet bug: the client failed handling crnetd's answers (not a daemon "
                      "problem); its connection to %s is closed", self.path, exc_info=self.failure)
        self.gone = self.failure is None
        self._answer(None)
        for fut in self._watches.values():
            if not fut.done():
                fut.set_exception(self._gone())
        self._watches.clear()

    def _gone(self) -> CrnetError:
        """Why the connection is gone: a bug here (chained: its traceback is the cause), or
        the daemon went away."""
        if self.failure is None:
            return DaemonNotRunning(f"crnetd at {self.path} closed the connection")
        err = InternalError(f"crnet bug: the client failed handling crnetd's answers "
                            f"({type(self.failure).__name__}: {self.failure}); crnetd at "
                            f"{self.path} is not at fault")
        err.__cause__ = self.failure
        return err


def time_out(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError())
