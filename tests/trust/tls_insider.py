"""A broken interior host's second process, over TLS: it answers for a rank that is not its own.

``TlsInsider`` holds what a compromised host holds: the cluster secret, and its own TLS
certificate and key (signed by the cluster CA). It listens on 127.0.0.1 where its host's
daemon told the tree a child of it listens (``tests/trust/test_trust_host_identity.py`` patches
that daemon), so every host dials it as that child's rank; it finishes the acceptor's side
of the handshake, welcomes and confirms the links at once, answers PEER_CHECK yes for the
links it dialed itself, and counts the pieces (REDUCE) the hosts send it: the child's share
of the decoding. It also dials every host as the child's rank (``claim``) and, on each link
a host confirmed, sends a forged sum (GATHER, 666 everywhere) for every chunk it got a
piece of. ``benchmarks/hostile_mesh.py`` is the same over plain TCP, as its own rank.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl

import msgpack
import numpy as np

from crnet.errors import CrnetError
from crnet.protocol.auth import mac, new_nonce
from crnet.protocol.handshake import claim
from crnet.protocol.messages import (
    LINK_ID_BYTES,
    Challenge,
    Message,
    PeerCheck,
    PeerChecked,
    PeerConfirmed,
    PeerHello,
    PeerWelcome,
    Proof,
    Refuse,
    parse,
)
from crnet.protocol.tls import TlsFiles, channel_binding, contexts
from crnet.protocol.wire import PREFIX, MsgType
from crnet.schemes.ring_allreduce.messages import Phase
from crnet.schemes.spread.messages import Piece

__all__ = ["TlsInsider"]


class Link:
    """One TLS connection, framed as crnet's."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @property
    def binding(self) -> bytes:
        return channel_binding(self.writer.transport)

    def send(self, msg: Message, payload=None) -> None:
        self.writer.write(b"".join(bytes(p) for p in msg.frame(payload)))

    async def recv(self, timeout: float = 30.0) -> tuple[Message, bytes] | None:
        """The next message this version of crnet parses, and its payload; None at EOF."""
        try:
            while True:
                prefix = await asyncio.wait_for(self.reader.readexactly(PREFIX.size), timeout)
                _, _, msg_type, hlen, plen = PREFIX.unpack(prefix)
                rest = await asyncio.wait_for(self.reader.readexactly(hlen + plen), timeout)
                with contextlib.suppress(ValueError, CrnetError):
                    return parse(MsgType(msg_type), msgpack.unpackb(rest[:hlen]), plen), rest[hlen:]
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            return None

    def close(self) -> None:
        self.writer.close()


class TlsInsider:
    """Answers for ``rank`` with the certificate of another host (``files``)."""

    def __init__(self, secret: bytes, files: TlsFiles, rank: int):
        self.secret, self.rank = secret, rank
        self._accept, self._dial = contexts(files)
        self.ids: dict[int, bytes] = {}          # host rank -> the id of its link there
        self.accepted = 0                        # hosts' links to it through the handshake
        self.pieces = 0                          # pieces (REDUCE) hosts sent it as ``rank``
        self.confirmed: set[int] = set()         # hosts that took its links as ``rank``'s
        self.refused: dict[int, str] = {}        # host rank -> why it refused the latest link
        self.forged = 0                          # forged sums sent on those links
        self._out: dict[int, Link] = {}
        self._links: list[Link] = []
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self.port = 0

    async def start(self) -> TlsInsider:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._accept)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader, writer) -> None:
        link = Link(reader, writer)
        self._links.append(link)
        got = await link.recv()
        if got is None or not isinstance(got[0], PeerHello) or got[0].nonce is None:
            return link.close()
        hello, ours = got[0], new_nonce()
        role, name = claim(hello)
        link.send(Challenge(ours, mac(self.secret, "acceptor", hello.nonce, ours, role, name,
                                      link.binding)))
        if (await link.recv()) is None:   # its PROOF (a hostile host checks nothing)
            return link.close()
        self.accepted += 1
        link.send(PeerWelcome())
        link.send(PeerConfirmed())
        while (got := await link.recv(timeout=3600)) is not None:
            msg, payload = got
            if isinstance(msg, PeerCheck):
                mine = self.ids.get(hello.rank)
                link.send(PeerChecked(msg.link_id, mine == msg.link_id))
            elif isinstance(msg, Piece) and msg.phase is Phase.REDUCE:
                self.pieces += 1
                self._forge(msg, len(payload))
        link.close()

    def _forge(self, piece: Piece, nbytes: int) -> None:
        """The chunk's "sum", 666 everywhere, to every host that took it as ``rank``."""
        forged = np.full(nbytes // 8, 666.0)
        for host in self.confirmed:
            self._out[host].send(Piece(piece.step, Phase.GATHER, piece.chunk, piece.total,
                                       piece.dtype), forged)
            self.forged += 1

    def claim(self, ports: dict[int, int], within: float) -> None:
        """Dial every host (rank -> port) as ``rank``, again until it confirms, for ``within`` s."""
        self._tasks += [asyncio.ensure_future(self._claim(host, port, within))
                        for host, port in ports.items()]

    async def _claim(self, host: int, port: int, within: float) -> None:
        deadline = asyncio.get_running_loop().time() + within
        while asyncio.get_running_loop().time() < deadline and host not in self.confirmed:
            with contextlib.suppress(OSError, ssl.SSLError, asyncio.TimeoutError):
                link = Link(*await asyncio.open_connection("127.0.0.1", port, ssl=self._dial))
                self._links.append(link)
                self.ids[host] = secrets.token_bytes(LINK_ID_BYTES)
                hello = PeerHello(self.rank, new_nonce(), self.ids[host], to=host)
                link.send(hello)
                got = await link.recv(timeout=10)
                if got is not None and isinstance(got[0], Challenge):
                    role, name = claim(hello)
                    assert hello.nonce is not None
                    link.send(Proof(mac(self.secret, "dialer", hello.nonce, got[0].nonce, role, name,
                                        link.binding)))
                    while (got := await link.recv(timeout=10)) is not None:
                        if isinstance(got[0], PeerConfirmed):
                            self._out[host] = link
                            self.confirmed.add(host)
                            return
                        if isinstance(got[0], Refuse):
                            self.refused[host] = got[0].reason
                            break
                link.close()
            await asyncio.sleep(0.3)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        for link in self._links:
            link.close()

