"""Results received straight into the waiting training process's shared output.

At a CodedReduce leaf, a ring worker and the ring's master, a step's result is received
into the shared output of the local process waiting on it (``StepEngine.alloc_result``,
``LocalProcesses.lend``): nothing copies it there. The process may change that memory
the moment it has its answer, so: its answer waits until no link holds a send that
reads it, the host's other processes copy it first, the daemon keeps no copy, and a
client that gave up waiting takes the answer still owed instead of asking again.

Real daemons on 127.0.0.1 (vectors of several chunks, the way a gradient goes), and
the daemon's side of one process with fake links.
"""

import asyncio
import functools

import numpy as np
import pytest

from crnet import AsyncClient, CrnetTimeout, StepFailed, StepLost
from crnet.coding.plan import Tree
from crnet.measure.stats import Stats
from crnet.node.join.membership import Membership
from crnet.node.links import ClientLink, ClientState
from crnet.node.local import LocalProcesses
from crnet.node.neighbours import Neighbours
from crnet.node.steps import EngineSettings, Lost, StepEngine
from crnet.protocol.messages import Attached, Done, Result, Submit
from crnet.protocol.shm import SharedRegion
from crnet.schemes import Origin, Place
from crnet.schemes.chunks import ChunkLayout
from crnet.tools.launch import MASTER

from ..helpers.clients import close_all, connect_all
from ..helpers.fake_links import FakeLink, rooms
from ..helpers.vectors import integers, rel_error
from ..helpers.waits import gather_or_cancel, wait_until

pytestmark = pytest.mark.asyncio(loop_factories=["asyncio"])   # the daemons run uvloop anyway

DIM = 1 << 20                  # float32: 4 MiB, 16 chunks of 256 KiB (a ring: parts of them)
BIG = 1 << 22                  # 16 MiB: a ring's parts are still queued when its step is done
CHUNK = 256 << 10
M = 24                         # samples
CR = Tree.regular(3, 2, 1)     # master -> 0, 1, 2 -> nine leaves; s = 1 at every parent
# s = 0: every leaf's part is needed, so its process waits before the result comes down and
# always takes it straight (with s = 1 a leaf whose process asked late may get a copy).
CR_ALL = Tree.regular(3, 2, 0)
RING = Tree((4,), (0,))        # rar: a ring of 4 workers under the master
COEF = np.random.default_rng(5).integers(1, 5, M).astype(np.float64)   # sample i: COEF[i] * BASE


def weight(client: AsyncClient) -> float:
    """This process's share of the step's gradient, as a multiple of BASE."""
    return float(sum(w * COEF[a:b].sum() for a, b, w in client.assignment.ranges))


@functools.cache
def want(step: int, dim: int) -> np.ndarray:
    return integers(dim) * (COEF.sum() * (step + 1))


async def submit(client: AsyncClient, step: int, dim: int = DIM, **kwargs) -> np.ndarray:
    """Step ``step`` of this process: its gradient computed into the shared input."""
    vec = await client.buffer(dim)
    np.multiply(integers(dim), np.float32(weight(client) * (step + 1)), out=vec)
    return await client.allreduce(vec, step, **kwargs)


async def direct(clients: dict) -> dict:
    """Each daemon's count of results delivered without a copy."""
    return {n: (await c.stats())["stats"]["results_direct"] for (n, i), c in clients.items() if i == 0}


async def everyone(clients: dict, step: int) -> dict:
    """Every process's result of ``step``."""
    got = await gather_or_cancel(*(submit(c, step, timeout=60) for c in clients.values()))
    return dict(zip(clients, got))


def exact(results: dict, step: int, scale: float = 1.0) -> None:
    """Every process got the step's sum, and the same bits as every other process."""
    first = next(iter(results.values()))
    for who, got in results.items():
        assert rel_error(got, want(step, got.size) * scale) <= 1e-5, (who, step)
        np.testing.assert_array_equal(got, first, err_msg=f"{who}, step {step}")


# ---------------------------------------------------------------- real daemons

@pytest.mark.timeout(180)
@pytest.mark.parametrize("scheme, tree", [("cr", CR_ALL), ("rar", RING)], ids=["cr", "rar"])
async def test_results_are_exact_and_leaves_and_ring_members_take_them_without_a_copy(
        local_tree, scheme, tree):
    lt = local_tree(tree, M, scheme=scheme, chunk_bytes=CHUNK)
    clients = await connect_all(lt, tree.names(), per_host=1)
    steps = 4
    try:
        for t in range(steps):
            exact(await everyone(clients, t), t)
        counts = await direct(clients)
    finally:
        close_all(clients)
    takers = [n for n in tree.names() if not tree.children(n)]   # leaves, ring workers
    assert all(counts[n] > 0 for n in takers), counts
    if scheme == "cr":   # they forward every chunk to children: they copy
        assert all(counts[n] == 0 for n in tree.names() if tree.children(n)), counts
    else:                # the master, a ring member too, takes it straight in as well
        assert counts[MASTER] > 0, counts


@pytest.mark.timeout(180)
@pytest.mark.parametrize("scheme, tree", [("cr", CR_ALL), ("rar", RING)], ids=["cr", "rar"])
async def test_a_second_submit_of_a_step_adds_nothing(local_tree, scheme, tree):
    """A host adds one vector to a step: a process that submits the same step again (a
    restarted process, a client retrying) gets the step's result, and the sum is not
    changed by it (a ring worker used to send its parts twice: its vector counted twice)."""
    lt = local_tree(tree, M, scheme=scheme, chunk_bytes=CHUNK)
    clients = await connect_all(lt, tree.names(), per_host=1)
    again = clients[(next(n for n in tree.names() if not tree.children(n)), 0)]
    try:
        for t in range(3):
            vec = await again.buffer(DIM)
            np.multiply(integers(DIM), np.float32(weight(again) * (t + 1)), out=vec)
            first = asyncio.ensure_future(again.allreduce(vec, t, timeout=60))
            await asyncio.sleep(0)           # its SUBMIT is out, the vector staged: again
            again._conn.send(Submit(t, DIM, "float32"))
            others = [submit(c, t, timeout=60) for c in clients.values() if c is not again]
            got = await gather_or_cancel(first, *others)
            exact(dict(zip([k for k, c in clients.items() if c is again]
                           + [k for k, c in clients.items() if c is not again], got)), t)
    finally:
        close_all(clients)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("scheme, tree, dim", [("cr", CR, DIM), ("rar", RING, BIG)],
                         ids=["cr", "rar"])
async def test_a_process_that_divides_its_result_in_place_corrupts_no_later_step(
        local_tree, scheme, tree, dim):
    """The torch integration's pattern: the result lands in the shared output and is
    divided there right after the step. Nothing the daemons still send or keep may read
    that memory: every later step is still exact everywhere. (A ring worker's last parts
    are often still queued when its step is done: without the wait for them, the
    successor would get divided ones.)"""
    lt = local_tree(tree, M, scheme=scheme, chunk_bytes=CHUNK)
    clients = await connect_all(lt, tree.names(), per_host=1)

    async def step(c: AsyncClient, t: int) -> np.ndarray:
        out = await c.result_buffer(dim)
        got = await submit(c, t, dim, out=out, timeout=60)
        assert got is out
        out /= np.float32(M)               # at once: the memory is the process's now
        return out.copy()

    try:
        for t in range(6):
            got = await gather_or_cancel(*(step(c, t) for c in clients.values()))
            exact(dict(zip(clients, got)), t, 1 / M)
        counts = await direct(clients)
    finally:
        close_all(clients)
    assert sum(counts.values()) > 0, counts


@pytest.mark.timeout(180)
async def test_a_retry_after_the_clients_own_timeout_gets_the_result_delivered_late(local_tree):
    """Worker 0 gives up on a step that finishes later (worker 3 is late) and asks again:
    before the step finished (its answer is still to come), and after (the DONE came in
    while nobody waited). The daemon keeps no copy of a result it delivered straight
    into the shared output, so asking it again would say StepLost: the retry takes the
    answer still owed, and the steps after it go on as usual."""
    lt = local_tree(RING, M, scheme="rar", chunk_bytes=CHUNK)
    clients = await connect_all(lt, RING.names(), per_host=1)
    late = clients[("3", 0)]
    first = clients[("0", 0)]
    others = [c for c in clients.values() if c is not first and c is not late]

    async def slow(t: int) -> np.ndarray:
        await asyncio.sleep(1.0)
        return await submit(late, t, timeout=60)

    try:
        exact(await everyone(clients, 0), 0)
        for t, finished_first in ((1, False), (2, True)):
            tasks = [asyncio.ensure_future(slow(t)),
                     *(asyncio.ensure_future(submit(c, t, timeout=60)) for c in others)]
            try:
                with pytest.raises(CrnetTimeout):
                    await submit(first, t, timeout=0.3)
                if finished_first:   # its DONE comes in while this process waits for nothing
                    await asyncio.gather(*tasks)
                    await asyncio.sleep(0.2)
                retried = await submit(first, t, timeout=60)
                got = await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
            exact({"retry": retried, **{i: g for i, g in enumerate(got)}}, t)
        for t in (3, 4):   # no answer was left over to be taken for a later step's
            exact(await everyone(clients, t), t)
        counts = await direct(clients)
    finally:
        close_all(clients)
    assert counts["0"] > 0, counts


@pytest.mark.timeout(180)
async def test_an_answer_that_comes_after_the_process_gave_up_is_not_taken_for_another(
        local_tree):
    """Worker 0 gives up on step 1 (worker 3 never joins it, so the tree fails it ~3 s
    later) and asks for step 2 once step 1's ERROR is in: that ERROR is not step 2's
    error, and step 2's sum comes. It gives up on step 3 (worker 3 is late) and asks for its stats once step
    3's DONE is in: that DONE is not the stats' answer. Step 3 asked again is a new
    request, answered from what the daemon kept (nothing: it delivered the result
    straight into the shared output), and later steps go on."""
    lt = local_tree(RING, M, scheme="rar", chunk_bytes=CHUNK, timeout=3.0)
    clients = await connect_all(lt, RING.names(), per_host=1)
    first, late = clients[("0", 0)], clients[("3", 0)]
    middle = [c for c in clients.values() if c is not first and c is not late]
    try:
        exact(await everyone(clients, 0), 0)
        failing = [asyncio.ensure_future(submit(c, 1, timeout=60)) for c in middle]
        with pytest.raises(CrnetTimeout):
            await submit(first, 1, timeout=0.3)
        for task in failing:
            with pytest.raises(StepFailed):
                await task
        await asyncio.sleep(0.3)              # step 1's ERROR for worker 0 is in by now
        exact(await everyone(clients, 2), 2)

        async def slow() -> np.ndarray:
            await asyncio.sleep(1.0)
            return await submit(late, 3, timeout=60)

        tasks = [asyncio.ensure_future(slow()), *(asyncio.ensure_future(submit(c, 3, timeout=60))
                                                   for c in middle)]
        with pytest.raises(CrnetTimeout):
            await submit(first, 3, timeout=0.3)
        exact(dict(enumerate(await gather_or_cancel(*tasks))), 3)
        await asyncio.sleep(0.3)              # step 3's DONE for worker 0 is in by now
        assert (await first.stats())["stats"]["steps_done"] >= 3
        with pytest.raises(StepLost):
            await submit(first, 3, timeout=60)
        assert first.stale                    # it missed step 3's result: say it is current
        first.mark_current()                  # (its vectors depend on no parameters)
        exact(await everyone(clients, 4), 4)
    finally:
        close_all(clients)


@pytest.mark.timeout(120)
async def test_a_second_request_while_one_waits_is_refused_and_the_first_gets_its_answer(
        local_tree):
    """Answers come in order on a process's connection: a second coroutine asking while
    the first waits would take the first one's answer. It is refused with a clear error;
    the waiting step is answered as usual."""
    lt = local_tree(RING, M, scheme="rar", chunk_bytes=CHUNK)
    clients = await connect_all(lt, RING.names(), per_host=1)
    first = clients[("0", 0)]
    others = [c for c in clients.values() if c is not first]
    try:
        waiting = asyncio.ensure_future(submit(first, 0, timeout=60))
        await asyncio.sleep(0.2)          # the step waits for the other processes
        assert not waiting.done()
        with pytest.raises(RuntimeError, match="one request at a time"):
            await first.stats()
        got = await gather_or_cancel(waiting, *(submit(c, 0, timeout=60) for c in others))
        exact(dict(enumerate(got)), 0)
        assert (await first.stats())["stats"]["steps_done"] == 1   # the connection still works
    finally:
        close_all(clients)


@pytest.mark.timeout(180)
async def test_two_processes_on_one_daemon_both_get_the_result(local_tree):
    """--local-processes 2: one process's output takes the result; the other copies it
    from there before the first is answered. s = 0 (as CR_ALL): with s = 1 a host whose
    processes ask late is the straggler the step goes without, and gets a copy."""
    tree = Tree.regular(3, 1, 0)
    lt = local_tree(tree, M, chunk_bytes=CHUNK, local_processes=2)
    clients = await connect_all(lt, tree.names(), per_host=2)

    async def step(c: AsyncClient, t: int) -> np.ndarray:
        got = await submit(c, t, out=await c.result_buffer(DIM), timeout=60)
        result = got.copy()
        got[:] = -1.0                      # its memory now: the other's copy came first
        return result

    try:
        for t in range(4):
            got = await gather_or_cancel(*(step(c, t) for c in clients.values()))
            exact(dict(zip(clients, got)), t)
        counts = await direct(clients)
    finally:
        close_all(clients)
    assert all(counts[n] > 0 for n in tree.names() if n != MASTER), counts
    assert counts[MASTER] == 0, counts


# ---------------------------------------------------------------- one daemon, fake links

LEAF = Place("0.0", 2, CR, "cr", "auto", 64)   # 8 float64 per chunk
N = 20                                         # 3 chunks


@pytest.fixture
def leaf():
    """``leaf(**settings)``: a CodedReduce leaf's engine with a fake parent link, and its
    one training process (``ClientLink``) with real shared memory and a fake socket."""
    made = []

    def make(**settings):
        neighbours = Neighbours()
        neighbours.parent = parent = FakeLink("parent")
        # The engine lends the process's output through LocalProcesses, as lifecycle.Node wires it.
        engine = StepEngine(EngineSettings(**settings), Stats(), neighbours,
                            lend=lambda *asked: local.lend(*asked))
        engine.start(LEAF)
        m = Membership(engine, neighbours, stop=lambda code: None)
        made.append(m)
        local = LocalProcesses(1, engine)
        r = rooms(m)
        link = ClientLink(local, m, engine, engine.stats, r.broadcasts, r.barriers)
        link.conn, link.region, link.index = FakeLink("process"), region(), 0
        link.state = ClientState.ATTACHED      # as after its hello, without the welcome
        local.seats[0] = link
        return engine, parent, link

    yield make
    for m in made:
        m.engine.close()
        m.close()


def region(capacity: int = 4096) -> SharedRegion:
    made = SharedRegion.create(capacity)
    made.close_fd()   # mapped: the descriptor is not needed
    return made


def result_chunks(engine, step: int, vector: np.ndarray, chunks) -> None:
    """The parent's RESULT chunks ``chunks`` of ``vector``, as ParentLink hands them over."""
    layout = ChunkLayout.of(vector.size, vector.dtype, LEAF.chunk_bytes)
    for c in chunks:
        a, b = layout.bounds(c)
        msg = Result(step, c, vector.size, vector.dtype.name)
        dest = engine.piece_dest(Origin.PARENT, 0, msg, layout.nbytes(c))
        np.frombuffer(dest, vector.dtype)[:] = vector[a:b]
        engine.piece(Origin.PARENT, 0, msg, dest)


def ask(link: ClientLink, step: int) -> None:
    assert link.region is not None and link.conn is not None
    link.region.input(np.float64, N)[:] = step + 1
    link.received(link.conn, Submit(step, N, "float64"), None)


async def test_a_leaf_receives_into_the_output_and_answers_at_once(leaf):
    """A leaf sends nothing from its result: its process is answered the moment the last
    chunk is in, even while its own (stale, straggling) upload still queues on the link."""
    engine, parent, link = leaf()
    result = np.arange(N, dtype=np.float64)
    ask(link, 0)
    result_chunks(engine, 0, result, [0])
    assert engine.lends(link)
    ask(link, 1)                     # it gave up waiting: held while its output takes step 0
    assert link.waiting is not None and link.waiting[0] == 0 and 1 not in engine.open_steps
    parent.write_buffer_size = 1000  # its own chunks of step 0, still going up
    result_chunks(engine, 0, result, [1, 2])
    await wait_until(lambda: link.conn.messages(Done), "the DONE of step 0")
    assert link.conn.messages(Done)[0].step == 0
    np.testing.assert_array_equal(link.region.output(np.float64, N), result)
    assert engine.stats.results_direct == 1 and not parent.aborted
    # The held request went on; the daemon kept nothing of step 0 (nor counts it).
    assert link.waiting is not None and link.waiting[0] == 1 and 1 in engine.open_steps
    lost = engine.outcome(0)
    assert isinstance(lost, Lost) and "shared memory" in lost.reason
    assert engine.bookkeeping()["kept_bytes"] == 0


def sent_result(engine, step: int, vector: np.ndarray) -> None:
    """A result that sends read (a ring worker's: ``alloc_result(sent=True)``), resolved."""
    out = engine.lending.alloc_result(step, vector.size, vector.dtype, sent=True)
    out[:] = vector
    engine.decisions.resolved(step, ChunkLayout.of(vector.size, vector.dtype, LEAF.chunk_bytes), out)


async def test_a_result_that_sends_read_is_answered_once_the_links_sent_all(leaf):
    engine, parent, link = leaf()
    result = np.arange(N, dtype=np.float64)
    ask(link, 0)
    parent.write_buffer_size = 1000  # a part queued on a link may read the output
    sent_result(engine, 0, result)
    await asyncio.sleep(0.02)
    assert link.conn.messages(Done) == [] and engine.lends(link)
    parent.write_buffer_size = 0
    await wait_until(lambda: link.conn.messages(Done), "the DONE of step 0")
    np.testing.assert_array_equal(link.region.output(np.float64, N), result)
    assert engine.stats.results_direct == 1 and not parent.aborted and not engine.lends(link)


async def test_a_link_that_does_not_send_within_the_steps_bound_is_cut_off(leaf):
    engine, parent, link = leaf(timeout=0.1)   # answered within 0.6 s
    loop = asyncio.get_running_loop()
    began = loop.time()
    ask(link, 0)
    parent.write_buffer_size = 1000
    sent_result(engine, 0, np.ones(N))
    await wait_until(lambda: link.conn.messages(Done), "the DONE of step 0", timeout=5)
    assert loop.time() - began >= engine.settings.answer_within - 0.01
    assert parent.aborted and "step 0" in parent.aborted


async def test_a_result_for_a_process_that_handed_over_new_memory_is_copied_there(leaf):
    engine, _, link = leaf()
    result = np.arange(N, dtype=np.float64)
    ask(link, 0)
    old = link.region
    assert old is not None
    result_chunks(engine, 0, result, [0])
    link.attach(region(8192))                       # mid-step: the result still lands in old
    result_chunks(engine, 0, result, [1, 2])
    await wait_until(lambda: link.conn.messages(Done), "the DONE of step 0")
    assert link.conn.messages(Attached)
    np.testing.assert_array_equal(old.output(np.float64, N), result)
    assert link.region is not None
    np.testing.assert_array_equal(link.region.output(np.float64, N), result)
    assert engine.stats.results_direct == 0          # that one was a copy
