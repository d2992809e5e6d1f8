"""A secret holder's side of spread's peer links, as its own rank: what a compromised host
of the tree has (``crnet/node/peers/check.py`` is an honest host's).

``InsiderMesh`` listens on 127.0.0.1, and says so where a real node does: its HELLO's
``listen`` (``hello``), which its parent reports up in JOINED's ``peers`` and the master
hands out in ASSIGN, so every other host dials it there. It accepts those links after
the acceptor's side of the handshake (``hostile_peer.accept``), welcomes them
(PEER_WELCOME), confirms them or not as it pleases (PEER_CONFIRMED, without checking a
thing: it is hostile), and answers the hosts' PEER_CHECKs truthfully for the link ids it
used when it dialed them. So its own links (``dial``: PEER_HELLO with its rank and a
fresh link id) are confirmed by the honest hosts, and what it sends on them (PIECE,
OWNERS, MOOT) reaches their engines as its rank's. It writes a HEARTBEAT on every link
it accepted, as a live daemon does (``crnet/node/peers/liveness.py``): the hosts judge
what it sends, not its silence.

Used by the trust tests (``tests/trust/test_trust_claims.py``, ``tests/trust/test_trust_fuzzed.py``)
and the authenticated fuzzer (``benchmarks/fuzz_authenticated.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import random
import secrets
import socket
from collections import Counter
from collections.abc import Callable

from crnet.protocol.messages import (
    LINK_ID_BYTES,
    Heartbeat,
    Hello,
    Message,
    PeerCheck,
    PeerChecked,
    PeerConfirmed,
    PeerHello,
    PeerWelcome,
)

from .hostile_peer import Peer, accept, authenticate, dial

__all__ = ["InsiderMesh", "framed"]

BEAT = 0.1   # seconds between its heartbeats (a host's are --timeout / 16: 0.125 s at 2 s)


def framed(msg: Message) -> bytes:
    return b"".join(bytes(p) for p in msg.frame())


class InsiderMesh:
    """Rank ``rank``'s peer links, held by a secret holder. ``confirm``: the share of the
    hosts' links to it that it confirms; ``seen(frame)`` hears every other frame a host
    sends it (its pieces: frames to replay)."""

    def __init__(self, secret: bytes, rank: int, confirm: float = 1.0,
                 rng: random.Random | None = None, seen: Callable[[bytes], None] | None = None):
        self.secret, self.rank, self.confirm = secret, rank, confirm
        self.rng = rng or random.Random()
        self.seen = seen
        self.ids: dict[int, bytes] = {}        # host rank -> the id of its newest link there
        self.accepted: dict[Peer, int] = {}    # the hosts' links to it, welcomed: their ranks
        self.answers: Counter[bool] = Counter()   # its answers to PEER_CHECK: yes, no
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._tasks: set[asyncio.Task] = set()
        self.started = False

    @property
    def address(self) -> str:
        """Where it listens: its HELLO's ``listen``."""
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def hello(self, name: str | None) -> Hello:
        """The HELLO of the slot it takes, saying where it listens (the handshake binds it)."""
        return Hello(name=name, listen=self.address)

    def start(self) -> InsiderMesh:
        self.started = True
        self._spawn(self._serve())
        return self

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(self._listener)
            self._spawn(self._link(Peer(sock)))

    async def _link(self, peer: Peer) -> None:
        """A host's link to it: the handshake, PEER_WELCOME, PEER_CONFIRMED (or not); then
        the answers to the host's checks."""
        try:
            hello = await accept(peer, self.secret)
            if not isinstance(hello, PeerHello):
                return
            self.accepted[peer] = hello.rank
            if not await peer.write(framed(PeerWelcome())):
                return
            if self.rng.random() < self.confirm:
                await peer.write(framed(PeerConfirmed()))
            self._spawn(self._beat(peer))
            while (got := await peer.recv_frame(timeout=3600)) is not None:
                msg, _, raw = got
                if isinstance(msg, PeerCheck):
                    mine = self.ids.get(hello.rank)
                    yes = mine is not None and hmac.compare_digest(mine, msg.link_id)
                    self.answers[yes] += 1
                    await peer.write(framed(PeerChecked(msg.link_id, yes)))
                elif self.seen is not None:
                    self.seen(raw)
        except (OSError, asyncio.TimeoutError, ValueError):
            pass
        finally:
            self.accepted.pop(peer, None)
            if not peer.writing:      # else ``send`` closes it once its write is done
                peer.close()

    async def _beat(self, peer: Peer) -> None:
        """Heartbeats on a host's link to it for as long as it is open."""
        beat = framed(Heartbeat())
        while peer in self.accepted:
            if not await peer.write(beat):
                return
            await asyncio.sleep(BEAT)

    async def send(self, data: bytes, within: float = 5.0) -> bool:
        """``data`` on one of the hosts' links to it (forged answers, confirmations, junk);
        False if there is none or it closed."""
        if not self.accepted:
            return False
        peer = self.rng.choice(list(self.accepted))
        ok = await peer.write(data, within)
        if peer not in self.accepted:    # its reader is done: closed by the host
            peer.close()
        return ok

    async def dial(self, port: int, host: int, confirmed: float | None = None) -> Peer | None:
        """A link of its own rank to host ``host`` (a rank) at ``port``: PEER_HELLO with a
        fresh link id (from now on the one it says yes for), the handshake, PEER_WELCOME;
        with ``confirmed``, also the host's PEER_CONFIRMED within that many seconds. None
        if the host did not welcome it (or confirm it)."""
        link_id = self.ids[host] = secrets.token_bytes(LINK_ID_BYTES)
        peer = await dial(port)
        try:
            answer = await authenticate(peer, self.secret, PeerHello(self.rank, link_id=link_id))
            if isinstance(answer, PeerWelcome) and (
                    confirmed is None or await peer.expect(PeerConfirmed, timeout=confirmed) is not None):
                return peer
        except (OSError, asyncio.TimeoutError):
            pass
        peer.close()
        return None

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        self._listener.close()
