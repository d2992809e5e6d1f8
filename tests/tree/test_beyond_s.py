"""Beyond s on real daemons: with --beyond-s approximate, a step where s + 1 children of the
master are frozen (SIGSTOP) completes within the patience with the least-squares decode from
the children there, the same (result, coverage, residual) at every process; with the default
(fail) the same step fails as before."""

from __future__ import annotations

import asyncio
import signal
import time

import numpy as np
import pytest

from crnet import ResultInfo, StepFailed
from crnet.coding.plan import Tree
from crnet.tools.launch import MASTER

from ..helpers.clients import close_all, connect_all
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import gather_or_cancel

pytestmark = pytest.mark.timeout(120)

PATIENCE = 0.5
TIMEOUT = 6.0
M, DIM = 48, 16


async def _connect(lt):
    clients = await connect_all(lt, lt.procs)
    for c in clients.values():
        c.mark_current()
    return clients


async def _submit(c, grads, step):
    return await c.allreduce(local_gradient(c.assignment, grads), step=step)


def _offline(clients, present, grads, code):
    """The least-squares decode at the master from the children ``present``, from the same
    vectors (float64): (result, coverage of the batch, residual)."""
    B = code.B
    a = np.linalg.lstsq(B[present].T, np.ones(code.n), rcond=None)[0]
    if code.kind == "frc":      # the first survivor of each group, coefficient 1 (codes.py)
        groups = [k // (code.s + 1) for k in present]
        a = np.array([1.0 if g not in groups[:i] else 0.0 for i, g in enumerate(groups)])
    want = np.zeros(DIM)
    weight = np.zeros(M)        # each sample's effective weight in the result
    for k, coeff in zip(present, a):
        assignment = clients[str(k)].assignment
        want += coeff * local_gradient(assignment, grads)
        for start, stop, w in assignment.ranges:
            weight[start:stop] += coeff * w
    part_weights = a @ B[present]
    return want, weight.sum() / M, float(np.abs(part_weights - 1.0).max())


@pytest.mark.parametrize("n,code_kind,frozen", [(3, "crc", ("1", "2")), (4, "frc", ("2", "3"))])
async def test_s_plus_1_frozen_children_give_the_least_squares_result_everywhere(
        local_tree, n, code_kind, frozen):
    tree = Tree((n,), (1,))
    grads = gradients(29, M, DIM)
    lt = local_tree(tree, M, timeout=TIMEOUT, code_kind=code_kind, beyond_s="approximate",
                    patience=PATIENCE)
    clients = await _connect(lt)
    try:
        first = await gather_or_cancel(*(_submit(c, grads, 0) for c in clients.values()))
        for r in first:
            assert rel_error(r, grads.sum(axis=0)) <= 1e-9
        assert all(c.last_result_info == ResultInfo() for c in clients.values())
        for name in frozen:
            lt.signal(name, signal.SIGSTOP)
        there = {name: c for name, c in clients.items() if name not in frozen}
        started = time.monotonic()
        results = await gather_or_cancel(*(_submit(c, grads, 1) for c in there.values()))
        took = time.monotonic() - started
        stats = await clients[MASTER].stats()
    finally:
        for name in frozen:
            lt.signal(name, signal.SIGCONT)
    code = tree.code_of(MASTER, code_kind)
    present = sorted(int(name) for name in there if name != MASTER)
    want, coverage, residual = _offline(clients, present, grads, code)
    assert took < PATIENCE + 1.5, took            # the patience, not the timeout
    infos = {c.last_result_info for c in there.values()}
    assert len(infos) == 1, infos                 # the same at every process
    info = infos.pop()
    assert info is not None and not info.exact
    assert info.coverage == pytest.approx(coverage, abs=1e-12)
    assert info.residual == pytest.approx(residual, abs=1e-12)
    assert 0.0 < info.coverage < 1.0
    for r in results:
        assert rel_error(r, want) <= 1e-9
        assert np.array_equal(r, results[0])
    assert stats["stats"]["steps_approximate"] == 1
    assert stats["stats"]["approximate_coverage"] == pytest.approx(coverage, abs=1e-12)
    # the frozen children are back: the next step is exact again
    again = await gather_or_cancel(*(_submit(c, grads, 2) for c in clients.values()))
    for r in again:
        assert rel_error(r, grads.sum(axis=0)) <= 1e-9
    assert all(c.last_result_info == ResultInfo() for c in clients.values())
    close_all(clients)


async def test_by_default_the_same_step_fails(local_tree):
    tree = Tree((3,), (1,))
    grads = gradients(30, M, DIM)
    lt = local_tree(tree, M, timeout=2.0, code_kind="crc")
    clients = await _connect(lt)
    frozen = ("1", "2")
    try:
        await gather_or_cancel(*(_submit(c, grads, 0) for c in clients.values()))
        for name in frozen:
            lt.signal(name, signal.SIGSTOP)
        there = [c for name, c in clients.items() if name not in frozen]
        outcomes = await asyncio.gather(*(_submit(c, grads, 1) for c in there),
                                        return_exceptions=True)
    finally:
        for name in frozen:
            lt.signal(name, signal.SIGCONT)
    for outcome in outcomes:
        assert isinstance(outcome, StepFailed) and outcome.tree_wide, outcome
    close_all(clients)


async def test_an_approximate_subtree_composes_into_the_masters_exact_decode(local_tree):
    """Two layers, n = 3, s = 1 (CRC): node 1's subtree and two of node 0's three children
    are frozen. Node 0 decodes from child 0.0 and its own share after its patience; the
    master decodes exactly from nodes 0 and 2, and the result's coverage is node 0's
    approximation carried up (crnet.coding.approximate: effective mass, composed)."""
    from crnet.coding.plan import plan

    tree = Tree.regular(3, 2, 1)
    grads = gradients(31, M, DIM)
    lt = local_tree(tree, M, timeout=TIMEOUT, code_kind="crc", beyond_s="approximate",
                    patience=PATIENCE)
    clients = await _connect(lt)
    frozen = ("0.1", "0.2", "1")
    try:
        await gather_or_cancel(*(_submit(c, grads, 0) for c in clients.values()))
        for name in frozen:
            lt.signal(name, signal.SIGSTOP)
        there = {n: c for n, c in clients.items()
                 if n not in frozen and not n.startswith("1.")}
        started = time.monotonic()
        results = await gather_or_cancel(*(_submit(c, grads, 1) for c in there.values()))
        took = time.monotonic() - started
    finally:
        for name in frozen:
            lt.signal(name, signal.SIGCONT)
    # Offline: every sample's effective weight, decoding as the daemons must have.
    p = plan(tree, M, "crc")

    def weights(name):
        w = np.zeros(M)
        for start, stop, wt in p.nodes[name].responsibility:
            w[start:stop] += wt
        return w

    local0 = np.zeros(M)
    for start, stop, wt in p.nodes["0"].local:
        local0[start:stop] += wt
    code = tree.code_of("0", "crc")
    a0 = np.linalg.lstsq(code.B[[0]].T, np.ones(3), rcond=None)[0][0]
    node0 = local0 + a0 * weights("0.0")
    a = code.decode([0, 2])            # the master: exact from nodes 0 and 2
    effective = a[0] * node0 + a[1] * weights("2")
    want = effective @ grads
    assert took < 2 * PATIENCE + 1.5, took
    infos = {c.last_result_info for c in there.values()}
    assert len(infos) == 1, infos
    info = infos.pop()
    assert info is not None and not info.exact
    assert info.coverage == pytest.approx(effective.sum() / M, abs=1e-12)
    assert info.residual == pytest.approx(float(np.abs(a0 * code.B[0] - 1.0).max()), abs=1e-12)
    for r in results:
        assert rel_error(r, want) <= 1e-9
        assert np.array_equal(r, results[0])
    close_all(clients)


async def test_frc_stragglers_in_different_groups_are_not_beyond_s(local_tree):
    """n = 4, s = 1, FRC (groups {0, 1} and {2, 3}): children 1 and 3 frozen are two
    stragglers, more than s, but one child of each group is there, so the master decodes
    the exact sum at once (GradientCode.covers), by default (--beyond-s fail), without
    waiting for a patience or the timeout."""
    tree = Tree((4,), (1,))
    grads = gradients(32, M, DIM)
    lt = local_tree(tree, M, timeout=TIMEOUT, code_kind="frc")
    clients = await _connect(lt)
    frozen = ("1", "3")
    try:
        await gather_or_cancel(*(_submit(c, grads, 0) for c in clients.values()))
        for name in frozen:
            lt.signal(name, signal.SIGSTOP)
        there = [c for name, c in clients.items() if name not in frozen]
        started = time.monotonic()
        results = await gather_or_cancel(*(_submit(c, grads, 1) for c in there))
        took = time.monotonic() - started
    finally:
        for name in frozen:
            lt.signal(name, signal.SIGCONT)
    assert took < 1.5, took
    for r in results:
        assert np.array_equal(r, results[0])
        assert rel_error(r, grads.sum(axis=0)) <= 1e-12
    assert all(c.last_result_info == ResultInfo() for c in there)   # exact, and said so
    close_all(clients)


async def test_a_parent_whose_own_gradient_came_after_its_patience_decodes_at_once(local_tree):
    """Node 0 (4 children, s = 1, FRC) has children 0.0 and 0.1, one whole group, frozen,
    and its own training process is slower than its patience. The patience runs out while
    node 0 waits for its own gradient; when that comes, node 0 decodes from the children
    there at once (an approximate result), not at the timeout."""
    tree = Tree((1, 4), (0, 1))
    grads = gradients(33, M, DIM)
    lt = local_tree(tree, M, timeout=TIMEOUT, code_kind="frc", beyond_s="approximate",
                    patience=PATIENCE)
    clients = await _connect(lt)
    frozen = ("0.0", "0.1")
    late = 3 * PATIENCE

    async def submit(name, c):
        if name == "0":
            await asyncio.sleep(late)
        return await _submit(c, grads, 1)

    try:
        await gather_or_cancel(*(_submit(c, grads, 0) for c in clients.values()))
        for name in frozen:
            lt.signal(name, signal.SIGSTOP)
        there = {n: c for n, c in clients.items() if n not in frozen}
        started = time.monotonic()
        results = await gather_or_cancel(*(submit(n, c) for n, c in there.items()))
        took = time.monotonic() - started
    finally:
        for name in frozen:
            lt.signal(name, signal.SIGCONT)
    assert took < late + 1.5, took               # node 0's gradient, not the timeout
    infos = {c.last_result_info for c in there.values()}
    assert len(infos) == 1, infos
    info = infos.pop()
    assert info is not None and not info.exact and 0.0 < info.coverage < 1.0
    for r in results:
        assert np.array_equal(r, results[0])
    close_all(clients)
