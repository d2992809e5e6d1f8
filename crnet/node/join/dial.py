"""Stay connected to a peer we dial (the parent, the ring successor): one loop for both.

Connect, say hello, wait for the peer's welcome; while the link is up, nothing to
do; when it drops, say so and try again with exponential backoff. A refusal the
peer marks temporary is retried the same way, and so is a link that is no good (a
``ProtocolError``: a WELCOME this node cannot take, a peer that does not prove it
holds the cluster secret, anything out of place before the welcome): whoever
answers at the peer's address must not be able to stop this node for good. Only a
refusal for good (``JoinRefused`` without ``retry``, which with a cluster secret
only an authenticated peer can send: ``node/admission/guard.py``) ends the loop.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Awaitable, Callable

from ... import defaults
from ...errors import JoinRefused, NotThatHost, ProtocolError
from ...peer_text import Throttle, shown
from ...protocol.messages import Message
from ...protocol.transport import Connection

log = logging.getLogger("crnet.node")

# Opens the TCP connection and sends the hello it is given (authenticated, with a
# cluster secret: node/guard.py); returns the connection and a future that resolves
# when the peer welcomes us (or fails with JoinRefused / ConnectionError).
Dialer = Callable[[Message], Awaitable[tuple[Connection, "asyncio.Future[None]"]]]

WELCOME_TIMEOUT = 30.0


def supervised(coro, name: str) -> asyncio.Task:
    """A task whose unexpected death is reported to the loop's exception handler at
    once (crnetd logs it and, in strict mode, exits), not when it is collected."""
    task = asyncio.create_task(coro, name=name)

    def report(t: asyncio.Task) -> None:
        if not t.cancelled() and t.exception() is not None:
            t.get_loop().call_exception_handler({
                "message": f"task {name} died", "exception": t.exception(), "task": t})

    task.add_done_callback(report)
    return task


async def _welcome(welcomed: asyncio.Future[None]) -> None:
    """Wait for the peer's welcome (or refusal). Not ``asyncio.wait_for``: before Python
    3.12 it swallows a cancellation that arrives as the future completes, and a refusal
    that crossed the daemon's shutdown kept this loop dialing after it was cancelled."""
    try:
        done, _ = await asyncio.wait({welcomed}, timeout=WELCOME_TIMEOUT)
    finally:
        if not welcomed.done():   # given up (or the node stops): how the link ends is moot
            welcomed.add_done_callback(moot)
    if not done:
        raise asyncio.TimeoutError
    welcomed.result()


def moot(welcomed: asyncio.Future[None]) -> None:
    """How a welcome nobody waits for ended is moot: retrieved, so that asyncio does not log it."""
    if not welcomed.cancelled():
        welcomed.exception()   # retrieved: not "Future exception was never retrieved"


async def keep_connected(what: str, dial: Dialer, *, hello: Callable[[], Message],
                         up: Callable[[Connection], None], down: Callable[[str], None],
                         refused: Callable[[JoinRefused], bool | None],
                         failed: Callable[[], None] | None = None,
                         unresolved: tuple[float, Callable[[], None]] | None = None,
                         moved: Callable[[str, str], None] | None = None,
                         backoff: tuple[float, float] = defaults.RECONNECT_BACKOFF) -> None:
    """``failed()``: a dial found nothing listening there, or no route to it (it is tried
    again). Not a connection closed in its handshake: a busy doorway does that to a live
    host (13 spread hosts on one address dial each other at once). A peer whose
    certificate names another host (``NotThatHost``, ``--tls-names``) is ``failed()`` too.
    ``refused(e)`` hears a refusal for good: the loop ends, unless it returns True.
    ``moved(address, name)``: the peer says the tree moved this node there (a refusal
    with ``to``): the next dial goes there, at once.
    ``unresolved``: (seconds, give_up): when the peer's host name has not resolved
    for that long, ``give_up()`` is called and the loop ends (a typo in a name does not
    heal by retrying; a name missing from DNS for a while does, within the bound)."""
    delay = backoff[0]
    warnings = Throttle(log)    # a link that stays bad is a line every few seconds
    unresolved_since: float | None = None
    while True:
        conn = None
        try:
            conn, welcomed = await dial(hello())
            await _welcome(welcomed)
        except socket.gaierror as e:
            now = time.monotonic()
            unresolved_since = now if unresolved_since is None else unresolved_since
            if unresolved is not None and now - unresolved_since >= unresolved[0]:
                log.error("%s: %s for %.0f s: giving up (--resolve-timeout)", what,
                          e.strerror or e, now - unresolved_since)
                unresolved[1]()
                return
            warnings.warning(("unresolved", what), "%s: %s; retrying in %.1f s%s", what,
                             e.strerror or e, delay, "" if unresolved is None else
                             f" (giving up {unresolved[0]:g} s after the first try)")
        except (OSError, asyncio.TimeoutError) as e:
            unresolved_since = None
            log.info("%s not reachable (%s); retrying in %.1f s", what,
                     getattr(e, "strerror", None) or e or "no welcome", delay)
            if failed is not None and _nothing_there(e):
                failed()
        except ProtocolError as e:
            unresolved_since = None
            warnings.warning(("bad", what), "%s: %s; dropped that connection, dialing again "
                             "in %.1f s", what, e, delay)
            if failed is not None and isinstance(e, NotThatHost):
                failed()
        except JoinRefused as e:
            if not e.retry:
                if not refused(e):   # (True: dial on, where it says now)
                    if conn is not None:
                        conn.close()
                    return
            elif e.to is not None and moved is not None:
                log.info("%s: the tree moved this node: it joins %s as %s", what, shown(e.to[0]),
                         shown(e.to[1]))
                moved(*e.to)
                delay = backoff[0]
            else:
                log.info("%s asks to retry: %s", what, shown(e.reason))
        else:
            delay = backoff[0]
            unresolved_since = None
            up(conn)
            await conn.closed
            down(what)
            conn = None
        if conn is not None:
            conn.close()
        await asyncio.sleep(delay)
        delay = min(delay * 2, backoff[1])


def _nothing_there(e: BaseException) -> bool:
    """A dial's failure that says no daemon is there: refused, or no route to the host."""
    return isinstance(e, ConnectionRefusedError) or (
        isinstance(e, OSError) and e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH))
