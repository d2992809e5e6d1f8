"""A node's peer links: the ring successor (rar), or every other host (spread).

A peer is a host this node sends a step's pieces to directly, off the tree. Each peer
link is one-way: this node dials every peer it sends to (``PEER_HELLO`` with its rank,
authenticated and encrypted like a tree link: ``node/admission/guard.py``,
``protocol/tls.py``) and accepts the links of those that send to it. Where peers listen
comes with the assignment:

- rar: the master gives each worker its successor's address (``RingPlace``);
- spread: every node reports where its subtree listens (JOINED's ``peers``, from the
  child slots' addresses, as the parent saw them), so the master knows every host's
  address; ASSIGN carries them by rank (``Tree.names()`` order) down the tree, and a
  child of the master fills in the master's, which it dials as its parent.

A host that restarts at the same address is dialed again (``node/join/dial.py`` reconnects);
one that moved needs the tree to assign anew (a restart of the master). When the tree
takes another shape between jobs (MOVE: ``Membership.move``), every host's links go
(``leave``) and a new ``Mesh`` makes the new place's.

With ``--tls-names`` ASSIGN carries every rank's host id too, and spread's peer links
are taken only between the hosts whose certificates name them (``identity.py``).

With a cluster secret, a peer link's rank is not the dialer's word: the rank's own host
confirms it over this node's link there (``check.py``) before anything that comes on
it counts, and only then (PEER_CONFIRMED) does its dialer send on it. A rar successor does
not dial its predecessor for the ring: to ask, it dials the address the master gave for
the predecessor's rank (``RingPlace.predecessor``) as that predecessor's successor, once
per link to confirm, and hangs up once it is (the predecessor welcomes such a link and
checks it as any other, but takes only questions on it). In a ring of two, each member's
successor is its predecessor: its own ring link is the one it asks over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ...coding.plan import Tree
from ...errors import JoinRefused, NotThatHost, ProtocolError
from ...peer_text import shown
from ...protocol.messages import PeerCheck, PeerConfirmed, PeerHello, PeerWelcome, RingPlace
from ...protocol.transport import Connection
from ...schemes import Place
from ..join.dial import Dialer, keep_connected, moot, supervised
from ..neighbours import ChildSlot, Neighbours
from .check import OutboundPeer, PeerChecks
from .identity import accepted_named
from .liveness import Liveness

log = logging.getLogger("crnet.node")

__all__ = ["Mesh", "PeerDialer"]

# Dials a peer at an address (None: the parent's, the master's); its link reports to the
# ``OutboundPeer`` (welcomed, gone, the answers to this node's checks: ``check.py``).
# The host id: what the peer's certificate must name (--tls-names; None: not checked).
PeerDialer = Callable[[str | None, OutboundPeer, str | None], Dialer]

# Links one peer rank may have to this node at once, and links claiming it that are being
# checked. A new one does not close the old unless its rank is confirmed (then it is that
# rank's newest, and the oldest is one it gave up on): anyone who holds the secret can say
# it is any rank, and a live peer's link must not be cut by that; a restarted peer's dead
# link goes by itself (keepalive, --link-timeout).
LINKS_PER_RANK = 4

ASK_AGAIN = 0.5   # seconds before a rar successor dials its predecessor again to ask


class Mesh:
    """This node's peer links (``neighbours.peers``, ``neighbours.peers_in``) and the
    addresses they are dialed at."""

    def __init__(self, neighbours: Neighbours, dial: PeerDialer | None,
                 lost: Callable[[int], None], unreachable: Callable[[int], None] = lambda rank: None,
                 names: bool = False, disowned: Callable[[int], None] = lambda rank: None, *,
                 stall_after: float):
        """``dial(address, peer, host)`` dials a peer (None: the one at the parent's
        address, the master), whose link reports to ``peer``; ``lost(rank)`` hears that a
        peer's link to this node is gone; ``unreachable(rank)`` that this node's link to it
        is (or could not be dialed). ``names``: --tls-names (spread's links checked);
        ``disowned(rank)``: then, that the rank was left out, or that another host
        answered at its address (``NotThatHost``). A peer that sends nothing for
        ``stall_after`` (``EngineSettings.stall_after``) is cut off (``liveness.py``)."""
        self.neighbours = neighbours
        self._dial = dial
        self._lost = lost
        self._unreachable = unreachable
        self._disowned = disowned
        self.names = names
        self.checks = PeerChecks()
        self.addresses: tuple[str | None, ...] = ()   # spread: where every rank listens
        self.hosts: tuple[str | None, ...] = ()       # ... and its host id (--tls-names)
        self.tasks: list[asyncio.Task] = []
        self._inbound: dict[int, list[Connection]] = {}   # rank -> its links here, newest last
        self._asker: asyncio.Task | None = None   # rar: dials the predecessor to ask (its checks)
        self.liveness = Liveness(self._links, stall_after, name=lambda rank: f"rank {rank}")
        self._judging: asyncio.Task | None = None

    def _judge(self) -> None:
        """From this node's first peer link on, its peers are judged live by what arrives
        from them (``liveness.py``)."""
        if self._judging is None:
            self._judging = supervised(self.liveness.run(), "peer liveness")
            self.tasks.append(self._judging)

    def _links(self) -> dict[int, list[Connection]]:
        """Every peer rank's links that are up here: the one this node dialed first (its
        heartbeats go there), then those the rank dialed."""
        links = {rank: [conn] for rank, conn in self.neighbours.peers.items()}
        for rank, conns in self._inbound.items():
            links.setdefault(rank, []).extend(conns)
        return links

    # -- spread's addresses
    @staticmethod
    def below(tree: Tree, name: str, slots: list[ChildSlot]) -> tuple[tuple[str, str], ...]:
        """Where the nodes below ``name`` listen, as far as it knows: JOINED's ``peers``."""
        found: dict[str, str] = {}
        for child, slot in zip(tree.children(name), slots):
            if slot.address is not None:
                found[child] = slot.address
            found.update((n, a) for n, a in slot.below.items()
                         if n.startswith(child + ".") and n in tree)
        return tuple(sorted(found.items()))

    @staticmethod
    def everyone(tree: Tree, slots: list[ChildSlot]) -> tuple[str | None, ...]:
        """At the master, once every worker joined: every rank's address (its own None)."""
        known = dict(Mesh.below(tree, "", slots))
        return tuple(known.get(name) for name in tree.names())

    def join(self, tree: Tree, name: str, addresses: tuple[str | None, ...],
             hosts: tuple[str | None, ...] = ()) -> None:
        """spread: dial every other host of ``tree`` (this node is ``name``); ``hosts``:
        every rank's host id (--tls-names)."""
        if self.addresses:
            return   # assigned again (the parent came back): the links are kept up already
        names = list(tree.names())
        if len(addresses) != len(names) or (self.names and len(hosts) != len(names)):
            log.error("spread: the assignment has %d addresses%s for %d hosts: no peer links",
                      len(addresses), f" and {len(hosts)} host ids" if self.names else "", len(names))
            return
        self.addresses, self.hosts = addresses, hosts
        me = tree.rank(name)
        for rank, address in enumerate(addresses):
            if rank == me:
                continue
            if self.names and hosts[rank] is None:
                log.error("spread: the master left host %s out of the peer links (its host id): "
                          "it gets no pieces from this one", names[rank] or "master")
                self._disowned(rank)
                continue
            # None: the master, which only its children know (they dial it as their parent).
            if address is None and (rank != 0 or tree.layer(name) != 1):
                log.error("spread: nobody knew where host %s listens: it gets no pieces from "
                          "this one", names[rank] or "master")
                continue
            self.keep(rank, address, me, f"peer {names[rank] or 'master'}")

    def keep_successor(self, ring: RingPlace) -> None:
        """rar: dial the ring successor."""
        last_worker = ring.rank == ring.size - 2
        if ring.successor is None and not last_worker:
            log.error("rar: the master did not know rank %d's successor", ring.rank)
            return
        # None: the last worker's successor is the master, at its parent's address.
        where = "the master" if ring.successor is None else ring.successor
        self.keep((ring.rank + 1) % ring.size, ring.successor, ring.rank, f"ring successor {where}")

    def keep(self, rank: int, address: str | None, me: int, what: str) -> None:
        """Stay connected to peer ``rank`` at ``address`` (None: the parent's), as rank ``me``."""
        if self._dial is None:
            log.error("%s: this node cannot dial peers", what)
            return
        host = self.hosts[rank] if self.names and rank < len(self.hosts) else None
        dial = self._dial(address, self.checks.to(rank), host)
        self._judge()

        async def checked(hello):
            try:
                return await dial(hello)
            except NotThatHost:
                self._disowned(rank)
                raise
        self.tasks.append(supervised(keep_connected(
            what, checked,
            hello=lambda: PeerHello(me, link_id=self.checks.new_link(rank), to=rank),
            up=lambda conn: self.neighbours.peer_up(rank, conn),
            down=lambda why: self._down(rank, why), failed=lambda: self._failed(rank),
            refused=lambda e: log.error("%s refused this node: %s", what, shown(e.reason))),
            what))

    def _down(self, rank: int, what: str) -> None:
        self.neighbours.peer_down(rank)
        log.warning("lost the %s; reconnecting", what)
        self._unreachable(rank)

    def _failed(self, rank: int) -> None:
        if self.neighbours.reachable(rank):
            self.neighbours.peer_failed(rank)
            self._unreachable(rank)

    # -- links accepted from peers
    def accept(self, conn: Connection, hello: PeerHello, place: Place | None, label: str,
               confirmed: Callable[[], None]) -> None:
        """A peer dialed this node: welcome its link, or ``JoinRefused`` why not; and
        ``confirmed()`` once its rank is (at once without a secret), from when what comes
        on it counts as that rank's. A link not confirmed is closed. (rar: a link from the
        ring successor only asks: it is checked, never ``confirmed()``.)"""
        asks = False
        if place is not None and place.scheme == "spread":
            hosts = place.tree.workers + 1
            if not 0 <= hello.rank < hosts or hello.rank == place.tree.rank(place.name):
                raise JoinRefused(f"rank {hello.rank} is not another host of this tree "
                                  f"(ranks 0..{hosts - 1})")
            if self.names:
                if not self.hosts:
                    raise JoinRefused(f"{label} does not know its peers' host ids yet", retry=True)
                why = accepted_named(conn.transport, hello, place.tree.rank(place.name), self.hosts)
                if why is not None:
                    raise JoinRefused(f"a peer link that says it is rank {hello.rank}: {why}",
                                      retry=True)
        elif place is not None and place.ring is not None:
            ring = place.ring
            predecessor = (ring.rank - 1) % ring.size
            # The successor asks (with a secret) about a link that claims this node's rank.
            asks = conn.authenticated and hello.rank == (ring.rank + 1) % ring.size != predecessor
            if hello.rank != predecessor and not asks:
                raise JoinRefused(f"rank {hello.rank} is not the ring predecessor of rank {ring.rank}")
        else:
            raise JoinRefused(f"{label} has no peers (yet)", retry=True)
        rank = hello.rank
        checked = conn.authenticated
        links = self.checks.pending(rank) if checked else len(self._inbound.get(rank, ()))
        if links >= LINKS_PER_RANK:
            raise JoinRefused(f"rank {rank} has {links} links to {label} already"
                              + (" being checked" if checked else ""), retry=True)
        conn.send(PeerWelcome())
        if asks:
            self.checks.check(conn, rank, hello.link_id, _only_asks)
        elif checked:
            self.checks.check(conn, rank, hello.link_id, lambda: self._confirmed(conn, rank, confirmed))
            if place.ring is not None:
                self._ask_predecessor(place.ring)
        else:
            self._confirmed(conn, rank, confirmed)

    def _ask_predecessor(self, ring: RingPlace) -> None:
        """rar: links that claim the predecessor's rank are checked; unless this node's own
        ring link goes there (a ring of two), it dials the predecessor to ask."""
        rank = (ring.rank - 1) % ring.size
        if rank == (ring.rank + 1) % ring.size or (self._asker is not None and not self._asker.done()):
            return
        if self._dial is None or (ring.predecessor is None and ring.rank != 0):
            log.error("rar: this node cannot dial its ring predecessor (rank %d) to confirm the "
                      "links that claim it", rank)
            return
        asker = self._asker = supervised(self._ask_over(rank, ring.predecessor, ring.rank),
                                         "ring predecessor check")
        self.tasks.append(asker)    # awaited when the node stops; forgotten once done
        asker.add_done_callback(lambda _: self.tasks.remove(asker))

    async def _ask_over(self, rank: int, address: str | None, me: int) -> None:
        """Dial the predecessor (``rank``, at ``address``; None: the master, at the parent's)
        as rank ``me``, for as long as links that claim its rank are checked here."""
        assert self._dial is not None
        while self.checks.pending(rank):
            conn = None
            try:
                conn, welcomed = await self._dial(address, self.checks.to(rank), None)(
                    PeerHello(me, link_id=self.checks.new_link(rank), to=rank))
                welcomed.add_done_callback(moot)     # the link is not for the ring: no welcome
                settled = self.checks.settled(rank)
                ends: list[asyncio.Future] = [settled, conn.closed]
                await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
                settled.cancel()
            except (OSError, asyncio.TimeoutError, ProtocolError) as e:
                log.info("rar: could not dial the ring predecessor %s to ask (%s)",
                         address or "(the master)", getattr(e, "strerror", None) or e)
            finally:
                if conn is not None:
                    conn.close()
            if self.checks.pending(rank):
                await asyncio.sleep(ASK_AGAIN)

    def _confirmed(self, conn: Connection, rank: int, confirmed: Callable[[], None]) -> None:
        links = self._inbound.setdefault(rank, [])
        if len(links) >= LINKS_PER_RANK:   # (checked: the rank's own, its newest)
            links.pop(0).close()
        links.append(conn)
        self.neighbours.peers_in[rank] = conn   # pieces come on any; this one is shown
        self._judge()
        confirmed()
        if conn.authenticated:   # (without a secret the dialer takes its welcome for this)
            conn.send(PeerConfirmed())

    def answer(self, conn: Connection, rank: int, msg: PeerCheck) -> None:
        """The host that dialed ``conn`` as ``rank`` asks about a link that claims this
        node's rank (``check.py``)."""
        self.checks.answer(conn, rank, msg)

    def dropped(self, conn: Connection) -> None:
        """An accepted peer link closed before its rank was confirmed."""
        self.checks.dropped(conn)

    def lost(self, rank: int, conn: Connection) -> bool:
        """An accepted peer link closed: True if it was that rank's last one here."""
        links = self._inbound.get(rank, [])
        if conn not in links:
            return False
        links.remove(conn)
        if links:
            self.neighbours.peers_in[rank] = links[-1]
            return False
        del self._inbound[rank]
        self.neighbours.peers_in.pop(rank, None)
        self._lost(rank)
        return True

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.checks.close()
        for links in self._inbound.values():
            for conn in links:
                conn.close()

    def leave(self) -> None:
        """The host moves to another place (MOVE): every peer link closes, those it dialed
        too (a new ``Mesh`` makes the new place's)."""
        self.close()
        self._inbound.clear()
        self.neighbours.drop_peers()


def _only_asks() -> None:
    """rar: the successor's link to ask over, confirmed: it stays one that may only ask."""
