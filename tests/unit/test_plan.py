"""Trees and allocations: exact end-to-end decoding under stragglers, load, GC/uncoded."""

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crnet.coding.plan import Tree, optimal_load, plan, plan_gc, plan_uncoded


def weighted_sum(ranges, grads):
    out = np.zeros(grads.shape[1])
    for start, stop, weight in ranges:
        out += weight * grads[start:stop].sum(axis=0)
    return out


def aggregate(p, grads, stragglers):
    """Each node's message, bottom-up: local weighted sum + decode of responding children.

    ``stragglers`` maps a parent's name to the set of child indices that never answer.
    Returns the master's decode and every computed node message.
    """
    messages = {}
    for name in reversed(list(p.tree.names())):
        msg = weighted_sum(p.nodes[name].local, grads)
        children = p.tree.children(name)
        if children:
            responders = [k for k in range(len(children)) if k not in stragglers.get(name, ())]
            random.shuffle(responders)  # arrival order is arbitrary
            coeffs = p.code(name).decode(responders)
            for k, a in zip(responders, coeffs):
                msg = msg + a * messages[children[k]]
        messages[name] = msg
    return messages[""], messages


@st.composite
def trees(draw):
    layers = draw(st.integers(1, 3))
    fanout = [draw(st.integers(1, 5)) for _ in range(layers)]
    stragglers = [draw(st.integers(0, n - 1)) for n in fanout]
    return Tree(fanout, stragglers)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees(), m=st.integers(1, 500), seed=st.integers(0, 2**32 - 1))
def test_master_decodes_exact_sum_under_stragglers_at_every_parent(tree, m, seed):
    rng = np.random.default_rng(seed)
    random.seed(seed)
    grads = rng.standard_normal((m, 3))
    p = plan(tree, m)
    stragglers = {}
    for name in tree.names():
        children = tree.children(name)
        if children:
            s = tree.stragglers[tree.layer(name)]
            stragglers[name] = set(random.sample(range(len(children)), random.randint(0, s)))
    result, messages = aggregate(p, grads, stragglers)
    want = grads.sum(axis=0)
    assert np.max(np.abs(result - want)) <= 1e-9 * max(1.0, np.max(np.abs(want)))
    # Stronger: every node that answered delivered exactly its weighted responsibility.
    for name, msg in messages.items():
        expect = weighted_sum(p.nodes[name].responsibility, grads)
        assert np.allclose(msg, expect, rtol=1e-9, atol=1e-9 * max(1.0, np.abs(want).max()))


@settings(max_examples=200, deadline=None)
@given(tree=trees(), m=st.integers(1, 100_000))
def test_local_load_is_optimal_up_to_rounding(tree, m):
    p = plan(tree, m)
    d = optimal_load(tree)
    slack = sum(s + 1 for s in tree.stragglers)
    assert p.max_local_samples <= math.ceil(d * m) + slack
    assert p.nodes[""].local == ()
    for name, a in p.nodes.items():
        positions = [i for start, stop, _ in a.local for i in range(start, stop)]
        assert len(positions) == len(set(positions)), f"{name} computes a sample twice"
        assert 0 <= a.local_samples <= a.responsibility_samples


@pytest.mark.parametrize(
    "fanout, stragglers",
    [([4, 4], [1, 1]), ([3, 3], [1, 1]), ([5, 3, 2], [2, 0, 1]), ([6], [2]), ([2, 2, 2], [0, 0, 0])],
)
def test_optimal_load_closed_form(fanout, stragglers):
    tree = Tree(fanout, stragglers)
    expect = 1 / sum(
        math.prod(n / (s + 1) for n, s in zip(fanout[:l], stragglers[:l]))
        for l in range(1, len(fanout) + 1)
    )
    assert optimal_load(tree) == pytest.approx(expect, rel=1e-15)


@pytest.mark.parametrize("fanout, layers", [(4, 2), (3, 3), (7, 1), (2, 4)])
def test_no_stragglers_is_one_over_n(fanout, layers):
    tree = Tree.regular(fanout, layers, 0)
    assert optimal_load(tree) == pytest.approx(1 / tree.workers)


def test_regular_tree_shape_and_names():
    tree = Tree.regular(3, 2, 1)
    assert tree.workers == 12
    names = list(tree.names())
    assert names[:5] == ["", "0", "1", "2", "0.0"]
    assert len(names) == 13
    assert tree.parent("2.1") == "2" and tree.parent("0") == "" and tree.parent("") is None
    assert tree.layer("2.1") == 2 and tree.child_index("2.1") == 1
    assert tree.children("1.2") == []
    assert "3" not in tree and "0.3" not in tree and "0.0.0" not in tree and "01" not in tree
    with pytest.raises(ValueError, match="no node"):
        tree.children("5")


@pytest.mark.parametrize(
    "fanout, stragglers, match",
    [([3], [3], "stragglers must be in 0..2"), ([0], [0], "fanout must be >= 1"),
     ([3, 3], [1], "one straggler count per layer"), ([], [], "at least one layer")],
)
def test_bad_trees_raise(fanout, stragglers, match):
    with pytest.raises(ValueError, match=match):
        Tree(fanout, stragglers)


def test_from_options_repeats_single_values_and_checks_lists():
    assert Tree.from_options([4], [1], 2) == Tree((4, 4), (1, 1))
    assert Tree.from_options([4, 3], [1, 0]) == Tree((4, 3), (1, 0))
    assert Tree.from_options([4, 3], [1]) == Tree((4, 3), (1, 1))
    with pytest.raises(ValueError, match="lists 2 values but the tree has 3 layers"):
        Tree.from_options([4, 3], [1], 3)


@pytest.mark.parametrize("workers, s, m", [(6, 2, 1000), (5, 1, 7), (8, 3, 3), (4, 0, 10)])
def test_gc_plan_exact_under_any_s_stragglers(workers, s, m):
    rng = np.random.default_rng(0)
    grads = rng.standard_normal((m, 2))
    p = plan_gc(workers, s, m)
    assert p.tree.layers == 1 and p.workers == workers
    for _ in range(20):
        down = set(rng.choice(workers, size=s, replace=False).tolist())
        result, _ = aggregate(p, grads, {"": down})
        np.testing.assert_allclose(result, grads.sum(axis=0), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("workers, m", [(20, 5000), (7, 100), (5, 3)])
def test_uncoded_plan_splits_evenly_and_exactly(workers, m):
    p = plan_uncoded(workers, m)
    loads = sorted(p.nodes[str(k)].local_samples for k in range(workers))
    assert loads[0] >= m // workers and loads[-1] <= -(-m // workers)
    covered = sorted(i for k in range(workers) for a, b, w in p.nodes[str(k)].local for i in range(a, b))
    assert covered == list(range(m))
    assert all(w == 1.0 for k in range(workers) for _, _, w in p.nodes[str(k)].local)


def test_frc_weights_stay_exactly_one():
    p = plan(Tree.regular(4, 2, 1), 60000)
    assert {w for a in p.nodes.values() for _, _, w in a.responsibility} == {1.0}


def test_json_shape():
    doc = plan(Tree.regular(3, 2, 1), 100).to_json()
    assert set(doc) == {"workers", "optimal_load", "max_local_samples", "samples", "nodes"}
    assert doc["workers"] == 12 and doc["samples"] == 100
    master = doc["nodes"][0]
    assert master == {"name": "", "layer": 0, "local": [], "responsibility": [[0, 100, 1.0]]}
    assert [n["name"] for n in doc["nodes"]][1:4] == ["0", "1", "2"]


def test_samples_must_be_positive():
    with pytest.raises(ValueError, match="samples must be >= 1"):
        plan(Tree.regular(2, 1, 0), 0)
