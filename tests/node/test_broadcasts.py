"""node/broadcasts.py without sockets: who relays what, up and down, and what is refused."""

import asyncio

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.errors import ProtocolError
from crnet.node.collectives.broadcasts import HELD, PER_SOURCE, Broadcasts
from crnet.node.collectives.state_answers import KEPT
from crnet.node.collectives.state_requests import STATE_PAUSE
from crnet.node.neighbours import ChildSlot, Neighbours
from crnet.protocol.messages import Bcast, WantState, state_key
from crnet.schemes.base import Place

from ..helpers.fake_links import FakeLink

TREE = Tree((2, 2), (1, 1))
CHUNK = 32   # bytes per piece: a 10 x float64 vector is 3 pieces


def node(name: str):
    """A Broadcasts at ``name`` with a parent link (unless the master) and two children."""
    n = Neighbours()
    if name:
        n.parent = FakeLink("parent")
    n.slots = [ChildSlot(link=FakeLink(f"child {k}")) for k in range(2)]
    place = Place(name, TREE.layer(name), TREE, "cr", "auto", CHUNK)
    return Broadcasts(n, lambda: place), n


def pieces(key, vector, origin=7, step=-1, chunk=CHUNK, root=None):
    raw = vector.tobytes()
    return [(Bcast(key, origin, step, at, vector.size, vector.dtype.name, root), raw[at:at + chunk])
            for at in range(0, len(raw), chunk)]


def from_child(b, k, key, vector, origin=7, step=-1):
    """Child ``k`` sends ``vector``; whether each piece was taken (a destination given)."""
    taken = []
    for msg, raw in pieces(key, vector, origin, step):
        dest = b.child_dest(k, msg, len(raw))
        taken.append(dest is not None)
        if dest is not None:
            dest[:] = raw
        b.from_child(k, msg, None if dest is None else dest)
    return taken


def from_parent(b, key, vector, origin=9, step=-1, root=None):
    for msg, raw in pieces(key, vector, origin, step, root=root):
        dest = b.parent_dest(msg, len(raw))
        if dest is not None:
            dest[:] = raw
        b.from_parent(msg, dest)


def carried(link, key):
    """The vector the Bcast pieces of ``key`` sent on ``link`` add up to."""
    got = sorted((m.offset, bytes(p)) for m, p in link.sent if isinstance(m, Bcast) and m.key == key)
    dtype = next(m.dtype for m, _ in link.sent if isinstance(m, Bcast) and m.key == key)
    return np.frombuffer(b"".join(p for _, p in got), dtype)


def test_a_node_relays_the_first_senders_state_answer_up_and_drops_the_others():
    b, n = node("0")
    first, second = np.arange(10.0), np.arange(10.0) + 100
    assert all(from_child(b, 0, "state/5", first, origin=1))
    assert not any(from_child(b, 1, "state/5", second, origin=2))   # any one will do: sent
    np.testing.assert_array_equal(carried(n.parent, "state/5"), first)
    assert {(m.origin, m.root) for m in n.parent.messages(Bcast)} == {(1, "0.0")}   # its root
    assert not b.held                                          # held once the master's comes


def test_a_broadcast_belongs_to_its_root():
    """Issue 26 row 7: a copy of a key from another host is another broadcast. Each is
    relayed with its root (the sender's host), which must be in the subtree it came from;
    a receiver that names a root gets that root's copy, whichever came first."""
    b, n = node("0")
    assert all(from_child(b, 0, "params", np.full(10, 666.0), origin=1))     # root 0.0
    assert all(from_child(b, 1, "params", np.arange(10.0), origin=2))        # root 0.1
    assert {(m.origin, m.root) for m in n.parent.messages(Bcast)} == {(1, "0.0"), (2, "0.1")}
    with pytest.raises(ProtocolError, match=r"not in the subtree of child 0\.0"):
        b.child_dest(0, Bcast("other", 3, -1, 0, 10, "float64", root="0.1"), 8)
    got: dict[str | None, list] = {"0.1": [], None: []}
    for root, into in got.items():
        b.receive("params", root, into.append)
    from_parent(b, "params", np.full(10, 666.0), origin=8, root="0.0")
    from_parent(b, "params", np.arange(10.0), origin=9, root="0.1")
    np.testing.assert_array_equal(got[None][0].vector, np.full(10, 666.0))    # the first
    np.testing.assert_array_equal(got["0.1"][0].vector, np.arange(10.0))      # root 0.1's
    assert len(got["0.1"]) == len(got[None]) == 1


def test_a_node_relays_each_piece_from_the_parent_to_its_children_and_keeps_the_whole():
    b, n = node("0")
    got = []
    b.receive("k", None, lambda held: got.append(held))
    vector = np.arange(10.0)
    from_parent(b, "k", vector, step=41)
    for slot in n.slots:
        np.testing.assert_array_equal(carried(slot.link, "k"), vector)
    [held] = got
    assert held.step == 41
    np.testing.assert_array_equal(held.vector, vector)
    late = []
    b.receive("k", None, late.append)                           # a later asker: at once
    assert late == [held]


def test_a_receiver_that_gives_up_is_not_called():
    b, _ = node("0")
    gave_up, stayed = [], []
    cancel = b.receive("k", None, gave_up.append)
    b.receive("k", None, stayed.append)
    cancel()
    b.receive("other", None, gave_up.append)()    # asked and given up at once
    from_parent(b, "k", np.arange(10.0))
    assert gave_up == [] and len(stayed) == 1
    from_parent(b, "other", np.arange(10.0), origin=8)
    assert gave_up == []


def test_the_master_sends_the_first_complete_copy_down_and_keeps_a_few():
    b, n = node("")
    vector = np.arange(10, dtype=np.float32)
    from_child(b, 1, "k", vector)
    for slot in n.slots:
        np.testing.assert_array_equal(carried(slot.link, "k"), vector)
    assert not any(from_child(b, 1, "k", vector + 1, origin=8))   # done: a second copy is moot
    for i in range(HELD + 2):
        assert b.publish(f"more/{i}", -1, vector) is None
    assert len(b.held) == HELD and not any(key == "k" for key, _ in b.held)


def test_a_process_publishes_through_its_node_in_pieces():
    b, n = node("0.1")
    vector = np.arange(10.0)
    assert b.publish("params/0", -1, vector) is None
    vector[:] = -1                                      # the process may reuse its memory
    np.testing.assert_array_equal(carried(n.parent, "params/0"), np.arange(10.0))
    n.parent = None
    assert "cut off from its parent" in b.publish("other", -1, vector)


def test_a_piece_that_does_not_fit_the_vector_begun_is_a_protocol_error():
    b, _ = node("0")
    (first, raw0), (msg, raw) = pieces("k", np.arange(10.0))[:2]
    b.child_dest(0, first, len(raw0))
    b.child_dest(0, msg, len(raw))
    with pytest.raises(ProtocolError, match="does not fit"):
        b.child_dest(0, msg, len(raw))                  # the same piece twice (past byte 0)
    with pytest.raises(ProtocolError, match="does not fit"):
        b.child_dest(0, Bcast("k", 7, -1, 72, 10, "float64"), 16)   # past the end


def test_a_lost_childs_half_copy_makes_way_for_another():
    b, _ = node("0")
    msg, raw = pieces("k", np.arange(10.0), origin=1)[0]
    b.child_dest(0, msg, len(raw))[:] = raw
    b.from_child(0, msg, raw)
    b.child_lost(0)
    assert all(from_child(b, 1, "k", np.arange(10.0), origin=2))


def test_a_copy_begun_again_by_the_same_child_starts_over():
    """A child's sender went away mid-copy and came back (a new link below the child, whose
    relay then starts over at byte 0): the half-received copy is dropped and the new one
    taken, instead of a protocol error that would close the honest child's link."""
    b, n = node("0")
    first = pieces("k", np.arange(10.0), origin=1)
    for msg, raw in first[:2]:
        b.child_dest(0, msg, len(raw))[:] = raw
        b.from_child(0, msg, raw)
    assert all(from_child(b, 0, "k", np.arange(10.0) + 1, origin=1))
    again = [bytes(p) for m, p in n.parent.sent if isinstance(m, Bcast)][2:]     # after the 2 first
    assert np.array_equal(np.frombuffer(b"".join(again)), np.arange(10.0) + 1)


def test_state_requests_go_up_and_the_masters_comes_down_to_everyone():
    b, n = node("0")
    b.states.want_state(5)
    assert n.parent.messages(WantState) == [WantState(5)]
    told = []
    b.states.on_state_request.connect(told.append)
    b.states.state_requested(5)
    assert told == [5] and b.states.state_request == 5
    assert all(slot.link.messages(WantState) == [WantState(5)] for slot in n.slots)
    assert state_key(5) == "state/5"


def test_a_new_job_forgets_everything():
    b, _ = node("0")
    from_parent(b, "k", np.arange(3.0))
    b.states.state_requested(3)
    b.new_job()
    assert not b.held and b.states.state_request == 0


def test_a_claim_no_host_could_hold_is_a_protocol_error_and_nothing_is_allocated_for_claims():
    """Issue 26 row 3: a claim is checked against this host's memory, and a vector's
    memory comes piece by piece with its bytes, never for what is only claimed."""
    n = Neighbours()
    n.parent = FakeLink("parent")
    n.slots = [ChildSlot(link=FakeLink(f"child {k}")) for k in range(2)]
    place = Place("0", TREE.layer("0"), TREE, "cr", "auto", CHUNK)
    b = Broadcasts(n, lambda: place, max_bytes=1 << 20)
    with pytest.raises(ProtocolError, match="more than this host's memory"):
        b.child_dest(0, Bcast("k", 1, -1, 0, (1 << 17) + 1, "float64"), 8)
    dest = b.child_dest(0, Bcast("k", 1, -1, 0, 1 << 17, "float64"), 8)   # 1 MiB claimed
    assert dest is not None and len(dest) == 8 and dest.obj is not None and len(dest.obj) == 8


def test_a_child_that_begins_many_broadcasts_drops_its_own_oldest_not_anothers():
    b, _ = node("0")
    first = pieces("theirs", np.arange(10.0), origin=1)[0]
    assert b.child_dest(1, first[0], len(first[1])) is not None      # child 1's, half-sent
    for i in range(PER_SOURCE + 2):                                   # child 0 begins many
        msg, raw = pieces(f"mine/{i}", np.arange(10.0), origin=2)[0]
        assert b.child_dest(0, msg, len(raw)) is not None
    msg, raw = pieces("theirs", np.arange(10.0), origin=1)[1]
    assert b.child_dest(1, msg, len(raw)) is not None                 # child 1's goes on
    msg, raw = pieces("mine/0", np.arange(10.0), origin=2)[1]
    with pytest.raises(ProtocolError, match="does not fit"):
        b.child_dest(0, msg, len(raw))          # its oldest was dropped: begun anew, not at 0


def test_a_child_without_processes_of_the_job_below_it_sends_no_broadcast_nor_request():
    """Issue 26 row 7: only a child with processes of the job attached below it speaks for
    them (``attached_below``): its copy of a key is dropped, its state requests too."""
    n = Neighbours()
    n.parent = FakeLink("parent")
    n.slots = [ChildSlot(link=FakeLink(f"child {k}")) for k in range(2)]
    place = Place("0", TREE.layer("0"), TREE, "cr", "auto", CHUNK)
    b = Broadcasts(n, lambda: place, attached_below=lambda k: k)     # child 0: none
    assert not any(from_child(b, 0, "params", np.full(10, 666.0), origin=1))
    assert all(from_child(b, 1, "params", np.arange(10.0), origin=2))
    np.testing.assert_array_equal(carried(n.parent, "params"), np.arange(10.0))
    b.states.want_state(5, child=0)
    b.states.want_state(6, child=1)
    assert n.parent.messages(WantState) == [WantState(6)]


@pytest.mark.timeout(30)
async def test_the_master_sends_a_state_request_down_at_most_once_a_pause():
    """Issue 26 row 7: however many requests come, each process is asked for its state at
    most once every STATE_PAUSE seconds; a request that came sooner goes once its turn
    comes (the newest of them)."""
    b, n = node("")
    for nonce in (1, 2, 3):
        b.states.want_state(nonce, child=0)
    assert [slot.link.messages(WantState) for slot in n.slots] == [[WantState(1)]] * 2
    await asyncio.sleep(STATE_PAUSE + 0.2)
    assert [slot.link.messages(WantState) for slot in n.slots] == [[WantState(1), WantState(3)]] * 2


STAR = Tree.regular(3, 1, 1)    # the master and three children


def master_with(here: list, tree: Tree = TREE, below=lambda k: 1, window: float = 30.0):
    """The master's Broadcasts, whose host's processes of the job are ``here`` (a list the
    test changes), with ``below(k)`` processes of the job below child ``k``."""
    n = Neighbours()
    n.slots = [ChildSlot(link=FakeLink(f"child {k}")) for k in range(len(tree.children("")))]
    place = Place("", 0, tree, "cr", "auto", CHUNK)
    return Broadcasts(n, lambda: place, attached_below=below, here=lambda: here,
                      window=window), n


def waiting(b, key="state/5"):
    got = []
    b.receive(key, None, lambda held: got.append(held.vector.copy()))
    return got


@pytest.mark.timeout(30)
async def test_the_master_takes_its_own_hosts_state_answer_over_another_hosts_sent_first():
    """Process A at the master asks; process B there can answer: a child's answer that
    comes first is kept aside, and B's is the one, even while another child's copy is
    half-received."""
    a, b_ = object(), object()
    b, n = master_with([a, b_])
    got = waiting(b)
    b.states.want_state(5, asker=a)
    assert all(from_child(b, 0, "state/5", np.full(10, 666.0), origin=1))
    msg, raw = pieces("state/5", np.full(10, 667.0), origin=2)[0]
    assert b.child_dest(1, msg, len(raw)) is not None      # another one, half-sent
    assert got == [] and not b.held
    assert b.publish("state/5", 3, np.arange(10.0)) is None
    np.testing.assert_array_equal(got[0], np.arange(10.0))
    np.testing.assert_array_equal(carried(n.slots[0].link, "state/5"), np.arange(10.0))
    assert not any(from_child(b, 0, "state/5", np.full(10, 668.0), origin=3))
    b.states.answers.served(a)                                            # A can answer from now on




@pytest.mark.timeout(30)
async def test_without_a_process_here_that_can_answer_the_state_two_child_slots_agree_on_is_the_one():
    """Issue 26: every process at the master asks. Child 2's answer comes first and is not
    taken; child 0's differs; child 1's agrees with child 0's: that state is taken, and a
    fourth copy is moot."""
    a = object()
    b, n = master_with([a], STAR)
    got = waiting(b)
    b.states.want_state(5, asker=a)
    assert all(from_child(b, 2, "state/5", np.full(10, 666.0), origin=1))
    assert all(from_child(b, 0, "state/5", np.arange(10.0), origin=2))
    assert got == [] and not b.held
    assert all(from_child(b, 1, "state/5", np.arange(10.0), origin=3))
    np.testing.assert_array_equal(got[0], np.arange(10.0))
    np.testing.assert_array_equal(carried(n.slots[2].link, "state/5"), np.arange(10.0))
    assert not any(from_child(b, 2, "state/5", np.full(10, 666.0), origin=4))


@pytest.mark.timeout(30)
async def test_the_same_bytes_after_another_step_are_another_state():
    """An answer says which step the state is after: two copies agree only on both."""
    a = object()
    b, _ = master_with([a], STAR)
    got = waiting(b)
    b.states.want_state(5, asker=a)
    for k, step in ((2, 7), (0, 3)):
        assert all(from_child(b, k, "state/5", np.arange(10.0), origin=k + 1, step=step))
    assert got == []


@pytest.mark.timeout(30)
async def test_the_copy_of_the_only_child_slot_with_processes_of_the_job_needs_no_second():
    a = object()
    b, _ = master_with([a], STAR, below=lambda k: int(k == 1))
    got = waiting(b)
    b.states.want_state(5, asker=a)
    assert all(from_child(b, 1, "state/5", np.arange(10.0), origin=1))
    np.testing.assert_array_equal(got[0], np.arange(10.0))


@pytest.mark.timeout(30)
async def test_a_lone_state_is_taken_once_the_window_after_it_ends_with_no_other():
    """Two slots have processes of the job, only one answers (the other's all ask): its
    state is taken ``window`` after it came, not before."""
    a = object()
    b, _ = master_with([a], window=0.3)
    got = waiting(b)
    b.states.want_state(5, asker=a)
    assert all(from_child(b, 0, "state/5", np.arange(10.0), origin=1))
    await asyncio.sleep(0.15)
    assert got == []
    await asyncio.sleep(0.3)
    np.testing.assert_array_equal(got[0], np.arange(10.0))


@pytest.mark.timeout(30)
async def test_copies_that_disagree_decide_nothing_until_two_slots_agree(caplog):
    """Slots 2 and 0 disagree: nothing is taken, even after the window, and the master
    says so once (naming the slots); slot 1's copy, which agrees with slot 0's, decides."""
    a = object()
    b, _ = master_with([a], STAR, window=0.2)
    got = waiting(b)
    b.states.want_state(5, asker=a)
    with caplog.at_level("WARNING", logger="crnet.node"):
        assert all(from_child(b, 2, "state/5", np.full(10, 666.0), origin=1))
        assert all(from_child(b, 0, "state/5", np.arange(10.0), origin=2))
        await asyncio.sleep(0.4)
        assert got == []
        warned = [r.getMessage() for r in caplog.records if "disagree" in r.getMessage()]
        assert len(warned) == 1 and "child slots 2 / 0" in warned[0], warned
        assert all(from_child(b, 1, "state/5", np.arange(10.0), origin=3))
    np.testing.assert_array_equal(got[0], np.arange(10.0))


@pytest.mark.timeout(30)
async def test_copies_wait_while_a_process_here_can_answer_and_vote_once_none_can():
    """Two children's copies agree while B (at the master) can answer: nothing is taken
    until B leaves; then their state is."""
    a, b_ = object(), object()
    here = [a, b_]
    b, _ = master_with(here, STAR)
    got = waiting(b)
    b.states.want_state(5, asker=a)
    assert all(from_child(b, 0, "state/5", np.full(10, 2.0), origin=1))
    assert all(from_child(b, 1, "state/5", np.full(10, 2.0), origin=2))
    assert got == []
    here.remove(b_)
    b.states.left(b_)
    np.testing.assert_array_equal(got[0], np.full(10, 2.0))


@pytest.mark.timeout(30)
async def test_the_master_keeps_the_bytes_of_two_states_at_most_and_counts_the_rest_by_digest():
    """Three slots send three different states: the third's pieces are hashed and dropped
    as they come. A copy that agrees with a kept one decides; answers to a request the
    master did not send down are not taken at all."""
    a = object()
    tree = Tree.regular(4, 1, 1)
    b, _ = master_with([a], tree)
    got = waiting(b)
    assert not any(from_child(b, 0, "state/4", np.arange(10.0), origin=9))   # not asked
    b.states.want_state(5, asker=a)
    for k in range(KEPT):
        assert all(from_child(b, k, "state/5", np.full(10, float(k)), origin=k + 1))
    third = pieces("state/5", np.full(10, 7.0), origin=3)
    for msg, raw in third:
        dest = b.child_dest(2, msg, len(raw))
        dest[:] = raw
        b.from_child(2, msg, dest)
        assert all(not x.pieces for x in b._up.values())     # nothing of it kept
    assert got == []
    assert all(from_child(b, 3, "state/5", np.full(10, 1.0), origin=4))
    np.testing.assert_array_equal(got[0], np.full(10, 1.0))


@pytest.mark.timeout(30)
async def test_when_the_answers_split_the_master_asks_once_more_and_its_answers_serve_the_asker():
    """Slots 0 and 1 answer request 5 with states after different steps (one straggled):
    the master sends a request of its own down (once its turn comes); their answers to it
    agree, and the asker of request 5 gets that state."""
    a = object()
    b, n = master_with([a])
    got = waiting(b)
    b.states.want_state(5, asker=a)
    for k, step in ((0, 3), (1, 4)):
        assert all(from_child(b, k, "state/5", np.arange(10.0), origin=k + 1, step=step))
    assert got == [] and n.slots[0].link.messages(WantState) == [WantState(5)]
    await asyncio.sleep(STATE_PAUSE + 0.2)
    again = n.slots[0].link.messages(WantState)[1:]
    assert len(again) == 1 and again == n.slots[1].link.messages(WantState)[1:]
    for k in (0, 1):
        assert all(from_child(b, k, state_key(again[0].nonce), np.arange(10.0), origin=k + 3))
    np.testing.assert_array_equal(got[0], np.arange(10.0))
