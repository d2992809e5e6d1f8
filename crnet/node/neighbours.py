"""A node's links to its neighbours: the parent, the children by slot, its peers (the
ring successor and predecessor, rar; every other host, spread).

Membership (``membership.py``) fills these in as peers join and leave; the step
engine (``steps/``) only sends through them. Nothing here decides anything.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..messages import Message
from ..transport import Connection

log = logging.getLogger("crnet.node")


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


class Neighbours:
    def __init__(self) -> None:
        self.parent: Connection | None = None
        self.slots: list[ChildSlot] = []
        # Peers by rank: the links this node dialed, where its pieces go (rar: the ring
        # successor; spread: every other host), and those it accepted, where pieces come from.
        self.peers: dict[int, Connection] = {}
        self.peers_in: dict[int, Connection] = {}
        self._queued: dict[int, list[tuple[int, list]]] = {}   # rank -> (step, frame) while reconnecting

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

    def to_peer(self, rank: int, step: int, frame: list) -> None:
        link = self.peers.get(rank)
        if link is None or not link.write(frame):
            self._queued.setdefault(rank, []).append((step, frame))  # sent once the link is (back) up

    def peer_up(self, rank: int, conn: Connection) -> None:
        self.peers[rank] = conn
        for _, frame in self._queued.pop(rank, []):
            conn.write(frame)

    def peer_down(self, rank: int) -> None:
        self.peers.pop(rank, None)

    def forget(self, step: int) -> None:
        """``step`` is decided: its pieces still queued for peers are moot."""
        for rank, queued in list(self._queued.items()):
            kept = [(s, f) for s, f in queued if s != step]
            if kept:
                self._queued[rank] = kept
            else:
                del self._queued[rank]

    def close(self) -> None:
        for conn in (self.parent, *self.peers.values(), *self.peers_in.values(),
                     *(slot.link for slot in self.slots)):
            if conn is not None:
                conn.close()
