"""crnet survives its own faults: a restarted master or daemon, a frozen spread owner.

Real crnetd processes on 127.0.0.1, the README's loop as printed on every worker (and on
the master's host where said), one fault while they train. The promise (docs/faults.md):
no single fault of a daemon ends the job or makes replicas differ; every call returns
within --timeout + grace; every replica ends with single-process training's parameters.
"""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from benchmarks.readme_trainer import updates
from crnet.coding.plan import Tree
from crnet.tools.launch import MASTER

from ..helpers.loop import run_hosts, single_process
from ..helpers.trees import KILL, workers
from ..helpers.vectors import gradients

pytestmark = pytest.mark.timeout(240)

TIMEOUT = 2.0
GRACE = 0.5                       # the daemons' grace at this timeout (defaults.GRACE_MIN)
BOUND = TIMEOUT + GRACE + 0.5     # every allreduce returns within this (+0.5 s for the trip)
OUTAGE = 2.0                      # seconds a killed daemon stays dead
SCHEMES = ("cr", "spread", "rar")


def tree_of(local_tree, tree, m, scheme, timeout=TIMEOUT, **options):
    if scheme == "spread":
        options.setdefault("chunk_bytes", 16 << 10)
    return local_tree(tree, m, scheme=scheme, timeout=timeout, **options)


def restart_after(lt, name, at: float, outage: float = OUTAGE):
    """``during``: SIGKILL daemon ``name`` ``at`` s after the processes started, start it
    again ``outage`` s later."""
    def fault(hosts):
        time.sleep(at)
        lt.signal(name, KILL)
        time.sleep(outage)
        lt.start_node(name)
        lt.wait_sockets([name], 30)
    return fault


def freeze(lt, name, at: float, seconds: float):
    def fault(hosts):
        time.sleep(at)
        lt.signal(name, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            lt.signal(name, signal.SIGCONT)
    return fault


def assert_replicas_equal_single_process(hosts, grads, steps, hit: bool = True,
                                         bound: float = BOUND):
    """No process raised; every one ends with the parameters of single-process training
    over the steps the tree did not fail (a step that failed tree-wide every replica
    skipped: the same ones everywhere); no allreduce took longer than the bound; ``hit``:
    the fault made some step fail."""
    for h in hosts:
        assert h.error is None, (h.name, repr(h.error))
    done = round(updates(hosts[0].w, grads))
    print(f"{done} of {steps} steps applied; failed here {[h.failed_here for h in hosts]}, "
          f"tree-wide {[h.failed_tree_wide for h in hosts]}, lives {[h.lives for h in hosts]}, "
          f"resyncs {[h.resyncs for h in hosts]}, reconnects {[h.reconnects for h in hosts]}, "
          f"longest allreduce "
          f"{max(h.longest for h in hosts):.2f} s")
    assert steps - 20 <= done <= steps
    want = single_process(grads, done)
    for h in hosts:
        np.testing.assert_allclose(h.w, want, rtol=1e-9, atol=1e-12, err_msg=h.name)
        assert h.longest <= bound, (h.name, h.longest)
    if hit:
        assert sum(h.failed_here + h.failed_tree_wide + h.resyncs + h.lives - 1
                   for h in hosts) > 0, \
            "the fault came after the job ended"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_master_restart_does_not_end_the_job(local_tree, monkeypatch, scheme):
    """Row 1 of issue 38: SIGKILL the master 1.5 s into the job, start it again 2 s later;
    the processes (none on the master's host) train on to the end, every replica exact."""
    tree = Tree.regular(3, 1, 1)
    grads = gradients(11, 30, 16)
    lt = tree_of(local_tree, tree, 30, scheme)
    names = workers(tree)
    monkeypatch.setenv("CRNET_WORLD_SIZE", str(len(names)))
    steps = 1000
    hosts, took = run_hosts(lt, tree, grads, steps, pieces=2, piece_s=0.005, names=names,
                            during=restart_after(lt, MASTER, 1.5))
    print(f"\n{scheme}: {steps} steps with a master restart in {took:.1f} s")
    assert_replicas_equal_single_process(hosts, grads, steps)


def assert_survived(hosts, name):
    """Row 5: the process on ``name``'s host outlived its daemon's restart: one life, and
    its client reconnected."""
    h = next(h for h in hosts if h.name == name)
    assert (h.lives, h.reconnects >= 1) == (1, True), (name, h.lives, h.reconnects)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_master_restart_with_a_process_on_its_host(local_tree, monkeypatch, scheme):
    """Rows 1 and 5: the master's host runs a process too; it outlives its daemon (its
    client reconnects when the daemon is back), takes the state if it must, and trains on:
    every replica exact."""
    tree = Tree.regular(3, 1, 1)
    grads = gradients(12, 30, 16)
    lt = tree_of(local_tree, tree, 30, scheme)
    monkeypatch.setenv("CRNET_WORLD_SIZE", str(len(list(tree.names()))))
    steps = 1000
    hosts, took = run_hosts(lt, tree, grads, steps, pieces=2, piece_s=0.005,
                            during=restart_after(lt, MASTER, 1.5))
    print(f"\n{scheme}: {steps} steps with a master restart in {took:.1f} s")
    assert_replicas_equal_single_process(hosts, grads, steps)
    assert_survived(hosts, MASTER)


def test_a_frozen_spread_owner_neither_ends_the_job_nor_splits_the_replicas(local_tree,
                                                                            monkeypatch):
    """Rows 2 and 3: one spread owner frozen (SIGSTOP) for --timeout, a process on the
    master's host: no host applies a step the master did not decide the same way, and the
    job goes on; every replica exact."""
    tree = Tree.regular(2, 2, 1)
    grads = gradients(13, 28, 1 << 13)     # 64 KiB of float64: relayed round the ring
    lt = tree_of(local_tree, tree, 28, "spread")
    names = [n for n in tree.names() if n != "1.0"]   # (its own process would wait it out)
    monkeypatch.setenv("CRNET_WORLD_SIZE", str(len(names)))
    steps = 800
    hosts, took = run_hosts(lt, tree, grads, steps, pieces=2, piece_s=0.005, names=names,
                            during=freeze(lt, "1.0", 1.5, TIMEOUT))
    print(f"\nspread: {steps} steps with an owner frozen for {TIMEOUT:g} s in {took:.1f} s")
    assert_replicas_equal_single_process(hosts, grads, steps)


@pytest.mark.parametrize("scheme", ("cr", "spread"))    # (rar's ring is one layer)
def test_the_processes_below_a_restarted_inner_daemon_train_on(local_tree, monkeypatch, scheme):
    """Rows 4 and 5: a 5-host tree (fanout 2, 1; s 1, 0); the inner node 0's crnetd is
    killed and started again 2 s later: the leaf below it, and 0's own process (its client
    reconnects), go on."""
    tree = Tree((2, 1), (1, 0))
    grads = gradients(14, 24, 16)
    lt = tree_of(local_tree, tree, 24, scheme)
    monkeypatch.setenv("CRNET_WORLD_SIZE", str(len(list(tree.names()))))
    steps = 1000
    hosts, took = run_hosts(lt, tree, grads, steps, pieces=2, piece_s=0.005,
                            during=restart_after(lt, "0", 1.5))
    print(f"\n{scheme}: {steps} steps with an inner daemon restart in {took:.1f} s")
    assert_replicas_equal_single_process(hosts, grads, steps)
    assert_survived(hosts, "0")


def two_restarts(local_tree, monkeypatch, *, steps: int, piece_s: float, first: float,
                 second: float, timeout: float = TIMEOUT, seed: int = 15):
    """Row 7's faults: the layer-1 node 0 restarted ``first`` s in, the master ``second`` s
    after that, while every worker runs ``steps`` steps of the README's loop."""
    tree = Tree.regular(2, 2, 1)
    grads = gradients(seed, 28, 16)
    lt = tree_of(local_tree, tree, 28, "cr", timeout=timeout)
    names = workers(tree)
    monkeypatch.setenv("CRNET_WORLD_SIZE", str(len(names)))

    def faults(hosts):
        restart_after(lt, "0", first)(hosts)
        restart_after(lt, MASTER, second)(hosts)

    hosts, took = run_hosts(lt, tree, grads, steps, pieces=2, piece_s=piece_s, names=names,
                            during=faults)
    print(f"\n{steps} steps with two restarts at --timeout {timeout:g} in {took:.1f} s; "
          f"longest allreduce {max(h.longest for h in hosts):.2f} s")
    return hosts, grads


def test_every_call_returns_within_the_bound_across_two_restarts(local_tree, monkeypatch):
    """Row 7: a layer-1 node restarted, then the master: no allreduce waits longer than
    --timeout + grace (+ the trip)."""
    steps = 1200
    hosts, grads = two_restarts(local_tree, monkeypatch, steps=steps, piece_s=0.005,
                                first=1.5, second=3.0)
    assert_replicas_equal_single_process(hosts, grads, steps)
    assert_survived(hosts, "0")


def test_row_7_as_the_issue_ran_it(local_tree, monkeypatch):
    """Row 7 with the issue's own settings: --timeout 5, processes stepping every 0.1 s;
    the layer-1 node 0 killed and started again 2 s later, the master killed 12 s after
    that and started again 2 s later. Before, every worker's call for the step in flight
    returned after 8.15 s (6.27 s on 02cb988 in another run); the bound is the promise
    itself, --timeout + grace (5 + 1.25 s), with nothing for the trip."""
    timeout, steps = 5.0, 320
    hosts, grads = two_restarts(local_tree, monkeypatch, steps=steps, piece_s=0.05, first=3.0,
                                second=12.0, timeout=timeout, seed=16)
    assert_replicas_equal_single_process(hosts, grads, steps, bound=timeout + 1.25)
    assert_survived(hosts, "0")
