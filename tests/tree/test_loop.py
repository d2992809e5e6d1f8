"""The README's training loop, taken from README.md itself, on a real local tree.

Each host's training process is a thread running ``train`` with the blocking Client;
its compute is emulated per micro-batch (a sleep, ten times longer when it straggles),
and its gradient is exact, so the final parameters say whether every step was applied.
Processes may start at different times, and one may be killed (its client closed
mid-step) and started again from the initial parameters: every replica must still end
with single-process gradient descent's parameters, or raise.
"""

import asyncio
import time

import numpy as np
import pytest

from crnet import CrnetTimeout, StaleReplica
from crnet.coding.plan import Tree

from ..helpers.clients import close_all, connect_all
from ..helpers.loop import assert_every_step_applied, connect, readme_train, run_hosts
from ..helpers.trees import workers
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import wait_until

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def world(monkeypatch):
    """The README's loop starts with ``c.barrier("start")``: $CRNET_WORLD_SIZE processes."""
    monkeypatch.setenv("CRNET_WORLD_SIZE", "4")


def test_the_readme_loop_sheds_stragglers_and_applies_every_step(local_tree, monkeypatch):
    """200 steps, every process 10x slow with probability 0.2, default daemon options:
    no StepLost, no failed step, every result exact; stragglers stop and catch up."""
    tree = Tree.regular(3, 2, 1)
    monkeypatch.setenv("CRNET_WORLD_SIZE", str(len(list(tree.names()))))
    grads = gradients(0, 60, 20)
    lt = local_tree(tree, 60)
    steps = 200
    hosts, took = run_hosts(lt, tree, grads, steps, straggle=(0.2, 10.0))
    assert_every_step_applied(hosts, grads, steps)
    abandoned = sum(h.abandoned for h in hosts)
    behind = [b for h in hosts for b in h.behind]
    assert abandoned > 0             # stragglers stopped computing steps the tree finished
    assert max(behind) <= 2          # and never fell further behind than that
    catch_ups = sorted(c for h in hosts for c in h.catch_ups) or [0.0]
    print(f"\n200 steps in {took:.1f} s; {abandoned} steps abandoned; steps behind at a "
          f"step's start: max {max(behind)}, {sum(b > 0 for b in behind)} of {len(behind)} "
          f"starts behind; back level after {1e3 * np.median(catch_ups):.1f} ms median, "
          f"{1e3 * catch_ups[-1]:.1f} ms max")


def test_the_readme_loop_without_compute_loses_no_step(local_tree, monkeypatch):
    tree = Tree.regular(2, 2, 1)
    monkeypatch.setenv("CRNET_WORLD_SIZE", str(len(list(tree.names()))))
    grads = gradients(1, 30, 4)
    lt = local_tree(tree, 30)
    hosts, _ = run_hosts(lt, tree, grads, 500, pieces=1, piece_s=0.0)
    assert_every_step_applied(hosts, grads, 500)


async def test_a_process_can_race_its_computation_against_the_tree(local_tree):

    tree = Tree.regular(3, 1, 1)
    grads = gradients(2, 30, 6)
    lt = local_tree(tree, 30)
    clients = list((await connect_all(lt, ("0", "1", "2"))).values())
    try:
        late = clients[2]
        assert not late.finished(0) and late.tree_step == -1
        waiting = asyncio.ensure_future(late.wait_finished(0))
        await asyncio.gather(*(c.allreduce(local_gradient(c.assignment, grads), step=0)
                               for c in clients[:2]))
        await asyncio.wait_for(waiting, 10)    # the tree finished step 0 without it
        assert late.finished(0) and late.tree_step == 0
        started = time.monotonic()
        result = await late.allreduce(np.zeros(6), step=0)   # its vector is not needed
        assert time.monotonic() - started < 0.5
        await late.wait_finished(0)                           # already finished: at once
    finally:
        close_all(clients)
    assert rel_error(result, grads.sum(axis=0)) <= 1e-9


def test_the_readme_loop_with_staggered_starts_and_a_restart_trains_like_one_process(local_tree):
    """4 daemons, their processes started 1.5 s apart, one killed in the middle of a step
    and started again from the initial parameters: the start barrier holds the first
    ones at step 0, the restarted one (stale: the job was running) takes the others'
    parameters and goes on with them; every replica ends with single-process gradient
    descent's parameters (float64, 1e-9). A rerun of the script without a job name
    raises, saying why; with a new job name it trains from step 0 again."""
    tree = Tree.regular(3, 1, 1)
    grads = gradients(3, 30, 8)
    # --timeout 5: the rerun's request_state waits for the daemons' answer bound (about
    # 11 s then; 40 s with the default --timeout 30) before it raises.
    lt = local_tree(tree, 30, timeout=5)
    steps = 300
    hosts, took = run_hosts(lt, tree, grads, steps, pieces=2, piece_s=0.002, stagger_s=1.5,
                            kill=(2, 120))
    assert [h.lives for h in hosts] == [1, 1, 2, 1]
    assert_every_step_applied(hosts, grads, steps, resyncs=1)
    print(f"\n{steps} steps, starts 1.5 s apart and a restart, in {took:.1f} s")

    started = time.monotonic()
    with connect(lt.socket_path(list(tree.names())[1])) as c:   # the same script again: no job name
        assert c.stale
        with pytest.raises(StaleReplica, match=r"connected to a job already at step 2\d\d.*"
                           r"request_state.*mark_current"):
            c.allreduce(np.zeros(8), step=0)
        with pytest.raises(CrnetTimeout, match=r"no process of the job sent its state.*"
                           r"give each run its own job"):
            readme_train()(c, np.zeros(8), steps, None, None, 0.5)
    print(f"the rerun without a job name raised after {time.monotonic() - started:.1f} s")

    hosts, _ = run_hosts(lt, tree, grads, 50, pieces=1, piece_s=0.0, job="second run")
    assert_every_step_applied(hosts, grads, 50)


async def test_a_process_that_may_have_missed_an_update_cannot_submit_until_it_takes_the_state(
        local_tree):
    """StepLost makes a process stale: allreduce and send_state raise StaleReplica before
    anything reaches the daemon, and it answers no state request; mark_current or
    request_state (answered by a process at a step boundary) make it current again."""
    from crnet import StepLost

    tree = Tree.regular(3, 1, 1)
    m, dim = 30, 8
    grads = gradients(8, m, dim)
    lt = local_tree(tree, m, keep_results=2, result_memory=1)   # no memory to keep results in
    clients = await connect_all(lt, workers(tree))
    try:
        assert not any(c.stale for c in clients.values())   # all there before step 0
        active = [clients["0"], clients["1"]]
        for t in range(5):
            await asyncio.gather(*(c.allreduce(local_gradient(c.assignment, grads), step=t)
                                   for c in active))
        late = clients["2"]
        await wait_until(lambda: late.tree_step == 4, "step 4's result at its daemon")
        with pytest.raises(StepLost):
            await late.result(0, like=np.zeros(dim), timeout=30)
        assert late.stale
        for call in (late.allreduce(np.zeros(dim), step=5), late.send_state(np.zeros(dim), 4)):
            with pytest.raises(StaleReplica, match=r"refused: it got StepLost .* may have missed "
                                                   r"an update.*request_state.*mark_current"):
                await call
        late.mark_current()
        assert not late.stale
        with pytest.raises(StepLost):
            await late.result(1, like=np.zeros(dim), timeout=30)
        assert late.stale

        asking = asyncio.ensure_future(late.request_state(np.zeros(dim), timeout=30))
        await wait_until(lambda: all(c.state_wanted() for c in active), "the state request at peers")
        assert not late.state_wanted()           # stale: it has no state to give
        # Both answer, as up-to-date processes do at their step boundary: the master (none
        # of whose host's processes can answer) takes the state two of its children agree
        # on at once; one answer alone would wait for the daemons' --timeout.
        await asyncio.gather(*(c.send_state(np.full(dim, 7.0), 4) for c in active))
        state, after = await asking
        assert after == 4 and not late.stale
        np.testing.assert_array_equal(state, np.full(dim, 7.0))
        got = await asyncio.gather(*(c.allreduce(local_gradient(c.assignment, grads), step=5)
                                     for c in clients.values()))
    finally:
        close_all(clients)
    for g in got:
        np.testing.assert_allclose(g, grads.sum(axis=0), rtol=1e-9)
