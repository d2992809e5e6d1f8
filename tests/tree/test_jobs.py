"""One set of daemons, one training job after another; processes joining a running job."""

import numpy as np
import pytest

from crnet import AsyncClient, DaemonBusy
from crnet.coding.plan import Tree

from ..helpers.clients import close_all, connect_all
from ..helpers.trees import workers
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import gather_or_cancel, wait_until

pytestmark = pytest.mark.timeout(120)

TREE = Tree.regular(2, 2, 1)


async def steps(clients, grads, first, count):
    want = grads.sum(axis=0)
    for t in range(first, first + count):
        for r in await gather_or_cancel(*(c.allreduce((t + 1) * local_gradient(c.assignment, grads),
                                                      step=t) for c in clients.values())):
            assert r.shape == want.shape and rel_error(r, (t + 1) * want) <= 1e-9


async def test_two_jobs_one_after_the_other_on_the_same_daemons(local_tree):
    lt = local_tree(TREE, 40)
    first_grads = gradients(1, 40, 8)
    first = await connect_all(lt, lt.procs, job="job-a")
    try:
        await steps(first, first_grads, 0, 5)
    finally:
        close_all(first)
    # Another job, another model size: it starts at step 0 and nothing of job-a remains.
    second_grads = gradients(2, 40, 12)
    second = await connect_all(lt, lt.procs, job="job-b")
    try:
        assert all(c.tree_step == -1 for c in second.values())
        await steps(second, second_grads, 0, 5)
    finally:
        close_all(second)


async def test_a_new_job_waits_until_no_process_of_the_running_one_is_attached(local_tree):
    """Issue 26 row 6: a process of another job does not end a running one (it used to:
    the old process got JobEnded); it is told which job runs, and starts once that job's
    last process has gone."""
    lt = local_tree(Tree.regular(2, 1, 1), 10)
    old = await AsyncClient.connect(lt.socket_path("0"), timeout=30, job="old")
    try:
        grads = np.ones((10, 3))
        await gather_or_cancel(old.allreduce(local_gradient(old.assignment, grads), step=0))
        with pytest.raises(DaemonBusy, match="run job 'old'"):
            await AsyncClient.connect(lt.socket_path("1"), timeout=30, job="new")
        await gather_or_cancel(old.allreduce(local_gradient(old.assignment, grads), step=1))
    finally:
        old.close()
    new = await AsyncClient.connect(lt.socket_path("1"), timeout=30, job="new")
    assert new.tree_step == -1
    new.close()


async def test_a_process_restarted_mid_job_joins_where_the_tree_is(local_tree):
    lt = local_tree(TREE, 40)
    grads = gradients(3, 40, 6)
    clients = await connect_all(lt, lt.procs, job="job")
    try:
        await steps(clients, grads, 0, 5)
        clients.pop("0.1").close()                      # the process dies ...
        clients["0.1"] = back = await AsyncClient.connect(lt.socket_path("0.1"), timeout=30,
                                                         job="job")
        await wait_until(lambda: back.tree_step == 4, "the newcomer to see the tree's step")
        assert back.stale                # joined a running job: it must take the state first;
        back.mark_current()              # these vectors depend on no parameters
        await steps(clients, grads, back.tree_step + 1, 3)   # ... and a new one joins at 5
    finally:
        close_all(clients)


async def test_processes_without_a_job_name_join_whatever_runs(local_tree):
    lt = local_tree(Tree.regular(2, 1, 1), 10)
    grads = np.ones((10, 3))
    named = await connect_all(lt, workers(Tree.regular(2, 1, 1))[:1], job="named")
    try:
        unnamed = await AsyncClient.connect(lt.socket_path("1"), timeout=30)
        both = {"0": named["0"], "1": unnamed}
        await steps(both, grads, 0, 2)
        unnamed.close()
    finally:
        named["0"].close()
