"""Several training processes per host (``crnetd --local-processes K``), on real daemons."""

import asyncio

import numpy as np
import pytest

from crnet import AsyncClient, StepFailed
from crnet.coding.plan import Tree

from ..helpers.clients import close_all, connect_all
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import gather_or_cancel, wait_until

pytestmark = pytest.mark.timeout(120)


async def test_two_processes_per_host_share_its_data_and_get_the_same_sum(local_tree):
    tree = Tree.regular(2, 2, 1)          # 7 hosts
    m, dim = 28, 16
    grads = gradients(3, m, dim)
    want = grads.sum(axis=0)
    lt = local_tree(tree, m, local_processes=2)
    clients = await connect_all(lt, lt.procs, per_host=2)
    try:
        for n in lt.procs:                # each has its own part of the host's share
            a, b = clients[(n, 0)].assignment, clients[(n, 1)].assignment
            assert (a.process, b.process, a.processes) == (0, 1, 2)
            mine = {i for s, e, _ in a.ranges for i in range(s, e)}
            theirs = {i for s, e, _ in b.ranges for i in range(s, e)}
            assert not mine & theirs
        results = await gather_or_cancel(*(c.allreduce(local_gradient(c.assignment, grads),
                                                       step=0) for c in clients.values()))
        # A process that leaves fails, for its host's other process, the step it had not
        # submitted; another one takes its seat and the tree goes on.
        waiting = asyncio.ensure_future(clients[("0", 0)].allreduce(
            local_gradient(clients[("0", 0)].assignment, grads), step=1))
        await wait_until(lambda: _open(clients[("0", 1)], 1), "step 1 at host 0")
        left = clients.pop(("0", 1))
        old_share = left.assignment
        left.close()
        with pytest.raises(StepFailed, match=r"training process 2 of 2 on this host .* left "
                                             r"before it submitted step 1") as failed:
            await asyncio.wait_for(waiting, 10)
        assert not failed.value.tree_wide
        assert not clients[("0", 0)].stale   # nothing was applied: it asks for the step again
        clients[("0", 1)] = back = await AsyncClient.connect(lt.socket_path("0"), timeout=30)
        back.mark_current()               # joined the running job: likewise
        assert back.assignment == old_share
        after = await gather_or_cancel(*(c.allreduce(2 * local_gradient(c.assignment, grads),
                                                     step=2) for c in clients.values()))
    finally:
        close_all(clients)
    for r in results:
        assert rel_error(r, want) <= 1e-9
        np.testing.assert_array_equal(r, results[0])   # the same vector everywhere
    for r in after:
        assert rel_error(r, 2 * want) <= 1e-9


async def _open(client, step):
    return step in (await client.stats())["open_steps"]


async def test_a_third_process_on_a_host_for_two_is_told_it_is_busy(local_tree):
    from crnet import DaemonBusy

    lt = local_tree(Tree.regular(2, 1, 1), 4, local_processes=2)
    first = [await AsyncClient.connect(lt.socket_path("0"), timeout=30) for _ in range(2)]
    try:
        with pytest.raises(DaemonBusy, match="2 training processes are attached"):
            await AsyncClient.connect(lt.socket_path("0"), timeout=30)
    finally:
        close_all(first)
