"""A spread peer link's rank is confirmed by that rank's host, over the acceptor's own link
there (``crnet/node/peers/check.py``), before anything on it counts: the link state machines
of both sides over fake links. Against real daemons: ``tests/trust/test_trust_fuzzed.py``."""

import asyncio

import pytest

from crnet.coding.plan import Tree
from crnet.errors import ProtocolError
from crnet.node.links import ChildLink, ChildState, DialedState, PeerLink
from crnet.protocol.messages import (
    PeerCheck,
    PeerChecked,
    PeerConfirmed,
    PeerHello,
    PeerWelcome,
    Refuse,
    RingPlace,
)
from crnet.schemes import Place
from crnet.schemes.ring_allreduce.messages import Phase, Segment
from crnet.schemes.spread.messages import Piece

from ..helpers.fake_links import FakeLink, rooms

pytestmark = pytest.mark.timeout(30)

STAR = Tree((3,), (1,))          # ranks: master 0, hosts 0, 1, 2 are ranks 1, 2, 3
ID, OTHER = b"i" * 16, b"o" * 16


def host_0(membership):
    """Host "0" (rank 1) of a spread tree."""
    return membership(Place("0", 1, STAR, "spread", "auto", 32))


def accepted(m, rank: int, link_id: bytes | None = ID, authenticated: bool = True,
             host: str = "10.0.0.9"):
    """A link that dialed ``m`` from ``host`` claiming ``rank``, through the handshake."""
    r = rooms(m)
    link = ChildLink(m, m.engine, r.broadcasts, r.barriers, r.status)
    conn = FakeLink(f"{host}:{4000 + rank}")
    conn.authenticated = authenticated
    link.received(conn, PeerHello(rank, None, link_id), None)
    return link, conn


def dialed(m, rank: int):
    """``m``'s own link to ``rank``, welcomed there."""
    link, conn = PeerLink(m.mesh.checks.to(rank)), FakeLink(f"peer {rank}")
    link.received(conn, PeerWelcome(), None)
    return link, conn


async def test_a_claimed_rank_counts_once_its_host_confirms_it_over_this_hosts_own_link(membership):
    m = host_0(membership)
    link, conn = accepted(m, 2)
    assert conn.messages() == [PeerWelcome()] and link.state is ChildState.UNCONFIRMED
    assert 2 not in m.neighbours.peers_in
    with pytest.raises(ProtocolError, match=r"^unexpected PIECE from a peer not yet confirmed$"):
        link.payload_dest(conn, Piece(0, Phase.GATHER, 0, 4, "float64"), 32)
    mine, out = dialed(m, 2)               # the check waited for this host's own link to rank 2
    assert out.messages() == [PeerCheck(ID)] and mine.state is DialedState.WELCOMED
    mine.received(out, PeerChecked(ID, True), None)
    assert conn.messages() == [PeerWelcome(), PeerConfirmed()] and link.state is ChildState.PEER
    assert m.neighbours.peers_in[2] is conn
    assert not mine.welcome.done()         # this host's own link waits for its own confirmation
    mine.received(out, PeerConfirmed(), None)
    assert mine.welcome.done()
    with pytest.raises(ProtocolError, match=r"^unexpected PEER_CONFIRMED from a peer$"):
        mine.received(out, PeerConfirmed(), None)


async def test_a_claim_its_host_disowns_or_leaves_unanswered_is_closed(membership, caplog):
    m = host_0(membership)
    m.mesh.checks.timeout = 0.1
    mine, out = dialed(m, 2)
    _, conn = accepted(m, 2, OTHER)
    assert out.messages() == [PeerCheck(OTHER)]          # asked at once: the link is up
    with caplog.at_level("WARNING", logger="crnet.node"):
        mine.received(out, PeerChecked(OTHER, False), None)
        _, no_id = accepted(m, 3, None)
        _, unanswered = accepted(m, 3, host="10.0.0.8")   # no link to rank 3 here: nobody to ask
        await asyncio.sleep(0.3)
    assert conn.closed and PeerConfirmed() not in conn.messages()
    assert no_id.closed and unanswered.closed
    assert [r.getMessage() for r in caplog.records] == [
        "a peer link from 10.0.0.9:4002 says it is rank 2, which did not confirm it (it says "
        "that is not its link): closed",
        "a peer link from 10.0.0.9:4003 says it is rank 3, which did not confirm it (its "
        "PEER_HELLO has no link id to ask about): closed",
        "a peer link from 10.0.0.8:4003 says it is rank 3, which did not confirm it (no answer "
        "in 0.1 s; this host's link to it is not up): closed"]
    assert 2 not in m.neighbours.peers_in and 3 not in m.neighbours.peers_in


async def test_a_question_asked_on_a_link_that_closed_is_asked_again_on_the_next(membership):
    m = host_0(membership)
    first, out = dialed(m, 2)
    link, _ = accepted(m, 2)
    first.lost(out, None)
    with pytest.raises(ConnectionResetError):
        await first.welcome
    second, again = dialed(m, 2)
    assert again.messages() == [PeerCheck(ID)]
    second.received(again, PeerChecked(ID, True), None)
    assert link.state is ChildState.PEER


async def test_a_host_says_yes_only_for_its_newest_link_to_the_asker(membership):
    m = host_0(membership)
    asker, conn = accepted(m, 2)          # host 1 (rank 2) dialed this one; it asks on that link
    old = m.mesh.checks.new_link(2)
    new = m.mesh.checks.new_link(2)
    for link_id in (new, old, OTHER):
        asker.received(conn, PeerCheck(link_id), None)
    assert conn.messages(PeerChecked) == [PeerChecked(new, True), PeerChecked(old, False),
                                          PeerChecked(OTHER, False)]
    # Nor for its link to another rank: the answer is about the asker's.
    other, conn3 = accepted(m, 3)
    other.received(conn3, PeerCheck(new), None)
    assert conn3.messages(PeerChecked) == [PeerChecked(new, False)]


async def test_without_a_secret_a_peer_is_confirmed_at_once(membership):
    m = host_0(membership)
    link, conn = accepted(m, 2, authenticated=False)
    assert conn.messages() == [PeerWelcome()] and link.state is ChildState.PEER   # as before
    ring = membership(Place("1", 1, Tree((3,), (0,)), "rar", "auto", 32, RingPlace(1, 4, None)))
    link, conn = accepted(ring, 0, authenticated=False)
    assert conn.messages() == [PeerWelcome()] and link.state is ChildState.PEER
    mine = PeerLink(m.mesh.checks.to(2), confirmed_by_welcome=True)
    mine.received(FakeLink(), PeerWelcome(), None)
    assert mine.welcome.done()


class Dialed(FakeLink):
    """A link a node dialed: its ``closed`` is a future, as a Connection's."""

    def __init__(self, label: str):
        super().__init__(label)
        self.closed = asyncio.get_running_loop().create_future()
        self.authenticated = True

    def close(self) -> None:
        self.is_closing = True
        if not self.closed.done():
            self.closed.set_result(None)


class Dials:
    """``mesh.PeerDialer`` for a test: each dial records (address, hello, link, conn)."""

    def __init__(self):
        self.made: list = []

    def __call__(self, address, peer, host=None):
        async def dial(hello):
            link, conn = PeerLink(peer), Dialed(f"peer {address}")
            self.made.append((address, hello, link, conn))
            return conn, link.welcome
        return dial


def ring_member(membership, dials, rank: int = 1, size: int = 4):
    name = str(rank) if rank < size - 1 else ""
    place = Place(name, 1 if name else 0, Tree((size - 1,), (0,)), "rar", "auto", 32,
                  RingPlace(rank, size, f"10.0.0.{rank + 2}:9", f"10.0.0.{rank}:9"))
    return membership(place, dial_peer=dials)


async def test_a_ring_successor_asks_its_predecessor_over_a_link_it_dials_for_that(membership):
    """rar: member 1 takes a link that claims rank 0 only once rank 0 confirms it, asked
    over a link member 1 dials to the address the master gave for rank 0 (as rank 1); it
    hangs up once nothing is left to ask. A link rank 0 disowns is closed."""
    dials = Dials()
    m = ring_member(membership, dials)
    link, conn = accepted(m, 0)
    assert conn.messages() == [PeerWelcome()] and link.state is ChildState.UNCONFIRMED
    with pytest.raises(ProtocolError, match=r"^unexpected SEGMENT from a peer not yet confirmed$"):
        link.payload_dest(conn, Segment(0, Phase.REDUCE, 0, 0, 4, "float64"), 8)
    await asyncio.sleep(0.05)
    [(address, hello, asking, out)] = dials.made
    assert address == "10.0.0.1:9" and hello.rank == 1 and hello.link_id is not None
    asking.received(out, PeerWelcome(), None)
    assert out.messages() == [PeerCheck(ID)]
    asking.received(out, PeerChecked(ID, True), None)
    assert conn.messages() == [PeerWelcome(), PeerConfirmed()] and link.state is ChildState.PEER
    assert m.neighbours.predecessor is conn
    await asyncio.sleep(0.05)
    assert out.closed.done()                        # nothing left to ask: hung up

    _, forged = accepted(m, 0, OTHER, host="10.0.0.66")
    await asyncio.sleep(0.05)
    _, _, asking, out = dials.made[-1]
    asking.received(out, PeerWelcome(), None)
    asking.received(out, PeerChecked(OTHER, False), None)
    assert forged.closed and PeerConfirmed() not in forged.messages()
    assert m.neighbours.predecessor is conn


async def test_a_ring_predecessor_answers_its_successors_questions_and_takes_nothing_else(membership):
    """rar: member 1's successor (rank 2) dials it to ask: welcomed, checked like any
    link (over member 1's own ring link to rank 2), never taken as a ring link; it may ask
    whether a link is member 1's newest to rank 2. Its PEER_HELLO claims rank 2, which is
    not member 1's predecessor: without a secret (nobody to ask) it is refused."""
    dials = Dials()
    m = ring_member(membership, dials)
    mine, out = dialed(m, 2)                        # member 1's ring link to rank 2
    asker, conn = accepted(m, 2)
    assert conn.messages() == [PeerWelcome()] and asker.state is ChildState.UNCONFIRMED
    assert out.messages() == [PeerCheck(ID)]         # its own check of the asking link
    mine.received(out, PeerChecked(ID, True), None)
    assert conn.messages() == [PeerWelcome()] and asker.state is ChildState.UNCONFIRMED
    assert 2 not in m.neighbours.peers_in and m.neighbours.predecessor is None
    newest = m.mesh.checks.new_link(2)
    asker.received(conn, PeerCheck(newest), None)
    assert conn.messages(PeerChecked) == [PeerChecked(newest, True)]
    with pytest.raises(ProtocolError, match=r"^unexpected SEGMENT from a peer not yet confirmed$"):
        asker.payload_dest(conn, Segment(0, Phase.REDUCE, 0, 0, 4, "float64"), 8)
    stranger, conn = accepted(m, 2, authenticated=False)
    assert isinstance(conn.messages()[0], Refuse) and stranger.state is ChildState.REFUSED
    assert not dials.made                           # its predecessor's links: none to check


async def test_in_a_ring_of_two_each_member_asks_over_its_own_ring_link(membership):
    """The master's ring successor and predecessor are worker 0: it asks over its own ring
    link there, and dials nothing more."""
    dials = Dials()
    m = ring_member(membership, dials, rank=1, size=2)
    link, _ = accepted(m, 0)
    mine, out = dialed(m, 0)
    assert out.messages() == [PeerCheck(ID)]
    mine.received(out, PeerChecked(ID, True), None)
    assert link.state is ChildState.PEER and not dials.made
