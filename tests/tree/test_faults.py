"""Fault injection: every wait ends, the tree heals, blame lands where it belongs.

Real crnetd processes on 127.0.0.1 (strict mode), training processes driven by the
README's loop (``Trainer``). Each test is one fault; ``test_random_faults`` mixes them.
Events are ordered by waiting on observable state (stats, logs), never by sleeping.
"""

import asyncio
import os
import random
import signal
import time

import numpy as np
import pytest

from crnet import AsyncClient, DaemonNotRunning, MismatchError, StepFailed, StepLost, StepRefused
from crnet.coding.plan import Tree
from crnet.tools.launch import MASTER

from ..helpers.clients import close_all, connect, connect_all, submit
from ..helpers.trees import KILL, workers
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import gather_or_cancel, timed, wait_until

pytestmark = pytest.mark.timeout(240)

TIMEOUT = 2.0
GRACE = 0.5                  # the daemon's grace at this timeout (defaults.GRACE_MIN)
BOUND = TIMEOUT + GRACE + 1  # every request is answered within this (+1 s for the trip)
RECOVERY = 10.0              # the tree completes steps again this long after a restart


async def stats(client):
    return await client.stats()


async def restart(lt, clients, names) -> float:
    """Start the daemons ``names`` again and reconnect their processes (which waits for
    their assignment); returns when they were up (the recovery clock starts then)."""
    for name in names:
        lt.start_node(name)
    lt.wait_sockets(names, 30)
    up = time.monotonic()
    for name in names:
        clients[name] = await connect(lt.socket_path(name))
    return up


async def steps_complete_again(clients, grads, first_step, within=RECOVERY):
    """Every process runs steps from ``first_step`` until one is exact everywhere; returns
    the step that was. A step that fails while the tree heals is skipped by everyone."""
    want = grads.sum(axis=0)
    deadline = time.monotonic() + within
    step = first_step
    while True:
        outcomes = await asyncio.gather(*(submit(c, grads, step) for c in clients.values()),
                                        return_exceptions=True)
        if all(isinstance(o, np.ndarray) for o in outcomes):
            for o in outcomes:
                assert rel_error(o, want) <= 1e-9
            return step
        for o in outcomes:
            assert isinstance(o, (np.ndarray, StepFailed, StepLost)), o
        assert time.monotonic() < deadline, f"no exact step within {within} s: {outcomes}"
        step = max(step + 1, *(c.tree_step + 1 for c in clients.values()))


# ---------------------------------------------------------------------- one fault each

async def test_a_process_that_jumps_ahead_blocks_nobody(local_tree):
    tree = Tree.regular(3, 1, 1)
    grads = gradients(1, 30, 12)
    want = grads.sum(axis=0)
    lt = local_tree(tree, 30, timeout=TIMEOUT)
    clients = await connect_all(lt, workers(tree))
    try:
        await gather_or_cancel(*(submit(c, grads, 0) for c in clients.values()))
        jumper = asyncio.ensure_future(timed(submit(clients["2"], grads, 2, scale=3)))
        first = await asyncio.gather(*(timed(submit(clients[n], grads, 1, scale=2))
                                       for n in ("0", "1")))
        second = await asyncio.gather(*(timed(submit(clients[n], grads, 2, scale=3))
                                        for n in ("0", "1")))
        jumped = await jumper
    finally:
        close_all(clients)
    for result, took in first:
        assert isinstance(result, np.ndarray) and rel_error(result, 2 * want) <= 1e-9
        assert took < BOUND
    for result, took in [*second, jumped]:
        assert isinstance(result, np.ndarray) and rel_error(result, 3 * want) <= 1e-9
        assert took < BOUND


@pytest.mark.parametrize("layers", [1, 2])
async def test_a_process_a_step_ahead_in_a_one_layer_tree_blocks_nobody(local_tree, layers):
    tree = Tree((5,), (2,)) if layers == 1 else Tree.regular(3, 2, 1)
    grads = gradients(2, 40, 6)
    want = grads.sum(axis=0)
    lt = local_tree(tree, 40, timeout=TIMEOUT)
    clients = await connect_all(lt, workers(tree))
    names = list(clients)
    try:
        await gather_or_cancel(*(submit(c, grads, 0) for c in clients.values()))
        ahead = asyncio.ensure_future(timed(submit(clients[names[-1]], grads, 2)))
        on_time = await asyncio.gather(*(timed(submit(clients[n], grads, 1))
                                         for n in names[:-1]))
        late_too = await asyncio.gather(*(timed(submit(clients[n], grads, 2))
                                          for n in names[:-1]))
        jumped = await ahead
    finally:
        close_all(clients)
    for result, took in on_time + late_too + [jumped]:
        assert took < BOUND
        if layers == 1:   # s = 2 of 5: the tree never needs the one that jumped
            assert isinstance(result, np.ndarray) and rel_error(result, want) <= 1e-9
        else:             # else its parent may lack it at step 1: failed, not stuck
            assert isinstance(result, (np.ndarray, StepFailed)), result


async def test_a_far_future_step_is_refused_to_its_process_only(local_tree):
    tree = Tree.regular(3, 1, 1)
    grads = gradients(3, 30, 5)
    want = grads.sum(axis=0)
    lt = local_tree(tree, 30, timeout=TIMEOUT, step_window=8)
    clients = await connect_all(lt, workers(tree))
    try:
        for t in range(2):
            await gather_or_cancel(*(submit(c, grads, t) for c in clients.values()))
        refused, took = await timed(submit(clients["2"], grads, 1000))
        later = [await gather_or_cancel(*(submit(c, grads, t, scale=t) for c in clients.values()))
                 for t in (2, 3)]
    finally:
        close_all(clients)
    assert isinstance(refused, StepRefused) and took < 1.0
    assert (refused.step, refused.tree_step) == (1000, 1)
    assert "more than 8 steps ahead of the tree, which is at step 1" in str(refused)
    for t, results in zip((2, 3), later):
        for r in results:
            assert rel_error(r, t * want) <= 1e-9


async def test_a_wrong_length_vector_fails_only_its_own_process(local_tree):
    tree = Tree.regular(3, 2, 1)
    m, dim = 60, 20
    grads = gradients(4, m, dim)
    want = grads.sum(axis=0)
    lt = local_tree(tree, m, timeout=TIMEOUT)
    clients = await connect_all(lt, lt.procs)
    try:
        await gather_or_cancel(*(submit(c, grads, 0) for c in clients.values()))
        # Leaf 0.0's vector is one element short, and it reaches node 0 first.
        bad = asyncio.ensure_future(timed(submit(clients["0.0"], grads, 1, dim=dim - 1)))
        await wait_until(lambda: _is_open(clients["0"], 1), "step 1 at node 0")
        good = await asyncio.gather(*(timed(submit(c, grads, 1)) for n, c in clients.items()
                                      if n != "0.0"))
        wrong, took = await bad
    finally:
        close_all(clients)
    assert isinstance(wrong, MismatchError) and took < BOUND
    assert f"{dim - 1} x float64" in str(wrong)
    for result, took in good:
        assert isinstance(result, np.ndarray) and rel_error(result, want) <= 1e-9, result
        assert took < BOUND


async def _is_open(client, step):
    return step in (await stats(client))["open_steps"]


async def test_a_wrong_length_first_vector_in_a_one_layer_tree_hangs_nobody(local_tree):
    tree = Tree.regular(3, 1, 1)
    grads = gradients(5, 30, 8)
    want = grads.sum(axis=0)
    lt = local_tree(tree, 30, timeout=TIMEOUT)
    clients = await connect_all(lt, lt.procs)
    try:
        await gather_or_cancel(*(submit(c, grads, 0) for c in clients.values()))
        # Child 0's vector is one element long, and it is the first to reach the master.
        bad = asyncio.ensure_future(timed(submit(clients["0"], grads, 1, dim=9)))
        await wait_until(lambda: _is_open(clients[MASTER], 1), "step 1 at the master")
        rest = await asyncio.gather(*(timed(submit(clients[n], grads, 1))
                                      for n in (MASTER, "1", "2")))
        wrong = await bad
    finally:
        close_all(clients)
    assert isinstance(wrong[0], MismatchError) and wrong[1] < BOUND
    for result, took in rest:
        assert isinstance(result, np.ndarray) and rel_error(result, want) <= 1e-9
        assert took < BOUND


async def test_a_restarted_layer_1_node_rejoins_without_spurious_errors(local_tree):
    tree = Tree.regular(2, 2, 1)        # master -> 0, 1 -> 0.0, 0.1, 1.0, 1.1
    grads = gradients(6, 40, 10)
    lt = local_tree(tree, 40, timeout=TIMEOUT)
    clients = await connect_all(lt, lt.procs)
    try:
        await gather_or_cancel(*(submit(c, grads, 0) for c in clients.values()))
        below = [asyncio.ensure_future(timed(submit(clients[n], grads, 1))) for n in ("0.0", "0.1")]
        await wait_until(lambda: _is_open(clients["0"], 1), "step 1 at node 0")
        clients.pop("0").close()
        lt.signal("0", KILL)
        for fut in below:   # the step in flight below the dead node: failed, not stuck
            result, took = await fut
            assert isinstance(result, StepFailed) and not result.tree_wide and took < BOUND
        # While node 0 is down its children cannot reach the master: a new step fails
        # within the bound instead of blocking.
        orphan, took = await timed(submit(clients["0.0"], grads, 2))
        assert isinstance(orphan, StepFailed) and not orphan.tree_wide and took < BOUND
        up = await restart(lt, clients, ["0"])
        await steps_complete_again(clients, grads, 3, within=RECOVERY - (time.monotonic() - up))
    finally:
        close_all(clients)


async def test_the_tree_recovers_after_s_plus_1_children_of_the_master_restart(local_tree):
    tree = Tree.regular(3, 2, 1)
    grads = gradients(7, 60, 8)
    lt = local_tree(tree, 60, timeout=TIMEOUT)
    clients = await connect_all(lt, lt.procs)
    try:
        await gather_or_cancel(*(submit(c, grads, 0) for c in clients.values()))
        for name in ("0", "1"):
            clients.pop(name).close()
            lt.signal(name, KILL)
        survivors = {n: c for n, c in clients.items() if n in (MASTER, "2", "2.0", "2.1", "2.2")}
        outcomes = await asyncio.gather(*(timed(submit(c, grads, 1)) for c in survivors.values()))
        for result, took in outcomes:
            assert isinstance(result, StepFailed) and result.tree_wide and took < BOUND
        up = await restart(lt, clients, ["0", "1"])
        await steps_complete_again(clients, grads, 2, within=RECOVERY - (time.monotonic() - up))
    finally:
        close_all(clients)


async def test_the_tree_recovers_after_the_master_restarts(local_tree):
    tree = Tree.regular(3, 2, 1)
    grads = gradients(8, 60, 8)
    lt = local_tree(tree, 60, timeout=TIMEOUT)
    clients = await connect_all(lt, lt.procs)
    try:
        for t in range(3):
            await gather_or_cancel(*(submit(c, grads, t) for c in clients.values()))
        step = await master_restarted_after_step_2(lt, clients, grads)
    finally:
        close_all(clients)
    assert step >= 4


async def master_restarted_after_step_2(lt, clients, grads) -> int:
    """Steps 0..2 are done: the master dies; step 3 fails at every process within the bound;
    the master comes back where its children are, and steps complete again within RECOVERY
    (any scheme: tests/tree/test_spread_faults.py runs it too). Returns the first step done again."""
    clients.pop(MASTER).close()
    lt.signal(MASTER, KILL)
    outage = await asyncio.gather(*(timed(submit(c, grads, 3)) for c in clients.values()))
    for result, took in outage:   # no master: every process hears so within the bound
        assert isinstance(result, StepFailed) and not result.tree_wide and took < BOUND
    up = await restart(lt, clients, [MASTER])
    assert clients[MASTER].tree_step == 2      # it resumed where its children were
    return await steps_complete_again(clients, grads, 4,
                                      within=RECOVERY - (time.monotonic() - up))


async def test_a_node_that_lost_more_than_s_children_says_so_and_the_tree_goes_on(local_tree):
    tree = Tree.regular(3, 2, 1)
    grads = gradients(9, 60, 8)
    want = grads.sum(axis=0)
    lt = local_tree(tree, 60, timeout=TIMEOUT)
    clients = await connect_all(lt, lt.procs)
    try:
        await gather_or_cancel(*(submit(c, grads, 0) for c in clients.values()))
        for name in ("0.1", "0.2"):
            clients.pop(name).close()
            lt.signal(name, KILL)
        await wait_until(lambda: _children_are(clients["0"], [True, False, False]),
                         "node 0 to see its children gone")
        for t in (1, 2, 3):
            for r in await gather_or_cancel(*(submit(c, grads, t) for c in clients.values())):
                assert rel_error(r, want) <= 1e-9   # the master tolerates node 0's subtree
        node0 = await stats(clients["0"])
    finally:
        close_all(clients)
    log = lt.log_path("0").read_text()
    assert log.count("node 0 did not get 2 of 3 children: 2 of them are gone or failed "
                     "(child 1: disconnected; child 2: disconnected); telling the parent "
                     "(this subtree straggles)") == 1   # said once, not every step
    assert node0["stats"]["times_skipped"] == 3
    assert node0["links"]["children"] == [True, False, False]


async def _children_are(client, up):
    return (await stats(client))["links"]["children"] == up


async def test_a_frozen_node_costs_its_processes_at_most_one_step_lost(links, local_tree):
    """A layer-1 node frozen (SIGSTOP): the tree goes on without its subtree, found by what
    it no longer delivers (its parent decodes from the others), on 127.0.0.1 and on veth
    links; thawed, its processes catch up, at most one step lost each."""
    tree = Tree.regular(3, 2, 1)
    grads = gradients(10, 60, 8)
    want = grads.sum(axis=0)
    lt = local_tree(tree, 60, timeout=TIMEOUT, keep_results=2, **links(list(tree.names())))
    clients = await connect_all(lt, lt.procs)
    below = ("0", "0.0", "0.1", "0.2")
    others = {n: c for n, c in clients.items() if n not in below}
    try:
        await gather_or_cancel(*(submit(c, grads, 0) for c in clients.values()))
        lt.signal("0", signal.SIGSTOP)
        frozen = [asyncio.ensure_future(timed(submit(clients[n], grads, 1))) for n in below]
        for t in range(1, 6):   # the tree goes on without node 0's subtree
            for r in await gather_or_cancel(*(submit(c, grads, t) for c in others.values())):
                assert rel_error(r, want) <= 1e-9
        lt.signal("0", signal.SIGCONT)
        for fut in frozen:
            result, took = await fut
            assert took < BOUND
            assert isinstance(result, (np.ndarray, StepFailed)), result
        # The README's loop: catch up on what the tree finished without us.
        lost = {}
        for name in below:
            c, step = clients[name], 2
            while step <= 5:
                try:
                    if step <= c.tree_step:
                        r = await c.result(step, like=np.zeros(8))
                    else:
                        r = await submit(c, grads, step)
                    assert rel_error(r, want) <= 1e-9
                    step += 1
                except StepLost as e:
                    lost[name] = lost.get(name, 0) + 1
                    assert e.tree_step >= 5
                    step = e.tree_step + 1
        after = await gather_or_cancel(*(submit(c, grads, 6) for c in clients.values()))
    finally:
        lt.signal("0", signal.SIGCONT)
        close_all(clients)
    assert all(n <= 1 for n in lost.values()), lost
    for r in after:
        assert rel_error(r, want) <= 1e-9


async def test_long_runs_keep_bookkeeping_bounded(local_tree):
    tree = Tree.regular(2, 1, 1)
    grads = gradients(11, 10, 16)
    want = grads.sum(axis=0)
    lt = local_tree(tree, 10, timeout=TIMEOUT, log_level="warning")
    clients = await connect_all(lt, lt.procs)
    master_pid = lt.procs[MASTER].pid
    rss = {}
    vectors = {n: local_gradient(c.assignment, grads) for n, c in clients.items()}
    try:
        for t in range(3000):
            results = await asyncio.gather(*(c.allreduce(vectors[n], step=t)
                                             for n, c in clients.items()))
            assert rel_error(results[0], want) <= 1e-9
            if t in (499, 2999):
                rss[t] = _rss_kib(master_pid)
        master = await stats(clients[MASTER])
        worker = await stats(clients["0"])
    finally:
        close_all(clients)
    for s in (master, worker):
        book = s["stats"]
        assert book["open"] <= 1 and book["waiting"] <= 1, book
        assert book["decided"] <= 16 and book["kept"] <= 4 and book["told"] <= 32, book
    assert worker["stats"]["times_skipped"] + worker["stats"]["steps_done"] >= 3000
    assert rss[2999] - rss[499] < 2048, rss   # KiB: nothing grows with the steps


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


# ---------------------------------------------------------------------- all of them, at random

class Trainer:
    """One host's training process, written as the README says: catch up on steps the
    tree finished without it, skip a step that failed, jump after a step it lost, ask
    again when refused, and reconnect when its daemon restarts. Records every answer and how long it took."""

    def __init__(self, lt, name, grads, rng):
        self.lt, self.name, self.grads, self.rng = lt, name, grads, rng
        self.results: dict[int, np.ndarray] = {}
        self.waits: list[float] = []
        self.errors: list[str] = []
        self.naughty = False   # set by the driver: send one wrong-length vector

    @property
    def newest(self) -> int:
        return max(self.results, default=-1)

    async def run(self, stop: asyncio.Event) -> None:
        step, c = 0, None
        while not stop.is_set():
            try:
                if c is None:
                    c = await AsyncClient.connect(self.lt.socket_path(self.name), timeout=60)
                    step = max(step, c.tree_step + 1)
                started = time.monotonic()
                try:
                    if step <= c.tree_step:
                        r = await c.result(step, like=np.zeros(self.grads.shape[1]))
                    else:
                        vec = (step + 1) * local_gradient(c.assignment, self.grads)
                        c.mark_current()   # the vector depends on no parameters
                        if self.naughty:
                            self.naughty = False
                            vec = vec[:-1]
                        r = await c.allreduce(vec, step=step)
                    self.results[step] = r
                finally:
                    self.waits.append(time.monotonic() - started)
                step += 1
            except MismatchError:
                self.errors.append("MismatchError")
                step += 1
            except (StepFailed, StepLost) as e:   # go on where the tree is
                self.errors.append(type(e).__name__)
                step = max(step, e.tree_step) + 1
            except StepRefused:   # ahead of what its (restarted) daemon knows: ask again
                self.errors.append("StepRefused")
                await asyncio.sleep(0.1)
            except DaemonNotRunning:
                self.errors.append("DaemonNotRunning")
                if c is not None:
                    c.close()
                c = None
                await wait_until(lambda: os.path.exists(self.lt.socket_path(self.name)),
                                 f"crnetd {self.name} back", timeout=120)
            await asyncio.sleep(self.rng.uniform(0, 0.05))   # compute
        if c is not None:
            c.close()


# Seeds of the fault sequence; CRNET_FAULT_SEEDS=1,2,3,... runs more of them.
SEEDS = [int(s) for s in os.environ.get("CRNET_FAULT_SEEDS", "1,5").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
async def test_random_faults(local_tree, seed):
    """Kills and restarts (the master too), freezes, wrong-length vectors, while every
    host trains: every wait ends within the bound, every result is exact, and the tree
    is healthy again soon after the last fault."""
    tree = Tree.regular(3, 2, 1)
    rng = random.Random(seed)
    grads = gradients(seed, 60, 30)
    lt = local_tree(tree, 60, timeout=TIMEOUT, keep_results=8)
    await random_faults(lt, grads, rng)


async def random_faults(lt, grads, rng: random.Random) -> None:
    """Eight faults at random (a kill and restart, the master's too, a freeze, a
    wrong-length vector) while every host of ``lt`` trains on ``grads``; then every wait
    ended within the bound, every result is exact, and every process went 5 steps past the
    last fault (any scheme: tests/tree/test_spread_faults.py runs it too)."""
    want = grads.sum(axis=0)
    names = list(lt.procs)
    trainers = {n: Trainer(lt, n, grads, random.Random(rng.random())) for n in names}
    stop = asyncio.Event()
    tasks = [asyncio.ensure_future(t.run(stop)) for t in trainers.values()]
    faults = []
    try:
        await wait_until(lambda: min(t.newest for t in trainers.values()) >= 3, "a warm tree")
        for _ in range(8):
            await asyncio.sleep(rng.uniform(0.2, 1.0))   # the interval between faults is the point
            victim = rng.choice([n for n in names if n != MASTER])
            fault = rng.choice(["kill", "kill", "freeze", "wrong", "kill-master"])
            faults.append((fault, victim))
            if fault == "kill":
                lt.signal(victim, KILL)
                lt.start_node(victim)
            elif fault == "kill-master":
                lt.signal(MASTER, KILL)
                lt.start_node(MASTER)
            elif fault == "freeze":
                lt.signal(victim, signal.SIGSTOP)
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                lt.signal(victim, signal.SIGCONT)
            else:
                trainers[victim].naughty = True
        last_fault = max(t.newest for t in trainers.values())
        try:
            await wait_until(lambda: min(t.newest for t in trainers.values()) >= last_fault + 5,
                             "every process 5 steps past the last fault", timeout=RECOVERY + 20)
        except AssertionError as e:
            raise AssertionError(f"{e}: {faults}, last fault at step {last_fault}, "
                                 f"{ {n: (t.newest, t.errors[-6:]) for n, t in trainers.items()} }"
                                 ) from None
    finally:
        stop.set()
        for name in names:
            if lt.alive(name):
                lt.signal(name, signal.SIGCONT)
        await asyncio.wait(tasks, timeout=30)
        for task in tasks:
            task.cancel()
    for name, t in trainers.items():
        assert max(t.waits) < BOUND, (name, max(t.waits), faults)   # every wait ended in time
        for step, r in t.results.items():
            assert rel_error(r, (step + 1) * want) <= 1e-9, (name, step, faults)


async def test_the_trees_vector_changes_when_every_vector_does(local_tree):
    """A new model (another length) on the same daemons: no process is blamed for it."""
    tree = Tree.regular(3, 2, 1)
    lt = local_tree(tree, 60, timeout=TIMEOUT)
    clients = await connect_all(lt, lt.procs)
    try:
        for step, dim in ((0, 8), (1, 8), (2, 12), (3, 12)):
            grads = gradients(step, 60, dim)
            for r in await gather_or_cancel(*(submit(c, grads, step) for c in clients.values())):
                assert r.shape == (dim,) and rel_error(r, grads.sum(axis=0)) <= 1e-9
    finally:
        close_all(clients)
