"""The accepted connections still in their handshake: how many, from whom, for how long.

Anyone who can reach a listener can open connections and say nothing; whatever such a
stranger does, the tree's own hosts must still get in (joins, reconnects, ``crnet
status``), and so must scrapers on the metrics port. So every accepted connection
enters the ``Doorway`` before anything else (under TLS, before its handshake too:
``tls_door.py``) and leaves it once through its handshake (``guard.Accepting``) or its
request (``node/observe/metrics.py``); until then:

- it has ``deadline`` seconds from its TCP accept to get through;
- at most ``per_address`` are in from one address: a newcomer beyond that is refused
  (its own address's earlier ones are still under way);
- the tree's own hosts have a reserve strangers cannot take: an address that proved it
  holds the cluster secret here before (``know``: a child, a ring or spread peer, an
  operator's ``crnet status``) has ``reserve`` places of its own, so a reconnect gets in
  whatever strangers hold;
- when the pool a newcomer goes to is full (``total`` strangers), the oldest connection
  of the *group* that weighs the most is closed to make room, unless the newcomer's group
  weighs as much: a few addresses that fill the pool cannot keep anyone else out. A
  group's weight is the connections it holds plus those it opened lately (each counts 1
  when it comes, halving every ``ARRIVALS_HALF_LIFE`` s). Held connections alone were not
  enough: with 100 addresses at their cap, every group held as much as a scraper's one
  connection, and the oldest went first, so a scrape (or a joiner's handshake) that took
  longer than the flood took to bring in as many connections as the pool holds was cut
  (issue 39 row 8: 15 of 59 scrapes failed). A flood's groups open many connections, a
  scraper or a joiner one now and then. A group is one IPv4 address, or an IPv6
  /64 (one host may hold all of a /64: counted per address, it could hold the pool with
  64 addresses; per /64 it is one group among others).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from ... import defaults
from ...peer_text import Throttle
from ...protocol.transport import address_group

log = logging.getLogger("crnet.node")

__all__ = ["Doorway", "Visitor"]

ARRIVALS_HALF_LIFE = 10.0     # seconds: how fast a group's recent connections stop weighing
ARRIVALS_KEPT = 4096          # groups whose recent connections are remembered (the newest)


class Visitor(Protocol):
    """A connection in the doorway (``transport.Connection``, ``tls_door.TlsDoor``, a
    scrape): closed with ``abort`` when its time is up or room is made."""

    label: str

    def abort(self, reason: str) -> None: ...


@dataclass
class _Entry:
    host: str
    group: str
    known: bool                       # in the reserve of addresses that proved the secret
    timer: asyncio.TimerHandle


class Doorway:
    """Accepted connections until they are through their handshake (the module docstring):
    ``total`` strangers and ``reserve`` more from known addresses, ``per_address`` from one
    address, ``deadline`` seconds each."""

    def __init__(self, total: int = defaults.MAX_HANDSHAKES,
                 per_address: int = defaults.MAX_HANDSHAKES_PER_ADDRESS,
                 deadline: float = defaults.HANDSHAKE_DEADLINE,
                 reserve: int = defaults.MAX_HANDSHAKES_KNOWN,
                 awaited: str = "hello and authentication"):
        self.total, self.per_address, self.deadline = total, per_address, deadline
        self.reserve = reserve
        self.awaited = awaited             # what a connection must get through, for the log
        self._pending: dict[Visitor, _Entry] = {}       # in order of arrival
        self._known: OrderedDict[str, None] = OrderedDict()   # most recently proved last
        # group -> (its recent connections, decayed to when: ``_arrived``), newest last
        self._arrivals: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._warnings = Throttle(log)     # a flood is one line per 10 s, not one per try

    def enter(self, visitor: Visitor, host: str | None = None) -> bool:
        """Let ``visitor`` (from ``host``; by default its label's address) in, making room
        if need be; False if it must be closed. True at once for one already in (handed
        over from its TLS handshake: ``hand_over``)."""
        if visitor in self._pending:
            return True
        host = _address(visitor.label) if host is None else host
        group = address_group(host)
        self._arrived(group)
        same = sum(1 for e in self._pending.values() if e.host == host)
        if same >= self.per_address:
            self._refusing("refusing connections: %d handshakes under way from %s",
                           same, host)
            return False
        known = host in self._known and self._count(True) < self.reserve
        if not known and self._count(False) >= self.total and not self._make_room(group):
            self._refusing("refusing connections: %d handshakes under way (%d from %s)",
                           len(self._pending), same, host)
            return False
        timer = asyncio.get_running_loop().call_later(self.deadline, self._expire, visitor)
        self._pending[visitor] = _Entry(host, group, known, timer)
        return True

    def leave(self, visitor: Visitor) -> None:
        entry = self._pending.pop(visitor, None)
        if entry is not None:
            entry.timer.cancel()

    def hand_over(self, old: Visitor, new: Visitor) -> None:
        """``new`` takes ``old``'s place and what is left of its deadline (a connection
        through its TLS handshake: its protocol from now on)."""
        entry = self._pending.pop(old, None)
        if entry is None:
            return
        entry.timer.cancel()
        entry.timer = asyncio.get_running_loop().call_at(entry.timer.when(), self._expire, new)
        self._pending[new] = entry

    def know(self, host: str) -> None:
        """``host`` proved it holds the cluster secret: its connections get the reserve."""
        self._known.pop(host, None)
        self._known[host] = None
        while len(self._known) > defaults.MAX_KNOWN_ADDRESSES:
            self._known.popitem(last=False)

    def _count(self, known: bool) -> int:
        return sum(1 for e in self._pending.values() if e.known == known)

    def _arrived(self, group: str) -> None:
        now = time.monotonic()
        self._arrivals[group] = (self._recent(group, now) + 1.0, now)
        self._arrivals.move_to_end(group)
        while len(self._arrivals) > ARRIVALS_KEPT:
            self._arrivals.popitem(last=False)

    def _recent(self, group: str, now: float) -> float:
        """``group``'s connections of late, each weighing less the older it is."""
        count, at = self._arrivals.get(group, (0.0, now))
        return count * 0.5 ** ((now - at) / ARRIVALS_HALF_LIFE)

    def _make_room(self, group: str) -> bool:
        """Close the oldest stranger of the group that weighs the most (the strangers it
        holds, and the connections it opened lately), if that is more than ``group``
        weighs; True if room was made."""
        sizes: dict[str, int] = {}
        for e in self._pending.values():
            if not e.known:
                sizes[e.group] = sizes.get(e.group, 0) + 1
        now = time.monotonic()
        # (Rounded: groups that came within a few ms of each other weigh the same, and
        # the one whose connection is the oldest goes first.)
        weight = {g: round(n + self._recent(g, now), 2) for g, n in sizes.items()}
        biggest = max(weight, key=weight.__getitem__, default=None)
        if biggest is None or weight[biggest] <= round(sizes.get(group, 0)
                                                       + self._recent(group, now), 2):
            return False
        oldest = next(v for v, e in self._pending.items() if not e.known and e.group == biggest)
        self._refusing("%d connections in their handshake, %d of them from %s: closing its "
                       "oldest to let one in", len(self._pending), sizes[biggest], biggest)
        self.leave(oldest)
        oldest.abort("made room for a newer connection: too many in their handshake")
        return True

    def _refusing(self, msg: str, *args: object) -> None:
        self._warnings.warning("flood", msg, *args)

    def _expire(self, visitor: Visitor) -> None:
        self._pending.pop(visitor, None)
        visitor.abort(f"no {self.awaited} within {self.deadline:g} s")

    def __len__(self) -> int:
        return len(self._pending)


def _address(label: str) -> str:
    return label.rpartition(":")[0]

