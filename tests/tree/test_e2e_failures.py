"""End to end, when things go wrong: real crnetd processes on 127.0.0.1 (strict mode).

Each test orders its events by waiting on the daemons' state (``Client.stats()``,
their logs), never by sleeping.
"""

import asyncio
import os
import signal
import socket
import time

import numpy as np
import pytest

from crnet import AsyncClient, DaemonNotRunning, StepFailed, StepLost
from crnet.coding.plan import Tree
from crnet.protocol.messages import Hello, Joined
from crnet.tools.launch import MASTER

from ..helpers.clients import close_all, connect_all
from ..helpers.trees import KILL, workers
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import gather_or_cancel, wait_for_log, wait_until

pytestmark = pytest.mark.timeout(180)


async def step_everywhere(clients, grads, step, scale=1.0):
    # Failures of the transport: the vectors depend on no parameters, so a process that
    # rejoined or whose step failed locally has no stale replica (StaleReplica).
    for c in clients.values():
        c.mark_current()
    got = await gather_or_cancel(*(c.allreduce(scale * local_gradient(c.assignment, grads),
                                               step=step, timeout=30)
                                   for c in clients.values()))
    return dict(zip(clients, got))


async def links_of(client):
    return (await client.stats())["links"]


async def test_parent_death_fails_the_step_below_it_and_the_subtree_rejoins(local_tree):
    tree = Tree.regular(2, 2, 1)        # master -> 0, 1 -> 0.0, 0.1, 1.0, 1.1
    m, dim = 40, 30
    lt = local_tree(tree, m, timeout=30)
    grads = gradients(7, m, dim)
    want = grads.sum(axis=0)
    clients = await connect_all(lt, lt.procs)
    try:
        for r in (await step_everywhere(clients, grads, 0)).values():
            assert rel_error(r, want) <= 1e-9
        # Node 0's children start step 1; node 0's own process has not: node 0 waits.
        below = {n: asyncio.ensure_future(clients[n].allreduce(
            local_gradient(clients[n].assignment, grads), step=1, timeout=30))
            for n in ("0.0", "0.1")}
        await wait_until(lambda: _open_at(clients["0"], 1), "step 1 to open at node 0")
        clients.pop("0").close()
        lt.signal("0", KILL)
        started = time.monotonic()
        for fut in below.values():
            with pytest.raises(StepFailed, match="lost the connection to its parent"):
                await fut
        assert time.monotonic() - started < 5, "no --timeout wait: the parent is gone"
        lt.start_node("0")
        lt.wait_sockets(["0"], 30)
        clients["0"] = await AsyncClient.connect(lt.socket_path("0"), timeout=30)  # assigned
        for child in ("0.0", "0.1"):
            await wait_until(lambda c=child: _parent_up(clients[c]), f"{child} to rejoin")
        results = await step_everywhere(clients, grads, 2, scale=3.0)
    finally:
        close_all(clients)
    for name, r in results.items():
        assert rel_error(r, 3 * want) <= 1e-9, name


async def _open_at(client, step):
    return step in (await client.stats())["open_steps"]


async def _parent_up(client):
    return (await links_of(client))["parent"]


async def test_a_process_that_fell_behind_catches_up_on_every_step(local_tree):
    tree = Tree.regular(3, 1, 1)        # a star of 3, s = 1: two workers carry each step
    m, dim = 30, 8
    lt = local_tree(tree, m, keep_results=2)
    grads = gradients(8, m, dim)
    want = grads.sum(axis=0)
    clients = await connect_all(lt, workers(tree))
    try:
        active = {n: clients[n] for n in ("0", "1")}
        for t in range(10):
            await step_everywhere(active, grads, t, scale=t + 1.0)
        late = clients["2"]                 # connected, but busy: its results wait for it
        await wait_until(lambda: late.tree_step == 9, "step 9's result at its daemon")
        assert all(late.finished(t) for t in range(10))
        missed = [await late.result(t, like=np.zeros(dim), timeout=30) for t in range(10)]
        kept = (await late.stats())["stats"]
    finally:
        close_all(clients)
    for t, r in enumerate(missed):
        assert rel_error(r, (t + 1) * want) <= 1e-9
    assert kept["kept"] >= 2 and kept["kept_bytes"] > 0


async def test_a_process_that_fell_behind_its_daemons_memory_gets_step_lost(local_tree):
    tree = Tree.regular(3, 1, 1)
    m, dim = 30, 8
    lt = local_tree(tree, m, keep_results=2, result_memory=1)   # no memory to keep results in
    grads = gradients(8, m, dim)
    want = grads.sum(axis=0)
    clients = await connect_all(lt, workers(tree))
    try:
        active = {n: clients[n] for n in ("0", "1")}
        for t in range(5):
            await step_everywhere(active, grads, t, scale=t + 1.0)
        late = clients["2"]
        # Its daemon takes step 4's result a moment after the others finish the step.
        await wait_until(lambda: late.tree_step == 4, "step 4's result at its daemon")
        with pytest.raises(StepLost, match=r"step 0 is not held .* the tree is at step 4: "
                                           r"reload the parameters") as lost:
            await late.result(0, like=np.zeros(dim), timeout=30)
        assert (lost.value.step, lost.value.tree_step) == (0, 4)
        newest = await late.result(4, like=np.zeros(dim), timeout=30)  # still held
        assert late.tree_step == 4
    finally:
        close_all(clients)
    assert rel_error(newest, 5 * want) <= 1e-9


async def test_ring_member_loss_fails_the_step_and_the_ring_recovers(local_tree):
    tree = Tree((4,), (0,))              # rar: a ring of 4 workers and the master
    timeout = 2.0
    m, dim = 20, 70_000                  # 112 kB segments in 4 parts of 28 kB (32 KiB chunks)
    lt = local_tree(tree, m, scheme="rar", timeout=timeout, chunk_bytes=32 << 10)
    grads = gradients(9, m, dim)
    want = grads.sum(axis=0)
    clients = await connect_all(lt, workers(tree))
    try:
        for r in (await step_everywhere(clients, grads, 0)).values():
            assert rel_error(r, want) <= 1e-9
        clients.pop("2").close()
        lt.signal("2", KILL)
        await wait_for_log(lt, "1", "lost the ring successor")   # rank 1 sends to rank 2
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(c.allreduce(local_gradient(c.assignment, grads), step=1, timeout=30)
              for c in clients.values()), return_exceptions=True)
        elapsed = time.monotonic() - started
        for name, outcome in zip(clients, outcomes):
            assert isinstance(outcome, StepFailed), (name, outcome)
            assert "a ring waits for every worker" in outcome.reason, outcome.reason
        assert elapsed <= timeout + 2
        lt.start_node("2")
        lt.wait_sockets(["2"], 30)
        clients["2"] = await AsyncClient.connect(lt.socket_path("2"), timeout=30)
        await wait_until(lambda: _successor_up(clients["1"]), "rank 1 to reach rank 2 again")
        await wait_until(lambda: _successor_up(clients["2"]), "rank 2 to reach rank 3")
        results = await step_everywhere(clients, grads, 2, scale=2.0)
    finally:
        close_all(clients)
    for name, r in results.items():
        assert rel_error(r, 2 * want) <= 1e-9, name


async def _successor_up(client):
    return (await links_of(client))["successor"]


async def test_a_child_that_stops_reading_is_cut_off_and_the_tree_goes_on(local_tree):
    tree = Tree.regular(3, 1, 1)         # s = 1: the master decodes from children 0 and 1
    dim = 128 * 1024                     # 1 MiB float64 vectors, one RESULT chunk each step
    lt = local_tree(tree, 3, max_send_queue=1 << 20)
    grads = gradients(11, 3, dim)
    want = grads.sum(axis=0)
    clients = await connect_all(lt, ["0", "1"])     # returns once the whole tree joined
    # Child 2's slot goes to a raw socket that joins and then never reads a byte.
    lt.signal("2", KILL)
    await wait_for_log(lt, MASTER, "child 2 disconnected")
    silent = socket.socket()
    silent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    silent.connect(("127.0.0.1", lt.ports[MASTER]))
    for msg in (Hello(name="2"), Joined(1)):
        silent.sendall(b"".join(bytes(p) for p in msg.frame()))
    try:
        t = 0
        while "child stopped reading" not in lt.log_path(MASTER).read_text():
            assert t < 200, "the master never cut off the child that does not read"
            for r in (await step_everywhere(clients, grads, t)).values():
                assert rel_error(r, want) <= 1e-9
            t += 1
        await wait_until(lambda: "child 2 disconnected" in lt.log_path(MASTER).read_text()
                         .split("child stopped reading")[1], "the master to drop child 2")
        after = await step_everywhere(clients, grads, t)
    finally:
        close_all(clients)
        silent.close()
    assert lt.alive(MASTER)
    for r in after.values():
        assert rel_error(r, want) <= 1e-9


async def test_a_layer_1_node_that_cannot_decode_fails_the_step_everywhere_at_the_deadline(
        local_tree):
    tree = Tree((2, 3), (0, 1))          # the master needs both children; node 0 any 2 of 3
    timeout = 2.0
    m, dim = 24, 10
    lt = local_tree(tree, m, timeout=timeout)
    grads = gradients(10, m, dim)
    want = grads.sum(axis=0)
    clients = await connect_all(lt, lt.procs)
    try:
        await step_everywhere(clients, grads, 0)
        # Step 1: 0.0 and 0.1 never answer, so node 0 cannot decode. The master's clock
        # starts with node 0's (OPEN), so the step fails everywhere at the deadline.
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(clients[n].allreduce(local_gradient(clients[n].assignment, grads), step=1,
                                   timeout=30) for n in ("0", "0.2")),
            clients[MASTER].result(1, like=np.zeros(dim), timeout=30), return_exceptions=True)
        elapsed = time.monotonic() - started
        reasons = set()
        for outcome in outcomes:
            assert isinstance(outcome, StepFailed) and outcome.tree_wide, outcome
            reasons.add(outcome.reason)
        [reason] = reasons   # decided once, by the master, for everyone
        assert reason.startswith("master did not get 2 of 2 children"), reason
        assert timeout - 0.1 <= elapsed <= timeout + 1.5
        # Node 0's own deadline and the master's fall together; whichever comes first, the
        # master decides (node 0's report, if first, is in the reason).
        results = await step_everywhere(clients, grads, 2)
    finally:
        close_all(clients)
    for r in results.values():
        assert rel_error(r, want) <= 1e-9


async def test_a_step_asked_for_while_its_daemon_restarts_keeps_to_the_bound(local_tree):
    """The README's promise, every call returns within the daemon's bound, for a call made
    while its own daemon is away: it waits for the daemon to come back, then fails here
    (ask again), since the new daemon's own bound would come on top of that wait; the
    call after it gets the sum. (Found by the README-loop soak: the master's process asked
    while its daemon restarted, and waited the restart plus a whole --timeout.)"""
    tree = Tree.regular(2, 1, 0)
    grads = np.ones((4, 3))
    lt = local_tree(tree, 4, timeout=2)
    clients = await connect_all(lt, workers(tree))
    bound = 2 + 0.5 + 0.5          # --timeout, the grace, the trip
    try:
        await step_everywhere(clients, grads, 0)
        lt.signal("1", KILL)
        lt.procs["1"].wait(10)
        c = clients["1"]
        with pytest.raises(StepFailed, match="closed the connection"):   # under way: at once
            await c.allreduce(local_gradient(c.assignment, grads), step=1, timeout=10)
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, lt.start_node, "1")       # back after a second
        began = time.monotonic()
        with pytest.raises(StepFailed, match="was restarting when step 1 was asked for") as e:
            await c.allreduce(local_gradient(c.assignment, grads), step=1, timeout=10)
        assert not e.value.tree_wide and 1.0 <= time.monotonic() - began < bound
        assert c.reconnects == 1
        for t in (1, 2):     # the others went on without it, or wait for it: both exact
            got = await step_everywhere(clients, grads, t)
            assert all(rel_error(v, grads.sum(axis=0)) <= 1e-12 for v in got.values())
    finally:
        close_all(clients)


async def test_sigterm_stops_a_daemon_in_order(local_tree):
    tree = Tree.regular(2, 1, 0)
    lt = local_tree(tree, 4)
    clients = await connect_all(lt, workers(tree))
    try:
        await step_everywhere(clients, np.ones((4, 3)), 0)
        proc = lt.procs["1"]
        started = time.monotonic()
        lt.signal("1", signal.SIGTERM)
        assert proc.wait(10) == 0
        assert time.monotonic() - started < 5
        log = lt.log_path("1").read_text()
        assert "node 1 stopped" in log
        assert not os.path.exists(lt.socket_path("1"))
        # Its process: the step under way fails here at once; the next call waits for the
        # daemon to come back (``reconnect`` s), then says it did not.
        clients["1"].reconnect = 1.0
        with pytest.raises(StepFailed, match="closed the connection") as failed:
            await clients["1"].allreduce(np.ones(3), step=1, timeout=10)
        assert not failed.value.tree_wide
        began = time.monotonic()
        with pytest.raises(DaemonNotRunning, match="did not come back within 1 s"):
            await clients["1"].allreduce(np.ones(3), step=1, timeout=10)
        assert time.monotonic() - began < 5
    finally:
        close_all(clients)
    assert lt.alive(MASTER) and lt.alive("0")
