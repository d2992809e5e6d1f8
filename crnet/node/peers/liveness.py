"""Whether a peer is live: by what arrives from it, never by what the kernels' buffers take.

A peer (spread: every other host; rar: the ring neighbours) is live while bytes come from
it on any of its links here: pieces, sums, checks, or at least a HEARTBEAT, which each host
writes to every peer it wrote nothing else to for a beat (``stall_after / BEATS``). A peer
from which nothing at all arrived for ``stall_after`` is frozen (SIGSTOP, a hung daemon) or
cut off: every link to it is cut, as when it goes, so the steps route round it (spread
relays the sum past it, the master leaves it out of the owners) and it is dialed again,
to be taken back once it answers.

Why not the send side, as before: a frozen host's kernel goes on taking bytes, as many as
its receive buffer and the sender's send buffer hold. With those buffers sized to the link
(megabytes on loopback, where a 32 KiB send buffer made every write wait for a delayed
ACK) a frozen relay would swallow a whole step's chunks of the sum and nobody would notice;
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

from ...protocol.messages import Heartbeat
from ...protocol.transport import Connection

log = logging.getLogger("crnet.node")

BEATS = 4   # heartbeats a peer has the chance to send within stall_after

# Each peer rank's links here, the one this node writes its heartbeat on first.
Links = Callable[[], dict[int, list[Connection]]]


class Liveness:
    def __init__(self, links: Links, stall_after: float,
                 name: Callable[[int], str] = str) -> None:
        """``links()``: every peer rank's links that are up here; ``name(rank)``: the peer
        as the log says it."""
        self.links = links
        self.stall_after = stall_after
        self.beat = stall_after / BEATS
        self.name = name
        self._heard: dict[int, tuple[int, float]] = {}   # rank -> (bytes in, since when)
        self._said: dict[int, tuple[Connection, int]] = {}   # rank -> (link, bytes out)
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
        for rank in [r for r in self._heard if r not in links]:
            del self._heard[rank]
            self._said.pop(rank, None)
        for rank, conns in links.items():
            conns = [c for c in conns if not c.is_closing]
            if not conns:   # going: its next links are judged afresh
                self._heard.pop(rank, None)
                self._said.pop(rank, None)
                continue
            got = sum(c.bytes_in for c in conns)
            heard = self._heard.get(rank)
            if heard is None or heard[0] != got or late:
                self._heard[rank] = (got, now)
            elif now - heard[1] >= self.stall_after:
                self._cut(rank, conns, now - heard[1])
                continue
            self._heartbeat(rank, conns[0])

    def _heartbeat(self, rank: int, conn: Connection) -> None:
        """A heartbeat to ``rank`` unless this node wrote it something else since the last
        beat (it goes straight to the link, past the sends waiting their turn: those wait
        for other links, and the peer must hear from this node meanwhile)."""
        said = self._said.get(rank)
        if said is not None and said[0] is conn and said[1] == conn.bytes_out:
            conn.send(Heartbeat())
        self._said[rank] = (conn, conn.bytes_out)

    def _cut(self, rank: int, conns: list[Connection], silent: float) -> None:
        self.cut_off += 1
        del self._heard[rank]
        self._said.pop(rank, None)
        log.warning("peer %s sent nothing, not even a heartbeat, for %.1f s: cut off as frozen "
                    "(it is dialed again)", self.name(rank), silent)
        for conn in conns:
            conn.abort(f"nothing came from it for {silent:.1f} s (frozen?)")
