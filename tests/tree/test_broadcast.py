"""Broadcasts through the daemons: one process's vector to every process of the job, and
the state a process that joins a running job asks its peers for."""

import asyncio

import numpy as np
import pytest

from crnet import AsyncClient, CrnetTimeout, MismatchError
from crnet.coding.plan import Tree

from ..helpers.clients import close_all, connect_all
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import gather_or_cancel, wait_until

pytestmark = pytest.mark.timeout(120)

TREE = Tree.regular(2, 2, 1)        # 7 hosts: "" (the master), 0, 1, 0.0, 0.1, 1.0, 1.1


@pytest.mark.parametrize("root", ["0.1", ""])
async def test_one_process_vector_reaches_every_process(local_tree, root):
    """From a leaf (up through its parent to the master, then down) and from the master;
    3 MB of float64 travel in several chunks (the default chunk is 1 MiB)."""
    lt = local_tree(TREE, 14)
    clients = await connect_all(lt, lt.procs, job="job")
    params = np.random.default_rng(0).standard_normal(400_000)
    try:
        got = await gather_or_cancel(*(
            c.broadcast(params if n == root else np.zeros_like(params), "params/0", root=n == root)
            for n, c in clients.items()))
        for r in got:
            np.testing.assert_array_equal(r, params)
        # Later receivers get it from what their daemon holds; ``out`` in shared memory.
        late = clients["1.0"]
        out = await late.result_buffer(params.size, np.float64)
        again = await late.broadcast(np.zeros_like(params), "params/0", root=False, out=out)
        assert again is out
        np.testing.assert_array_equal(out, params)
    finally:
        close_all(clients)


async def test_receivers_wait_for_a_root_that_comes_later(local_tree):
    lt = local_tree(TREE, 14)
    clients = await connect_all(lt, lt.procs, job="job")
    vec = np.arange(10, dtype=np.float32)
    try:
        waiting = [asyncio.ensure_future(c.broadcast(np.zeros_like(vec), "k", root=False))
                   for n, c in clients.items() if n != "1.1"]
        await asyncio.sleep(0.3)
        assert not any(w.done() for w in waiting)
        await clients["1.1"].broadcast(vec, "k", root=True)
        for r in await gather_or_cancel(*waiting):
            np.testing.assert_array_equal(r, vec)
    finally:
        close_all(clients)


async def test_a_receiver_expecting_another_vector_is_told(local_tree):
    """Two of the tree's three processes take part (``processes=2``)."""
    lt = local_tree(Tree.regular(2, 1, 1), 4)
    clients = await connect_all(lt, lt.procs, job="job")
    try:
        await clients["0"].broadcast(np.ones(5), "k", root=True, processes=2)
        with pytest.raises(MismatchError, match="broadcast 'k' is 5 x float64"):
            await clients["1"].broadcast(np.ones(6), "k", root=False, processes=2)
        with pytest.raises(CrnetTimeout):   # a key nobody sends: the caller's timeout
            await clients["1"].broadcast(np.ones(5), "never", root=False, timeout=0.5,
                                         processes=2)
        # The connection is still good for the next one.
        np.testing.assert_array_equal(
            await clients["1"].broadcast(np.ones(5), "k", root=False, processes=2), np.ones(5))
    finally:
        close_all(clients)


async def test_a_newcomer_gets_the_state_from_its_peers_and_goes_on_in_lockstep(local_tree):
    """A process dies mid-job; its successor asks for the state; every other process
    answers at its next step boundary (the first answer wins); the newcomer continues
    at the step after the state's and its replica equals the others'."""
    lt = local_tree(TREE, 28)
    grads = gradients(5, 28, 6)
    want = grads.sum(axis=0)
    clients = await connect_all(lt, lt.procs, job="job")
    w = {n: np.zeros(6) for n in clients}
    step = {n: 0 for n in clients}

    async def train(n, until):
        """The others' loop: a step, then answer a state request at the boundary."""
        c = clients[n]
        while step[n] < until:
            g = await c.allreduce(local_gradient(c.assignment, grads), step=step[n])
            assert rel_error(g, want) <= 1e-9
            w[n] = w[n] - 0.1 * g
            if c.state_wanted():
                await c.send_state(w[n], step[n])
            step[n] += 1
            await asyncio.sleep(0.01)

    try:
        await gather_or_cancel(*(train(n, 5) for n in clients))
        clients.pop("0.0").close()
        del w["0.0"], step["0.0"]
        others = asyncio.ensure_future(gather_or_cancel(*(train(n, 40) for n in clients)))
        new = await AsyncClient.connect(lt.socket_path("0.0"), timeout=30, job="job")
        await wait_until(lambda: new.tree_step >= 6, "the job to go on")
        state, after = await new.request_state(np.zeros(6))
        assert after >= 6
        clients["0.0"], w["0.0"], step["0.0"] = new, state, after + 1
        assert not new.state_wanted()            # its own request is not one to answer
        await train("0.0", 40)                   # finished steps return at once: catch up
        await others
    finally:
        close_all(clients)
    for n in w:
        np.testing.assert_allclose(w[n], -0.1 * 40 * want, rtol=1e-9, err_msg=n)


async def test_a_new_job_drops_the_old_jobs_broadcasts(local_tree):
    lt = local_tree(Tree.regular(2, 1, 1), 4)
    old = await connect_all(lt, ["0"], job="a")
    rank = old["0"].assignment.rank
    await old["0"].broadcast(np.ones(3), "k", root=rank)
    old["0"].close()
    new = await connect_all(lt, ["0", "1"], job="b")
    try:
        with pytest.raises(CrnetTimeout):
            await new["1"].broadcast(np.ones(3), "k", root=rank, timeout=0.5)
    finally:
        close_all(new)


async def test_a_barrier_lets_everyone_go_once_all_are_there(local_tree):
    lt = local_tree(TREE, 14)
    clients = await connect_all(lt, lt.procs, job="job")
    try:
        names = list(clients)
        early = [asyncio.ensure_future(clients[n].barrier("start", processes=7))
                 for n in names[:-1]]
        await asyncio.sleep(0.5)
        assert not any(w.done() for w in early)
        # One leaves while it waits: it no longer counts, and its successor must come.
        early.pop(0).cancel()
        clients.pop(names[0]).close()
        await asyncio.sleep(1.0)   # its daemon tells the master it left (a leave racing
        # the last arrival may still count: that is the barrier's, not this test's, edge)
        late = asyncio.ensure_future(clients[names[-1]].barrier("start", processes=7))
        await asyncio.sleep(0.5)
        assert not late.done() and not any(w.done() for w in early)
        clients[names[0]] = await AsyncClient.connect(lt.socket_path(names[0]), timeout=30,
                                                     job="job")
        await asyncio.wait_for(asyncio.gather(clients[names[0]].barrier("start", processes=7),
                                              late, *early), 30)
    finally:
        close_all(clients)


async def test_newcomers_asking_at_once_all_get_a_peers_state(local_tree):
    lt = local_tree(TREE, 28)
    clients = await connect_all(lt, lt.procs, job="job")
    try:
        grads = np.ones((28, 3))
        for t in range(3):
            await gather_or_cancel(*(c.allreduce(local_gradient(c.assignment, grads), step=t)
                                     for c in clients.values()))
        asking = [clients.pop(n) for n in ("0.0", "1.1")]
        waits = [asyncio.ensure_future(c.request_state(np.zeros(4))) for c in asking]
        await wait_until(lambda: all(c.state_wanted() for c in clients.values()),
                         "the others to see a request")
        for c in clients.values():
            await c.send_state(np.full(4, 7.0), 2)
        for state, after in await asyncio.wait_for(asyncio.gather(*waits), 10):
            np.testing.assert_array_equal(state, np.full(4, 7.0))
            assert after == 2
        clients.update(zip(("0.0", "1.1"), asking))
    finally:
        close_all(clients)
