"""A node's links to its neighbours: the parent, the children by slot, its peers (the
ring successor and predecessor, rar; every other host, spread).

Membership (``node/join/membership.py``) fills these in as peers join and leave; the step
engine (``steps/``) only sends through them. Nothing here decides anything.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from .. import defaults
from ..protocol.messages import Message
from ..protocol.tcp_info import tcp_info
from ..protocol.transport import Connection

log = logging.getLogger("crnet.node")

KEPT_STEPS = 4   # decided steps whose kept sends still wait for a peer's link to come up


@dataclass
class ChildSlot:
    """One of a parent's child places, and the connection that holds it (if any)."""

    link: Connection | None = None
    address: str | None = None      # where the child listens (a ring successor's address)
    workers: int = 0                # joined workers in the child's subtree
    assigned: bool = False          # ASSIGN sent on this link
    # Steps up to this one may not have reached this link in full (they were under way
    # when it joined): a late chunk of one of them gets the outcome sent once.
    missed_through: int = -1
    told: set[int] = field(default_factory=set)   # steps it was sent a verdict about (pruned)
    host: str | None = None         # the host id it said in HELLO (kept when it leaves)
    peer: str | None = None         # the address it connected from (kept when it leaves)
    below: dict[str, str] = field(default_factory=dict)  # spread: where its subtree listens
    hosts: dict[str, str] = field(default_factory=dict)  # ... and its host ids (--tls-names)
    tree_step: int = -1             # the newest step the master decided, as it says (JOINED)
    job: str = ""                   # the job it runs, as it says (JOINED)
    vector: tuple[int, str] | None = None   # the tree's vector layout, as it says (JOINED)

    def vacated(self) -> ChildSlot:
        """The slot once its child has left: what the parent keeps of it (where the child
        listened, its host id and address, what its subtree said)."""
        return ChildSlot(address=self.address, host=self.host, peer=self.peer, below=self.below,
                         hosts=self.hosts)


class Neighbours:
    def __init__(self) -> None:
        self.parent: Connection | None = None
        self.slots: list[ChildSlot] = []
        # Peers by rank: the links this node dialed, where its pieces go (rar: the ring
        # successor; spread: every other host), and those it accepted, where pieces come from.
        self.peers: dict[int, Connection] = {}
        self.peers_in: dict[int, Connection] = {}
        # rank -> (step, frame, keep) while its link is (re)connecting (keep: as ``in_turn``'s)
        self._queued: dict[int, list[tuple[int, list, bool]]] = {}
        self._announced: list | None = None   # the frame every peer gets first (spread's map)
        self._unreachable: set[int] = set()   # peers whose link went down, or could not be dialed
        # Sends in turn (spread), one link writing at a time: (step, rank, frame, keep, tag).
        self._turns: deque[tuple[int, int, list, bool, int | None]] = deque()
        self._writing: Connection | None = None

    @property
    def successor(self) -> Connection | None:
        """rar: the one peer a ring member dials."""
        return next(iter(self.peers.values()), None)

    @property
    def predecessor(self) -> Connection | None:
        """rar: the one peer that dials a ring member."""
        return next(iter(self.peers_in.values()), None)

    def child(self, k: int) -> Connection | None:
        return self.slots[k].link if 0 <= k < len(self.slots) else None

    def absent_children(self) -> dict[int, str]:
        return {k: "disconnected" for k, slot in enumerate(self.slots) if slot.link is None}

    def sending(self) -> list[Connection]:
        """The links this node sends steps' pieces on: the parent, the children, the peers."""
        links = [self.parent, *self.peers.values(), *(slot.link for slot in self.slots)]
        return [link for link in links if link is not None]

    def summary(self) -> dict:
        """Which links are up (for ``Client.stats()`` and operators)."""
        return {"parent": self.parent is not None,
                "children": [slot.link is not None for slot in self.slots],
                "successor": self.successor is not None,
                "predecessor": self.predecessor is not None,
                "peers": len(self.peers), "peers_in": len(self.peers_in)}

    def to_parent(self, msg: Message, payload=None) -> bool:
        return self.parent is not None and self.parent.send(msg, payload)

    def to_children(self, frame: list, queue_limit: int) -> None:
        """One encoded frame to every connected child. Results keep coming whether or
        not a child reads them: one with more than ``queue_limit`` bytes queued while
        its socket is full is cut off (it reconnects and catches up, or straggles)."""
        for slot in self.slots:
            link = slot.link
            if link is None:
                continue
            if link.writing_paused and link.write_buffer_size > queue_limit:
                link.abort(f"child stopped reading ({link.write_buffer_size} bytes queued)")
                continue
            link.write(frame)

    def to_peer(self, rank: int, step: int, frame: list, keep: bool = False) -> None:
        link = self.peers.get(rank)
        if link is None or not link.write(frame):
            self._queued.setdefault(rank, []).append((step, frame, keep))  # sent once it is (back) up

    def announce(self, frame: list) -> None:
        """``frame`` to every peer now, and first to each one whose link comes up later
        (the latest announcement only)."""
        self._announced = frame
        for link in self.peers.values():
            link.write(frame)

    def in_turn(self, rank: int, step: int, frame: list, keep: bool = False,
                tag: int | None = None) -> None:
        """``frame`` to peer ``rank`` once this node's sends in turn before it have gone to
        the kernel: one link at a time takes this node's uplink, so N hosts sending to N
        others in rotation do not all load one downlink at once (TCP incast: queues overflow,
        segments are lost, flows wait for retransmission timeouts). ``keep``: sent even once
        the step is decided here (spread's sums, which the other hosts still need). ``tag``:
        what ``withdraw`` knows it by."""
        self._turns.append((step, rank, frame, keep, tag))
        self._next_turn()

    def withdraw(self, rank: int, step: int, tag: int) -> bool:
        """The send in turn to ``rank`` tagged ``tag`` for ``step`` is not to go, if it has not
        gone to its link yet (spread: a piece its owner no longer needs). True if it had not."""
        for i, (s, r, _, _, t) in enumerate(self._turns):
            if s == step and r == rank and t == tag:
                del self._turns[i]
                return True
        return False

    def _next_turn(self) -> None:
        writing = self._writing
        if writing is not None and not writing.is_closing and writing.write_buffer_size:
            # Its on_drained comes; if its peer froze, it never does, and the peer is found
            # by what it no longer sends (``peers/liveness.py``): its link is cut, and
            # ``peer_down`` moves on.
            return
        self._writing = None
        turns = self._turns
        while turns:
            step, rank, frame, keep, _ = turns.popleft()
            link = self.peers.get(rank)
            if link is not None and link.on_drained is None:   # before its first write
                link.pace(defaults.PACED_UNSENT)
                link.on_drained = self._next_turn
            if link is None or not link.write(frame):
                self._queued.setdefault(rank, []).append((step, frame, keep))
                continue
            if link.write_buffer_size:
                self._writing = link
                return

    def reachable(self, rank: int) -> bool:
        """Peer ``rank``'s link is up or coming up (not down, nor failed to dial)."""
        return rank not in self._unreachable

    def link_rate(self, rank: int) -> float | None:
        """What peer ``rank``'s link carried while it had something to send, in bytes/s (TCP's
        bytes acknowledged over its busy time, ``TcpInfo.throughput``); None while it is down
        or has carried nothing. Not the kernel's newest delivery rate: behind a shaper
        with a bucket (tbf), a part that fits in the bucket goes at line rate, and that
        rate read 26 MB/s to 3.1 GB/s on 1 Gbit/s links, where this reads 100-330 MB/s."""
        info = tcp_info(self.peers.get(rank))
        return None if info is None else info.throughput

    def peer_failed(self, rank: int) -> None:
        """Dialing peer ``rank`` failed (nothing listens there, or it did not answer)."""
        if rank not in self.peers:
            self._unreachable.add(rank)

    def peer_up(self, rank: int, conn: Connection) -> None:
        self.peers[rank] = conn
        self._unreachable.discard(rank)
        if self._announced is not None:
            conn.write(self._announced)
        for _, frame, _ in self._queued.pop(rank, []):
            conn.write(frame)

    def peer_down(self, rank: int) -> None:
        self.peers.pop(rank, None)
        self._unreachable.add(rank)
        self._next_turn()   # (it may have been the link writing)

    def forget(self, step: int) -> None:
        """``step`` is decided: its pieces still queued for peers are moot (but not the sends
        in turn it must keep: spread's sums, which the other hosts still need)."""
        turns = self._turns
        if any(s == step and not keep for s, _, _, keep, _ in turns):
            staying = [t for t in turns if t[0] != step or t[3]]
            turns.clear()
            turns.extend(staying)
        for rank, queued in list(self._queued.items()):
            # Kept sends wait for a link that is coming up (the first steps, a restart), but
            # not for ever: a peer that stays away would hold every step's.
            kept = [q for q in queued if q[0] > step - KEPT_STEPS and (q[0] != step or q[2])]
            if kept:
                self._queued[rank] = kept
            else:
                del self._queued[rank]

    def drop_peers(self) -> None:
        """Close every peer link and forget what waited for one (the host moves: MOVE)."""
        for conn in (*self.peers.values(), *self.peers_in.values()):
            conn.close()
        self.peers.clear()
        self.peers_in.clear()
        self._queued.clear()
        self._announced = None
        self._unreachable.clear()
        self._turns.clear()
        self._writing = None

    def close(self) -> None:
        for conn in (self.parent, *self.peers.values(), *self.peers_in.values(),
                     *(slot.link for slot in self.slots)):
            if conn is not None:
                conn.close()
