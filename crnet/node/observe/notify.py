"""systemd's notify protocol (``sd_notify(3)``): tell the service manager how the node is.

Under a ``Type=notify`` unit systemd puts a Unix datagram socket's address in
``$NOTIFY_SOCKET`` (``@name`` for an abstract one); each datagram is a few
``KEY=VALUE`` lines. Unset (a shell, the tests' local trees), nothing is sent.

``Readiness`` says, for one daemon:

- ``READY=1`` once the node holds its assignment (it has joined, and the master has
  planned the tree: training processes can start), the master once it listens. Until
  then ``systemctl start`` waits, and units ordered after crnetd.service wait too.
- ``STATUS=`` (``systemctl status``) as the join and the steps go, at most about one a
  second: the newest is sent when the second is over, so the last word is never lost.
- ``STOPPING=1`` when the shutdown begins.
- ``WATCHDOG=1`` every half ``$WATCHDOG_USEC`` (``WatchdogSec=`` in the unit), from a
  timer on the event loop: a loop that froze stops the pings, and systemd restarts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ...units import plural

if TYPE_CHECKING:
    from ...measure.stats import Stats
    from ..join.membership import Membership
    from ..steps import StepEngine

log = logging.getLogger("crnet.node")

STATUS_INTERVAL = 1.0    # seconds between STATUS= lines at most


class Notifier:
    """Datagrams to ``$NOTIFY_SOCKET``; every method does nothing when it is unset."""

    def __init__(self, environ: Mapping[str, str] = os.environ):
        address = environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):          # an abstract socket: its name starts with NUL
            address = "\0" + address[1:]
        self.address = address if address[:1] in ("/", "\0") else None
        self.watchdog: float | None = None   # seconds between WATCHDOG=1 pings
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        if self.address and usec.isdigit() and int(usec) > 0 and pid in ("", str(os.getpid())):
            self.watchdog = int(usec) / 2e6
        self._sock: socket.socket | None = None
        self._failed = False

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> None:
        """One datagram of ``KEY=VALUE`` lines. Never raises: systemd going away (or a full
        queue) must not take the daemon with it; the first failure is logged."""
        if self.address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto("\n".join(fields).encode(), self.address)
        except OSError as e:
            if not self._failed:
                self._failed = True
                log.warning("cannot notify systemd at %s: %s", os.environ.get("NOTIFY_SOCKET"), e)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class Readiness:
    """What systemd hears of one daemon: READY, STATUS, STOPPING and the watchdog."""

    def __init__(self, notifier: Notifier, membership: Membership, engine: StepEngine,
                 stats: Stats):
        self.notifier = notifier
        self.membership = membership
        self.engine = engine
        self.stats = stats
        self.ready = False
        self._status_sent = -STATUS_INTERVAL   # monotonic time of the last STATUS=
        self._status_due: asyncio.TimerHandle | None = None
        self._status_pending: str | Callable[[], str] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._skipped = stats.children_skipped  # at the previous step: the difference straggled
        self._stragglers = 0
        if notifier.enabled:
            membership.on_assigned.connect(lambda _: self.assigned())
            membership.on_change.connect(lambda _: self.changed())
            engine.decided.connect(self.decided)

    def start(self) -> None:
        """The daemon starts: the watchdog's pings begin."""
        if self.notifier.watchdog is not None:
            self._ping()
        if not self.membership.place:
            self.status(self._joined_status())

    def listening(self, address: str) -> None:
        """The master listens: it is ready (its workers find it now)."""
        self.ready = True
        self._status_sent = time.monotonic()
        self.notifier.send("READY=1", f"STATUS={self._joined_status()} (listening on {address})")

    def assigned(self) -> None:
        """A node holds its assignment (and the master planned the tree): ready."""
        place = self.membership.place
        assert place is not None
        text = (f"master: all {place.tree.workers} workers joined, running" if place.is_master
                else f"{place.label}: assigned, running")
        if not self.ready:
            self.ready = True
            self._status_sent = time.monotonic()
            self.notifier.send("READY=1", f"STATUS={text}")
        else:
            self.status(text)

    def changed(self) -> None:
        """The join moved on (welcomed, a child came or went, the parent was lost)."""
        self.status(self._joined_status())

    def decided(self, step: int | None) -> None:
        """A step was decided here (or the tree's step learned: ``step`` None)."""
        if step is None or step < self.engine.tree_step:
            return
        skipped = self.stats.children_skipped
        self._stragglers, self._skipped = skipped - self._skipped, skipped
        self.status(lambda: f"{self.membership.label}: step {step}, "
                            f"{plural(self._stragglers, 'straggler')} last step, "
                            f"{self.stats.steps_done} done, {self.stats.steps_failed} failed")

    def stopping(self) -> None:
        if self._status_due is not None:
            self._status_due.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.notifier.send("STOPPING=1", f"STATUS={self.membership.label}: stopping")
        self.notifier.close()

    # ----------------------------------------------------------------------------
    def status(self, text: str | Callable[[], str]) -> None:
        """A STATUS= line, at most one a second: a newer text waits for the second's end.
        Sent from the loop, after the callback that asked for it (``text`` may be a
        function: a step's counters are complete by then)."""
        if not self.notifier.enabled:
            return
        self._status_pending = text
        if self._status_due is None:
            wait = max(0.0, self._status_sent + STATUS_INTERVAL - time.monotonic())
            self._status_due = asyncio.get_running_loop().call_later(wait, self._flush_status)

    def _flush_status(self) -> None:
        self._status_due = None
        text = self._status_pending
        if text is not None:
            self.notifier.send(f"STATUS={text if isinstance(text, str) else text()}")
            self._status_pending = None
            self._status_sent = time.monotonic()

    def _joined_status(self) -> str:
        m = self.membership
        place = m.place
        if place is None:
            return "joining: connecting to the parent"
        if place.is_master:
            joined = sum(s.workers for s in m.neighbours.slots if s.link is not None)
            return f"master: {joined}/{place.tree.workers} workers joined"
        if m.neighbours.parent is None:
            return f"{place.label}: reconnecting to the parent"
        if m.allocation is None:
            return f"joined as {place.name}, waiting for the assignment"
        return f"{place.label}: assigned, running"

    def _ping(self) -> None:
        self.notifier.send("WATCHDOG=1")
        assert self.notifier.watchdog is not None
        self._watchdog = asyncio.get_running_loop().call_later(self.notifier.watchdog, self._ping)

