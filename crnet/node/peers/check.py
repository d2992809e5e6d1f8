"""Confirming the rank a spread peer link claims, over this host's own link to that rank.

Whoever holds the cluster secret can dial a host and say (PEER_HELLO) it is any rank: the
handshake proves the secret, not the rank. In spread every host dials every other one at
the address the tree gave for it (``mesh.py``), so host B has a link of its own to rank R's
real address, and R knows which links it dialed. When a link that says it is R dials B:

1. B welcomes it (PEER_WELCOME: at once, or each direction's link would wait for the
   other's) but takes nothing from it: until it is confirmed it may only ask questions
   (``links/child.py``, UNCONFIRMED), and its dialer sends nothing else (``links/peer.py``);
2. B asks R over its own link there: PEER_CHECK(the id the link said in its PEER_HELLO).
   R answers on that link: PEER_CHECKED(id, ok), ok if the id is that of its newest link
   to B. A yes or no about 16 random bytes the asker gave tells the asker nothing;
3. ok: B confirms the link to its dialer (PEER_CONFIRMED) and takes its pieces as R's; the
   dialer's link counts as up only then (``dial.keep_connected``'s ``up``). Not ok, or no
   answer within ``PEER_CHECK_TIMEOUT`` (waiting for B's own link to R too, if it is still
   being dialed): B closes the link with a warning, and its dialer dials again.

A question asked on a link to R that closed before it was answered is asked again on the
next one. Without a secret there is nothing to check (anyone may claim any rank). rar's
successor has no link of its own to its predecessor to ask over: it dials one for as long
as a link that claims that rank is checked (``mesh.py``), which its predecessor welcomes
and checks as any other, but which may only ask.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from ... import defaults
from ...peer_text import Throttle
from ...protocol.messages import LINK_ID_BYTES, PeerCheck, PeerChecked
from ...protocol.transport import Connection

log = logging.getLogger("crnet.node")

__all__ = ["OutboundPeer", "PeerChecks"]

# A link that asks (PEER_CHECK) and leaves this much of the answers unread is cut off: an
# honest host asks once per link it is dialed on.
ANSWERS_QUEUED = 64 << 10


@dataclass(eq=False)
class _Check:
    """An accepted link whose rank is not confirmed yet."""

    conn: Connection
    rank: int
    link_id: bytes
    confirmed: Callable[[], None]
    timer: asyncio.TimerHandle | None = None
    asked_on: Connection | None = None      # this node's link to ``rank`` it was asked on


class PeerChecks:
    """This node's side of the checks: the ids of the links it dialed (it answers for
    them), and the accepted links it is confirming."""

    def __init__(self, timeout: float = defaults.PEER_CHECK_TIMEOUT, warnings: Throttle | None = None):
        self.timeout = timeout
        self._warnings = warnings or Throttle(log)
        self._ids: dict[int, bytes] = {}               # rank -> the id of this node's newest link to it
        self._asking: dict[int, Connection] = {}       # rank -> this node's welcomed link to it
        self._checks: dict[Connection, _Check] = {}    # accepted links, not yet confirmed
        self._settled: dict[int, list[asyncio.Future[None]]] = {}   # rank -> who waits (``settled``)

    # -- the links this node dials
    def new_link(self, rank: int) -> bytes:
        """The id of a new link to ``rank`` (its PEER_HELLO's); the one this node answers for."""
        link_id = self._ids[rank] = secrets.token_bytes(LINK_ID_BYTES)
        return link_id

    def to(self, rank: int) -> OutboundPeer:
        return OutboundPeer(self, rank)

    def welcomed(self, rank: int, conn: Connection) -> None:
        """This node's link to ``rank`` was welcomed there: the checks of links that claim
        ``rank`` are asked on it (again, if they were asked on one that closed)."""
        self._asking[rank] = conn
        for check in list(self._checks.values()):
            if check.rank == rank and check.asked_on is not conn:
                self._ask(check, conn)

    def gone(self, rank: int, conn: Connection) -> None:
        if self._asking.get(rank) is conn:
            del self._asking[rank]
        for check in self._checks.values():
            if check.asked_on is conn:   # its answer will not come: asked again on the next link
                check.asked_on = None

    def answered(self, rank: int, msg: PeerChecked) -> None:
        """``rank`` answered a check on this node's link to it (a late answer is moot)."""
        for check in self._checks.values():
            if check.rank == rank and hmac.compare_digest(check.link_id, msg.link_id):
                self._done(check, msg.ok, "it says that is not its link")
                return

    def answer(self, conn: Connection, rank: int, msg: PeerCheck) -> None:
        """A host asks, on the link it dialed here as ``rank``, whether a link that claims
        this node's rank is this node's newest link to it."""
        if conn.write_buffer_size > ANSWERS_QUEUED:
            conn.abort(f"it asks (PEER_CHECK) and leaves {conn.write_buffer_size} bytes of "
                       "answers unread")
            return
        mine = self._ids.get(rank)
        conn.send(PeerChecked(msg.link_id, mine is not None and hmac.compare_digest(mine, msg.link_id)))

    # -- the links this node accepts
    def check(self, conn: Connection, rank: int, link_id: bytes | None,
              confirmed: Callable[[], None]) -> None:
        """Confirm that ``conn`` is ``rank``'s link (its PEER_HELLO said ``link_id``):
        ``confirmed()`` once ``rank`` says so; otherwise ``conn`` is closed."""
        if link_id is None:
            self._refused(conn, rank, "its PEER_HELLO has no link id to ask about")
            return
        loop = asyncio.get_running_loop()
        check = _Check(conn, rank, link_id, confirmed)
        check.timer = loop.call_later(self.timeout, self._expired, check)
        self._checks[conn] = check
        asking = self._asking.get(rank)
        if asking is not None:
            self._ask(check, asking)

    def pending(self, rank: int) -> int:
        """Links that claim ``rank`` and are being checked."""
        return sum(check.rank == rank for check in self._checks.values())

    def settled(self, rank: int) -> asyncio.Future[None]:
        """Done once no link that claims ``rank`` is being checked."""
        done = asyncio.get_running_loop().create_future()
        if self.pending(rank):
            self._settled.setdefault(rank, []).append(done)
        else:
            done.set_result(None)
        return done

    def dropped(self, conn: Connection) -> None:
        """An accepted link closed before its check ended (or its check ended)."""
        check = self._checks.pop(conn, None)
        if check is None:
            return
        if check.timer is not None:
            check.timer.cancel()
        if not self.pending(check.rank):
            for done in self._settled.pop(check.rank, []):
                if not done.done():
                    done.set_result(None)

    def close(self) -> None:
        for conn in list(self._checks):
            self.dropped(conn)

    def _ask(self, check: _Check, conn: Connection) -> None:
        check.asked_on = conn if conn.send(PeerCheck(check.link_id)) else None

    def _expired(self, check: _Check) -> None:
        if self._checks.get(check.conn) is check:
            self._done(check, False, f"no answer in {self.timeout:g} s" + (
                "" if check.asked_on is not None else "; this host's link to it is not up"))

    def _done(self, check: _Check, ok: bool, why: str) -> None:
        self.dropped(check.conn)
        if ok:
            check.confirmed()
        else:
            self._refused(check.conn, check.rank, why)

    def _refused(self, conn: Connection, rank: int, why: str) -> None:
        self._warnings.warning((conn.label.rpartition(":")[0], "unconfirmed", rank),
                               "a peer link from %s says it is rank %d, which did not confirm it "
                               "(%s): closed", conn.label, rank, why)
        conn.close()


@dataclass(frozen=True)
class OutboundPeer:
    """This node's link to peer ``rank``, as its ``PeerLink`` reports it: welcomed (checks
    may be asked on it), gone, and the answers to them."""

    checks: PeerChecks
    rank: int

    def welcomed(self, conn: Connection) -> None:
        self.checks.welcomed(self.rank, conn)

    def gone(self, conn: Connection) -> None:
        self.checks.gone(self.rank, conn)

    def answered(self, msg: PeerChecked) -> None:
        self.checks.answered(self.rank, msg)
