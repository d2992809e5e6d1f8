"""The admission guard hands an accepted connection to its link once the peer is through the
handshake: from then on no frame passes through guard.py (docs/development.md, "Following a
chunk", lists the files a chunk enters; this is the same with a cluster secret)."""

from __future__ import annotations

import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.node.admission import guard as guard_module
from crnet.node.admission.doorway import Doorway
from crnet.node.admission.guard import HANDSHAKE_LIMITS, Accepting
from crnet.node.links import ChildLink
from crnet.protocol.auth import mac, new_nonce
from crnet.protocol.handshake import claim
from crnet.protocol.messages import Challenge, Chunk, Hello, Joined, Proof, parse
from crnet.protocol.transport import Connection
from crnet.protocol.wire import PREFIX, Limits, MsgType
from crnet.schemes import Place

from ..helpers.fake_links import FakeLink, rooms

pytestmark = pytest.mark.timeout(30)

GUARD = Path(guard_module.__file__).resolve()
N = 6                              # float64: one chunk of 48 bytes


class FakeTransport:
    """What a Connection uses of an asyncio transport, for bytes fed by hand."""

    def get_extra_info(self, name, default=None):
        return default

    def is_closing(self):
        return False

    def writelines(self, data):
        pass

    def get_write_buffer_size(self):
        return 0


def frame_bytes(msg: Chunk, payload: np.ndarray) -> bytes:
    return b"".join(bytes(part) for part in msg.frame(memoryview(payload).cast("B")))


class RecordingTransport(FakeTransport):
    """A FakeTransport that keeps each frame written (the daemon's CHALLENGE)."""

    def __init__(self):
        self.frames: list[bytes] = []

    def writelines(self, data):
        self.frames.append(b"".join(bytes(part) for part in data))


def feed(conn: Connection, data: bytes) -> None:
    """``data`` into ``conn`` as the event loop hands bytes over."""
    at = 0
    while at < len(data):
        buf = conn.get_buffer(len(data) - at)
        n = min(len(buf), len(data) - at)
        buf[:n] = data[at:at + n]
        conn.buffer_updated(n)
        at += n


async def test_after_the_handshake_a_chunk_never_enters_the_guard(membership):
    """An accepted connection, guard included (as ``lifecycle.Node._accepted`` makes it, with
    a secret): once its peer proved it holds the secret, the guard hands the connection to
    the link, and a CHUNK then runs no function of guard.py on its way to the step."""
    secret = b"s" * 32
    m = membership(Place("", 0, Tree((2,), (1,)), "cr", "auto", 64), samples=10)
    r = rooms(m)
    child = ChildLink(m, m.engine, r.broadcasts, r.barriers, r.status)
    guard = Accepting(child, secret, Doorway(), lambda: Limits(max_payload=1 << 20))
    conn = Connection(guard, HANDSHAKE_LIMITS)
    wire = RecordingTransport()
    conn.connection_made(wire)
    hello = Hello(nonce=new_nonce())
    feed(conn, b"".join(bytes(part) for part in hello.frame()))
    [frame] = wire.frames
    _, _, kind, hlen, _ = PREFIX.unpack_from(frame)
    challenge = parse(MsgType(kind), msgpack.unpackb(frame[PREFIX.size:PREFIX.size + hlen]), 0)
    assert isinstance(challenge, Challenge)
    proof = Proof(mac(secret, "dialer", hello.nonce, challenge.nonce, *claim(hello), b""))
    feed(conn, b"".join(bytes(part) for part in proof.frame()))
    assert conn.authenticated and conn.handler is child     # handed over
    m.child_hello(FakeLink(), Hello())
    for k in range(2):
        m.child_joined(k, Joined(1))           # assigned: steps run

    entered: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and Path(frame.f_code.co_filename).resolve() == GUARD:
            entered.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        feed(conn, frame_bytes(Chunk(0, 0, N, "float64"), np.arange(1.0, N + 1)))
    finally:
        sys.setprofile(None)
    assert conn.failure is None and conn.aborted is None
    assert m.engine.is_decided(0), "the chunk did not reach the step"   # (n - s = 1 of 2)
    assert entered == []
