"""What each kind of peer may send, and when: a message out of place is a ProtocolError
(its connection closes); a refusal is a REFUSE; a second training process is BUSY; each
outcome of a step reaches the training process as DONE or the ERROR of its kind, with
where the tree stands (``tree_step``)."""

import logging
import os
from types import SimpleNamespace

import numpy as np
import pytest

from crnet.coding.plan import Tree, plan
from crnet.defaults import PROBE_FRAME
from crnet.errors import DaemonBusy, ErrorKind, JoinRefused, ProtocolError, StepFailed
from crnet.node.links import (
    ChildLink,
    ChildState,
    ClientLink,
    ClientState,
    DialedState,
    ParentLink,
    PeerLink,
)
from crnet.node.local import LocalProcesses
from crnet.node.steps import EngineSettings, Failed, Refused
from crnet.peer_text import SHOWN, Throttle, shown, tamed
from crnet.protocol.allocation import NodeShare, pack_allocation
from crnet.protocol.messages import (
    Assign,
    Attached,
    Chunk,
    ClientError,
    ClientHello,
    ClientWelcome,
    Done,
    Fail,
    FailKind,
    Fetch,
    Hello,
    Joined,
    Open,
    PeerHello,
    PeerWelcome,
    Probe,
    ProbeEcho,
    Refuse,
    Result,
    RingPlace,
    StatsReply,
    StatsRequest,
    Submit,
    Welcome,
)
from crnet.protocol.shm import SharedRegion
from crnet.schemes import Place
from crnet.schemes.chunks import ChunkLayout
from crnet.schemes.ring_allreduce.messages import Phase, Segment

from ..helpers.fake_links import FakeLink, not_held, rooms

pytestmark = pytest.mark.timeout(30)

TREE = Tree((2,), (1,))
RING = Tree((3,), (0,))
CHUNK = Chunk(0, 0, 4, "float64")
SEGMENT = Segment(0, Phase.REDUCE, 0, 0, 4, "float64")


@pytest.fixture
def master(membership):
    return membership(Place("", 0, TREE, "cr", "auto", 32), samples=10)


def child_link(m, warnings=None):
    r = rooms(m)
    return ChildLink(m, m.engine, r.broadcasts, r.barriers, r.status, warnings)


def parent_link(m):
    r = rooms(m)
    return ParentLink(m, m.engine, r.broadcasts, r.barriers, r.status)


@pytest.mark.parametrize("link, states", [(ChildLink, ChildState), (ParentLink, DialedState),
                                          (PeerLink, DialedState), (ClientLink, ClientState)])
def test_every_state_of_a_link_has_its_table(link, states):
    """What a peer may send is read off one table per state (links/machine.py)."""
    assert set(link.RECEIVE) == set(states)
    assert set(link.PAYLOAD) <= set(states)


# ---------------------------------------------------------------- ChildLink

@pytest.mark.parametrize("msg", [CHUNK, Result(0, 0, 4, "float64"), SEGMENT])
def test_a_payload_before_hello_is_a_protocol_error(master, msg):
    with pytest.raises(ProtocolError, match=f"^unexpected {msg.TYPE.name} from a peer before HELLO$"):
        child_link(master).payload_dest(FakeLink(), msg, 32)


@pytest.mark.parametrize("msg", [Joined(1), Fail(0, "x"), Open(0),
                                 Welcome("0", 1, (2,), (1,), "auto", 32, "cr")])
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


def test_refusals_show_a_peers_name_quoted_and_short_and_log_a_line_per_address(master, caplog):
    warnings = Throttle(logging.getLogger("crnet.node"))     # the node's, for every connection
    with caplog.at_level("WARNING", logger="crnet.node"):
        for port in range(3):
            link, conn = child_link(master, warnings), FakeLink(f"10.0.0.5:{port}")
            link.received(conn, Hello("x\n" * 128), None)
            [refused] = conn.messages()
            assert refused.reason.startswith(repr("x\n" * 100) + "... (56 more characters) is "
                                             "not a child of master")
            assert conn.closed
    assert [r.getMessage().partition(":")[0] for r in caplog.records] == ["refusing 10.0.0.5"]


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


async def test_open_and_fail_from_a_child_go_to_the_step_engine(master):
    assign_everyone(master)
    link, conn = child_link(master), FakeLink()
    master.child_lost(0, master.neighbours.slots[0].link)
    link.received(conn, Hello("0"), None)
    link.received(conn, Open(3), None)
    assert master.engine.open_steps == [3]
    outcomes = []
    master.engine.request(3, None, outcomes.append)
    link.received(conn, Fail(3, "node 0 stalled", FailKind.STALL), None)
    assert outcomes == []               # s = 1: child 1 alone may still decode step 3
    master.engine.child_failed(1, Fail(3, "node 1 stalled", FailKind.STALL))
    assert [type(o) for o in outcomes] == [Failed]


async def test_a_child_reports_a_steps_failure_once_and_printable(master, caplog):
    assign_everyone(master)
    link, conn = child_link(master), FakeLink("10.0.0.9:4000")
    master.child_lost(0, master.neighbours.slots[0].link)
    link.received(conn, Hello("0"), None)
    reported = []
    master.engine.child_failed = lambda k, msg: reported.append((k, msg))
    forged = "stalled\n2001-01-01 00:00:00,000 ERROR   crnet.node[1]: FORGED"
    with caplog.at_level("WARNING", logger="crnet.node"):
        for _ in range(300):
            link.received(conn, Fail(3, forged, FailKind.STALL), None)
        link.received(conn, Fail(4, "node 0 stalled", FailKind.STALL), None)
    assert reported == [(0, Fail(3, "stalled\\n2001-01-01 00:00:00,000 ERROR   crnet.node[1]: "
                                    "FORGED", FailKind.STALL)),
                        (0, Fail(4, "node 0 stalled", FailKind.STALL))]
    assert [r.getMessage() for r in caplog.records if "again" in r.getMessage()] == [
        "10.0.0.9:4000 (child slot 0) reported step 3's failure again; ignored"]
    assert not conn.closed                # a repeat changes nothing: no need to cut it off


async def test_a_new_job_lets_a_child_report_the_same_step_number_again(master):
    assign_everyone(master)
    link, conn = child_link(master), FakeLink()
    master.child_lost(0, master.neighbours.slots[0].link)
    link.received(conn, Hello("0"), None)
    reported = []
    master.engine.child_failed = lambda k, msg: reported.append(msg.step)
    link.received(conn, Fail(3, "node 0 stalled", FailKind.STALL), None)
    master.run_job("next")                 # steps count from 0 again
    link.received(conn, Fail(3, "node 0 stalled", FailKind.STALL), None)
    assert reported == [3, 3]


def test_a_child_counting_more_workers_than_its_subtree_holds_is_cut_off(master):
    link, conn = child_link(master), FakeLink()
    link.received(conn, Hello(), None)
    with pytest.raises(ProtocolError, match=r"^JOINED: child 0 counts 2 workers, but its subtree "
                                            r"holds 1$"):
        link.received(conn, Joined(2), None)
    assert master.neighbours.slots[0].workers == 0 and master.allocation is None


def ring_member(membership, rank):
    return membership(Place(str(rank), 1, RING, "rar", "auto", 32, RingPlace(rank, 4, None)))


async def test_the_ring_predecessor_is_welcomed_and_may_send_segments_only(membership):
    m = ring_member(membership, 1)
    link, conn = child_link(m), FakeLink()
    link.received(conn, PeerHello(0), None)
    assert conn.messages() == [PeerWelcome()] and m.neighbours.predecessor is conn
    with pytest.raises(ProtocolError, match=r"^unexpected CHUNK from a peer$"):
        link.payload_dest(conn, CHUNK, 32)
    with pytest.raises(ProtocolError, match=r"^unexpected JOINED from a peer$"):
        link.received(conn, Joined(1), None)


def test_a_wrong_ring_predecessor_is_refused(membership):
    link, conn = child_link(ring_member(membership, 1)), FakeLink()
    link.received(conn, PeerHello(2), None)
    assert conn.messages() == [Refuse("rank 2 is not the ring predecessor of rank 1", False)]
    assert conn.closed and link.state is not ChildState.PEER


def test_a_node_outside_a_ring_asks_a_predecessor_to_retry(master):
    link, conn = child_link(master), FakeLink()
    link.received(conn, PeerHello(0), None)
    assert conn.messages() == [Refuse("master has no peers (yet)", True)]


# ---------------------------------------------------------------- ParentLink

async def test_the_parent_must_welcome_first(membership):
    link = parent_link(membership())
    with pytest.raises(ProtocolError, match=r"^RESULT from the parent before WELCOME$"):
        link.received(FakeLink(), Result(0, 0, 4, "float64"), None)
    with pytest.raises(ProtocolError, match=r"^unexpected RESULT from the parent$"):
        link.payload_dest(FakeLink(), Result(0, 0, 4, "float64"), 32)


async def test_a_parents_refusal_fails_the_welcome(membership):
    link = parent_link(membership())
    link.received(FakeLink(), Refuse("master has all 2 child slots taken", False), None)
    with pytest.raises(JoinRefused) as e:
        await link.welcome
    assert (e.value.reason, e.value.retry) == ("master has all 2 child slots taken", False)


async def test_a_welcome_the_nodes_configuration_cannot_take_stops_it_and_tells_the_parent(membership):
    """An inner node without --listen joined and left every 1-2 s, and the master's log said
    nothing of why: now the parent hears why (REFUSE) and the node stops as after a refusal
    for good (with a secret, only an authenticated parent welcomes it: guard.py)."""
    m = membership()                              # no --listen: it cannot be an inner node
    link, conn = parent_link(m), FakeLink("parent")
    link.received(conn, Welcome("0", 1, (2, 2), (1, 1), "auto", 32, "cr"), None)
    reason = "node 0 is at layer 1 of 2 and must accept children: start it with --listen"
    with pytest.raises(JoinRefused) as e:
        await link.welcome
    assert (e.value.reason, e.value.retry) == (reason, False)
    assert conn.messages() == [Refuse(reason, False)]
    assert conn.closed and m.place is None and m.neighbours.slots == []
    link.lost(conn, None)                         # the close that follows changes nothing


async def test_a_probes_bytes_land_in_one_bounded_buffer_and_its_rounds_are_echoed(membership):
    """crnet tune --probe: the parent's PROBE frames (only once welcomed) are read into one
    buffer of PROBE_FRAME bytes, whatever their number; a larger frame closes the link; the
    last frame of a round is echoed."""
    m = membership()
    m.listen_address = "10.0.0.1:7000"
    link, conn = parent_link(m), FakeLink("parent")
    with pytest.raises(ProtocolError, match=r"^unexpected PROBE from the parent$"):
        link.payload_dest(conn, Probe(1, 0), 32)
    link.received(conn, Welcome("0", 1, (2, 2), (1, 1), "auto", 32, "cr"), None)
    await link.welcome
    conn.sent.clear()
    first = link.payload_dest(conn, Probe(1, 0), PROBE_FRAME)
    assert len(first) == PROBE_FRAME
    link.received(conn, Probe(1, 0), first)
    again = link.payload_dest(conn, Probe(1, 0, last=True), 100)
    assert again.obj is first.obj                # the same buffer, every frame
    link.received(conn, Probe(1, 0, last=True), again)
    assert conn.messages() == [ProbeEcho(1, 0)]
    with pytest.raises(ProtocolError, match=f"at most {PROBE_FRAME}"):
        link.payload_dest(conn, Probe(1, 1), PROBE_FRAME + 1)


async def test_a_welcome_to_another_place_drops_the_link_but_is_no_refusal(membership):
    """It may come from anyone at the parent's address: the node dials again (dial.py)
    rather than stop for good, and keeps its place."""
    m = membership()
    m.listen_address = "10.0.0.1:7000"
    link, conn = parent_link(m), FakeLink("parent")
    link.received(conn, Welcome("0", 1, (2, 2), (1, 1), "auto", 32, "cr"), None)
    await link.welcome
    again, conn2 = parent_link(m), FakeLink("parent")
    again.received(conn2, Welcome("1", 1, (2, 2), (1, 1), "auto", 32, "cr"), None)
    with pytest.raises(ProtocolError, match=r"^a WELCOME this node cannot take: the parent gave "
                                            r"this node slot 1, but it is 0$"):
        await again.welcome
    assert conn2.closed and m.place.name == "0" and conn2.messages() == []


def test_a_child_that_cannot_take_its_place_says_why_in_the_parents_log(master, caplog):
    link, conn = child_link(master), FakeLink("10.0.0.5:40001")
    link.received(conn, Hello(), None)
    with caplog.at_level("WARNING", logger="crnet.node"):
        link.received(conn, Refuse("node 0 is at layer 1 of 2 and must accept children: start "
                                   "it with --listen", False), None)
    assert conn.closed
    assert any("child 0 (from 10.0.0.5:40001) cannot take its place and stops: node 0 is at "
               "layer 1 of 2 and must accept children" in r.getMessage() for r in caplog.records)


async def test_a_parents_fail_reason_goes_on_printable(membership):
    m = membership()
    link, conn = parent_link(m), FakeLink("parent")
    link.received(conn, Welcome("0", 1, (2,), (1,), "auto", 32, "cr"), None)
    await link.welcome
    link.received(conn, Fail(3, "gone\n2001-01-01 FORGED\x1b[2J", FailKind.LOCAL), None)
    assert m.engine.outcome(3) == Failed(3, "gone\\n2001-01-01 FORGED\\x1b[2J", tree_wide=False)


async def test_a_welcome_tells_the_node_where_the_tree_is_and_then_fail_decides(membership):
    m = membership()
    link, conn = parent_link(m), FakeLink("parent")
    link.received(conn, Welcome("0", 1, (2,), (1,), "auto", 32, "cr", 7, 4, "float64"), None)
    await link.welcome
    assert m.engine.window.tree_step == 7 and m.engine.window.tree_vector == (4, "float64")
    link.received(conn, Fail(9, "node 0's parent gave up", FailKind.LOCAL), None)
    assert m.engine.is_decided(9)
    assert m.engine.outcome(9) == Failed(9, "node 0's parent gave up", tree_wide=False)
    with pytest.raises(ProtocolError, match=r"^unexpected OPEN from the parent$"):
        link.received(conn, Open(9), None)


async def test_a_parent_that_hangs_up_before_welcome_fails_the_welcome(membership):
    link = parent_link(membership())
    link.lost(FakeLink(), None)
    with pytest.raises(ConnectionResetError):
        await link.welcome


# ---------------------------------------------------------------- ClientLink

def client_link(m, local=None):
    r = rooms(m)
    return ClientLink(local or LocalProcesses(1, m.engine), m, m.engine, m.engine.stats,
                      r.broadcasts, r.barriers)


def assign_everyone(master):
    for k in range(2):
        master.child_hello(FakeLink(), Hello())
        master.child_joined(k, Joined(1))


def test_a_second_training_process_is_told_the_daemon_is_busy(master):
    seat = LocalProcesses(1, master.engine)
    first, second = client_link(master, seat), client_link(master, seat)
    c1, c2 = FakeLink(), FakeLink()
    first.received(c1, ClientHello(111), None)
    second.received(c2, ClientHello(222), None)
    [busy] = c2.messages()
    assert busy == ClientError("another training process is attached to this daemon (pid 111; "
                               "--local-processes)", ErrorKind.BUSY)
    assert isinstance(busy.kind.exception(busy.reason), DaemonBusy)
    assert c2.closed and seat.seats == [first]
    first.lost(c1, None)                     # once it leaves, the next one is served
    third, c3 = client_link(master, seat), FakeLink()
    third.received(c3, ClientHello(333), None)
    assert seat.seats == [third] and c3.messages() == []


def test_a_training_process_is_welcomed_once_its_host_is_assigned(master):
    link, conn = client_link(master), FakeLink()
    link.received(conn, ClientHello(111), None)
    assert conn.messages() == []             # the tree has not assigned this host yet
    assign_everyone(master)
    answer_within = master.engine.settings.answer_within
    assert answer_within == EngineSettings().timeout + EngineSettings().grace
    assert conn.messages() == [ClientWelcome({"name": "", "layer": 0, "samples": 10,
                                              "workers": 2, "process": 0, "processes": 1,
                                              "ranges": (), "rank": 0}, -1, answer_within,
                                             link.token)]
    master.on_assigned.emit(None)            # assigned again, the same share: not told again
    assert len(conn.messages()) == 1
    link.lost(conn, None)
    assert len(master.on_assigned) == 0


def test_a_changed_assignment_welcomes_the_training_process_again(membership):
    m = membership(Place("0", 1, Tree((2, 2), (1, 1)), "cr", "auto", 32))
    m.listen_address = "10.0.0.1:7000"
    link, conn = client_link(m), FakeLink()
    link.received(conn, ClientHello(111), None)

    def assign(samples):
        p = plan(Tree((2, 2), (1, 1)), samples)
        shares = {a.name: NodeShare(a.layer, tuple(a.local), tuple(a.responsibility))
                  for a in p.nodes.values() if a.name == "0" or a.name.startswith("0.")}
        m.assigned(Assign(samples), memoryview(pack_allocation(shares)))
        a = m.assignment()     # as the process reads it off the wire: ranges are tuples
        return {**a, "ranges": tuple(tuple(r) for r in a["ranges"])}

    first = assign(12)
    assert conn.messages() == [ClientWelcome(first, -1, m.engine.settings.answer_within,
                                             link.token)]
    assign(12)                               # the master restarted with the same settings
    assert len(conn.messages()) == 1
    second = assign(24)                      # ... or with others: the process is told
    assert second != first
    assert conn.messages()[1:] == [ClientWelcome(second, -1, m.engine.settings.answer_within,
                                                 link.token)]


@pytest.mark.parametrize("msg", [Submit(0, 4, "float32"), StatsRequest()])
def test_the_training_process_must_say_hello_first(master, msg):
    with pytest.raises(ProtocolError, match=f"^{msg.TYPE.name} before CLIENT_HELLO$"):
        client_link(master).received(FakeLink(), msg, None)


def test_the_client_link_carries_no_payloads(master):
    with pytest.raises(ProtocolError, match=r"^the client link carries no payloads$"):
        client_link(master).payload_dest(FakeLink(), CHUNK, 32)


def test_a_second_hello_is_a_protocol_error(master):
    link, conn = client_link(master), FakeLink()
    link.received(conn, ClientHello(111), None)
    with pytest.raises(ProtocolError, match=r"^unexpected CLIENT_HELLO from the training process$"):
        link.received(conn, ClientHello(111), None)


def test_a_request_before_shared_memory_is_rejected(master):
    link, conn = client_link(master), FakeLink()
    link.received(conn, ClientHello(111), None)
    link.received(conn, Submit(0, 4, "float64"), None)
    assert conn.messages() == [ClientError("vector does not fit the attached shared memory",
                                           ErrorKind.REQUEST)]


def test_shared_memory_that_cannot_be_mapped_is_reported(master):
    link, conn = client_link(master), FakeLink()
    link.received(conn, ClientHello(111), None)
    link.attach_failed("cannot map shared memory: not sealed")
    [error] = conn.messages()
    assert error.kind is ErrorKind.SHM and error.reason.startswith("cannot map shared memory:")


@pytest.fixture
def attached(master):
    """The master's training process, attached with 64 bytes of shared memory:
    ``(link, conn, region)``."""
    assign_everyone(master)
    link, conn = client_link(master), FakeLink()
    link.received(conn, ClientHello(111), None)
    region = SharedRegion.create(64)
    link.attach(SharedRegion.attach(os.dup(region.fd), 64))
    region.close_fd()
    assert conn.messages()[-1] == Attached()
    return link, conn, region


async def test_a_result_reaches_the_training_process_through_shared_memory(master, attached):
    link, conn, region = attached
    link.received(conn, Submit(3, 4, "float64"), None)
    assert conn.messages()[-1] == Attached()
    result = np.array([1.0, 2.0, 3.0, 4.0])
    master.engine.decisions.resolved(3, ChunkLayout.of(4, np.float64, 32), result)
    done = conn.messages()[-1]
    assert isinstance(done, Done) and done.step == 3
    np.testing.assert_array_equal(region.output(np.float64, 4), result)
    link.received(conn, Submit(4, 8, "float64"), None)   # 8 elements, the tree's are 4
    master.engine.decisions.resolved(4, ChunkLayout.of(4, np.float64, 32), result)
    error = conn.messages()[-1]
    assert (error.reason, error.kind, error.step) == (
        "this process's vector is 8 x float64 but the tree's for step 4 is 4 x float64",
        ErrorKind.MISMATCH, 4)
    link.received(conn, Fetch(3, 4, "float64"), None)    # a kept result, answered at once
    assert conn.messages()[-1] == Done(3, 4)


async def test_a_result_that_no_longer_fits_the_swapped_region_is_an_error_for_that_step(
        master, attached):
    """The process handed over a smaller region while its step was pending: it gets an
    ERROR for that step (nothing raises into whoever delivered the result)."""
    link, conn, _ = attached
    link.received(conn, Submit(3, 8, "float64"), None)    # 64 bytes: fits
    small = SharedRegion.create(8)
    link.attach(SharedRegion.attach(os.dup(small.fd), 8))
    small.close_fd()
    master.engine.decisions.resolved(3, ChunkLayout.of(8, np.float64, 32), np.ones(8))
    assert conn.messages()[-1] == ClientError("vector does not fit the attached shared memory",
                                              ErrorKind.REQUEST, 3, 3, True)
    assert link.waiting is None
    link.received(conn, Submit(4, 1, "float64"), None)    # the new region serves what fits
    master.engine.decisions.resolved(4, ChunkLayout.of(1, np.float64, 32), np.full(1, 7.0))
    assert conn.messages()[-1] == Done(4, 4)
    np.testing.assert_array_equal(small.output(np.float64, 1), [7.0])


@pytest.mark.parametrize("decision", ["resolved", "failed"])
async def test_the_answer_says_the_tree_is_at_the_step_just_decided(master, attached, decision):
    link, conn, _ = attached
    link.received(conn, Submit(3, 4, "float64"), None)
    if decision == "resolved":
        master.engine.decisions.resolved(3, ChunkLayout.of(4, np.float64, 32), np.ones(4))
        assert conn.messages()[-1] == Done(3, 3)
    else:    # the process goes on at tree_step + 1: it must not ask for step 3 again
        master.engine.decisions.fail(3, "master did not get 1 of 2 children")
        assert conn.messages()[-1] == ClientError("master did not get 1 of 2 children",
                                                  ErrorKind.FAILED, 3, 3, True)


async def test_each_outcome_reaches_the_training_process_as_its_error(master, attached):
    link, conn, _ = attached
    engine = master.engine
    engine.decisions.resolved(0, ChunkLayout.of(4, np.float64, 32), np.ones(4))
    window, behind = engine.settings.window, engine.settings.behind

    link.received(conn, Submit(window + 1, 4, "float64"), None)
    assert conn.messages()[-1] == ClientError(
        f"step {window + 1} is more than {window} steps ahead of the tree, which is at step 0",
        ErrorKind.REFUSED, window + 1, 0, True)

    link.received(conn, Submit(1, 4, "float64"), None)
    engine.decisions.fail(1, "node 1 gave up: its parent is cut off", tree_wide=False)
    error = conn.messages()[-1]
    assert error == ClientError("node 1 gave up: its parent is cut off", ErrorKind.FAILED, 1,
                                0, False)
    e = error.exception()
    assert isinstance(e, StepFailed) and (e.step, e.tree_step, e.tree_wide) == (1, 0, False)

    engine.learn(40)                          # the tree is far ahead (this daemon restarted)
    link.received(conn, Fetch(40 - behind, 4, "float64"), None)
    assert conn.messages()[-1] == ClientError(
        not_held(40 - behind, engine.settings.keep_results, 40), ErrorKind.LOST,
        40 - behind, 40, True)


def test_stats_report_the_counters_the_bookkeeping_and_the_tree_step(master):
    assign_everyone(master)
    master.engine.decisions.resolved(5, ChunkLayout.of(4, np.float64, 32), np.ones(4))
    link, conn = client_link(master), FakeLink()
    link.received(conn, ClientHello(111), None)
    link.received(conn, StatsRequest(), None)
    [reply] = conn.messages(StatsReply)
    assert reply.tree_step == 5 and reply.open_steps == () and reply.state == "assigned"
    assert reply.stats["steps_done"] == 1
    assert {k: reply.stats[k] for k in ("open", "decided", "kept", "waiting", "told")} == {
        "open": 0, "decided": 1, "kept": 1, "waiting": 0, "told": 0}


# ---------------------------------------------------------------- peer text in log lines

def test_peer_text_is_shown_quoted_on_one_line_and_cut_short():
    assert shown("0.1") == "'0.1'"
    assert shown("a\nb\x1b[2J") == "'a\\nb\\x1b[2J'"
    long = shown("n" * 60_000)
    assert long == repr("n" * SHOWN) + "... (59800 more characters)" and "\n" not in long


def test_tamed_text_is_printable_and_honest_text_unchanged():
    honest = "master did not get 2 of 3 children: 2 of them are gone or failed (child 0: µs)"
    assert tamed(honest) is honest
    assert tamed("a\nb\tc\x00") == "a\\nb\\tc\\x00"
    assert tamed("a\nb").isprintable()


def test_a_throttle_logs_a_key_once_per_interval_and_counts_the_rest(caplog):
    now = [0.0]
    throttle = Throttle(logging.getLogger("crnet.test"), every=10, max_keys=4,
                        clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="crnet.test"):
        for _ in range(5):
            throttle.warning(("10.0.0.1", "refused"), "refusing %s", "10.0.0.1:1")
        throttle.warning(("10.0.0.2", "refused"), "refusing %s", "10.0.0.2:1")   # another peer
        now[0] = 12.0
        throttle.warning(("10.0.0.1", "refused"), "refusing %s", "10.0.0.1:2")
    assert [r.getMessage() for r in caplog.records] == [
        "refusing 10.0.0.1:1", "refusing 10.0.0.2:1",
        "refusing 10.0.0.1:2 (and 4 more like it in the last 12 s, not logged)"]
    assert {r.filename for r in caplog.records} == {"test_links.py"}   # where it was said
    for k in range(100):                     # many peers: it remembers at most max_keys
        throttle.warning(k, "x")
    assert len(throttle._seen) <= 4


async def test_far_steps_of_one_of_k_processes_are_refused_and_kept_nowhere(master):
    """With --local-processes K > 1 a process's vector waits for the host's others: one
    naming steps beyond the window is refused at once, and nothing of it is kept."""
    assign_everyone(master)
    seat = LocalProcesses(2, master.engine)
    answers: list = []
    process = SimpleNamespace(index=0, answer=answers.append)
    window = master.engine.settings.window
    for step in range(window + 1, window + 201):
        seat.submit(process, step, np.zeros(4))
    assert len(answers) == 200 and all(isinstance(a, Refused) for a in answers)
    assert seat._parts == {}
    seat.submit(process, 0, np.zeros(4))     # in the window: it waits for the other
    assert len(answers) == 200 and list(seat._parts) == [0]
