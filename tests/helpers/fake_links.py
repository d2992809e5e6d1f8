"""A stand-in for ``transport.Connection`` in tests of the node's rooms (engine, membership, links).

Every message sent on it is framed and parsed back (``messages.parse``), so a test sees
exactly what the peer would receive, and a message the node could not put on the wire fails.
Beside it: the rooms beside a membership (``rooms``), and the reason a node gives for a step
whose outcome it no longer holds (``not_held``).
"""

from __future__ import annotations

import asyncio
import weakref

import msgpack
import numpy as np

from crnet.protocol.messages import Message, parse
from crnet.protocol.wire import PREFIX, MsgType


class FakeLink:
    """What the node's rooms use of a Connection; it records instead of sending."""

    def __init__(self, label: str = "fake"):
        self.label = label
        self.sent: list[tuple[Message, memoryview | None]] = []
        self.times: list[float | None] = []     # the loop's time of each send (None: no loop)
        self.writing_paused = False
        self.write_buffer_size = 0
        self.is_closing = False
        self.aborted: str | None = None
        self.closed = False
        self.authenticated = False
        self.transport = None      # as over plain TCP: no TLS channel (crnet.protocol.tls.channel_binding)

    def send(self, msg: Message, payload=None) -> bool:
        return self.write(msg.frame(payload))

    def write(self, frame: list) -> bool:
        if self.is_closing:
            return False
        head = bytes(frame[0])
        _, _, msg_type, hlen, plen = PREFIX.unpack_from(head)
        header = msgpack.unpackb(head[PREFIX.size:PREFIX.size + hlen])
        payload = frame[1] if plen else None
        self.sent.append((parse(MsgType(msg_type), header, plen), payload))
        try:
            self.times.append(asyncio.get_running_loop().time())
        except RuntimeError:
            self.times.append(None)
        return True

    def abort(self, reason: str) -> None:
        self.aborted = reason
        self.is_closing = True

    def close(self) -> None:
        self.closed = True
        self.is_closing = True

    def messages(self, kind: type[Message] | None = None) -> list[Message]:
        """The messages sent on this link (of one kind), in order."""
        return [m for m, _ in self.sent if kind is None or isinstance(m, kind)]

    def times_of(self, kind: type[Message]) -> list[float | None]:
        """When each message of one kind was sent (the loop's clock)."""
        return [t for (m, _), t in zip(self.sent, self.times) if isinstance(m, kind)]

    def vector(self, kind: type[Message], step: int) -> np.ndarray:
        """The vector carried by the chunks (RESULT, CHUNK) of ``step`` sent on this link."""
        pieces = sorted((m.chunk, p) for m, p in self.sent
                        if isinstance(m, kind) and m.step == step)
        dtype = next(m for m, _ in self.sent if isinstance(m, kind) and m.step == step).dtype
        return np.concatenate([np.frombuffer(p, dtype) for _, p in pieces])


_ROOMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def rooms(m):
    """The broadcasts, barriers and status beside membership ``m`` (``node/rooms.py``),
    built once, as ``lifecycle.Node`` builds them."""
    from crnet.node.rooms import Rooms

    made = _ROOMS.get(m)
    if made is None:
        made = _ROOMS[m] = Rooms.beside(m)
    return made


def not_held(step, keep, tree_step):
    """The reason a daemon gives for a step whose outcome it no longer holds."""
    return (f"the outcome of step {step} is not held by this daemon (it keeps the last {keep}, "
            "and those its training processes have not taken within --result-memory); the "
            f"tree is at step {tree_step}: reload the parameters (e.g. the newest checkpoint) "
            "and go on after it")
