"""Whether a peer is live: by what arrives from it, never by what the kernels' buffers take.

A peer (spread: every other host; rar: the ring neighbours) is live while bytes come from
it on any of its links here (read, or waiting in the kernel below the receive low-water
mark: ``Connection.heard``): pieces, sums, checks, or at least a HEARTBEAT, which each host
writes to every peer it wrote nothing else to for a beat (``stall_after / BEATS``). A peer
from which nothing at all arrived for ``stall_after`` is frozen (SIGSTOP, a hung daemon) or
cut off: every link to it is cut, as when it goes, so the steps route round it (spread
relays the sum past it, the master leaves it out of the owners) and it is dialed again,
to be taken back once it answers.

Why not the send side, as before: a frozen host's kernel goes on taking bytes, as many as
its receive buffer (megabytes on loopback, by the kernel's autotuning) and the sender's
send buffer hold. With send buffers of a few segments (256 KiB on loopback, where 32 KiB
made every write wait for a delayed ACK) a frozen relay swallows a whole step's chunks of
the sum, and a sender never waits on it long enough to notice;
judged by what it delivers, it is found within ``stall_after`` whatever the buffers.

Judged on ticks of a beat, between steps too: a live daemon always owes its heartbeats,
and steps on fast links are open for milliseconds, too short to be caught open by a tick
(a host frozen between steps is found before the next one needs it). A tick that comes
late (this host's own loop was held up, or this daemon was itself stopped) judges nobody:
the bytes that arrived meanwhile are not read yet, so the silence is counted again from
there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ...protocol.messages import Heartbeat
from ...protocol.transport import Connection

log = logging.getLogger("crnet.node")

BEATS = 4   # heartbeats a peer has the chance to send within stall_after

# Each peer rank's links here, the one this node writes its heartbeat on first.
Links = Callable[[], dict[int, list[Connection]]]

BEAT_FRAME = Heartbeat().frame()   # encoded once: it is the same every time


@dataclass
class _Peer:
    """What this node knows of one peer rank: the bytes in from it on its links and since
    when that count stood; the link it writes its heartbeats on and that link's bytes out
    at the last beat."""

    heard: int
    since: float
    beat_on: Connection | None = None
    said: int = 0


class Liveness:
    def __init__(self, links: Links, stall_after: float,
                 name: Callable[[int], str] = str) -> None:
        """``links()``: every peer rank's links that are up here; ``name(rank)``: the peer
        as the log says it."""
        self.links = links
        self.stall_after = stall_after
        self.beat = stall_after / BEATS
        self.name = name
        self._peers: dict[int, _Peer] = {}
        self._due: float | None = None
        self.cut_off = 0   # peers cut as silent (metrics, tests)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.beat)
            self.tick(loop.time())

    def tick(self, now: float) -> None:
        late = self._due is not None and now > self._due + self.beat
        self._due = now + self.beat
        links = self.links()
        for rank in [r for r in self._peers if r not in links]:
            del self._peers[rank]
        for rank, conns in links.items():
            conns = [c for c in conns if not c.is_closing]
            if not conns:   # going: its next links are judged afresh
                self._peers.pop(rank, None)
                continue
            got = sum(c.heard for c in conns)
            peer = self._peers.get(rank)
            if peer is None:
                peer = self._peers[rank] = _Peer(got, now)
            elif peer.heard != got or late:
                peer.heard, peer.since = got, now
            elif now - peer.since >= self.stall_after:
                self._cut(rank, conns, now - peer.since)
                continue
            self._heartbeat(peer, conns[0])

    @staticmethod
    def _heartbeat(peer: _Peer, conn: Connection) -> None:
        """A heartbeat on ``conn`` unless this node wrote it something else since the last
        beat (it goes straight to the link, past the sends waiting their turn: those wait
        for other links, and the peer must hear from this node meanwhile)."""
        if peer.beat_on is conn and peer.said == conn.bytes_out:
            conn.write(BEAT_FRAME)
        peer.beat_on, peer.said = conn, conn.bytes_out

    def _cut(self, rank: int, conns: list[Connection], silent: float) -> None:
        self.cut_off += 1
        del self._peers[rank]
        log.warning("peer %s sent nothing, not even a heartbeat, for %.1f s: cut off as frozen "
                    "(it is dialed again)", self.name(rank), silent)
        for conn in conns:
            conn.abort(f"nothing came from it for {silent:.1f} s (frozen?)")
