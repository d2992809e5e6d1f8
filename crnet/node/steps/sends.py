"""Where a scheme's pieces go (``schemes.Sends``): the parent, a child, every child, a
peer, over the node's links (``neighbours.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ... import defaults
from ...protocol.messages import Chunk, Message, Result
from ..neighbours import Neighbours

__all__ = ["TreeSends"]


class TreeSends:
    def __init__(self, neighbours: Neighbours, send_queue_bytes: int | None,
                 sent_up: Callable[[int], None]):
        self.neighbours = neighbours
        self.send_queue_bytes = send_queue_bytes   # None: max(SEND_QUEUE_BYTES, 4 vectors)
        self._sent_up = sent_up                     # the step's clock hears a chunk went up

    def to_parent(self, msg: Message, payload=None) -> bool:
        if isinstance(msg, Chunk):
            self._sent_up(msg.step)
        return self.neighbours.to_parent(msg, payload)

    def to_child(self, k: int, msg: Message, payload=None) -> bool:
        link = self.neighbours.child(k)
        return link is not None and link.send(msg, payload)

    def to_children(self, msg: Result, payload) -> None:
        limit = self.send_queue_bytes
        if limit is None:
            vector = msg.total * np.dtype(msg.dtype).itemsize
            limit = max(defaults.SEND_QUEUE_BYTES, defaults.SEND_QUEUE_VECTORS * vector)
        self.neighbours.to_children(msg.frame(payload), limit)

    def to_peer(self, rank: int, step: int, msg: Message, payload) -> None:
        self.neighbours.to_peer(rank, step, msg.frame(payload))

    def in_turn(self, ranks: Sequence[int], step: int, msg: Message, payload,
                keep: bool = False, tag: int | None = None) -> None:
        frame = msg.frame(payload)   # one encoding for every peer
        for rank in ranks:
            self.neighbours.in_turn(rank, step, frame, keep, tag)

    def withdraw(self, rank: int, step: int, tag: int) -> bool:
        return self.neighbours.withdraw(rank, step, tag)

    def reachable(self, rank: int) -> bool:
        return self.neighbours.reachable(rank)

    def announce(self, msg: Message) -> None:
        self.neighbours.announce(msg.frame())

    def absent_children(self) -> dict[int, str]:
        return self.neighbours.absent_children()
