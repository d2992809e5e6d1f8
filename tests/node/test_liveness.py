"""``node/peers/liveness.py``: a peer is live by what arrives from it. Over stand-in links and
a clock the test turns (``Liveness.tick``): a peer that sends anything, heartbeats
included, is never cut; one silent for ``stall_after`` is cut on every link it has here; a
late tick judges nobody; heartbeats go only where nothing else went for a beat."""

import asyncio

import msgpack
import pytest

from crnet.node.peers.liveness import BEATS, Liveness
from crnet.protocol.messages import Heartbeat, parse
from crnet.protocol.wire import PREFIX, MsgType

pytestmark = pytest.mark.timeout(10)

STALL = 1.0
BEAT = STALL / BEATS


class Link:
    def __init__(self):
        self.bytes_in = self.bytes_out = 0
        self.queued = 0   # arrived, held in the kernel below the receive low-water mark
        self.is_closing = False
        self.sent: list = []
        self.aborted: str | None = None

    @property
    def heard(self) -> int:
        return self.bytes_in + self.queued

    def write(self, frame: list) -> bool:
        """A frame as ``Connection.write`` takes it: kept as the message it encodes."""
        data = b"".join(frame)
        _, _, kind, hlen, _ = PREFIX.unpack_from(data)
        header = msgpack.unpackb(data[PREFIX.size:PREFIX.size + hlen])
        self.sent.append(parse(MsgType(kind), header, 0))
        self.bytes_out += len(data)
        return True

    def abort(self, reason: str) -> None:
        self.aborted, self.is_closing = reason, True


class Peers:
    def __init__(self, ranks=(1, 2)):
        self.links = {r: [Link(), Link()] for r in ranks}   # (dialed, accepted)
        self.live = Liveness(lambda: {r: list(ls) for r, ls in self.links.items()}, STALL)
        self.now = 0.0

    def ticks(self, n: int, heard=(), wrote=()) -> None:
        """``n`` beats; each one, bytes come from the ranks in ``heard`` and this node
        writes to those in ``wrote``."""
        for _ in range(n):
            self.now += BEAT
            for r in heard:
                self.links[r][1].bytes_in += 100
            for r in wrote:
                self.links[r][0].bytes_out += 100
            self.live.tick(self.now)


def test_a_peer_that_sends_anything_is_never_cut():
    p = Peers()
    p.ticks(40, heard=(1, 2))
    assert p.live.cut_off == 0
    assert all(link.aborted is None for ls in p.links.values() for link in ls)


def test_a_peer_silent_for_stall_after_is_cut_on_every_link():
    p = Peers()
    p.ticks(2, heard=(1, 2))
    p.ticks(BEATS - 1, heard=(2,))
    assert p.live.cut_off == 0                  # silent for less than stall_after
    p.ticks(1, heard=(2,))
    assert p.live.cut_off == 1
    assert all(link.aborted and "frozen" in link.aborted for link in p.links[1])
    assert all(link.aborted is None for link in p.links[2])


def test_a_late_tick_judges_nobody():
    """This host's loop was held up (or it was stopped itself): what came meanwhile is not
    read yet, so the silence counts from the late tick."""
    p = Peers()
    p.ticks(1, heard=(1, 2))
    p.now += 3 * STALL
    p.live.tick(p.now)
    assert p.live.cut_off == 0
    p.ticks(BEATS - 1, heard=(2,))
    assert p.live.cut_off == 0
    p.ticks(1, heard=(2,))
    assert p.live.cut_off == 1


def test_heartbeats_go_on_the_first_link_only_where_nothing_else_went():
    p = Peers()
    p.ticks(BEATS, heard=(1, 2), wrote=(1,))
    dialed, accepted = p.links[2]
    assert p.links[1][0].sent == []                 # data went to peer 1 every beat
    assert len(dialed.sent) == BEATS - 1 and all(isinstance(m, Heartbeat) for m in dialed.sent)
    assert accepted.sent == []


def test_a_link_that_went_is_forgotten():
    p = Peers()
    p.ticks(2, heard=(1, 2))
    del p.links[1]
    p.ticks(2 * BEATS, heard=(2,))
    assert p.live.cut_off == 0


async def test_it_ticks_on_the_running_loop():
    p = Peers()
    p.live = Liveness(lambda: {r: list(ls) for r, ls in p.links.items()}, 0.08)
    task = asyncio.ensure_future(p.live.run())
    try:
        await asyncio.sleep(0.3)
    finally:
        task.cancel()
    assert p.live.cut_off == 2     # nothing came from either


def test_a_payload_held_below_the_low_water_mark_is_progress():
    """A large payload crossing a slow link wakes the loop only once the rest of it is in:
    its bytes waiting in the kernel keep the peer live meanwhile."""
    p = Peers(ranks=(1,))
    p.ticks(1)
    for _ in range(3 * BEATS):          # 3 x stall_after, nothing read, bytes queued
        p.links[1][1].queued += 1000
        p.ticks(1)
    assert p.live.cut_off == 0 and p.links[1][1].aborted is None
    p.ticks(BEATS + 1)                  # then nothing at all: cut
    assert p.live.cut_off == 1
