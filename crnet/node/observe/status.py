"""``crnet status``, the daemon's side: this node's subtree, as it stands now.

Asked on ``--listen`` by ``crnet status`` (a STATUS_HELLO, through the same handshake
as every tree link: ``node/admission/guard.py``, role "status"), or by its parent down the tree link
(STATUS). The node answers with its own entry and, for each child slot, that child's
answer to the same question, asked down the existing tree links with a shorter
deadline: nothing is sent while nobody asks, and a child that does not answer in time
is shown as "silent" instead of holding the answer up.

What a parent adds to each child's entry, from its own view: the child's host id
and address (where it listens, or connected from), and how often it straggled (of
the last ``RECENT_STEPS`` steps decoded here, how many without it). A child's answer
is checked like any child message: its names must be its own subtree's, no more
nodes than that subtree holds (``check_subtree``). An empty slot is "missing"; the
nodes under it are "unreachable" from here (they are reconnecting to it).

A request with ``probe`` (``crnet tune --probe``) has each node time its links and a
compute kernel first (``probe.py``, which says who may start one), taking at most
``PROBE_SHARE`` of its deadline, and then ask its children with what is left.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ...coding.plan import Tree
from ...errors import ProtocolError
from ...measure.stats import Stats
from ...protocol.messages import ProbeEcho, Refuse, StatusReply, StatusRequest
from ...protocol.status_tree import DEADLINE
from ...protocol.transport import Connection
from ...schemes.base import Place
from ..join.dial import supervised
from ..neighbours import ChildSlot
from .probe import Prober

log = logging.getLogger("crnet.node")

CHILD_SHARE = 0.7       # a child gets this share of its parent's deadline
PROBE_SHARE = 0.3       # a node's own probe takes at most this share of its deadline
# crnet status connections a node holds at once (``watching``): each costs two descriptors
# (the socket, and its duplicate for the receive low-water mark), and a client that holds
# the secret could otherwise open them until training processes could not attach.
MAX_WATCHERS = 32


@dataclass(frozen=True)
class StatusView:
    """What the answer reads of this node, at the moment it is asked (``lifecycle.Node``
    builds it from membership, the engine and the neighbours): read-only."""

    place: Callable[[], Place | None]
    assigned: Callable[[], bool]                 # it holds its share (JoinState.ASSIGNED)
    listen_address: Callable[[], str | None]
    parent_up: Callable[[], bool]
    slots: Callable[[], list[ChildSlot]]
    tree_step: Callable[[], int]
    stats: Stats
    host_id: str | None = None
    measured: Callable[[int], dict] | None = None   # its measured section (node/measure.py)
    prober: Prober | None = None                   # crnet tune --probe (node/probe.py)


class StatusService:
    def __init__(self, view: StatusView):
        self.view = view
        self._ids = itertools.count(1)
        self._pending: dict[tuple[int, int], asyncio.Future[dict]] = {}   # (id, slot)
        self._busy: set[Connection] = set()   # connections whose question is being answered
        self._probes: dict[int, asyncio.Future[None]] = {}   # slot -> is its link alive?
        self._watchers: dict[Connection, float] = {}   # crnet status -> when it last asked

    def watching(self, conn: Connection) -> None:
        """``conn`` is a crnet status connection now (authenticated, if the tree is): kept
        with up to ``MAX_WATCHERS - 1`` others; past that the one that asked least recently
        is closed (a ``--watch`` asks every few seconds; a connection left idle is the one
        to go), so that a new one always gets its answer."""
        for gone in [c for c in self._watchers if c.is_closing]:
            del self._watchers[gone]
        if len(self._watchers) >= MAX_WATCHERS:
            idle = min(self._watchers, key=self._watchers.__getitem__)
            del self._watchers[idle]
            idle.abort(f"more than {MAX_WATCHERS} crnet status connections: the one idle "
                       "longest is closed")
        self._watchers[conn] = asyncio.get_running_loop().time()

    # ---------------------------------------------------------------- asked
    def asked(self, conn: Connection, request_id: int, deadline: float = DEADLINE,
              measured: int = 0, probe: int = 0, client: bool = False) -> None:
        """``conn`` (crnet status, ``client``, or the parent) asks: it gets a STATUS_REPLY
        (with every node's measured section if ``measured``, probed first if ``probe``).
        One question per connection at a time: another one while it is answered is
        dropped. A probe a status client may not start is refused (REFUSE, saying why);
        one the parent asks for while another runs here is left out of the answer."""
        if conn in self._busy:
            return
        if conn in self._watchers:
            self._watchers[conn] = asyncio.get_running_loop().time()
        prober = self.view.prober
        if probe:
            why = "this node runs no probe" if prober is None else prober.claim(client)
            if why is not None and client:
                conn.send(Refuse(why))
                return
            probe = 0 if why is not None else probe
        self._busy.add(conn)

        async def answer() -> None:
            try:
                conn.send(StatusReply(request_id, await self.subtree(deadline, measured, probe)))
            finally:
                self._busy.discard(conn)
                if probe and prober is not None:
                    prober.release()
        supervised(answer(), "status")

    def probe_echoed(self, k: int, msg: ProbeEcho) -> None:
        if self.view.prober is not None:
            self.view.prober.echoed(k, msg)

    def probe(self, k: int, conn: Connection, within: float, dead: Callable[[], None]) -> None:
        """Is child ``k``'s link ``conn`` alive? It is asked for its status (its own entry
        only: deadline 0); any answer from it will do (it may be answering another
        question); ``dead()`` if none comes within ``within`` seconds."""
        if k in self._probes:
            return
        request_id = next(self._ids)
        answer = self._probes[k] = asyncio.get_running_loop().create_future()

        async def wait() -> None:
            try:
                if conn.send(StatusRequest(request_id, 0.0)):
                    await asyncio.wait_for(answer, within)
                    return
            except asyncio.TimeoutError:
                pass
            finally:
                del self._probes[k]
            dead()
        supervised(wait(), "liveness check")

    def child_reply(self, k: int, msg: StatusReply) -> None:
        probe = self._probes.get(k)
        if probe is not None and not probe.done():
            probe.set_result(None)               # it answers: alive
        waiting = self._pending.get((msg.id, k))
        if waiting is None or waiting.done():
            return                               # late, or never asked: moot
        place = self.view.place()
        assert place is not None
        child = place.tree.children(place.name)[k]
        check_subtree(place.tree, child, msg.node)   # ProtocolError: that link closes
        waiting.set_result(msg.node)

    # ---------------------------------------------------------------- the answer
    def own(self, measured: int = 0) -> dict:
        """This node's entry, without its children (with its measured section, its windows
        cut to ``measured`` steps, unless that is 0)."""
        v = self.view
        place = v.place()
        if place is None or not v.assigned():
            state = "joining"
        elif not place.is_master and not v.parent_up():
            state = "reconnecting"
        else:
            state = "joined"
        return {"name": "" if place is None else place.name, "host": v.host_id,
                "address": v.listen_address(), "state": state, "tree_step": v.tree_step(),
                "steps_done": v.stats.steps_done,
                "last_step_seconds": v.stats.times.step_seconds.last,
                "straggled": None, "recent": None, "children": [],
                "measured": v.measured(measured) if measured and v.measured is not None else None}

    async def subtree(self, deadline: float, measured: int = 0, probe: int = 0) -> dict:
        """This node's entry with every child slot's (asked within ``deadline``); probed
        first if ``probe`` (claimed by the caller: ``Prober.claim``)."""
        probed = None
        if probe and self.view.prober is not None:
            loop = asyncio.get_running_loop()
            started = loop.time()
            probed = await self.view.prober.run(probe, deadline * PROBE_SHARE)
            deadline = max(0.0, deadline - (loop.time() - started))
            measured = measured or 1
        entry = self.own(measured)
        if probed is not None and entry["measured"] is not None:
            entry["measured"]["probe"] = probed
        place = self.view.place()
        slots = self.view.slots()
        if place is None or not slots:
            return entry
        names = place.tree.children(place.name)
        request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        asked: dict[int, asyncio.Future[dict]] = {}
        for k, slot in enumerate(slots):
            if slot.link is not None and slot.link.send(
                    StatusRequest(request_id, deadline * CHILD_SHARE, measured, probe)):
                asked[k] = self._pending[(request_id, k)] = loop.create_future()
        try:
            if asked:
                await asyncio.wait(asked.values(), timeout=deadline)
        finally:
            for k in asked:
                self._pending.pop((request_id, k), None)
        stats = self.view.stats
        for k, slot in enumerate(slots):
            got = asked.get(k)
            if got is not None and got.done() and not got.cancelled():
                child = got.result()
            elif slot.link is not None:
                child = _placeholder(place.tree, names[k], "silent", children=False)
            else:
                child = _placeholder(place.tree, names[k], "missing")
            child["host"] = child["host"] or slot.host
            child["address"] = child["address"] or slot.address or slot.peer
            record = stats.times.children.get(k)
            if record is not None:
                child["straggled"], child["recent"] = sum(record.recent), len(record.recent)
            entry["children"].append(child)
        return entry


def _placeholder(tree: Tree, name: str, state: str, children: bool = True) -> dict:
    """A node this one knows only by its place: ``state``; its subtree unreachable."""
    below = [_placeholder(tree, c, "unreachable") for c in tree.children(name)] if children else []
    return {"name": name, "host": None, "address": None, "state": state, "tree_step": -1,
            "steps_done": 0, "last_step_seconds": None, "straggled": None, "recent": None,
            "measured": None, "children": below}


def check_subtree(tree: Tree, name: str, entry: dict) -> None:
    """A child's answer names its own subtree's nodes, each in its place, once."""
    if entry["name"] != name:
        raise ProtocolError(f"STATUS_REPLY: child {name} answered as {entry['name']!r}")
    allowed = tree.children(name)
    seen = [c["name"] for c in entry["children"]]
    if len(set(seen)) != len(seen) or not set(seen) <= set(allowed):
        raise ProtocolError(f"STATUS_REPLY: child {name} names children {seen[:8]!r}, but its "
                            f"children are {allowed[:8]!r}")
    for child in entry["children"]:
        check_subtree(tree, child["name"], child)
