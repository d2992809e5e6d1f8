"""Membership with fake links: child slots, refusals, JOINED counts, the plan and ASSIGN,
a child's loss, a node taking (or refusing) its place, and what the tree knows (its
newest result and its vector) passed on in WELCOME and JOINED."""

import asyncio

import numpy as np
import pytest

from crnet.coding.plan import Tree, plan
from crnet.errors import JoinRefused, ProtocolError
from crnet.node.collectives.jobs import JOB_GRACE
from crnet.node.join.dial import keep_connected
from crnet.node.join.membership import JoinState, subtree_workers
from crnet.node.steps import Failed, Lost, vouched, vouched_floor
from crnet.protocol.allocation import NodeShare, pack_allocation, parse_allocation
from crnet.protocol.messages import (
    Assign,
    Chunk,
    Hello,
    Job,
    Joined,
    RingPlace,
    Welcome,
)
from crnet.schemes import Origin, Place
from crnet.schemes.chunks import ChunkLayout

from ..helpers.fake_links import FakeLink

pytestmark = pytest.mark.timeout(30)

TREE = Tree.regular(2, 2, 1)     # master -> 0, 1 -> 0.0, 0.1, 1.0, 1.1: N = 6
SAMPLES = 60
CHUNK_BYTES = 32


def place(name, tree=TREE, scheme="cr"):
    return Place(name, tree.layer(name), tree, scheme, "auto", CHUNK_BYTES)


@pytest.fixture
def master(membership):
    return membership(place(""), SAMPLES)


def welcome(name, tree=TREE, scheme="cr", tree_step=-1, total=None, dtype=None):
    return Welcome(name, tree.layer(name), tree.fanout, tree.stragglers, "auto", CHUNK_BYTES, scheme,
                   tree_step, total, dtype)


def shares_of(subtree_root):
    p = plan(TREE, SAMPLES)
    return {a.name: NodeShare(a.layer, tuple(a.local), tuple(a.responsibility))
            for a in p.nodes.values()
            if a.name == subtree_root or a.name.startswith(subtree_root + ".")}


# ---------------------------------------------------------------- slots

def test_a_child_gets_the_first_free_slot_and_its_place(master):
    a, b = FakeLink("10.0.0.5:40001"), FakeLink("10.0.0.6:40002")
    assert master.child_hello(a, Hello()) == 0
    assert master.child_hello(b, Hello(listen="10.0.0.6:7000")) == 1
    assert a.messages() == [welcome("0")]
    assert b.messages() == [welcome("1")]
    slots = master.neighbours.slots
    assert [s.link for s in slots] == [a, b]
    assert [s.address for s in slots] == [None, "10.0.0.6:7000"]


def test_a_child_may_name_its_slot(master):
    b, a = FakeLink(), FakeLink()
    assert master.child_hello(b, Hello("1")) == 1
    assert master.child_hello(a, Hello()) == 0
    assert b.messages() == [welcome("1")] and a.messages() == [welcome("0")]


def test_a_child_listening_everywhere_is_reached_at_its_address(master):
    master.child_hello(FakeLink("10.0.0.7:51234"), Hello(listen="0.0.0.0:7001"))
    assert master.neighbours.slots[0].address == "10.0.0.7:7001"


def refuse(m, hello):
    link = FakeLink()
    before = [(s.link, s.address) for s in m.neighbours.slots]
    with pytest.raises(JoinRefused) as e:
        m.child_hello(link, hello)
    assert link.messages() == []     # ChildLink sends the REFUSE, not membership
    assert [(s.link, s.address) for s in m.neighbours.slots] == before
    return e.value


@pytest.mark.parametrize("name", ["2", "0.1", ""])
def test_a_name_that_is_not_a_child_is_refused_for_good(master, name):
    e = refuse(master, Hello(name))
    assert e.reason == f"{name!r} is not a child of master (its children are 0..1)"
    assert e.retry is False


def test_a_slot_held_by_a_live_connection_is_refused_for_now(master):
    master.child_hello(FakeLink(), Hello("0"))
    e = refuse(master, Hello("0"))
    assert e.reason == "slot 0 of master is held by a live connection"
    assert e.retry is True


def test_a_full_parent_refuses_for_good(master):
    master.child_hello(FakeLink(), Hello())
    master.child_hello(FakeLink(), Hello())
    e = refuse(master, Hello())
    assert (e.reason, e.retry) == ("master has all 2 child slots taken", False)


def test_a_leaf_refuses_children(membership):
    e = refuse(membership(place("1.0")), Hello())
    assert (e.reason, e.retry) == ("node 1.0 is a leaf (layer 2 of 2): it accepts no children", False)


def test_a_node_without_a_place_asks_children_to_retry(membership):
    e = refuse(membership(), Hello())
    assert (e.reason, e.retry) == ("node (joining) has not joined the tree yet", True)


def test_a_lost_child_frees_its_slot_for_its_return(master):
    old, new = FakeLink(), FakeLink()
    master.child_hello(old, Hello(listen="10.0.0.5:7000"))
    master.engine.window.seen(12)           # steps were under way when it came back
    master.child_lost(0, new)               # not the slot's connection: ignored
    assert master.neighbours.slots[0].link is old
    master.child_lost(0, old)
    assert master.neighbours.slots[0].link is None
    assert master.neighbours.slots[0].address == "10.0.0.5:7000"   # its ring address stays
    assert master.child_hello(new, Hello("0")) == 0
    assert master.neighbours.slots[0].missed_through == 12


# ---------------------------------------------------------------- JOINED and ASSIGN

def test_a_node_reports_its_subtrees_joined_workers_to_its_parent(membership):
    m = membership()
    m.listen_address = "10.0.0.1:7000"
    m.welcomed(welcome("0"))
    parent = FakeLink("parent")
    m.neighbours.parent = parent
    c0, c1 = FakeLink(), FakeLink()
    m.child_hello(c0, Hello())
    m.child_joined(0, Joined(1))
    m.child_joined(0, Joined(1))            # the same count again: nothing new to say
    m.child_hello(c1, Hello())
    m.child_joined(1, Joined(1))
    m.child_lost(0, c0)
    assert parent.messages() == [Joined(2), Joined(3), Joined(2)]


def test_the_master_says_workers_left_when_its_count_falls(master, caplog):
    a, b = FakeLink(), FakeLink()
    master.child_hello(a, Hello())
    master.child_hello(b, Hello())
    with caplog.at_level("INFO", logger="crnet.node"):
        master.child_joined(0, Joined(3))
        master.child_joined(1, Joined(3))
        master.child_lost(0, a)
    said = [r.getMessage() for r in caplog.records if "workers" in r.getMessage()]
    assert said[:2] == ["3/6 workers joined", "6/6 workers joined"]
    assert "3/6 workers connected (3 left)" in said
    assert not any(m.endswith("joined") for m in said[2:]), said


@pytest.mark.parametrize("tree, layer, workers", [
    (TREE, 1, 3), (TREE, 2, 1), (Tree((3, 4, 5), (0, 0, 0)), 1, 25), (Tree((7,), (0,)), 1, 1)])
def test_a_subtree_holds_its_root_and_every_node_below(tree, layer, workers):
    assert subtree_workers(tree, layer) == workers
    assert tree.fanout[0] * subtree_workers(tree, 1) == tree.workers


def test_a_joined_count_beyond_the_childs_subtree_is_a_protocol_error(master):
    a, b = FakeLink(), FakeLink()
    master.child_hello(a, Hello())
    master.child_hello(b, Hello())
    master.child_joined(0, Joined(3))       # all of subtree 0
    with pytest.raises(ProtocolError, match=r"^JOINED: child 1 counts 6 workers, but its "
                                            r"subtree holds 3$"):
        master.child_joined(1, Joined(6, 99, "other job"))
    assert [s.workers for s in master.neighbours.slots] == [3, 0]
    assert master.allocation is None and master.state is JoinState.WELCOMED
    assert master.engine.window.tree_step == -1 and master.job == ""      # nothing else taken from it
    master.child_joined(1, Joined(3))       # the honest count plans the tree as before
    assert master.state is JoinState.ASSIGNED


def test_a_node_bounds_its_childrens_counts_by_their_subtrees(membership):
    m = membership()
    m.listen_address = "10.0.0.1:7000"
    m.welcomed(welcome("0"))                # layer 1 of 2: its children are leaves
    m.neighbours.parent = parent = FakeLink("parent")
    m.child_hello(FakeLink(), Hello())
    with pytest.raises(ProtocolError, match="counts 2 workers, but its subtree holds 1"):
        m.child_joined(0, Joined(2))
    assert parent.messages() == []


def test_once_all_workers_joined_each_child_is_assigned_its_subtree_once(master):
    assigned = []
    master.on_assigned.connect(lambda _: assigned.append(master.state))
    a, b = FakeLink(), FakeLink()
    master.child_hello(a, Hello())
    master.child_hello(b, Hello())
    master.child_joined(0, Joined(3))
    assert master.state is JoinState.WELCOMED and master.allocation is None
    assert a.messages(Assign) == [] and assigned == []

    master.child_joined(1, Joined(3))       # 6 of 6
    assert master.state is JoinState.ASSIGNED
    assert assigned == [JoinState.ASSIGNED]
    assert master.engine.place == master.place and master.engine.scheme is not None
    for link, root in ((a, "0"), (b, "1")):
        [(msg, payload)] = [(m, p) for m, p in link.sent if isinstance(m, Assign)]
        assert msg == Assign(SAMPLES, None)
        assert parse_allocation(payload, SAMPLES) == shares_of(root)
    master.child_joined(0, Joined(3))       # a repeated count sends no second ASSIGN
    assert len(a.messages(Assign)) == len(b.messages(Assign)) == 1
    assert master.assignment() == {"name": "", "layer": 0, "samples": SAMPLES, "workers": 6,
                                   "ranges": [], "process": 0, "processes": 1, "rank": 0}
    assert assigned == [JoinState.ASSIGNED]


def test_a_ring_is_the_workers_then_the_master_and_the_last_worker_dials_its_parent(membership):
    ring = Tree((3,), (0,))
    master = membership(place("", ring, "rar"), SAMPLES)
    links = [FakeLink() for _ in range(3)]
    for k, link in enumerate(links):
        master.child_hello(link, Hello(listen=f"10.0.0.{k + 2}:7000"))
    for k in range(3):
        master.child_joined(k, Joined(1))
    # Successor, then predecessor (where a successor asks to confirm its link): None is the
    # master, at the worker's parent's address.
    assert [link.messages(Assign)[0].ring for link in links] == [
        RingPlace(0, 4, "10.0.0.3:7000", None), RingPlace(1, 4, "10.0.0.4:7000", "10.0.0.2:7000"),
        RingPlace(2, 4, None, "10.0.0.3:7000")]
    assert master.place.ring == RingPlace(3, 4, "10.0.0.2:7000", "10.0.0.4:7000")   # worker 0, 2
    assert master.engine.place.ring == master.place.ring


def test_a_child_that_rejoins_after_the_plan_is_assigned_again(master):
    a, b, back = FakeLink(), FakeLink(), FakeLink()
    master.child_hello(a, Hello())
    master.child_hello(b, Hello())
    master.child_joined(0, Joined(3))
    master.child_joined(1, Joined(3))
    master.child_lost(0, a)
    master.child_hello(back, Hello("0"))
    assert back.messages(Assign) == []      # it has not said how many workers it brings
    master.child_joined(0, Joined(3))
    [(_, payload)] = [(m, p) for m, p in back.sent if isinstance(m, Assign)]
    assert parse_allocation(payload, SAMPLES) == shares_of("0")
    assert len(b.messages(Assign)) == 1


async def test_losing_children_is_told_to_the_step_engine(master):
    a, b = FakeLink(), FakeLink()
    master.child_hello(a, Hello())
    master.child_hello(b, Hello())
    master.child_joined(0, Joined(3))
    master.child_joined(1, Joined(3))
    outcomes = []
    master.engine.request(7, None, outcomes.append)
    # Child 1's chunk header arrived (the step is under way); then both children go.
    assert master.engine.piece_dest(Origin.CHILD, 1, Chunk(7, 0, 4, "float64"), 32) is not None
    master.child_lost(1, b)
    assert outcomes == []                   # s = 1: child 0 alone still decodes
    master.child_lost(0, a)
    assert outcomes == [Failed(7, "master did not get 1 of 2 children: 2 of them are gone or "
                                  "failed (child 0: disconnected; child 1: disconnected)",
                               tree_wide=True)]
    for link in (a, b):                     # both were gone before the decision went down
        assert [m for m in link.messages() if not isinstance(m, (Welcome, Assign))] == []
    assert master.neighbours.absent_children() == {0: "disconnected", 1: "disconnected"}


# ---------------------------------------------------------------- a node takes its place

def test_a_welcomed_node_takes_its_place(membership):
    m = membership()
    m.listen_address = "10.0.0.1:7000"
    assert m.state is JoinState.JOINING
    m.welcomed(welcome("1"))
    assert m.place == place("1")
    assert m.state is JoinState.WELCOMED
    assert len(m.neighbours.slots) == 2


def test_a_leaf_needs_no_listen_address(membership):
    m = membership()
    m.welcomed(welcome("0.1"))
    assert m.place == place("0.1") and m.neighbours.slots == []


@pytest.mark.parametrize("msg, reason", [
    (Welcome("0", 1, (3,), (1,), "auto", CHUNK_BYTES, "cr"),
     "the parent's tree Tree(fanout=(3,), stragglers=(1,)) differs from the one this node joined"),
    (welcome("1"), "the parent gave this node slot 1, but it is 0"),
])
def test_a_node_refuses_a_different_place_than_its_own(membership, msg, reason):
    """A ProtocolError, not a refusal for good: the WELCOME may come from anyone at the
    parent's address, so the node drops that link and dials again (dial.py)."""
    m = membership()
    m.listen_address = "10.0.0.1:7000"
    m.welcomed(welcome("0"))
    with pytest.raises(ProtocolError) as e:
        m.welcomed(msg)
    assert str(e.value) == reason
    assert m.place == place("0")


@pytest.mark.parametrize("msg, reason", [
    (welcome("0"), "node 0 is at layer 1 of 2 and must accept children: start it with --listen"),
    (welcome("1", Tree((2,), (0,)), "rar"),
     "node 1 takes pieces from its peers (--scheme rar) and must accept them: start it with --listen"),
])
def test_a_node_that_must_accept_peers_needs_a_listen_address(membership, msg, reason):
    """Its configuration is wrong: a refusal for good (the node stops), not a ProtocolError."""
    m = membership()
    with pytest.raises(JoinRefused) as e:
        m.welcomed(msg)
    assert str(e.value) == reason and not e.value.retry
    assert m.place is None and m.state is JoinState.JOINING and m.neighbours.slots == []


def test_a_node_assigned_its_subtree_starts_its_steps(membership):
    m = membership()
    m.listen_address = "10.0.0.1:7000"
    m.welcomed(welcome("1"))
    m.assigned(Assign(SAMPLES), memoryview(pack_allocation(shares_of("1"))))
    assert m.state is JoinState.ASSIGNED
    assert m.engine.place == place("1") and m.engine.scheme is not None
    local = shares_of("1")["1"].local
    assert m.assignment() == {"name": "1", "layer": 1, "samples": SAMPLES, "workers": 6,
                              "ranges": [list(r) for r in local], "process": 0, "processes": 1,
                              "rank": 2}     # the master is 0, node 0 is 1
    first, second = m.assignment(0, 2)["ranges"], m.assignment(1, 2)["ranges"]
    assert sum(b - a for a, b, _ in first + second) == sum(b - a for a, b, _ in local)


def test_an_assignment_without_this_nodes_share_is_a_protocol_error(membership):
    m = membership()
    m.listen_address = "10.0.0.1:7000"
    m.welcomed(welcome("1"))
    with pytest.raises(ProtocolError, match=r"^ASSIGN: the allocation has no share for node 1$"):
        m.assigned(Assign(SAMPLES), memoryview(pack_allocation(shares_of("0"))))
    assert m.state is JoinState.WELCOMED and m.allocation is None


# ---------------------------------------------------------------- what the tree knows

def test_welcome_tells_a_child_where_the_tree_is_and_its_vector(master):
    before = FakeLink()
    master.child_hello(before, Hello())     # before any result: nothing to tell
    assert before.messages() == [welcome("0")]
    master.engine.decisions.resolved(12, ChunkLayout.of(10, np.float32, CHUNK_BYTES),
                                     np.zeros(10, np.float32))
    after = FakeLink()
    master.child_hello(after, Hello())
    assert after.messages() == [welcome("1", tree_step=12, total=10, dtype="float32")]


def test_a_welcomed_node_learns_where_the_tree_is(membership):
    m = membership()
    m.listen_address = "10.0.0.1:7000"
    m.welcomed(welcome("0", tree_step=40, total=10, dtype="float64"))
    assert m.engine.window.tree_step == 40 and m.engine.window.tree_vector == (10, "float64")
    outcomes = []                           # a step behind the window is decided here now
    behind = m.engine.settings.behind
    m.engine.request(40 - behind, None, outcomes.append)
    assert [type(o) for o in outcomes] == [Lost]
    m.welcomed(welcome("0", tree_step=3))   # a parent that knows less moves nothing back
    assert m.engine.window.tree_step == 40 and m.engine.window.tree_vector == (10, "float64")


def test_joined_carries_the_newest_result_up(membership):
    m = membership()
    m.listen_address = "10.0.0.1:7000"
    m.welcomed(welcome("0", tree_step=21))
    parent = FakeLink("parent")
    m.neighbours.parent = parent
    m.child_hello(FakeLink(), Hello())
    m.child_joined(0, Joined(1, 21))
    assert parent.messages() == [Joined(2, 21)]


def test_a_restarted_master_resumes_where_its_children_are(master):
    a, b = FakeLink(), FakeLink()
    master.child_hello(a, Hello())
    master.child_joined(0, Joined(3, 57))   # its children knew step 57's result
    assert master.engine.window.tree_step == -1   # taken when all have joined, not before
    master.child_hello(b, Hello())
    master.child_joined(1, Joined(3, 50))   # an older one, within the window of 57
    assert master.engine.window.tree_step == 57
    master.child_lost(1, b)
    c = FakeLink()
    master.child_hello(c, Hello())
    assert c.messages()[0] == welcome("1", tree_step=57)


def test_a_claim_far_ahead_of_the_other_childrens_moves_no_master(master):
    """Issue 26, row 1: a child's word for where the tree is counts only as far as s + 1
    children vouch for it (a restarted master), and not at all once the master has a
    state of its own (every step it decided)."""
    master.child_hello(FakeLink(), Hello())
    master.child_hello(FakeLink(), Hello())
    master.child_joined(0, Joined(3, 10 ** 6))
    master.child_joined(1, Joined(3, 57))   # 6 of 6: planned
    assert master.engine.window.tree_step == 57
    master.child_joined(0, Joined(2, 10 ** 6))   # once running, no claim moves it
    master.child_joined(0, Joined(3, 10 ** 6))
    assert master.engine.window.tree_step == 57


async def test_a_restarted_masters_job_holds_until_every_child_said_what_it_runs(master):
    """Issue 39 row 7 at a master restart (the authenticated fuzzer, --restart-master): the
    master, planned again, learned that the tree is mid-job (step 57) but has no child's
    count of processes yet. A JOB of another job from one child (a secret holder) must not
    start that job before the other children said theirs: it did, every host began 'evil'
    at step 0, and the unnamed job's processes were refused for good."""
    master.child_hello(FakeLink(), Hello())
    master.child_hello(FakeLink(), Hello())
    master.child_joined(0, Joined(3, 57))
    master.child_joined(1, Joined(3, 57))   # 6 of 6: planned, the tree at step 57
    assert master.engine.window.tree_step == 57
    master.child_job(0, Job("evil", 1))
    assert master.job == ""                 # child 1 has not said what it runs
    master.child_job(1, Job("", 3))         # processes of the running (unnamed) job
    await asyncio.sleep(JOB_GRACE + 0.2)
    assert master.job == ""                 # turned away: the running job has processes


def refusals(link: FakeLink) -> list[Job]:
    return [m for m in link.messages() if isinstance(m, Job) and m.refused]


async def test_a_job_one_host_claims_on_an_idle_tree_yields_to_one_on_two_hosts(master):
    """Issue 39 row 7: on an idle tree a host that holds the secret asks for a job of its
    own (JOB, within its seats) and gets it, as the first to ask does; then every other
    job's processes were turned away (DaemonBusy) for as long as it kept the claim, and it
    never ran a step. A job that has decided no step and has processes on one host only
    holds the tree provisionally: a job on two hosts starts over it, and meanwhile its
    processes wait, not turned away."""
    a, b = FakeLink(), FakeLink()
    master.child_hello(a, Hello())
    master.child_hello(b, Hello())
    master.child_joined(0, Joined(3))
    master.child_joined(1, Joined(3))       # 6 of 6: planned, no job yet
    master.child_job(0, Job("evil", 1))
    assert master.job == "evil"             # the first to ask an idle tree runs
    master.child_job(1, Job("real", 3))
    assert master.job == "evil"             # one host each: the first holds ...
    await asyncio.sleep(JOB_GRACE + 0.2)
    assert master.job == "evil" and not refusals(b)   # ... and the other waits
    process = object()
    master.jobs.attached(process, "real")   # a process of it on the master's host too
    assert master.job == "real"
    master.child_job(0, Job("evil", 1))     # asked again: the running job is on two hosts
    await asyncio.sleep(JOB_GRACE + 0.2)
    assert master.job == "real" and [m.refused for m in refusals(a)] == ["evil"]


async def test_a_job_under_way_on_one_host_is_not_taken_over(master):
    """The provisional hold ends with the first decided step: a job under way keeps the
    tree while any process of it is attached, however many hosts another job has."""
    a, b = FakeLink(), FakeLink()
    master.child_hello(a, Hello())
    master.child_hello(b, Hello())
    master.child_joined(0, Joined(3))
    master.child_joined(1, Joined(3))
    master.child_job(0, Job("old", 1))
    assert master.job == "old"
    master.engine.window.tree_step = 0      # its first step decided
    master.child_job(1, Job("new", 3))
    master.jobs.attached(object(), "new")
    await asyncio.sleep(JOB_GRACE + 0.2)
    assert master.job == "old" and [m.refused for m in refusals(b)] == ["new"]


async def test_a_job_a_child_asks_for_before_the_plan_is_weighed_once_it_is_made(master):
    """The authenticated fuzzer, --restart-master: a secret holder, the first child to join
    a restarted master, asked for job 'evil' (JOB) before the master had planned. The
    master started it at once (it knew no job and no step yet); the honest children, then
    welcomed into 'evil', began it at step 0 and refused every step of the running job's
    processes. Now the request waits for the plan, and is weighed as any other then."""
    master.child_hello(FakeLink(), Hello())
    master.child_joined(0, Joined(3, 57))
    master.child_job(0, Job("evil", 1))
    assert master.job == ""                 # not planned yet: nothing is decided
    master.child_hello(FakeLink(), Hello())
    master.child_joined(1, Joined(3, 57))   # 6 of 6: planned, the tree at step 57
    assert master.job == "" and master.engine.window.tree_step == 57
    master.child_job(1, Job("", 3))         # processes of the running (unnamed) job
    await asyncio.sleep(JOB_GRACE + 0.2)
    assert master.job == ""


def test_a_restarted_master_takes_as_settled_only_what_s_plus_1_children_claim(master):
    """Issue 54 row 2: steps the master before its restart may have decided (a failure of
    one is lost for the tree, not failed) go as far as s + 1 children say, not as far as
    the newest claim: a secret holder's 10^6 made the window's failures lost."""
    master.child_hello(FakeLink(), Hello())
    master.child_hello(FakeLink(), Hello())
    master.child_joined(0, Joined(3, 10 ** 6))
    master.child_joined(1, Joined(3, 57))   # 6 of 6: planned
    assert master.engine.decisions.settled_before == 57


@pytest.mark.parametrize(("claims", "s", "want"), [
    ([], 1, -1),
    ([-1, -1], 1, -1),                 # restarted children know nothing
    ([57], 1, -1),                     # fewer than s + 1 that know: a lone word may be a lie
    ([57, -1, -1], 1, -1),             # (at a job's start the honest children all say -1)
    ([-1, -1, 10 ** 6], 1, -1),
    ([57, -1, 10 ** 6], 1, 57),        # one far ahead of the other that knows
    ([57, 50, 60], 1, 60),             # honest children, a few steps apart: the newest
    ([57, 10 ** 6, 10 ** 6 + 1], 1, 10 ** 6 + 1),   # s + 1 vouch for it
    ([57, 57, 10 ** 6, 10 ** 6], 2, 57),
    ([57, 70, 80], 1, 80),             # within the window of the second newest
])
def test_vouched_takes_what_s_plus_1_children_vouch_for(claims, s, want):
    assert vouched(claims, s, 16) == want


@pytest.mark.parametrize(("claims", "s", "want"), [
    ([], 1, -1),
    ([-1, -1], 1, -1),
    ([57], 1, -1),                     # fewer than s + 1 claims: none
    ([-1, 10 ** 6, -1], 1, -1),
    ([57, -1, 10 ** 6], 1, 57),
    ([57, 50, 60], 1, 57),             # the second newest
    ([57, 70, 80], 1, 70),
    ([57, 57, 10 ** 6, 10 ** 6], 2, 57),
])
def test_vouched_floor_is_the_s_plus_1_th_newest_claim(claims, s, want):
    assert vouched_floor(claims, s) == want


# ---------------------------------------------------------------- staying joined (dial.py)

async def test_a_bad_link_is_dialed_again_and_only_a_refusal_for_good_stops_dialing(caplog):
    """Whoever answers at the parent's address may send a WELCOME the node cannot take
    (or fail to authenticate): that connection is dropped and the parent dialed again,
    as after a refusal for now. Only a refusal for good (an authenticated parent's, or
    any without a cluster secret) ends the loop (Membership then stops the node: exit 2)."""
    answers = [ProtocolError("a WELCOME this node cannot take: node 0 must accept children"),
               ProtocolError("parent 10.0.0.1:7070 answered WELCOME without authenticating"),
               JoinRefused("master has not joined the tree yet", retry=True),
               JoinRefused("master has all 2 child slots taken")]
    conns, refused = [], []

    async def dial(hello):
        conns.append(FakeLink("parent"))
        welcome = asyncio.get_running_loop().create_future()
        welcome.set_exception(answers[len(conns) - 1])
        return conns[-1], welcome

    with caplog.at_level("INFO", logger="crnet.node"):
        await asyncio.wait_for(keep_connected(
            "parent", dial, hello=Hello, up=lambda conn: pytest.fail("took a bad link"),
            down=lambda what: None, refused=refused.append, backoff=(0.001, 0.002)), 10)
    assert len(conns) == 4 and all(c.closed for c in conns)
    assert [e.reason for e in refused] == ["master has all 2 child slots taken"]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == ("parent: a WELCOME this node cannot take: node 0 must accept children; "
                        "dropped that connection, dialing again in 0.0 s")
    assert not any("without authenticating" in line for line in lines)   # one line per 10 s
    assert lines[1:] == ["parent asks to retry: 'master has not joined the tree yet'"]
