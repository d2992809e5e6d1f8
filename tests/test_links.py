"""What each kind of peer may send, and when: a message out of place is a ProtocolError
(its connection closes); a refusal is a REFUSE; a second training process is BUSY."""

import numpy as np
import pytest

from crnet.errors import DaemonBusy, ErrorKind, JoinRefused, ProtocolError
from crnet.messages import (
    Attach,
    Attached,
    Chunk,
    ClientError,
    ClientHello,
    ClientWelcome,
    Done,
    Fail,
    Hello,
    Joined,
    PeerHello,
    PeerWelcome,
    Phase,
    Refuse,
    Result,
    RingPlace,
    Segment,
    StatsRequest,
    Submit,
    Welcome,
)
from crnet.node.engine import EngineSettings, StepEngine
from crnet.node.links import ChildLink, ClientLink, ClientSeat, ParentLink
from crnet.node.membership import Membership
from crnet.node.neighbours import Neighbours
from crnet.plan import Tree
from crnet.schemes import Place
from crnet.schemes.chunks import ChunkLayout
from crnet.shm import SharedRegion
from crnet.stats import Stats

from .fake_links import FakeLink

pytestmark = pytest.mark.timeout(30)

TREE = Tree((2,), (1,))
RING = Tree((3,), (0,))
CHUNK = Chunk(0, 0, 4, "float64")
SEGMENT = Segment(0, Phase.REDUCE, 0, 0, 4, "float64")


@pytest.fixture
def rooms():
    """``rooms(place=None, samples=None)``: a Membership and its StepEngine."""
    made = []

    def make(place=None, samples=None):
        neighbours = Neighbours()
        engine = StepEngine(EngineSettings(), Stats(), neighbours)
        m = Membership(engine, neighbours, stop=lambda code: None, place=place, samples=samples)
        made.append(m)
        return m

    yield make
    for m in made:
        m.engine.close()


@pytest.fixture
def master(rooms):
    return rooms(Place("", 0, TREE, "cr", "auto", 32), samples=10)


def child_link(m):
    return ChildLink(m, m.engine)


# ---------------------------------------------------------------- ChildLink

@pytest.mark.parametrize("msg", [CHUNK, Result(0, 0, 4, "float64"), SEGMENT])
def test_a_payload_before_hello_is_a_protocol_error(master, msg):
    with pytest.raises(ProtocolError, match=f"^unexpected {msg.TYPE.name} from a peer before HELLO$"):
        child_link(master).payload_dest(FakeLink(), msg, 32)


@pytest.mark.parametrize("msg", [Joined(1), Fail(0, "x"), Welcome("0", 1, (2,), (1,), "auto", 32, "cr")])
def test_a_message_before_hello_is_a_protocol_error(master, msg):
    with pytest.raises(ProtocolError, match=f"^unexpected {msg.TYPE.name} from a peer before HELLO$"):
        child_link(master).received(FakeLink(), msg, None)


def test_hello_takes_a_slot(master):
    link, conn = child_link(master), FakeLink()
    link.received(conn, Hello(), None)
    assert link.slot == 0 and master.neighbours.slots[0].link is conn
    assert conn.messages() == [Welcome("0", 1, (2,), (1,), "auto", 32, "cr")]
    link.lost(conn, None)
    assert master.neighbours.slots[0].link is None


def test_a_refused_hello_is_answered_with_refuse_and_closed(master):
    link, conn = child_link(master), FakeLink()
    link.received(conn, Hello("5"), None)
    assert conn.messages() == [Refuse("'5' is not a child of master (its children are 0..1)", False)]
    assert conn.closed and link.slot is None


def test_what_a_refused_peer_sent_before_reading_the_refusal_is_ignored(master):
    link, conn = child_link(master), FakeLink()
    link.received(conn, Hello("5"), None)
    link.received(conn, Joined(1), None)               # no ProtocolError, no slot taken
    assert link.payload_dest(conn, CHUNK, 32) is None  # its payload is read and dropped
    assert [s.link for s in master.neighbours.slots] == [None, None]


@pytest.mark.parametrize("msg", [Hello(), PeerHello(0), StatsRequest()])
def test_a_child_may_not_say_hello_twice_or_speak_for_others(master, msg):
    link, conn = child_link(master), FakeLink()
    link.received(conn, Hello(), None)
    with pytest.raises(ProtocolError, match=f"^unexpected {msg.TYPE.name} from a child$"):
        link.received(conn, msg, None)


def test_a_child_may_not_send_ring_segments(master):
    link, conn = child_link(master), FakeLink()
    link.received(conn, Hello(), None)
    with pytest.raises(ProtocolError, match=r"^unexpected SEGMENT from a child$"):
        link.payload_dest(conn, SEGMENT, 32)


async def test_a_chunk_from_a_child_goes_to_the_step_engine(master):
    link, conn = child_link(master), FakeLink()
    link.received(conn, Hello(), None)
    master.child_joined(0, Joined(1))       # 1 of 2 workers: the tree is not assigned yet
    assert link.payload_dest(conn, CHUNK, 32) is None    # dropped: no step runs before ASSIGN
    master.child_hello(FakeLink(), Hello())
    master.child_joined(1, Joined(1))       # 2 of 2: assigned, steps run
    dest = link.payload_dest(conn, CHUNK, 32)
    assert dest is not None and len(dest) == 32
    assert master.engine.open_steps == [0]


def ring_member(rooms, rank):
    return rooms(Place(str(rank), 1, RING, "rar", "auto", 32, RingPlace(rank, 3, None)))


def test_the_ring_predecessor_is_welcomed_and_may_send_segments_only(rooms):
    m = ring_member(rooms, 1)
    link, conn = child_link(m), FakeLink()
    link.received(conn, PeerHello(0), None)
    assert conn.messages() == [PeerWelcome()] and m.neighbours.predecessor is conn
    with pytest.raises(ProtocolError, match=r"^unexpected CHUNK from the ring predecessor$"):
        link.payload_dest(conn, CHUNK, 32)
    with pytest.raises(ProtocolError, match=r"^unexpected JOINED from the ring predecessor$"):
        link.received(conn, Joined(1), None)


def test_a_wrong_ring_predecessor_is_refused(rooms):
    link, conn = child_link(ring_member(rooms, 1)), FakeLink()
    link.received(conn, PeerHello(2), None)
    assert conn.messages() == [Refuse("rank 2 is not the ring predecessor of rank 1", False)]
    assert conn.closed and not link.peer


def test_a_node_outside_a_ring_asks_a_predecessor_to_retry(master):
    link, conn = child_link(master), FakeLink()
    link.received(conn, PeerHello(0), None)
    assert conn.messages() == [Refuse("master is not in a ring (yet)", True)]


# ---------------------------------------------------------------- ParentLink

async def test_the_parent_must_welcome_first(rooms):
    link = ParentLink(rooms(), None)
    with pytest.raises(ProtocolError, match=r"^RESULT from the parent before WELCOME$"):
        link.received(FakeLink(), Result(0, 0, 4, "float64"), None)
    with pytest.raises(ProtocolError, match=r"^unexpected RESULT from the parent$"):
        link.payload_dest(FakeLink(), Result(0, 0, 4, "float64"), 32)


async def test_a_parents_refusal_fails_the_welcome(rooms):
    link = ParentLink(rooms(), None)
    link.received(FakeLink(), Refuse("master has all 2 child slots taken", False), None)
    with pytest.raises(JoinRefused) as e:
        await link.welcome
    assert (e.value.reason, e.value.retry) == ("master has all 2 child slots taken", False)


async def test_a_welcome_the_node_cannot_take_fails_the_welcome(rooms):
    m = rooms()                              # no --listen: it cannot be an inner node
    link = ParentLink(m, m.engine)
    link.received(FakeLink(), Welcome("0", 1, (2, 2), (1, 1), "auto", 32, "cr"), None)
    with pytest.raises(JoinRefused, match="must accept children: start it with --listen"):
        await link.welcome


async def test_a_parent_that_hangs_up_before_welcome_fails_the_welcome(rooms):
    link = ParentLink(rooms(), None)
    link.lost(FakeLink(), None)
    with pytest.raises(ConnectionResetError):
        await link.welcome


# ---------------------------------------------------------------- ClientLink

def client_link(m, seat):
    return ClientLink(seat, m, m.engine, m.engine.stats)


def assign_everyone(master):
    for k in range(2):
        master.child_hello(FakeLink(), Hello())
        master.child_joined(k, Joined(1))


def test_a_second_training_process_is_told_the_daemon_is_busy(master):
    seat = ClientSeat()
    first, second = client_link(master, seat), client_link(master, seat)
    c1, c2 = FakeLink(), FakeLink()
    first.received(c1, ClientHello(111), None)
    second.received(c2, ClientHello(222), None)
    [busy] = c2.messages()
    assert busy == ClientError("another training process is attached to this daemon (pid 111)",
                               ErrorKind.BUSY)
    assert isinstance(busy.kind.exception(busy.reason), DaemonBusy)
    assert c2.closed and seat.holder is first
    first.lost(c1, None)                     # once it leaves, the next one is served
    third, c3 = client_link(master, seat), FakeLink()
    third.received(c3, ClientHello(333), None)
    assert seat.holder is third and c3.messages() == []


def test_a_training_process_is_welcomed_once_its_host_is_assigned(master):
    link, conn = client_link(master, ClientSeat()), FakeLink()
    link.received(conn, ClientHello(111), None)
    assert conn.messages() == []             # the tree has not assigned this host yet
    assign_everyone(master)
    assert conn.messages() == [ClientWelcome({"name": "", "layer": 0, "samples": 10,
                                              "workers": 2, "ranges": ()}, -1)]
    master.on_assigned[0]()                  # told again (a re-assignment): welcomed once
    assert len(conn.messages()) == 1
    link.lost(conn, None)
    assert master.on_assigned == []


@pytest.mark.parametrize("msg", [Submit(0, 4, "float32"), StatsRequest()])
def test_the_training_process_must_say_hello_first(master, msg):
    with pytest.raises(ProtocolError, match=f"^{msg.TYPE.name} before CLIENT_HELLO$"):
        client_link(master, ClientSeat()).received(FakeLink(), msg, None)


def test_the_client_link_carries_no_payloads(master):
    with pytest.raises(ProtocolError, match=r"^the client link carries no payloads$"):
        client_link(master, ClientSeat()).payload_dest(FakeLink(), CHUNK, 32)


def test_a_second_hello_is_a_protocol_error(master):
    link, conn = client_link(master, ClientSeat()), FakeLink()
    link.received(conn, ClientHello(111), None)
    with pytest.raises(ProtocolError, match=r"^unexpected CLIENT_HELLO from the training process$"):
        link.received(conn, ClientHello(111), None)


def test_a_request_before_shared_memory_is_rejected(master):
    link, conn = client_link(master, ClientSeat()), FakeLink()
    link.received(conn, ClientHello(111), None)
    link.received(conn, Submit(0, 4, "float64"), None)
    assert conn.messages() == [ClientError("vector does not fit the attached shared memory",
                                           ErrorKind.REQUEST)]


def test_shared_memory_that_cannot_be_mapped_is_reported(master, tmp_path):
    link, conn = client_link(master, ClientSeat()), FakeLink()
    link.received(conn, ClientHello(111), None)
    link.received(conn, Attach(str(tmp_path / "missing"), 64), None)
    [error] = conn.messages()
    assert error.kind is ErrorKind.SHM and error.reason.startswith("cannot map shared memory:")


async def test_a_result_reaches_the_training_process_through_shared_memory(master):
    assign_everyone(master)
    link, conn = client_link(master, ClientSeat()), FakeLink()
    link.received(conn, ClientHello(111), None)
    region = SharedRegion.create(64)
    try:
        link.received(conn, Attach(region.path, 64), None)
        link.received(conn, Submit(3, 4, "float64"), None)
        assert conn.messages()[-1] == Attached()
        result = np.array([1.0, 2.0, 3.0, 4.0])
        master.engine.resolved(3, ChunkLayout.of(4, np.float64, 32), result)
        assert conn.messages()[-1] == Done(3, 3)
        np.testing.assert_array_equal(region.output(np.float64, 4), result)
        link.received(conn, Submit(4, 8, "float64"), None)   # 8 elements, the tree's are 4
        master.engine.resolved(4, ChunkLayout.of(4, np.float64, 32), result)
        assert conn.messages()[-1] == ClientError(
            "this process's vector is 8 x float64 but the tree's for step 4 is 4 x float64",
            ErrorKind.MISMATCH, 4)
    finally:
        region.unlink()
