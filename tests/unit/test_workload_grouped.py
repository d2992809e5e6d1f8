"""Correlated stragglers (``grouped:A,P,F,G``): a group of G consecutive workers is slow as a
whole, drawn from (seed, step, group); the model's mean step follows from the law."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.tune import model
from crnet.tune.workload import ComputeModel

GROUPED = ComputeModel("grouped", 1e-4, prob=0.2, factor=10, group=3)


def test_a_group_is_slow_as_a_whole_and_groups_are_consecutive_workers():
    for step in range(100):
        times = [GROUPED.compute_time(100, seed=5, step=step, worker=w) for w in range(12)]
        for g in range(4):
            assert len(set(times[3 * g:3 * g + 3])) == 1, (step, times)
    assert [GROUPED.group_of(w) for w in range(7)] == [0, 0, 0, 1, 1, 1, 2]
    assert ComputeModel("straggle", 1e-4, prob=0.2, factor=10).group_of(5) == 5
    # Groups are independent: over 400 steps, every pair of groups differs in some step.
    slow = np.array([[GROUPED.compute_time(100, 5, t, 3 * g) > 0.05 for g in range(4)]
                     for t in range(400)])
    assert all(np.any(slow[:, i] != slow[:, j]) for i, j in itertools.combinations(range(4), 2))


def test_compute_time_is_deterministic_in_seed_step_group():
    t = GROUPED.compute_time(100, seed=7, step=3, worker=10)
    assert t == GROUPED.compute_time(100, seed=7, step=3, worker=9)   # the same group, 3
    assert t == GROUPED.sample(np.array([100]), np.random.default_rng([7, 3, 3]), 1)[0, 0]
    assert {GROUPED.compute_time(100, s, 3, 10) for s in range(60)} == {0.01, 0.1}


def test_one_worker_groups_are_the_straggle_law():
    straggle = ComputeModel("straggle", 1e-4, prob=0.2, factor=10)
    ones = ComputeModel("grouped", 1e-4, prob=0.2, factor=10, group=1)
    for t, w in itertools.product(range(30), range(5)):
        assert ones.compute_time(50, 1, t, w) == straggle.compute_time(50, 1, t, w)
    loads = np.arange(1, 8)
    np.testing.assert_array_equal(ones.sample(loads, np.random.default_rng(2), 50),
                                  straggle.sample(loads, np.random.default_rng(2), 50))


def test_vectorised_draw_is_the_per_call_draw():
    """The bulk draw (the model's) and the per-(seed, step, worker) call (the benchmark's) are
    one draw: a group's columns of ``sample`` on the group's generator are the values
    ``compute_time`` gives each of its workers."""
    loads = np.array([10, 20, 30, 40, 50, 60, 70])   # a short last group (7 = 3 + 3 + 1)
    for seed, step in itertools.product(range(3), range(40)):
        for g in range(3):
            members = range(3 * g, min(3 * g + 3, loads.size))
            row = GROUPED.sample(loads[members.start:members.stop],
                                 np.random.default_rng([seed, step, g]), 1)[0]
            assert list(row) == [GROUPED.compute_time(int(loads[w]), seed, step, w)
                                 for w in members]


def test_bulk_draws_slow_whole_groups_with_probability_p():
    draws = GROUPED.sample(np.full(8, 100), np.random.default_rng(3), 20_000)
    assert draws.shape == (20_000, 8)
    np.testing.assert_array_equal(draws[:, 0:3], np.repeat(draws[:, :1], 3, axis=1))
    np.testing.assert_array_equal(draws[:, 3:6], np.repeat(draws[:, 3:4], 3, axis=1))
    slowed = draws[:, [0, 3, 6]] > 0.05
    assert abs(slowed.mean() - 0.2) < 4 * math.sqrt(0.2 * 0.8 / slowed.size)
    assert draws.mean() == pytest.approx(GROUPED.mean_time(100), rel=0.03)


def _expected_step(tree: Tree, loads: np.ndarray, law: ComputeModel) -> float:
    """E[step] of a two-layer tree on a free network, by enumerating the groups' states:
    a parent is ready at max(its own time, its (n-s)-th child's); the master at its
    (n_1 - s_1)-th child's."""
    n1, n2 = tree.fanout
    need1, need2 = n1 - tree.stragglers[0], n2 - tree.stragglers[1]
    groups = -(-tree.workers // law.group)
    total = 0.0
    for state in itertools.product((False, True), repeat=groups):
        p = math.prod(law.prob if slow else 1 - law.prob for slow in state)
        per = [law.per_sample_s * (law.factor if state[law.group_of(w)] else 1.0)
               for w in range(tree.workers)]
        t = loads * np.array(per)
        ready = []
        for i in range(n1):
            leaves = np.sort(t[n1 + i * n2:n1 + (i + 1) * n2])
            ready.append(max(t[i], leaves[need2 - 1]))
        total += p * np.sort(ready)[need1 - 1]
    return total


@pytest.mark.parametrize("group", [3, 1])
def test_the_models_mean_step_is_the_laws_expectation(group):
    """3,3 s 1,1 with groups of 3 (the master's children, then each parent's children) and
    with independent stragglers: the Monte-Carlo mean is the enumeration's, and correlated
    stragglers cost more (a slow group is more than s = 1 of a parent's children)."""
    tree = Tree((3, 3), (1, 1))
    law = ComputeModel("grouped", 1e-4, prob=0.2, factor=10, group=group)
    loads = model.worker_loads(tree, 240)
    got = model.step_times("cr", tree=tree, samples=240, vector_bytes=1.0, bandwidth=1e15,
                           latency=0.0, compute=law, trials=20_000, seed=1).mean()
    if group == 1:   # 2^12 states: check by simulation, not enumeration
        assert got < _expected_step(tree, loads, ComputeModel("grouped", 1e-4, prob=0.2,
                                                              factor=10, group=3))
        return
    assert got == pytest.approx(_expected_step(tree, loads, law), rel=0.03)
