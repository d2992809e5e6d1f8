"""The step engine with a real CodedReduce scheme and fake links: one decision per step,
the deadlines (timeout, then grace), the window, OPEN, the parent's FAIL kinds, the
tree's vector, the outcome cache, catch-up, bounded bookkeeping, and an exact decode."""

import asyncio
from collections import Counter

import numpy as np
import pytest

from crnet import defaults
from crnet.coding.plan import Tree, plan
from crnet.errors import ProtocolError
from crnet.node.neighbours import ChildSlot
from crnet.node.steps import (
    EngineSettings,
    Failed,
    Lost,
    Mismatched,
    Refused,
    Resolved,
)
from crnet.node.steps.settings import physical_memory
from crnet.protocol.messages import Chunk, Fail, FailKind, Open, Result
from crnet.schemes import Origin, Place
from crnet.schemes.chunks import ChunkLayout

from ..helpers.engines import (
    PAIR,
    STAR,
    master,
    node,
    recorder,
    send_chunk,
    send_result,
    send_vector,
)
from ..helpers.fake_links import FakeLink, not_held
from ..helpers.waits import wait_until

pytestmark = pytest.mark.timeout(30)

SLACK = 0.005                      # timer slack when comparing the loop's clock


def coded(tree, dim=10, samples=24, seed=1):
    """Each of the master's children's coded messages for one step of integer-valued
    per-sample gradients, and the full gradient any n - s of them decode to."""
    grads = np.random.default_rng(seed).integers(-8, 8, (samples, dim)).astype(np.float64)
    shares = plan(tree, samples).nodes
    messages = [sum(w * grads[a:b].sum(axis=0) for a, b, w in shares[str(k)].local)
                for k in range(tree.fanout[0])]
    return messages, grads.sum(axis=0)


def peak_of(peaks: Counter, engine) -> None:
    for key, n in engine.bookkeeping().items():
        peaks[key] = max(peaks[key], n)


# ---------------------------------------------------------------- the step's time

async def test_a_step_decided_within_a_millisecond_still_takes_its_time(engine_at):
    """uvloop's clock counts whole milliseconds: a step's time read from it was 0.0 ms
    (`crnet status`'s LAST STEP, crnet_step_seconds) for steps decided within one."""
    import time

    engine = engine_at(master(), [FakeLink() for _ in range(3)])
    messages, _ = coded(STAR)
    seen = []
    for step in range(5):
        assert all(send_vector(engine, 0, step, messages[0]))     # the step begins here
        time.sleep(0.0002)
        assert all(send_vector(engine, 1, step, messages[1]))     # and is decided
        seen.append(engine.stats.times.step_seconds.last)
    assert engine.stats.steps_done == 5
    assert all(t >= 0.0002 for t in seen), seen


# ---------------------------------------------------------------- deadlines at the master

async def test_each_open_step_fails_at_its_own_deadline(engine_at):
    loop = asyncio.get_running_loop()
    timeout = 0.2
    children = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), children, timeout=timeout)
    first, second = recorder(loop), recorder(loop)
    open_when_first_failed = []

    t1 = loop.time()
    engine.request(1, np.zeros(4), lambda outcome: open_when_first_failed.append(engine.open_steps))
    engine.request(1, None, first)
    await asyncio.sleep(timeout / 4)   # the gap under test: step 2's clock starts later
    t2 = loop.time()
    engine.request(2, np.zeros(4), second)
    engine.request(1, np.zeros(4), recorder())   # a step opens once: this does not restart its clock
    assert engine.open_steps == [1, 2]

    one = await first.future
    assert open_when_first_failed == [[2]]     # step 2 is still running on its own clock
    two = await second.future
    assert one == Failed(1, "master did not get 2 of 3 children (got 0) within 0.2 s", True)
    assert two == Failed(2, "master did not get 2 of 3 children (got 0) within 0.2 s", True)
    assert engine.open_steps == [] and engine.is_decided(1) and engine.is_decided(2)
    assert engine.window.tree_step == 2           # the master decided both: the tree is at step 2
    assert engine.stats.steps_failed == 2
    for link in children:    # every child hears of both failures, decided for the whole tree
        assert link.messages() == [Fail(1, one.reason, FailKind.TREE),
                                   Fail(2, two.reason, FailKind.TREE)]
    # each was answered once, no earlier than its own deadline
    assert first.got == [one] and second.got == [two]
    assert first.times[0] >= t1 + timeout - SLACK
    assert second.times[0] >= t2 + timeout - SLACK


async def test_the_master_fails_a_step_at_once_when_more_than_s_children_are_gone(engine_at):
    child0 = FakeLink()
    engine = engine_at(master(), [child0, None, None])   # children 1 and 2 never joined
    answer = recorder()
    engine.request(4, None, answer)
    assert answer.got == [] and engine.open_steps == [4]
    assert not send_chunk(engine, 0, 4, 0, np.ones(8))   # child 0's chunk arrives: no quorum
    reason = ("master did not get 2 of 3 children: 2 of them are gone or failed "
              "(child 1: disconnected; child 2: disconnected)")
    assert answer.got == [Failed(4, reason, True)]
    assert child0.messages() == [Fail(4, reason, FailKind.TREE)]
    assert engine.window.tree_step == 4 and engine.open_steps == [] and engine.is_decided(4)


async def test_losing_children_during_a_step_fails_it_when_the_quorum_is_gone(engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links)
    answer = recorder()
    engine.request(6, None, answer)
    assert send_chunk(engine, 0, 6, 0, np.ones(8))       # the step is under way

    def lose(k):
        engine.neighbours.slots[k] = ChildSlot()          # as membership.child_lost does
        engine.child_lost(k)

    lose(1)
    assert answer.got == [] and engine.open_steps == [6]   # s = 1: one child may go
    lose(2)
    assert answer.got == [Failed(6, "master did not get 2 of 3 children: 2 of them are gone "
                                    "or failed (child 1: disconnected; child 2: disconnected)")]
    assert links[0].messages(Fail) == [Fail(6, answer.got[0].reason, FailKind.TREE)]
    assert links[1].messages() == links[2].messages() == []


@pytest.mark.parametrize("when", ["gone-before", "lost-after"])
async def test_the_masters_own_request_fails_at_once_when_more_than_s_children_are_gone(engine_at,
                                                                                       when):
    links = [FakeLink(), None, None] if when == "gone-before" else [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, timeout=30)
    answer = recorder()
    engine.request(4, np.zeros(8), answer)     # the master's training process asks for step 4
    if when == "lost-after":          # no child has sent anything yet
        assert answer.got == []
        for k in (1, 2):
            engine.neighbours.slots[k] = ChildSlot()
            engine.child_lost(k)
    assert answer.got == [Failed(4, "master did not get 2 of 3 children: 2 of them are gone or "
                                    "failed (child 1: disconnected; child 2: disconnected)")]


# ---------------------------------------------------------------- one decision per step

async def test_failing_a_newer_step_does_not_decide_an_older_open_one(engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links)
    messages, want = coded(STAR)
    one, two = recorder(), recorder()
    engine.request(1, None, one)
    engine.request(2, None, two)
    assert send_chunk(engine, 0, 1, 0, messages[0])     # step 1 is under way
    # Children 1 and 2 give up on step 2: more than s are out, the master fails it.
    engine.child_failed(1, Fail(2, "node 1 stalled", FailKind.STALL))
    engine.child_failed(2, Fail(2, "node 2 stalled", FailKind.STALL))
    reason = ("master did not get 2 of 3 children: 2 of them are gone or failed "
              "(child 1: node 1 stalled; child 2: node 2 stalled)")
    assert two.got == [Failed(2, reason, tree_wide=True)]
    for link in links:
        assert link.messages() == [Fail(2, reason, FailKind.TREE)]
    # Step 1 is not decided by it: still open, nobody answered it.
    assert one.got == [] and engine.open_steps == [1]
    assert engine.is_decided(2) and not engine.is_decided(1)
    assert engine.window.tree_step == 2             # the newest step the master decided
    # Step 1 goes on and resolves exactly from children 1 and 2 (and 0, for chunk 0).
    for k in (1, 2):
        assert all(send_vector(engine, k, 1, messages[k]))
    [outcome] = one.got
    assert isinstance(outcome, Resolved) and outcome.step == 1
    np.testing.assert_allclose(outcome.vector, want, rtol=1e-12, atol=1e-12)
    assert engine.window.tree_step == 2             # it only moves forward
    assert engine.outcome(2) == two.got[0]   # step 2's failure stands
    assert engine.stats.steps_done == 1 and engine.stats.steps_failed == 1


async def test_a_later_result_does_not_decide_an_older_open_step(engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links)
    messages, _ = coded(STAR)
    one = recorder()
    engine.request(1, None, one)
    assert send_chunk(engine, 0, 1, 0, messages[0])
    for k in (1, 2):
        assert all(send_vector(engine, k, 2, messages[k]))
    assert engine.window.tree_step == 2 and engine.is_decided(2)
    assert one.got == [] and engine.open_steps == [1] and not engine.is_decided(1)
    assert all(link.messages(Fail) == [] for link in links)   # nothing said about step 1


# ---------------------------------------------------------------- deadlines below the master

@pytest.mark.parametrize("first", ["quorum", "deadline"])
async def test_a_node_tells_its_parent_once_per_step(engine_at, first):
    parent, child0 = FakeLink("parent"), FakeLink()
    timeout = 0.05
    if first == "quorum":      # two of node 0's three children are gone before the step
        engine = engine_at(node("0"), [child0, None, None], parent, timeout=timeout)
    else:
        engine = engine_at(node("0"), [child0, FakeLink(), FakeLink()], parent, timeout=timeout)
    answer = recorder()
    engine.request(5, np.zeros(8), answer)
    await asyncio.sleep(2 * timeout)   # the deadline passes (the give-up is at 0.55 s)
    if first == "deadline":    # then two children report failures: the quorum is gone too
        engine.child_failed(1, Fail(5, "node 0.1 did not get its local gradient", FailKind.STALL))
        engine.child_failed(2, Fail(5, "node 0.2 did not get its local gradient", FailKind.STALL))
    [fail] = parent.messages(Fail)
    assert fail.step == 5 and fail.kind is FailKind.STALL
    if first == "quorum":
        assert fail.reason == ("node 0 did not get 2 of 3 children: 2 of them are gone or failed "
                               "(child 1: disconnected; child 2: disconnected)")
    else:
        assert fail.reason == "node 0 did not get 2 of 3 children (got 0) within 0.05 s"
    # The parent decides: the step stays undecided here until it answers.
    assert engine.open_steps == [5] and not engine.is_decided(5)
    assert answer.got == [] and child0.messages() == []
    engine.parent_failed(Fail(5, "master did not get 2 of 3 children"))
    assert answer.got == [Failed(5, "master did not get 2 of 3 children", tree_wide=True)]
    assert child0.messages() == [Fail(5, "master did not get 2 of 3 children", FailKind.TREE)]
    assert parent.messages(Fail) == [fail]
    assert engine.open_steps == [] and engine.window.tree_step == 5   # the master decided it


async def test_a_node_reports_a_stall_at_timeout_and_gives_up_locally_after_grace(engine_at):
    loop = asyncio.get_running_loop()
    settings = EngineSettings(timeout=0.05)
    assert settings.grace == defaults.GRACE_MIN           # 25% of 0.05 s is below the minimum
    parent, children = FakeLink("parent"), [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), children, parent, timeout=settings.timeout)
    answer = recorder(loop)
    t0 = loop.time()
    engine.request(5, np.zeros(8), answer)

    [stall] = await wait_until(lambda: parent.messages(Fail), "the stall report at the timeout")
    assert stall == Fail(5, "node 0 did not get 2 of 3 children (got 0) within 0.05 s",
                         FailKind.STALL)
    [when] = parent.times_of(Fail)
    assert t0 + settings.timeout - SLACK <= when < t0 + settings.answer_within
    assert answer.got == [] and engine.open_steps == [5]   # waiting for the master's decision

    outcome = await answer.future         # none came: the node gives up for its subtree
    assert outcome == Failed(5, f"node 0 got no decision about step 5 from the master within "
                                f"{settings.answer_within:g} s (its parent is cut off or frozen)",
                             tree_wide=False)
    assert answer.times[0] >= t0 + settings.timeout + settings.grace - SLACK
    for link in children:
        assert link.messages() == [Fail(5, outcome.reason, FailKind.LOCAL)]
    assert parent.messages(Fail) == [stall]   # one STALL; giving up says nothing up
    assert engine.open_steps == [] and engine.window.tree_step == -1   # local: not the tree's
    assert engine.stats.steps_failed == 1

    # The failure here was not the tree's word: the master's decision, arriving after all,
    # replaces it, goes down, and is what a process that asks again gets.
    verdict = Fail(5, "master did not get 2 of 3 children", FailKind.TREE)
    engine.parent_failed(verdict)
    assert answer.got == [outcome]
    assert engine.window.tree_step == 5
    for link in children:
        assert link.messages() == [Fail(5, outcome.reason, FailKind.LOCAL), verdict]
    again = recorder()
    engine.request(5, None, again)
    assert again.got == [Failed(5, verdict.reason, tree_wide=True)]


async def test_a_node_without_a_parent_fails_its_steps_locally_at_the_timeout(engine_at):
    loop = asyncio.get_running_loop()
    settings = EngineSettings(timeout=0.05)
    children = [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), children, None, timeout=settings.timeout)   # reconnecting
    answer = recorder(loop)
    t0 = loop.time()
    engine.request(5, np.zeros(8), answer)
    outcome = await answer.future
    assert outcome == Failed(5, "node 0 has no parent (it is reconnecting) and could not get "
                                "step 5 decided within 0.05 s", tree_wide=False)
    # at the timeout, not after the grace (nobody could decide it anyway)
    assert t0 + settings.timeout - SLACK <= answer.times[0] < t0 + settings.answer_within
    for link in children:
        assert link.messages() == [Fail(5, outcome.reason, FailKind.LOCAL)]


async def test_a_leaf_sends_its_vector_up_reports_nothing_and_gives_up_after_grace(engine_at):
    loop = asyncio.get_running_loop()
    settings = EngineSettings(timeout=0.05)
    parent = FakeLink("parent")
    engine = engine_at(node("0.1"), [], parent, timeout=settings.timeout)
    vector = np.arange(10, dtype=np.float32)
    answer = recorder(loop)
    t0 = loop.time()
    engine.request(3, vector, answer)
    # Two chunks of 8 and 2 float32s went up at once (no OPEN: the chunk says it).
    assert [type(m) for m in parent.messages()] == [Chunk, Chunk]
    np.testing.assert_array_equal(parent.vector(Chunk, 3), vector)
    await asyncio.sleep(2 * settings.timeout)   # the deadline passes: a leaf's part was done
    assert len(parent.messages()) == 2 and answer.got == [] and engine.open_steps == [3]
    outcome = await answer.future
    assert outcome == Failed(3, "node 0.1 got no decision about step 3 from the master within "
                                "0.55 s (its parent is cut off or frozen)", tree_wide=False)
    assert answer.times[0] >= t0 + settings.answer_within - SLACK
    assert len(parent.messages()) == 2


async def test_a_vector_that_does_not_fit_the_step_is_mismatched(engine_at):
    engine = engine_at(node("0.1"), [], FakeLink("parent"))
    first, second = recorder(), recorder()
    engine.request(3, np.zeros(10, np.float32), first)
    engine.request(3, np.zeros(12, np.float32), second)
    assert second.got == [Mismatched(
        3, "this process's vector is 12 x float32 but the tree's for step 3 is 10 x float32")]
    assert first.got == [] and engine.open_steps == [3]   # the step goes on


# ---------------------------------------------------------------- the parent's verdicts

WHY = "the parent says so"


@pytest.mark.parametrize("kind, outcome, down, tree_step", [
    (FailKind.TREE, Failed(5, WHY, tree_wide=True), FailKind.TREE, 5),   # the master decided
    (FailKind.LOCAL, Failed(5, WHY, tree_wide=False), FailKind.LOCAL, -1),
    (FailKind.REFUSED, Refused(5, WHY), FailKind.REFUSED, -1),
    (FailKind.LOST, Lost(5, WHY), FailKind.LOST, -1),
], ids=["tree", "local", "refused", "lost"])
async def test_the_parents_fail_decides_the_step_and_goes_down(engine_at, kind, outcome, down,
                                                               tree_step):
    parent, children = FakeLink("parent"), [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), children, parent)
    answer = recorder()
    engine.request(5, np.zeros(8), answer)
    engine.parent_failed(Fail(5, WHY, kind))
    assert answer.got == [outcome]
    assert engine.is_decided(5) and engine.open_steps == [] and engine.window.tree_step == tree_step
    for link in children:
        assert link.messages() == [Fail(5, WHY, down)]
    later = recorder()
    engine.request(5, None, later)     # a later request gets the same, at once
    if kind is FailKind.LOST:          # a lost outcome is not held here either
        assert later.got == [Lost(5, not_held(5, 4, -1))]
    elif kind in (FailKind.LOCAL, FailKind.REFUSED):
        # Not the tree's word (a refusal: beyond the parent's window now, not for good):
        # asked again, the step reopens.
        assert later.got == [] and engine.open_steps == [5] and not engine.is_decided(5)
    else:
        assert later.got == [outcome]


async def test_the_parents_mismatch_answers_the_request_and_the_step_goes_on(engine_at):
    parent, children = FakeLink("parent"), [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), children, parent)
    answer = recorder()
    engine.request(5, np.zeros(8), answer)
    why = "vector is 8 x float64 but the step's is 10 x float64"
    engine.parent_failed(Fail(5, why, FailKind.MISMATCH))
    assert answer.got == [Mismatched(5, why)]
    assert engine.open_steps == [5] and not engine.is_decided(5)
    assert all(link.messages() == [] for link in children)
    # The rest of the tree resolves it; this node passes the result on.
    result = np.arange(10.0)
    send_result(engine, 5, result)
    assert answer.got == [Mismatched(5, why)]        # answered once
    fetch = recorder()
    engine.request(5, None, fetch)
    [resolved] = fetch.got
    assert isinstance(resolved, Resolved)
    np.testing.assert_array_equal(resolved.vector, result)
    for link in children:
        np.testing.assert_array_equal(link.vector(Result, 5), result)
    assert engine.window.tree_step == 5


async def test_a_stall_from_the_parent_decides_nothing(engine_at):
    engine = engine_at(node("0"), [FakeLink() for _ in range(3)], FakeLink("parent"))
    answer = recorder()
    engine.request(5, np.zeros(8), answer)
    engine.parent_failed(Fail(5, "a child's kind, sent down", FailKind.STALL))
    assert answer.got == [] and engine.open_steps == [5] and not engine.is_decided(5)


async def test_losing_the_parent_fails_open_steps_locally(engine_at):
    children = [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), children, FakeLink("parent"))
    answers = {step: recorder() for step in (3, 4)}
    for step, answer in answers.items():
        engine.request(step, np.zeros(8), answer)
    engine.neighbours.parent = None
    engine.parent_lost("lost the connection to its parent")
    reason = "node 0 lost the connection to its parent"
    assert {s: a.got for s, a in answers.items()} == {
        3: [Failed(3, reason, tree_wide=False)], 4: [Failed(4, reason, tree_wide=False)]}
    for link in children:
        assert link.messages() == [Fail(3, reason, FailKind.LOCAL), Fail(4, reason, FailKind.LOCAL)]


async def test_a_step_failed_here_takes_part_anew_when_asked_again(engine_at):
    """A failure here (cut off from the master) is not the tree's word: the process that
    asks for the step again reopens it, its vector goes up over the new parent link, and
    the result the master decides is what it gets."""
    engine = engine_at(node("0.1"), [], FakeLink("parent"))
    first = recorder()
    engine.request(3, np.ones(4), first)
    engine.neighbours.parent = None
    engine.parent_lost("lost the connection to its parent")
    assert [type(o) for o in first.got] == [Failed] and not first.got[0].tree_wide
    assert engine.failed_here(3) and engine.is_decided(3)
    engine.neighbours.parent = parent = FakeLink("parent")   # back: a new link
    engine.parent_back()
    again = recorder()
    engine.request(3, np.ones(4), again)
    assert engine.open_steps == [3] and not engine.is_decided(3) and not engine.failed_here(3)
    assert parent.messages(Chunk)                             # its vector went up again
    send_result(engine, 3, np.arange(4.0))
    [resolved] = again.got
    np.testing.assert_array_equal(resolved.vector, np.arange(4.0))
    assert engine.window.tree_step == 3


async def test_the_parents_result_replaces_a_failure_here(engine_at):
    """A catch-up RESULT (the master decided the step while this node was cut off) is the
    step's outcome here from then on, and goes down."""
    children = [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), children, None)
    engine.decisions.fail(4, "node 0 has no parent", tree_wide=False)
    engine.neighbours.parent = FakeLink("parent")
    send_result(engine, 4, np.arange(8.0))
    fetch = recorder()
    engine.request(4, None, fetch)
    [resolved] = fetch.got
    np.testing.assert_array_equal(resolved.vector, np.arange(8.0))
    for link in children:
        np.testing.assert_array_equal(link.vector(Result, 4), np.arange(8.0))


async def test_a_new_parent_link_fails_the_steps_begun_on_the_old_one_here(engine_at):
    """What went up on the old link is gone: the processes ask again at once, rather than
    wait for the deadline."""
    engine = engine_at(node("0.1"), [], FakeLink("parent"))
    answer = recorder()
    engine.request(6, np.ones(4), answer)
    engine.neighbours.parent = FakeLink("parent")
    engine.parent_back()
    [failed] = answer.got
    assert isinstance(failed, Failed) and not failed.tree_wide and "reconnected" in failed.reason
    assert engine.failed_here(6)


# ---------------------------------------------------------------- the window

async def test_a_request_beyond_the_window_is_refused_at_once_and_opens_nothing(engine_at):
    parent = FakeLink("parent")
    engine = engine_at(node("0.1"), [], parent, window=4)
    send_result(engine, 0, np.arange(4.0))
    assert engine.window.tree_step == 0
    far = recorder()
    engine.request(5, np.ones(4), far)
    assert far.got == [Refused(5, "step 5 is more than 4 steps ahead of the tree, which is at "
                                  "step 0")]
    assert engine.open_steps == [] and not engine.is_decided(5) and engine.window.newest_step == 0
    assert parent.messages() == []               # no chunk, no OPEN
    fetch = recorder()
    engine.request(5, None, fetch)               # nor for a fetch
    assert [type(o) for o in fetch.got] == [Refused] and parent.messages() == []
    edge = recorder()
    engine.request(4, np.ones(4), edge)          # the window's last step is taken
    assert edge.got == [] and engine.open_steps == [4]
    assert parent.messages() == [Chunk(4, 0, 4, "float64")]


async def test_a_childs_pieces_beyond_the_window_get_one_refusal(engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, window=4)
    for k in (0, 1):
        assert all(send_vector(engine, k, 0, np.ones(10)))
    assert engine.window.tree_step == 0
    refusal = Fail(5, "step 5 is more than 4 steps ahead of the tree, which is at step 0",
                   FailKind.REFUSED)
    assert send_vector(engine, 2, 5, np.ones(10)) == [False, False, False]   # three chunks...
    assert links[2].messages(Fail) == [refusal]                              # ... one FAIL
    engine.child_opened(2, Open(5))
    engine.child_failed(2, Fail(5, "node 2 stalled", FailKind.STALL))
    assert links[2].messages(Fail) == [refusal]
    assert links[0].messages(Fail) == links[1].messages(Fail) == []   # only the sender is told
    assert engine.open_steps == [] and not engine.is_decided(5) and engine.window.newest_step == 0
    engine.child_opened(1, Open(5))              # another child is refused too, once
    assert links[1].messages(Fail) == [refusal]


FAR = 1 << 62


async def test_the_window_holds_before_the_trees_first_step(engine_at):
    """Before any step is decided the window runs from step 0: a process's request, a
    child's CHUNK, OPEN or FAIL for a step far ahead is refused to its sender and opens
    nothing, so no peer can make the tree jump (step-counter poisoning)."""
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, window=4)
    assert engine.window.tree_step == -1
    why = (f"step {FAR} is more than 4 steps ahead of the tree, which has not decided a step "
           "yet (steps count from 0)")
    far = recorder()
    engine.request(FAR, np.zeros(4), far)
    assert far.got == [Refused(FAR, why)]
    engine.child_failed(1, Fail(FAR, "poison", FailKind.STALL))
    engine.child_opened(1, Open(FAR))
    assert not send_chunk(engine, 2, FAR, 0, np.ones(4))
    assert links[1].messages() == [Fail(FAR, why, FailKind.REFUSED)]     # once
    assert links[2].messages() == [Fail(FAR, why, FailKind.REFUSED)]
    assert links[0].messages() == []
    assert engine.open_steps == [] and engine.window.newest_step == -1 and engine.window.tree_step == -1
    edge = recorder()
    engine.request(4, None, edge)        # the window's last step is taken
    assert edge.got == [] and engine.open_steps == [4]
    messages, want = coded(STAR, dim=4)
    for k in (0, 1):                     # and the tree's first steps go on exactly
        assert all(send_vector(engine, k, 4, messages[k]))
    [outcome] = edge.got
    np.testing.assert_allclose(outcome.vector, want, rtol=1e-12, atol=1e-12)


async def test_a_childs_fail_opens_no_step_but_counts_once_it_opens(engine_at):
    """A FAIL starts no clock and opens no step; remembered, it counts the moment the step
    opens here (a node that lost its quorum says so before its OPEN comes)."""
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, timeout=30)
    for k in (1, 2):
        engine.child_failed(k, Fail(3, f"node {k} stalled", FailKind.STALL))
    assert engine.open_steps == [] and not engine.is_decided(3) and engine.window.tree_step == -1
    assert all(link.messages() == [] for link in links)
    answer = recorder()
    engine.request(3, None, answer)      # the step opens: more than s children are out
    reason = ("master did not get 2 of 3 children: 2 of them are gone or failed "
              "(child 1: node 1 stalled; child 2: node 2 stalled)")
    assert answer.got == [Failed(3, reason)]
    assert engine.window.tree_step == 3 and engine.open_steps == []
    engine.child_failed(1, Fail(5, "node 1 stalled", FailKind.STALL))
    engine.child_opened(2, Open(5))      # one out of step 5: s = 1, it goes on
    assert engine.open_steps == [5] and not engine.is_decided(5)
    engine.child_failed(0, Fail(5, "node 0 stalled", FailKind.STALL))   # open: at once
    assert engine.is_decided(5) and engine.window.tree_step == 5
    assert engine.scheme._ahead == {}


async def test_a_childs_refusals_of_far_steps_leave_one_entry(engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, window=4)
    for k in (0, 1):
        assert all(send_vector(engine, k, 0, np.ones(4)))
    assert engine.window.tree_step == 0
    for i in range(500):
        engine.child_opened(2, Open(10**9 + i))
    engine.child_opened(2, Open(10**9 + 499))   # the newest refusal is remembered: told once
    fails = links[2].messages(Fail)
    assert [f.step for f in fails] == [10**9 + i for i in range(500)]
    assert all(f.kind is FailKind.REFUSED for f in fails)
    assert engine.neighbours.slots[2].told == {10**9 + 499}
    assert engine.bookkeeping()["told"] == 1 and engine.open_steps == []


async def test_a_piece_claiming_more_than_the_hosts_memory_closes_the_link(engine_at):
    assert EngineSettings().max_vector_bytes == physical_memory() > 0
    parent, links = FakeLink("parent"), [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), links, parent, max_vector_bytes=1024)
    huge = Chunk(1, 0, 129, "float64")           # 1032 bytes
    with pytest.raises(ProtocolError, match=r"claims a vector of 129 x float64 \(1032 bytes\)"):
        engine.piece_dest(Origin.CHILD, 0, huge, 1032)
    with pytest.raises(ProtocolError, match="RESULT for step 1"):
        engine.piece_dest(Origin.PARENT, 0, Result(1, 0, 129, "float64"), 1032)
    assert engine.open_steps == [] and engine.scheme.ups == {}
    assert all(link.messages() == [] for link in links) and parent.messages() == []
    assert send_chunk(engine, 0, 1, 0, np.ones(128))   # 1024 bytes: taken


# ---------------------------------------------------------------- a step's layout

@pytest.mark.parametrize("tree_vector", [None, (8, "float64")], ids=["first-step", "new-model"])
@pytest.mark.parametrize("order", [(2, 0, 1), (0, 2, 1)], ids=["hostile-first", "hostile-second"])
async def test_a_lone_childs_layout_loses_to_the_n_minus_s_that_agree(engine_at, tree_vector,
                                                                      order):
    """With no layout settled (the tree's first step, or a new model's), a hostile child's
    float32 chunk, first or not, does not set the step's layout: the two honest children's
    (n - s = 2) decode, and only the hostile one is told MISMATCH."""
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links)
    if tree_vector is not None:
        engine.learn(0, tree_vector)
    messages, want = coded(STAR, dim=10)
    answer = recorder()
    engine.request(1, None, answer)
    for k in order:
        vector = np.ones(10, np.float32) if k == 2 else messages[k]
        assert send_chunk(engine, k, 1, 0, vector)
    for k in (0, 1):
        assert all(send_vector(engine, k, 1, messages[k])[1:])
    [outcome] = answer.got
    assert isinstance(outcome, Resolved)
    np.testing.assert_allclose(outcome.vector, want, rtol=1e-12, atol=1e-12)
    assert engine.window.tree_vector == (10, "float64")
    [refused] = links[2].messages(Fail)
    assert refused.kind is FailKind.MISMATCH and "10 x float32" in refused.reason
    assert links[0].messages(Fail) == links[1].messages(Fail) == []
    assert engine.scheme.vote.rivals == {}


@pytest.mark.parametrize("tree, gone", [
    (Tree((2,), (0,)), ()),           # s = 0: both children are needed
    (STAR, (2,)),                     # child 2 is gone: 0 and 1 are needed
], ids=["s=0", "one-gone"])
async def test_with_no_majority_possible_the_first_layout_stays(engine_at, tree, gone):
    """Two children, two layouts, and both are needed: neither can be decoded, so there is
    nothing to judge by: the second is refused at once, and the step fails at once."""
    children = [None if k in gone else FakeLink() for k in range(tree.fanout[0])]
    engine = engine_at(master(tree), children)
    answer = recorder()
    engine.request(1, None, answer)
    assert send_chunk(engine, 0, 1, 0, np.ones(10))
    assert not send_chunk(engine, 1, 1, 0, np.ones(12))
    assert children[1].messages(Fail)[0] == Fail(
        1, "vector is 12 x float64 but the step's is 10 x float64", FailKind.MISMATCH)
    [outcome] = answer.got
    assert isinstance(outcome, Failed) and "child 1: its vector does not fit" in outcome.reason
    assert engine.scheme.vote.rivals == {}


async def test_a_nodes_own_vector_settles_the_layout_against_its_children(engine_at):
    """At a node, before the tree's first result, children's chunks of two layouts are held
    apart; the training process's vector settles it, and the other layout's sender is told."""
    parent, links = FakeLink("parent"), [FakeLink() for _ in range(3)]
    engine = engine_at(node("0", chunk_bytes=32), links, parent)
    rng = np.random.default_rng(3)
    messages = rng.integers(-8, 8, (3, 10)).astype(np.float64)
    local = rng.integers(-8, 8, 10).astype(np.float64)
    assert all(send_vector(engine, 2, 1, np.ones(10, np.float32)))   # hostile, first
    for k in (0, 1):
        assert all(send_vector(engine, k, 1, messages[k]))          # held apart
    assert links[0].messages() == links[1].messages() == links[2].messages() == []
    assert parent.messages(Chunk) == []
    engine.request(1, local, recorder())
    coeffs = engine.scheme.code.decode((0, 1))
    want = local + coeffs[0] * messages[0] + coeffs[1] * messages[1]
    np.testing.assert_allclose(parent.vector(Chunk, 1), want, rtol=1e-12, atol=1e-12)
    assert {m.dtype for m in parent.messages(Chunk)} == {"float64"}
    [refused] = links[2].messages(Fail)
    assert refused.kind is FailKind.MISMATCH and refused.step == 1
    assert links[0].messages() == links[1].messages() == []


async def test_a_child_keeps_to_one_layout_per_step(engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links)
    assert send_chunk(engine, 0, 1, 0, np.ones(10))                    # float64 first
    assert send_chunk(engine, 2, 1, 0, np.ones(12))                    # held apart
    assert not send_chunk(engine, 2, 1, 0, np.ones(10))                # another: refused
    assert [f.kind for f in links[2].messages(Fail)] == [FailKind.MISMATCH]
    assert not send_chunk(engine, 2, 1, 1, np.ones(12))                # out of the step


async def test_a_step_left_open_is_lost_when_the_tree_passes_it_by(engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, window=4, keep_results=2)
    behind = engine.settings.behind
    assert behind == 4
    stuck = recorder()
    engine.request(1, None, stuck)
    assert send_chunk(engine, 0, 1, 0, np.ones(4))   # under way, but child 0 alone decodes nothing
    reason = "step 1 was passed over: the tree went on to step 5 before it was decided here"
    for step in range(2, 2 + behind):
        for k in (1, 2):
            send_chunk(engine, k, step, 0, np.ones(4))
        assert engine.window.tree_step == step
        if step - 1 < behind:
            assert stuck.got == [] and engine.open_steps == [1] and not engine.is_decided(1)
    assert engine.window.tree_step == 1 + behind
    assert stuck.got == [Lost(1, reason)]
    assert engine.open_steps == [] and engine.is_decided(1)
    for link in links:
        assert link.messages(Fail) == [Fail(1, reason, FailKind.LOST)]
    assert not send_chunk(engine, 2, 1, 0, np.ones(4))   # a straggler's chunk for it: dropped
    late = recorder()
    engine.request(1, None, late)
    assert late.got == [Lost(1, not_held(1, 2, 5))]
    assert engine.bookkeeping()["waiting"] == 0


# ---------------------------------------------------------------- OPEN

async def test_a_node_whose_step_waits_below_tells_its_parent_once(engine_at):
    parent, children = FakeLink("parent"), [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), children, parent)
    assert all(send_vector(engine, 0, 7, np.ones(10)))
    assert all(send_vector(engine, 1, 7, np.ones(10)))   # s + 1 children: the step began here
    await wait_until(lambda: parent.messages() == [Open(7)], "OPEN once nothing went up")
    engine.request(7, np.ones(10), recorder())        # the local vector: chunks go up
    assert parent.messages(Open) == [Open(7)] and parent.messages()[0] == Open(7)
    assert [m.chunk for m in parent.messages(Chunk)] == [0, 1, 2]
    engine.child_opened(2, Open(7))                   # a child's OPEN of an open step: nothing
    assert parent.messages(Open) == [Open(7)]


async def test_a_node_that_sends_its_part_at_once_needs_no_open(engine_at):
    parent, children = FakeLink("parent"), [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), children, parent)
    for k in (0, 1):
        assert all(send_vector(engine, k, 7, np.ones(10)))
    engine.request(7, np.ones(10), recorder())        # quorum and local: chunks go up now
    await asyncio.sleep(3 * defaults.OPEN_DELAY)       # the delay under test: no OPEN after it
    assert parent.messages(Open) == [] and len(parent.messages(Chunk)) == 3


async def test_a_nodes_open_goes_on_up(engine_at):
    parent = FakeLink("parent")
    engine = engine_at(node("0"), [FakeLink() for _ in range(3)], parent)
    engine.child_opened(1, Open(9))
    assert engine.open_steps == [9]
    await asyncio.sleep(3 * defaults.OPEN_DELAY)    # one child (s = 1) may be lying: not yet
    assert parent.messages() == []
    engine.child_opened(1, Open(9))                 # ... however often it says so
    engine.child_opened(2, Open(9))                 # s + 1 children: the step began below
    await wait_until(lambda: parent.messages() == [Open(9)], "OPEN up")


async def test_a_leafs_own_vector_needs_no_open_but_a_fetch_does(engine_at):
    parent = FakeLink("parent")
    engine = engine_at(node("0.1"), [], parent)
    engine.request(3, np.ones(4), recorder())
    assert parent.messages() == [Chunk(3, 0, 4, "float64")]
    engine.request(4, None, recorder())               # asks for step 4, contributes nothing
    engine.request(4, None, recorder())
    await wait_until(lambda: parent.messages() == [Chunk(3, 0, 4, "float64"), Open(4)], "OPEN")
    assert engine.open_steps == [3, 4]


async def test_open_from_a_child_starts_the_masters_clock(engine_at):
    loop = asyncio.get_running_loop()
    timeout = 0.2
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, timeout=timeout)
    t0 = loop.time()
    engine.child_opened(0, Open(4))
    engine.child_opened(1, Open(4))      # s + 1 children say it began: its clock runs
    assert engine.open_steps == [4]
    await asyncio.sleep(timeout / 2)   # the delay under test: the request comes later
    answer, reference = recorder(loop), recorder(loop)
    open_when_answered = []
    engine.request(4, None, answer)
    engine.request(4, None, lambda outcome: open_when_answered.append(engine.open_steps))
    engine.request(5, None, reference)     # a step whose clock starts with this request
    outcome = await answer.future
    assert outcome == Failed(4, "master did not get 2 of 3 children (got 0) within 0.2 s")
    assert answer.times[0] >= t0 + timeout - SLACK
    # Step 4's clock ran from the OPEN: it ended while step 5, asked for together with
    # it, was still open (timers fire in order, however late a loaded machine runs them).
    assert open_when_answered == [[5]] and reference.got == []
    await reference.future
    for link in links:
        assert link.messages(Fail)[0] == Fail(4, outcome.reason, FailKind.TREE)


async def test_one_childs_open_starts_no_clock_at_the_master(engine_at):
    """Issue 26, row 2: a child (s = 1 of them may straggle, or lie) that says every step
    began below it opens them, but their clocks start only when s + 1 children (or a
    process here) say so: no honest step times out early."""
    timeout = 0.2
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, timeout=timeout)
    for step in range(1, 5):
        engine.child_opened(2, Open(step))
    engine.child_opened(2, Open(1))
    await asyncio.sleep(2 * timeout)
    assert engine.open_steps == [1, 2, 3, 4] and not any(map(engine.is_decided, range(1, 5)))
    messages, want = coded(STAR)
    for k in (0, 1):                      # the honest children, late: step 1 resolves
        assert all(send_vector(engine, k, 1, messages[k]))
    answer = recorder()
    engine.request(1, None, answer)
    assert len(answer.got) == 1 and np.allclose(answer.got[0].vector, want)
    started = asyncio.get_running_loop().time()
    late = recorder(asyncio.get_running_loop())
    engine.child_opened(0, Open(2))       # a second child: step 2's clock runs from now
    engine.request(2, None, late)
    outcome = await late.future
    assert isinstance(outcome, Failed) and late.times[0] >= started + timeout - SLACK


# ---------------------------------------------------------------- what the tree knows

async def test_a_restarted_node_learns_where_the_tree_is(engine_at):
    parent = FakeLink("parent")
    engine = engine_at(node("0.1"), [], parent)
    engine.learn(40, (8, "float64"))
    w = engine.window
    assert (w.tree_step, w.tree_vector, w.newest_step) == (40, (8, "float64"), 40)
    engine.learn(30, (4, "float32"))   # older news: nothing changes
    assert (engine.window.tree_step, engine.window.tree_vector) == (40, (8, "float64"))
    behind, window = engine.settings.behind, engine.settings.window

    old = recorder()
    engine.request(40 - behind, np.zeros(8), old)
    assert old.got == [Lost(40 - behind, not_held(40 - behind, 4, 40))]
    far = recorder()
    engine.request(41 + window, np.zeros(8), far)
    assert [type(o) for o in far.got] == [Refused]
    bad = recorder()
    engine.request(41, np.zeros(5), bad)  # a leaf cannot tell a wrong vector from a new model:
    assert bad.got == []                  # its parent judges, with the others' vectors
    assert parent.messages() == [Chunk(41, 0, 5, "float64"), Chunk(41, 1, 5, "float64")]
    engine.parent_failed(Fail(41, "this subtree's vector is 5 x float64, but the tree's is "
                                  "8 x float64", FailKind.MISMATCH))
    assert bad.got == [Mismatched(41, "this subtree's vector is 5 x float64, but the tree's is "
                                      "8 x float64")]
    engine.request(42, np.ones(8), recorder())
    assert parent.messages()[2:] == [Chunk(42, 0, 8, "float64"), Chunk(42, 1, 8, "float64")]


async def test_learning_passes_over_steps_left_behind(engine_at):
    children = [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), children, FakeLink("parent"))
    answer = recorder()
    engine.request(3, np.zeros(8), answer)
    engine.learn(3 + engine.settings.behind)
    reason = "step 3 was passed over: the tree went on to step 19 before it was decided here"
    assert answer.got == [Lost(3, reason)] and engine.open_steps == []
    for link in children:
        assert link.messages() == [Fail(3, reason, FailKind.LOST)]


async def test_a_local_vector_that_began_a_step_wrong_is_refused_when_a_fitting_one_comes(
        engine_at):
    parent, children = FakeLink("parent"), [FakeLink() for _ in range(3)]
    engine = engine_at(node("0"), children, parent)
    assert engine.window.tree_vector is None
    send_result(engine, 0, np.arange(10.0))           # the tree's first result sets its vector
    assert engine.window.tree_vector == (10, "float64")
    bad = recorder()
    engine.request(1, np.zeros(12), bad)              # first here: nothing to tell it by yet
    assert bad.got == []
    for k in (0, 1):                                  # the children's vectors fit the tree's:
        assert all(send_vector(engine, k, 1, np.ones(10)))   # the step begins again without it
    assert bad.got == [Mismatched(1, "this process's vector is 12 x float64, but the tree's "
                                     "is 10 x float64")]
    assert engine.open_steps == [1]                   # the step goes on without it
    assert parent.messages(Chunk) == []               # without its own part, nothing goes up
    result = np.arange(10.0) * 2
    send_result(engine, 1, result)                    # the rest of the tree resolves it
    fetch = recorder()
    engine.request(1, None, fetch)
    [resolved] = fetch.got
    assert isinstance(resolved, Resolved)
    np.testing.assert_array_equal(resolved.vector, result)
    assert bad.got == [bad.got[0]]
    assert engine.stats.times_skipped == 2            # steps 0 and 1 resolved without this node


async def test_a_childs_chunk_that_does_not_fit_the_trees_vector_silences_it_for_the_step(
        engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links)
    for k in (0, 1):
        assert all(send_vector(engine, k, 0, np.ones(10)))
    assert engine.window.tree_vector == (10, "float64")
    answer = recorder()
    engine.request(1, None, answer)
    assert send_chunk(engine, 0, 1, 0, np.ones(12))       # first: nothing to tell it by yet
    assert links[0].messages(Fail) == []
    assert send_chunk(engine, 1, 1, 0, np.ones(10))       # one that fits the tree's: child 0
    mismatch = Fail(1, "this subtree's vector is 12 x float64, but the tree's is 10 x float64",
                    FailKind.MISMATCH)                    # was wrong, and the step begins again
    assert links[0].messages(Fail) == [mismatch]
    assert not send_chunk(engine, 0, 1, 1, np.ones(12))   # silenced: no second FAIL...
    assert not send_chunk(engine, 0, 1, 0, np.ones(10))   # ... and out of step 1 even if it fits
    assert links[0].messages(Fail) == [mismatch]
    assert links[1].messages(Fail) == links[2].messages(Fail) == []
    messages, want = coded(STAR)
    for k in (1, 2):                                      # the others resolve it exactly
        assert all(send_vector(engine, k, 1, messages[k]))
    [outcome] = answer.got
    assert isinstance(outcome, Resolved)
    np.testing.assert_allclose(outcome.vector, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(links[0].vector(Result, 1), outcome.vector)   # it gets it too
    assert send_chunk(engine, 0, 2, 0, np.ones(10))       # and takes part in the next step


# ---------------------------------------------------------------- outcomes

def test_requesting_a_decided_step_answers_at_once_from_the_last_keep_results(engine_at):
    engine = engine_at(master(), [None, None, None], keep_results=2)
    layout = ChunkLayout.of(3, np.float64, 32)
    vectors = {s: np.full(3, float(s)) for s in range(4)}
    for s in range(4):
        if s == 2:
            engine.decisions.fail(2, "child 1: disconnected")
        else:
            engine.decisions.resolved(s, layout, vectors[s])
    assert engine.window.tree_step == 3
    got = {}
    for s in range(4):
        engine.request(s, None, lambda outcome, s=s: got.setdefault(s, outcome))
    assert set(got) == {0, 1, 2, 3}    # all answered during request()
    assert got[3] == Resolved(3, layout, vectors[3])
    assert got[2] == Failed(2, "child 1: disconnected", tree_wide=True)
    for s in (0, 1):
        assert got[s] == Lost(s, not_held(s, 2, 3))
    assert engine.open_steps == [] and engine.bookkeeping()["waiting"] == 0


async def test_a_waiting_request_is_answered_once_when_its_step_is_decided(engine_at):
    engine = engine_at(master(), [None, None, None])
    answer = recorder()
    engine.request(0, None, answer)
    assert answer.got == []
    engine.decisions.fail(0, "gone")
    engine.decisions.fail(0, "again")            # a decided step is not decided twice
    assert answer.got == [Failed(0, "gone")]
    assert engine.stats.steps_failed == 1


# ---------------------------------------------------------------- catch-up

def test_a_child_that_joined_mid_step_catches_up_once(engine_at):
    late, on_time, failed_late = FakeLink("late"), FakeLink("on time"), FakeLink("failed late")
    engine = engine_at(master(), [late, on_time, None])
    engine.neighbours.slots[0].missed_through = 2   # joined while step 2 was under way
    engine.neighbours.slots[1].missed_through = 1   # joined before step 2 began
    layout = ChunkLayout.of(10, np.float64, 32)     # chunks of 4, 4 and 2 elements
    result = np.arange(10, dtype=np.float64)
    engine.decisions.resolved(2, layout, result)

    assert not send_chunk(engine, 0, 2, 0, np.zeros(10))    # a late chunk: dropped, but...
    assert [(m.step, m.chunk) for m in late.messages()] == [(2, 0), (2, 1), (2, 2)]
    np.testing.assert_array_equal(late.vector(Result, 2), result)
    assert not send_chunk(engine, 0, 2, 1, np.zeros(10))    # ... only once per step
    assert len(late.messages()) == 3
    assert not send_chunk(engine, 1, 2, 0, np.zeros(10))    # this one had step 2 in full
    assert on_time.messages() == []

    engine.decisions.fail(3, "child 1: disconnected")
    engine.neighbours.slots[2] = ChildSlot(link=failed_late, missed_through=3)
    assert not send_chunk(engine, 2, 3, 0, np.zeros(10))
    assert not send_chunk(engine, 2, 3, 1, np.zeros(10))
    assert failed_late.messages() == [Fail(3, "child 1: disconnected", FailKind.TREE)]


# ---------------------------------------------------------------- bounded bookkeeping

STEPS = 2000


async def test_the_masters_bookkeeping_stays_bounded_over_a_long_run(engine_at):
    links = [FakeLink("fast"), FakeLink("slow")]
    engine = engine_at(master(PAIR), links, keep_results=3, window=5)
    s = engine.settings
    # The slow child's slot counts every step as possibly missed: each of its late chunks
    # is caught up (``told``), so that table is exercised on every step.
    engine.neighbours.slots[1].missed_through = STEPS
    vector = np.ones(2)
    peaks: Counter = Counter()
    for step in range(STEPS):
        answer = recorder()
        engine.request(step, None, answer)
        peak_of(peaks, engine)
        assert send_chunk(engine, 0, step, 0, vector)       # either child decodes it
        assert [type(o) for o in answer.got] == [Resolved]
        assert not send_chunk(engine, 1, step, 0, vector)   # late: it gets the result again
        peak_of(peaks, engine)
    assert engine.window.tree_step == STEPS - 1 and engine.stats.steps_done == STEPS
    peaks.pop("kept_bytes")
    assert dict(peaks) == {"open": 1, "decided": s.behind, "kept": s.keep_results,
                           "waiting": 1, "told": s.behind, "records": s.behind + 1}
    book = engine.bookkeeping()
    assert book.pop("kept_bytes") <= s.keep_results * 8 * 8   # the kept vectors, no more
    assert book == {"open": 0, "decided": s.behind, "kept": s.keep_results,
                    "waiting": 0, "told": s.behind, "records": s.behind}
    scheme = engine.scheme
    assert scheme.ups == {} and scheme.down == {} and scheme._ahead == {}
    assert len(links[1].messages(Result)) == 2 * STEPS    # broadcast, plus the catch-up


async def test_a_node_counts_the_steps_resolved_without_it_and_stays_bounded(engine_at):
    parent = FakeLink("parent")
    engine = engine_at(node("0.1"), [], parent, keep_results=3, window=5)
    s = engine.settings
    result = np.arange(4.0)
    peaks: Counter = Counter()
    for step in range(STEPS):
        if step % 4 == 0:          # this node's process contributes to every fourth step
            engine.request(step, np.ones(4), recorder())
            peak_of(peaks, engine)
        send_result(engine, step, result)
        peak_of(peaks, engine)
    assert engine.stats.steps_done == STEPS
    assert engine.stats.times_skipped == STEPS - STEPS // 4
    assert len(parent.messages(Chunk)) == STEPS // 4
    peaks.pop("kept_bytes")
    assert dict(peaks) == {"open": 1, "decided": s.behind, "kept": s.keep_results,
                           "waiting": 1, "told": 0, "records": s.behind + 1}
    book = engine.bookkeeping()
    book.pop("kept_bytes")
    assert book == {"open": 0, "decided": s.behind, "kept": s.keep_results,
                    "waiting": 0, "told": 0, "records": s.behind}
    assert engine.scheme.ups == {} and engine.scheme.down == {}


async def test_a_run_of_failed_steps_keeps_the_bookkeeping_bounded(engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, keep_results=3, window=5)
    s = engine.settings
    peaks: Counter = Counter()
    for step in range(STEPS):       # no step ever has a result
        # Nodes 1 and 2 lose their quorum at once: each says so (FAIL), then that the step
        # began (OPEN): the step fails at the master the moment it opens there.
        engine.child_failed(1, Fail(step, "node 1 stalled", FailKind.STALL))
        engine.child_failed(2, Fail(step, "node 2 stalled", FailKind.STALL))
        assert not engine.is_decided(step)
        engine.child_opened(1, Open(step))
        assert engine.is_decided(step)
        peak_of(peaks, engine)
    assert engine.window.tree_step == STEPS - 1 and engine.stats.steps_failed == STEPS
    assert engine.window.tree_vector is None
    assert dict(peaks) == {"open": 0, "decided": s.behind, "kept": s.keep_results,
                           "kept_bytes": 0, "waiting": 0, "told": 0, "records": s.behind}
    assert engine.scheme._ahead == {} and engine.scheme.ups == {}


async def test_the_window_moves_on_tree_wide_failures(engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, window=4)
    messages, want = coded(STAR)
    for k in (1, 2):
        assert all(send_vector(engine, k, 0, messages[k]))
    for step in range(1, 5):             # a bad spell: steps 1..4 fail for the whole tree
        engine.child_opened(1, Open(step))
        engine.child_failed(1, Fail(step, "node 1 stalled", FailKind.STALL))
        engine.child_failed(2, Fail(step, "node 2 stalled", FailKind.STALL))
    assert engine.window.tree_step == 4 and engine.stats.steps_failed == 4
    answer = recorder()
    engine.request(4 + 4, None, answer)  # the window runs from the newest decision, not result
    assert answer.got == [] and engine.open_steps == [8]
    refused = recorder()
    engine.request(4 + 5, None, refused)
    assert refused.got == [Refused(9, "step 9 is more than 4 steps ahead of the tree, which "
                                      "is at step 4")]
    for k in (1, 2):                     # the stragglers are back: step 8 resolves
        assert all(send_vector(engine, k, 8, messages[k]))
    [outcome] = answer.got
    assert isinstance(outcome, Resolved)
    np.testing.assert_allclose(outcome.vector, want, rtol=1e-12, atol=1e-12)
    assert engine.window.tree_step == 8


async def test_a_local_failure_does_not_move_the_tree(engine_at):
    engine = engine_at(node("0"), [FakeLink() for _ in range(3)], None, window=4)
    send_result(engine, 0, np.arange(8.0))
    for step in range(1, 5):             # cut off from the master: failed here only
        engine.decisions.fail(step, "node 0 has no parent", tree_wide=False)
    assert engine.window.tree_step == 0
    refused = recorder()
    engine.request(5, np.zeros(8), refused)
    assert [type(o) for o in refused.got] == [Refused]


# ---------------------------------------------------------------- an exact decode at the master

@pytest.mark.parametrize("tree, steps, tolerance", [
    # CRC (3 children, s = 1): each chunk from its own 2 fastest children; exact to rounding.
    (Tree((3,), (1,)), [[(2, 0), (1, 2), (0, 1)]], 1e-12),
    # FRC (4 children, s = 1): any 3 of 4, coefficients 1.0: exact in floating point.
    (Tree((4,), (1,)), [[(3, 1, 0), (0, 2, 1), (1, 3, 2)]], 0.0),
    # FRC, groups {0, 1} and {2, 3}: from the tree's second step on (its layout settled),
    # one child of every group decodes each chunk, fewer than n - s = 3; at the first, a
    # layout needs n - s children that agree on it.
    (Tree((4,), (1,)), [[(0, 1, 2)] * 3, [(3, 1), (0, 2), (1, 2)]], 0.0),
], ids=["crc", "frc", "frc-one-of-every-group"])
async def test_the_master_decodes_the_exact_sum_from_the_fastest_children(engine_at, tree, steps,
                                                                         tolerance):
    dim = 10
    messages, want = coded(tree, dim)
    links = [FakeLink() for _ in range(tree.fanout[0])]
    engine = engine_at(master(tree, chunk_bytes=32), links)   # 3 chunks: 4 + 4 + 2 elements
    for step, quorums in enumerate(steps, start=7):
        answer = recorder()
        engine.request(step, np.empty(dim), answer)
        for chunk, quorum in enumerate(quorums):
            for k in quorum:
                assert send_chunk(engine, k, step, chunk, messages[k])
        [outcome] = answer.got
        assert isinstance(outcome, Resolved) and outcome.step == step
        np.testing.assert_allclose(outcome.vector, want, rtol=tolerance, atol=tolerance)
        for link in links:    # every child gets the result, the slow ones too
            np.testing.assert_array_equal(link.vector(Result, step), outcome.vector)
        assert engine.window.tree_step == step and engine.window.tree_vector == (dim, "float64")
    assert engine.stats.steps_done == len(steps)


async def test_a_child_that_stopped_reading_is_cut_off_and_the_others_get_the_result(engine_at):
    stuck, reading = FakeLink("stuck"), FakeLink("reading")
    stuck.writing_paused, stuck.write_buffer_size = True, 1000    # its socket is full
    engine = engine_at(master(), [stuck, reading, FakeLink()], send_queue_bytes=999)
    for k in (1, 2):     # any two children decode step 0's only chunk
        assert send_chunk(engine, k, 0, 0, np.ones(4))
    assert stuck.aborted == "child stopped reading (1000 bytes queued)"
    assert stuck.messages() == []
    assert len(reading.messages(Result)) == 1


# ---------------------------------------------------------------- peers' vouchers (row 2)

async def test_peers_start_the_clock_of_the_next_step_only(engine_at):
    """Issue 26 row 2 with two hostile ranks: PEER_VOUCHERS peers that send pieces of a step
    far ahead must not start its clock (it would fail for the tree before the tree gets
    there); their vouchers count once the step before it is decided here. The next step's
    clock they do start."""
    place = Place("", 0, STAR, "spread", "auto", 32)
    engine = engine_at(place, [FakeLink() for _ in range(3)], timeout=0.2)
    clocks = engine.deadlines
    for rank in (1, 2):
        clocks.open(5, True, peer=rank)      # far ahead: tree at step -1
        clocks.open(0, True, peer=rank)      # the next step
    await asyncio.sleep(0.5)
    assert engine.is_decided(0)              # its clock ran out: failed, as a stall
    assert clocks.is_open(5) and not engine.is_decided(5)
    for t in range(1, 5):
        engine.decisions.fail(t, "decided for the test", True)
    assert not engine.is_decided(5)
    await wait_until(lambda: engine.is_decided(5), "step 5's clock to run out", timeout=5)
