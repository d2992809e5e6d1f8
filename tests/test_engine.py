"""The step engine with a real CodedReduce scheme and fake links: deadlines, failures,
the result cache, catch-up, and an exact decode at the master."""

import asyncio

import numpy as np
import pytest

from crnet.messages import Chunk, Fail, Result
from crnet.node.engine import EngineSettings, Failed, Lost, Resolved, StepEngine
from crnet.node.neighbours import ChildSlot, Neighbours
from crnet.plan import Tree, plan
from crnet.schemes import Place
from crnet.schemes.chunks import ChunkLayout
from crnet.stats import Stats

from .conftest import wait_until
from .fake_links import FakeLink

pytestmark = pytest.mark.timeout(30)

STAR = Tree((3,), (1,))            # the master decodes any 2 of its 3 children
TWO_LAYERS = Tree.regular(3, 2, 1)  # node "0" decodes any 2 of its 3 children


@pytest.fixture
def engine_at():
    """``engine_at(place, children, parent=None, **settings)``: a started StepEngine whose
    child slots hold ``children`` (FakeLinks, or None for an empty slot)."""
    engines = []

    def make(place, children, parent=None, **settings):
        neighbours = Neighbours()
        neighbours.parent = parent
        neighbours.slots = [ChildSlot(link=link) for link in children]
        engine = StepEngine(EngineSettings(**settings), Stats(), neighbours)
        engine.start(place)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def master(tree=STAR, chunk_bytes=32):
    return Place("", 0, tree, "cr", "auto", chunk_bytes)


def node(name, tree=TWO_LAYERS, chunk_bytes=32):
    return Place(name, tree.layer(name), tree, "cr", "auto", chunk_bytes)


def recorder(loop=None):
    """A watch callback that records each outcome; given the loop, also when it came
    (``times``) and a future resolved with the first."""
    got, times = [], []
    future = None if loop is None else loop.create_future()

    def callback(outcome):
        got.append(outcome)
        if future is not None:
            times.append(loop.time())
            if not future.done():
                future.set_result(outcome)
    callback.got, callback.times, callback.future = got, times, future
    return callback


def send_chunk(engine, k, step, chunk, vector, chunk_bytes=32):
    """Child ``k``'s chunk of ``vector`` through the engine, as ChildLink does; returns
    whether the engine took the payload."""
    layout = ChunkLayout.of(vector.size, vector.dtype, chunk_bytes)
    a, b = layout.bounds(chunk)
    msg = Chunk(step, chunk, vector.size, vector.dtype.name)
    dest = engine.child_chunk_dest(k, msg, layout.nbytes(chunk))
    if dest is None:
        return False
    np.frombuffer(dest, vector.dtype)[:] = vector[a:b]
    engine.child_chunk(k, msg)
    return True


# ---------------------------------------------------------------- deadlines

async def test_each_open_step_fails_at_its_own_deadline(engine_at):
    loop = asyncio.get_running_loop()
    timeout = 0.2
    children = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), children, timeout=timeout)
    first, second = recorder(loop), recorder(loop)
    open_when_first_failed = []
    engine.watch(1, lambda outcome: open_when_first_failed.append(list(engine.open_steps)))

    t1 = loop.time()
    engine.submit(1, np.zeros(4))
    engine.watch(1, first)
    await asyncio.sleep(timeout / 4)   # the gap under test: step 2's clock starts later
    t2 = loop.time()
    engine.submit(2, np.zeros(4))
    engine.submit(1, np.zeros(4))      # a step opens once: this does not restart its clock
    engine.watch(2, second)
    assert engine.open_steps == [1, 2]

    one = await first.future
    assert open_when_first_failed == [[2]]     # step 2 is still running on its own clock
    two = await second.future
    assert one == Failed(1, "master did not get any message for this step within 0.2 s")
    assert two == Failed(2, "master did not get any message for this step within 0.2 s")
    assert engine.resolved_through == 2 and engine.open_steps == []
    assert engine.stats.steps_failed == 2
    for link in children:    # every child hears of both failures
        assert link.messages() == [Fail(1, one.reason), Fail(2, two.reason)]
    # each was answered once, no earlier than its own deadline (timer slack: 5 ms)
    assert first.got == [one] and second.got == [two]
    assert first.times[0] >= t1 + timeout - 0.005
    assert second.times[0] >= t2 + timeout - 0.005


async def test_the_master_fails_a_step_at_once_when_more_than_s_children_are_gone(engine_at):
    child0 = FakeLink()
    engine = engine_at(master(), [child0, None, None])   # children 1 and 2 never joined
    watcher = recorder()
    engine.watch(4, watcher)
    assert not send_chunk(engine, 0, 4, 0, np.ones(8))   # child 0's chunk arrives: no quorum
    reason = ("master did not get 2 of 3 children: 2 of them are gone or failed "
              "(child 1: disconnected; child 2: disconnected)")
    assert watcher.got == [Failed(4, reason)]
    assert child0.messages() == [Fail(4, reason)]
    assert engine.resolved_through == 4 and engine.open_steps == []


async def test_losing_children_during_a_step_fails_it_when_the_quorum_is_gone(engine_at):
    links = [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links)
    watcher = recorder()
    engine.watch(6, watcher)
    assert send_chunk(engine, 0, 6, 0, np.ones(8))       # the step is under way

    def lose(k):
        engine.neighbours.slots[k] = ChildSlot()          # as membership.child_lost does
        engine.child_lost(k)

    lose(1)
    assert watcher.got == [] and engine.open_steps == [6]   # s = 1: one child may go
    lose(2)
    assert watcher.got == [Failed(6, "master did not get 2 of 3 children: 2 of them are gone "
                                     "or failed (child 1: disconnected; child 2: disconnected)")]
    assert links[0].messages(Fail) == [Fail(6, watcher.got[0].reason)]
    assert links[1].messages() == links[2].messages() == []


@pytest.mark.parametrize("when", ["gone-before", "lost-after"])
async def test_the_masters_own_request_fails_at_once_when_more_than_s_children_are_gone(engine_at,
                                                                                       when):
    links = [FakeLink(), None, None] if when == "gone-before" else [FakeLink() for _ in range(3)]
    engine = engine_at(master(), links, timeout=30)
    watcher = recorder()
    engine.submit(4, np.zeros(8))     # the master's training process asks for step 4
    engine.watch(4, watcher)
    if when == "lost-after":          # no child has sent anything yet
        for k in (1, 2):
            engine.neighbours.slots[k] = ChildSlot()
            engine.child_lost(k)
    assert [type(o) for o in watcher.got] == [Failed]


@pytest.mark.parametrize("first", ["quorum", "deadline"])
async def test_a_node_tells_its_parent_once_per_step(engine_at, first):
    parent, child0 = FakeLink("parent"), FakeLink()
    if first == "quorum":      # two of node 0's three children are gone before the step
        engine = engine_at(node("0"), [child0, None, None], parent, timeout=0.05)
    else:
        engine = engine_at(node("0"), [child0, FakeLink(), FakeLink()], parent, timeout=0.05)
    watcher = recorder()
    engine.submit(5, np.zeros(8))
    engine.watch(5, watcher)
    await wait_until(lambda: not engine.open_steps, "step 5's deadline")
    if first == "deadline":    # then two children report failures: the quorum is gone too
        engine.child_failed(1, Fail(5, "node 0.1 did not get its local gradient"))
        engine.child_failed(2, Fail(5, "node 0.2 did not get its local gradient"))
    [fail] = parent.messages()
    assert isinstance(fail, Fail) and fail.step == 5 and not fail.mismatch
    if first == "quorum":
        assert fail.reason == ("node 0 did not get 2 of 3 children: 2 of them are gone or failed "
                               "(child 1: disconnected; child 2: disconnected)")
    else:
        assert fail.reason == ("node 0 did not get 2 of 3 children (got 0) within 0.05 s")
    # The parent decides: the step stays undecided here until it answers.
    assert engine.resolved_through == -1 and watcher.got == [] and child0.messages() == []
    engine.parent_failed(Fail(5, "master did not get 2 of 3 children"))
    assert watcher.got == [Failed(5, "master did not get 2 of 3 children")]
    assert child0.messages() == [Fail(5, "master did not get 2 of 3 children")]
    assert parent.messages() == [fail]


async def test_a_leaf_sends_its_vector_up_and_reports_nothing_at_its_deadline(engine_at):
    parent = FakeLink("parent")
    engine = engine_at(node("0.1"), [], parent, timeout=0.05)
    vector = np.arange(10, dtype=np.float32)
    assert engine.submit(3, vector) is None
    await wait_until(lambda: not engine.open_steps, "step 3's deadline")
    # Two chunks of 8 and 2 float32s went up, and nothing else: a leaf's part was done.
    assert [type(m) for m in parent.messages()] == [Chunk, Chunk]
    np.testing.assert_array_equal(parent.vector(Chunk, 3), vector)


async def test_a_vector_that_does_not_fit_the_step_is_refused(engine_at):
    engine = engine_at(node("0.1"), [], FakeLink("parent"))
    assert engine.submit(3, np.zeros(10, np.float32)) is None
    assert engine.submit(3, np.zeros(12, np.float32)) == (
        "this process's vector is 12 x float32 but the tree's for step 3 is 10 x float32")


# ---------------------------------------------------------------- outcomes

def test_watching_a_decided_step_answers_at_once_from_the_last_keep_results(engine_at):
    engine = engine_at(master(), [None, None, None], keep_results=2)
    layout = ChunkLayout.of(3, np.float64, 32)
    vectors = {s: np.full(3, float(s)) for s in range(4)}
    for s in range(4):
        if s == 2:
            engine.fail(2, "child 1: disconnected")
        else:
            engine.resolved(s, layout, vectors[s])
    assert engine.resolved_through == 3
    got = {}
    for s in range(4):
        engine.watch(s, lambda outcome, s=s: got.setdefault(s, outcome))
    assert set(got) == {0, 1, 2, 3}    # all answered during watch()
    assert got[3] == Resolved(3, layout, vectors[3])
    assert got[2] == Failed(2, "child 1: disconnected")
    for s in (0, 1):
        assert got[s] == Lost(s, f"the result of step {s} is no longer held by this daemon (it "
                                 "keeps the last 2); the tree is at step 3")


def test_a_waiting_watcher_is_answered_once_when_its_step_is_decided(engine_at):
    engine = engine_at(master(), [None, None, None])
    watcher = recorder()
    engine.watch(0, watcher)
    assert watcher.got == []
    engine.fail(0, "gone")
    engine.fail(0, "again")            # a decided step is not decided twice
    assert watcher.got == [Failed(0, "gone")]
    assert engine.stats.steps_failed == 1


# ---------------------------------------------------------------- catch-up

def test_a_child_that_joined_mid_step_catches_up_once(engine_at):
    late, on_time, failed_late = FakeLink("late"), FakeLink("on time"), FakeLink("failed late")
    engine = engine_at(master(), [late, on_time, None])
    engine.neighbours.slots[0].missed_through = 2   # joined while step 2 was under way
    engine.neighbours.slots[1].missed_through = 1   # joined before step 2 began
    layout = ChunkLayout.of(10, np.float64, 32)     # chunks of 4, 4 and 2 elements
    result = np.arange(10, dtype=np.float64)
    engine.resolved(2, layout, result)

    assert not send_chunk(engine, 0, 2, 0, np.zeros(10))    # a late chunk: dropped, but...
    assert [(m.step, m.chunk) for m in late.messages()] == [(2, 0), (2, 1), (2, 2)]
    np.testing.assert_array_equal(late.vector(Result, 2), result)
    assert not send_chunk(engine, 0, 2, 1, np.zeros(10))    # ... only once per step
    assert len(late.messages()) == 3
    assert not send_chunk(engine, 1, 2, 0, np.zeros(10))    # this one had step 2 in full
    assert on_time.messages() == []

    engine.fail(3, "child 1: disconnected")
    engine.neighbours.slots[2] = ChildSlot(link=failed_late, missed_through=3)
    assert not send_chunk(engine, 2, 3, 0, np.zeros(10))
    assert not send_chunk(engine, 2, 3, 1, np.zeros(10))
    assert failed_late.messages() == [Fail(3, "child 1: disconnected")]


# ---------------------------------------------------------------- an exact decode at the master

@pytest.mark.parametrize("tree, quorums, tolerance", [
    # CRC (3 children, s = 1): each chunk from its own 2 fastest children; exact to rounding.
    (Tree((3,), (1,)), [(2, 0), (1, 2), (0, 1)], 1e-12),
    # FRC (4 children, s = 1): any 3 of 4, coefficients 1.0: exact in floating point.
    (Tree((4,), (1,)), [(3, 1, 0), (0, 2, 1), (1, 3, 2)], 0.0),
], ids=["crc", "frc"])
async def test_the_master_decodes_the_exact_sum_from_the_fastest_children(engine_at, tree, quorums,
                                                                         tolerance):
    samples, dim, step = 24, 10, 7
    grads = np.random.default_rng(1).integers(-8, 8, (samples, dim)).astype(np.float64)
    shares = plan(tree, samples).nodes
    messages = [sum(w * grads[a:b].sum(axis=0) for a, b, w in shares[str(k)].local)
                for k in range(tree.fanout[0])]
    links = [FakeLink() for _ in range(tree.fanout[0])]
    engine = engine_at(master(tree, chunk_bytes=32), links)   # 3 chunks: 4 + 4 + 2 elements
    watcher = recorder()
    engine.submit(step, np.empty(dim))
    engine.watch(step, watcher)
    for chunk, quorum in enumerate(quorums):
        for k in quorum:
            assert send_chunk(engine, k, step, chunk, messages[k])
    [outcome] = watcher.got
    assert isinstance(outcome, Resolved) and outcome.step == step
    np.testing.assert_allclose(outcome.vector, grads.sum(axis=0), rtol=tolerance, atol=tolerance)
    for link in links:    # every child gets the result, the slow ones too
        np.testing.assert_array_equal(link.vector(Result, step), outcome.vector)
    assert engine.resolved_through == step and engine.stats.steps_done == 1


async def test_a_child_that_stopped_reading_is_cut_off_and_the_others_get_the_result(engine_at):
    stuck, reading = FakeLink("stuck"), FakeLink("reading")
    stuck.writing_paused, stuck.write_buffer_size = True, 1000    # its socket is full
    engine = engine_at(master(), [stuck, reading, FakeLink()], send_queue_bytes=999)
    for k in (1, 2):     # any two children decode step 0's only chunk
        assert send_chunk(engine, k, 0, 0, np.ones(4))
    assert stuck.aborted == "child stopped reading (1000 bytes queued)"
    assert stuck.messages() == []
    assert len(reading.messages(Result)) == 1
