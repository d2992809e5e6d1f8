"""A raw peer of a crnetd that speaks the wire protocol: what an attacker has.

``Peer`` sends whatever frames it is given (well-formed messages from ``crnet.protocol.messages``
or any bytes) and reads the daemon's frames back. ``authenticate`` performs the dialer's
side of the cluster secret's handshake (HELLO or PEER_HELLO with a nonce, CHALLENGE,
PROOF) for a peer that holds the secret, as a host of the tree does: after it, the
daemon acts on what the peer sends as it would on a real host's frames. ``accept`` is the
acceptor's side, for a peer that listens itself (``hostile_mesh.py``: a host of the tree
dials it).

Used by the trust tests (``tests/trust/test_trust*.py``) and the authenticated fuzzer
(``benchmarks/fuzz_authenticated.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from dataclasses import dataclass

import msgpack

from crnet.errors import CrnetError
from crnet.protocol.auth import mac, new_nonce, verify
from crnet.protocol.handshake import claim
from crnet.protocol.messages import Challenge, Hello, Message, PeerHello, Proof, parse
from crnet.protocol.wire import PREFIX, MsgType

__all__ = ["Peer", "Unparsed", "accept", "authenticate", "dial"]


@dataclass(frozen=True)
class Unparsed:
    """A frame the daemon sent that ``crnet.protocol.messages`` here does not parse."""

    msg_type: int
    header: object


class Peer:
    """A raw connection to a daemon that speaks the wire protocol: what an attacker has.
    A plain non-blocking socket driven by the loop's ``sock_*`` calls, so closing it never
    needs the loop."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self._buf = bytearray()
        self._writing: asyncio.Lock | None = None   # one ``write`` at a time: frames never interleave

    def send(self, msg: Message, payload=None) -> bool:
        return self.send_bytes(b"".join(bytes(p) for p in msg.frame(payload)))

    def send_bytes(self, data: bytes, within: float = 10.0) -> bool:
        """All of ``data``; False if the daemon closed the connection (TimeoutError if it
        stops reading for ``within`` seconds). Blocks the caller while the socket is full:
        ``write`` is the event loop's version."""
        view, deadline = memoryview(data), time.monotonic() + within
        while view:
            try:
                view = view[self.sock.send(view):]
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError("the daemon stopped reading") from None
                time.sleep(0.001)
            except (BrokenPipeError, ConnectionResetError):
                return False
        return True

    async def write(self, data: bytes, within: float = 10.0) -> bool:
        """``send_bytes`` without blocking the event loop: False if the daemon closed the
        connection or stopped reading for ``within`` seconds."""
        self._writing = self._writing or asyncio.Lock()
        try:
            async with self._writing:
                await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(self.sock, data), within)
        except (OSError, asyncio.TimeoutError):
            return False
        return True

    @property
    def writing(self) -> bool:
        """A ``write`` is under way (its socket must not be closed under it)."""
        return self._writing is not None and self._writing.locked()

    async def _fill(self, n: int) -> bool:
        """At least ``n`` bytes buffered; False at EOF. Nothing is consumed here, so a
        timeout (a cancelled read) never loses part of a frame."""
        loop = asyncio.get_running_loop()
        while len(self._buf) < n:
            try:
                data = await loop.sock_recv(self.sock, 1 << 16)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                return False
            self._buf += data
        return True

    async def recv(self, timeout: float = 10.0) -> tuple[Message | Unparsed, bytes | None] | None:
        """The next message and its payload; None once the daemon closed the connection."""
        got = await self.recv_frame(timeout)
        return None if got is None else got[:2]

    async def recv_frame(self, timeout: float = 10.0
                         ) -> tuple[Message | Unparsed, bytes | None, bytes] | None:
        """As ``recv``, with the frame's bytes as they came (to replay them)."""
        return await asyncio.wait_for(self._recv(), timeout)

    async def _recv(self):
        if not await self._fill(PREFIX.size):
            return None
        _, _, msg_type, hlen, plen = PREFIX.unpack_from(self._buf)
        size = PREFIX.size + hlen + plen
        if not await self._fill(size):
            return None
        frame = bytes(self._buf[:size])
        del self._buf[:size]
        header = msgpack.unpackb(frame[PREFIX.size:PREFIX.size + hlen])
        payload = frame[PREFIX.size + hlen:] or None
        try:
            return parse(MsgType(msg_type), header, plen), payload, frame
        except (ValueError, CrnetError):   # a message this version of crnet does not know
            return Unparsed(msg_type, header), payload, frame

    async def expect(self, *kinds: type[Message], timeout: float = 10.0):
        """The next message of one of ``kinds`` (others are skipped), or None at EOF."""
        deadline = time.monotonic() + timeout
        while True:
            got = await self.recv(max(0.01, deadline - time.monotonic()))
            if got is None or isinstance(got[0], kinds):
                return got

    async def closed_by_daemon(self, timeout: float) -> bool:
        """True if the daemon closes the connection within ``timeout`` (frames are dropped)."""
        try:
            while await self.recv(timeout) is not None:
                pass
        except asyncio.TimeoutError:
            return False
        return True

    async def finish(self, timeout: float = 10.0) -> bool:
        """Say all (FIN after everything sent: close() with unread input would reset the
        connection and make the daemon drop what it had not read yet); True once it closed."""
        self.sock.shutdown(socket.SHUT_WR)
        return await self.closed_by_daemon(timeout)

    def close(self) -> None:
        self.sock.close()


async def dial(port: int, host: str = "127.0.0.1") -> Peer:
    """A raw peer connected to ``host:port`` (OSError if nothing listens there)."""
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return Peer(sock)


async def authenticate(peer: Peer, secret: bytes, hello: Hello | PeerHello,
                       timeout: float = 10.0) -> Message | Unparsed | None:
    """Say ``hello`` (with a fresh nonce) and prove that this peer holds ``secret``, as a
    child (HELLO) or a ring or spread peer (PEER_HELLO) does; returns the daemon's answer
    after the proof (WELCOME, PEER_WELCOME, REFUSE, ...) or None if it hung up."""
    said = dataclasses.replace(hello, nonce=new_nonce())
    assert said.nonce is not None
    if not await peer.write(b"".join(bytes(p) for p in said.frame())):
        return None
    got = await peer.recv(timeout)
    if got is None or not isinstance(got[0], Challenge):
        return None if got is None else got[0]
    role, name = claim(said)
    if not await peer.write(b"".join(bytes(p) for p in Proof(mac(secret, "dialer", said.nonce,
                                                                 got[0].nonce, role, name)).frame())):
        return None
    answer = await peer.recv(timeout)
    return None if answer is None else answer[0]


async def accept(peer: Peer, secret: bytes, timeout: float = 10.0) -> Hello | PeerHello | None:
    """The acceptor's side of the handshake on a connection a host of the tree dialed:
    its hello (with its nonce), CHALLENGE, its PROOF checked. Returns the hello, or None
    if it hung up or its proof was wrong (plain TCP: no TLS channel to bind)."""
    got = await peer.recv(timeout)
    if got is None or not isinstance(got[0], (Hello, PeerHello)) or got[0].nonce is None:
        return None
    said, theirs, ours = got[0], got[0].nonce, new_nonce()
    role, name = claim(said)
    if not await peer.write(b"".join(bytes(p) for p in Challenge(
            ours, mac(secret, "acceptor", theirs, ours, role, name)).frame())):
        return None
    proof = await peer.recv(timeout)
    if proof is None or not isinstance(proof[0], Proof):
        return None
    return said if verify(mac(secret, "dialer", theirs, ours, role, name), proof[0].mac) else None
