"""Run-time model: closed forms by hand, order statistics, monotonicity, ranking, and the CLI."""

import itertools
import json
import math
import time

import numpy as np
import pytest
from click.testing import CliRunner

from crnet.cli import main
from crnet.coding.plan import Tree
from crnet.tune.model import (
    candidates,
    predict,
    rank,
    scheme_tree,
    shared_link_arrivals,
    step_times,
    step_times_from_draws,
    summary,
    tree_step_times,
    worker_loads,
)
from crnet.tune.workload import ComputeModel

A = 1e-3  # seconds per sample
LAT = 1e-4  # one-way latency
M = 1e4  # vector bytes
B = 1e6  # bytes per second
U = M / B  # one vector over one link: 10 ms
NET = dict(vector_bytes=M, bandwidth=B, latency=LAT)
FIXED = ComputeModel("fixed", A)


def times(scheme, samples, compute=FIXED, trials=5, **shape):
    return step_times(scheme, samples=samples, compute=compute, trials=trials, **NET, **shape)


# ---- closed forms with deterministic compute, worked out by hand ----

def test_rar_closed_form():
    # 4 workers, 100 samples each; 2(N-1) = 6 rounds of latency + M/(N B).
    want = 100 * A + 6 * (LAT + M / (4 * B))
    np.testing.assert_allclose(times("rar", 400, workers=4), want)


def test_gc_closed_form():
    # N = 4, s = 1: each worker holds (s+1)/N = 1/2 of 400 samples. All 4 workers are ready at
    # once and send into the master's link together: the 4 vectors share it and all arrive
    # 4U later (the one the master does not need still takes its share), then the master
    # sends the result to all 4.
    want = 200 * A + LAT + 4 * U + 4 * U + LAT
    np.testing.assert_allclose(times("gc", 400, workers=4, stragglers=1), want)
    # s = 0 (a parameter server): 100 samples each, 5 vectors up, 5 down.
    np.testing.assert_allclose(times("gc", 500, workers=5), 100 * A + 2 * LAT + 10 * U)


def test_tree_closed_form_two_layers():
    # fanout (2, 3), s = 0: N = 8 workers with 100 of 800 samples each, all done at T.
    # A layer-1 node receives its 3 children's vectors together, sharing its link: all arrive
    # at T + LAT + 3U (its own compute finished at T). The master receives the 2 layer-1
    # vectors together: + LAT + 2U. Down: master -> 2
    # children (2U + LAT), each -> 3 children (3U + LAT).
    want = 100 * A + 4 * LAT + 10 * U
    tree = Tree((2, 3), (1, 1))  # the "tree" scheme drops the stragglers, keeps the fanout
    np.testing.assert_allclose(times("tree", 800, tree=tree), want)
    np.testing.assert_allclose(times("cr", 800, tree=Tree((2, 3), (0, 0))), want)


def test_cr_closed_form_two_layers():
    # fanout (2, 3), s = (1, 1): d* = 1 / (2/2 + 2/2 * 3/2) = 0.4, 320 of 800 samples each.
    # Layer-1 nodes need 2 of 3 children, the master 1 of 2, but the children are ready
    # together and share the link: the needed vectors arrive with the unneeded ones, 3U and
    # 2U after they start, as for s = 0. Down as for s = 0. Only the compute is longer.
    assert list(worker_loads(Tree((2, 3), (1, 1)), 800)) == [320] * 8
    want = 320 * A + 2 * LAT + 5 * U + (2 * U + LAT) + (3 * U + LAT)
    np.testing.assert_allclose(times("cr", 800, tree=Tree((2, 3), (1, 1))), want)


@pytest.mark.parametrize("compute", [FIXED, ComputeModel("straggle", A, prob=0.2, factor=10),
                                     ComputeModel("shifted_exp", A, mu=500.0)],
                         ids=lambda c: c.kind)
@pytest.mark.parametrize("n, s", [(4, 1), (6, 2), (5, 0)])
def test_cr_on_one_layer_is_gc(compute, n, s):
    cr = times("cr", 600, compute, trials=300, tree=Tree((n,), (s,)))
    gc = times("gc", 600, compute, trials=300, workers=n, stragglers=s)
    np.testing.assert_array_equal(cr, gc)


# ---- order statistics on hand-made compute times ----

def test_parent_waits_for_its_fastest_n_minus_s_children():
    # Children ready at 1, 5, 2 s; need 2: the first vector is in long before the second
    # starts at 2 + LAT, which then has the link to itself.
    got = tree_step_times(Tree((3,), (1,)), [1.0, 5.0, 2.0], **NET)
    assert got == pytest.approx(2 + LAT + U + 3 * U + LAT)


def test_an_frc_parent_decodes_once_every_group_has_a_child():
    # n = 4, s = 1 (FRC, groups {0, 1} and {2, 3}): children 1 and 3 straggle (ready at 9 s),
    # which n - s = 3 would wait for; one of each group is in at 1 and 2 s.
    got = tree_step_times(Tree((4,), (1,)), [1.0, 9.0, 2.0, 9.0], **NET)
    assert got == pytest.approx(2 + LAT + U + 4 * U + LAT)
    # Both stragglers in one group: that group's parts wait for the first of them.
    assert tree_step_times(Tree((4,), (1,)), [1.0, 2.0, 9.0, 9.0], **NET) > 9


# ---- the shared link (processor sharing) ----

def test_shared_link_by_hand():
    # Two vectors start at 0, a third at U/2. Until U/2 the two get half the link each: U/4
    # in, 3U/4 to go. Then three share it: the first two finish 3 * 3U/4 later, at 11U/4,
    # when the third has 3U/4 in; alone, it finishes U/4 later, at 3U.
    got = shared_link_arrivals(np.array([[0.0, U / 2, 0.0]]), U)
    np.testing.assert_allclose(got, [[11 * U / 4, 11 * U / 4, 3 * U]])
    # With s = 1 the parent needs 2 of these 3: at 11U/4, not 2U (first come, first served)
    # nor 2U as if the third were not sent: the unneeded vector slows the needed ones.
    got = tree_step_times(Tree((3,), (1,)), [0.0, U / 2, 0.0], **NET)
    assert got == pytest.approx(LAT + 11 * U / 4 + 3 * U + LAT)
    # Non-overlapping vectors each get the whole link; a vector starting as another one is
    # half done shares the rest of it: 0..U alone, then U/2 each at half rate.
    np.testing.assert_allclose(shared_link_arrivals(np.array([[0.0, 5.0], [0.0, 0.5]]), 1.0),
                               [[1.0, 6.0], [1.5, 2.0]])
    # need: only the first columns (later starts still count while they overlap).
    got = shared_link_arrivals(np.array([[0.0, 0.0, 0.5, 9.0]]), 1.0, need=2)
    np.testing.assert_allclose(got[:, :2], [[2.75, 2.75]])
    assert np.isnan(got[:, 2:]).all()


def _reference_processor_sharing(starts, unit):
    """Plain Python: step time forward from event to event, with remaining work per vector."""
    pending = sorted(starts)
    active = {}  # index -> remaining link-seconds
    t, out, i = pending[0], [], 0
    while len(out) < len(starts):
        while i < len(pending) and pending[i] <= t:
            active[i] = unit
            i += 1
        if not active:
            t = pending[i]
            continue
        k = len(active)
        first_end = t + k * min(active.values())
        next_start = pending[i] if i < len(pending) else math.inf
        step_to = min(first_end, next_start)
        for j in active:
            active[j] -= (step_to - t) / k
        t = step_to
        for j in [j for j, left in active.items() if left <= 1e-12]:
            del active[j]
            out.append(t)
    return sorted(out)


def test_shared_link_matches_a_plain_simulation():
    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 5, 8):
        starts = rng.exponential(1.0, size=(40, n)) * rng.choice([0.0, 1.0], size=(40, n))
        got = shared_link_arrivals(starts, 0.7)
        for row, want in zip(starts, got):
            np.testing.assert_allclose(want, _reference_processor_sharing(list(row), 0.7),
                                       rtol=1e-9, atol=1e-12)
        # The link is work conserving: the last vector is in at least n units after the
        # first starts, and exactly n units after when all start together.
        assert np.all(got[:, -1] >= starts.min(axis=1) + n * 0.7 - 1e-9)
    np.testing.assert_allclose(shared_link_arrivals(np.zeros((3, 4)), 0.5), np.full((3, 4), 2.0))


def test_children_ready_together_share_the_parents_link():
    got = tree_step_times(Tree((3,), (0,)), [1.0, 1.0, 1.0], **NET)
    assert got == pytest.approx(1 + LAT + 3 * U + 3 * U + LAT)


def test_a_straggling_subtree_is_skipped():
    # fanout (2, 2), s = (1, 1); columns in names() order: 0, 1, 0.0, 0.1, 1.0, 1.1.
    # Node 0 has child 0.0 by 0.5 + LAT + U but its own compute ends at 1; node 1's whole
    # subtree straggles (9 s). The master takes node 0 alone.
    got = tree_step_times(Tree((2, 2), (1, 1)), [1.0, 1.0, 0.5, 9.0, 9.0, 9.0], **NET)
    assert got == pytest.approx(1 + LAT + U + (2 * U + LAT) + (2 * U + LAT))
    # Without tolerance everyone waits: node 0 for 0.1 (9 + LAT + U, 0.0's vector is long
    # in), node 1 for both its children (9 + LAT + 2U); the master gets node 0's vector by
    # 9 + 2LAT + 2U and node 1's right after, by 9 + 2LAT + 3U.
    got = tree_step_times(Tree((2, 2), (0, 0)), [1.0, 1.0, 0.5, 9.0, 9.0, 9.0], **NET)
    assert got == pytest.approx(9 + 2 * LAT + 3 * U + 2 * (2 * U + LAT))


def test_chunked_pipeline():
    # Chunks of C = M/10: the first chunk goes through the order statistics, the rest streams
    # at the busiest link's pace (3 chunks down per chunk at the master).
    c = M / 10
    got = tree_step_times(Tree((3,), (1,)), [1.0, 5.0, 2.0], **NET, chunk_bytes=c)
    assert got == pytest.approx(2 + LAT + c / B + 3 * c / B + LAT + 3 * (M - c) / B)
    # Children ready together: their first chunks share the link (3c/B, though 2 are needed),
    # then 3 chunks per chunk up and down.
    got = tree_step_times(Tree((3,), (1,)), [1.0, 1.0, 1.0], **NET, chunk_bytes=c)
    assert got == pytest.approx(1 + LAT + 3 * c / B + 3 * c / B + LAT + 3 * (M - c) / B)
    # A chunk as large as the vector is store and forward.
    assert tree_step_times(Tree((3,), (1,)), [1.0, 5.0, 2.0], **NET, chunk_bytes=2 * M) == \
        tree_step_times(Tree((3,), (1,)), [1.0, 5.0, 2.0], **NET)


@pytest.mark.parametrize("tree", [Tree((4, 4), (1, 1)), Tree((2, 3, 2), (1, 0, 1)),
                                  Tree((20,), (3,))])
def test_pipelining_never_slower_than_store_and_forward(tree):
    compute = ComputeModel("shifted_exp", A, mu=100.0)
    whole = times("cr", 2000, compute, trials=300, tree=tree)
    for chunk in (M / 100, M / 3, M):
        chunked = step_times("cr", tree=tree, samples=2000, compute=compute, trials=300, **NET,
                             chunk_bytes=chunk)
        assert np.all(chunked <= whole + 1e-12)


# ---- given compute times (the benchmark's draws) ----

def test_step_times_from_draws_by_hand():
    draws = np.array([[1.0, 5.0, 2.0],   # need 2: the 2nd vector alone, 2 + LAT + U
                      [1.0, 1.0, 1.0],   # together: all 3 in at 1 + LAT + 3U
                      [0.0, U / 2, 0.0]])  # see test_shared_link_by_hand: LAT + 11U/4
    down = 3 * U + LAT
    want = [2 + LAT + U + down, 1 + LAT + 3 * U + down, LAT + 11 * U / 4 + down]
    for scheme, shape in (("cr", dict(tree=Tree((3,), (1,)))),
                          ("gc", dict(workers=3, stragglers=1))):
        got = step_times_from_draws(scheme, compute_times=draws, **shape, **NET)
        assert got.shape == (3,)
        np.testing.assert_allclose(got, want)
    # tree: the same fanout, all 3 needed: the last vector (5 + LAT + U), 1 + LAT + 3U, 3U.
    got = step_times_from_draws("tree", compute_times=draws, tree=Tree((3,), (1,)), **NET)
    np.testing.assert_allclose(got, [5 + LAT + U + down, 1 + LAT + 3 * U + down,
                                     LAT + 3 * U + down])
    # rar: the slowest worker, then 2(N-1) rounds of LAT + M/(N B).
    got = step_times_from_draws("rar", compute_times=draws, workers=3, **NET)
    np.testing.assert_allclose(got, draws.max(axis=1) + 4 * (LAT + M / (3 * B)))
    # One step as a 1-D row; chunking as in tree_step_times.
    got = step_times_from_draws("cr", compute_times=[1.0, 1.0, 1.0], tree=Tree((3,), (1,)),
                                **NET, chunk_bytes=M / 10)
    c = M / 10
    np.testing.assert_allclose(got, [1 + LAT + 3 * c / B + 3 * c / B + LAT + 3 * (M - c) / B])


def test_step_times_from_draws_on_a_two_layer_tree_by_hand():
    # fanout (2, 2), s = (1, 1); columns 0, 1, 0.0, 0.1, 1.0, 1.1. Step 0: node 0's children
    # are ready at 0.5 and 0.5 (both in at 0.5 + LAT + 2U, though it needs 1), node 0 itself
    # at 1; node 1's children straggle (9). The master needs 1 of 2: node 0's vector, alone on
    # its link, at 1 + LAT + U. Down: 2U + LAT twice.
    draws = np.array([[1.0, 1.0, 0.5, 0.5, 9.0, 9.0]])
    got = step_times_from_draws("cr", compute_times=draws, tree=Tree((2, 2), (1, 1)), **NET)
    np.testing.assert_allclose(got, [1 + LAT + U + 2 * (2 * U + LAT)])


def test_step_times_from_draws_agrees_with_step_times():
    compute = ComputeModel("straggle", A, prob=0.2, factor=10)
    for scheme, shape in (("cr", dict(tree=Tree((4, 4), (1, 1)))),
                          ("tree", dict(tree=Tree((2, 3, 2), (1, 1, 1)))),
                          ("gc", dict(workers=20, stragglers=3)), ("rar", dict(workers=20))):
        want = step_times(scheme, samples=2000, compute=compute, trials=50, seed=3, **shape,
                          **NET, chunk_bytes=M / 4)
        loads = worker_loads(scheme_tree(scheme, **shape), 2000)
        draws = compute.sample(loads, np.random.default_rng(3), 50)
        got = step_times_from_draws(scheme, compute_times=draws, **shape, **NET,
                                    chunk_bytes=M / 4)
        np.testing.assert_array_equal(got, want)


def test_step_times_from_draws_checks_the_columns():
    with pytest.raises(ValueError, match="3 columns for a tree of 4 workers"):
        step_times_from_draws("cr", compute_times=np.zeros((2, 3)), tree=Tree((4,), (1,)), **NET)
    with pytest.raises(ValueError, match="3 columns for a ring of 4 workers"):
        step_times_from_draws("rar", compute_times=np.zeros((2, 3)), workers=4, **NET)
    with pytest.raises(ValueError, match="bandwidth must be > 0"):
        step_times_from_draws("rar", compute_times=np.zeros((2, 4)), workers=4,
                              vector_bytes=M, bandwidth=0.0, latency=LAT)


def test_compute_times_must_match_the_tree():
    with pytest.raises(ValueError, match="3 columns for a tree of 4 workers"):
        tree_step_times(Tree((4,), (1,)), np.zeros((2, 3)), **NET)


# ---- monotonicity, inputs, speed ----

@pytest.mark.parametrize("scheme, shape", [
    ("cr", dict(tree=Tree((4, 4), (1, 1)))),
    ("tree", dict(tree=Tree((4, 4), (1, 1)))),
    ("gc", dict(workers=20, stragglers=2)),
    ("rar", dict(workers=20)),
])
def test_mean_step_time_grows_with_straggle_probability(scheme, shape):
    means = []
    for prob in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.0):
        compute = ComputeModel("straggle", A, prob=prob, factor=10)
        t = times(scheme, 2000, compute, trials=500, **shape)
        means.append(t.mean())
    if scheme in ("cr", "gc"):
        # A rare straggler the code tolerates leaves its share of the parent's link to the
        # needed vectors (see test_a_tolerated_straggler_frees_the_link): the mean may dip,
        # by less than one vector per layer.
        layers = shape["tree"].layers if "tree" in shape else 1
        assert all(b >= a - layers * U for a, b in itertools.pairwise(means))
        assert means[2:] == sorted(means[2:])
    else:
        assert means == sorted(means)
    assert means[-1] > means[0]


def test_a_tolerated_straggler_frees_the_link():
    # s = 1 of 3: all ready at 1, the 3 vectors share the link (3U); with the third child
    # late, the two needed ones have it to themselves (2U).
    together = tree_step_times(Tree((3,), (1,)), [1.0, 1.0, 1.0], **NET)
    one_late = tree_step_times(Tree((3,), (1,)), [1.0, 1.0, 9.0], **NET)
    assert together == pytest.approx(1 + LAT + 3 * U + 3 * U + LAT)
    assert one_late == pytest.approx(1 + LAT + 2 * U + 3 * U + LAT)


def test_summary():
    s = summary(np.arange(101.0))
    assert s == {"mean": 50.0, "p50": 50.0, "p95": 95.0}


@pytest.mark.parametrize("kwargs, message", [
    (dict(scheme="ps"), "unknown scheme 'ps'"),
    (dict(scheme="cr"), "needs a tree"),
    (dict(scheme="gc"), "needs workers"),
    (dict(scheme="gc", workers=4, stragglers=4), "stragglers must be in 0..3"),
    (dict(scheme="rar", workers=4, bandwidth=0.0), "bandwidth must be > 0"),
    (dict(scheme="rar", workers=4, latency=-1.0), "latency must be >= 0"),
    (dict(scheme="rar", workers=4, samples=0), "samples must be >= 1"),
])
def test_bad_inputs(kwargs, message):
    args = dict(samples=100, compute=FIXED, **NET)
    args.update(kwargs)
    scheme = args.pop("scheme")
    with pytest.raises(ValueError, match=message):
        step_times(scheme, **args)


def test_scheme_tree():
    assert scheme_tree("tree", tree=Tree((3, 2), (1, 1))) == Tree((3, 2), (0, 0))
    assert scheme_tree("gc", tree=Tree((3, 2), (1, 1)), stragglers=2) == Tree((9,), (2,))
    assert scheme_tree("rar", workers=5) == Tree((5,), (0,))


def test_two_thousand_trials_of_a_twenty_host_tree_are_fast():
    compute = ComputeModel("straggle", 1e-5, prob=0.1, factor=10)
    tree = Tree((4, 4), (1, 1))
    step_times("cr", tree=tree, samples=20000, compute=compute, **NET)  # plan cached
    start = time.perf_counter()
    for _ in range(5):
        step_times("cr", tree=tree, samples=20000, compute=compute, trials=2000, **NET)
    assert (time.perf_counter() - start) / 5 < 0.25


def test_prediction():
    p = predict("cr", tree=Tree((4, 4), (1, 1)), samples=20000, compute=FIXED, **NET)
    assert (p.scheme, p.workers, p.max_load) == ("cr", 20, 3334)
    assert p.p50 <= p.p95 and p.shape == "fanout 4,4, s 1,1"
    assert predict("rar", workers=20, samples=20000, compute=FIXED, **NET).shape == "ring of 20"


# ---- candidates and ranking ----

def test_candidates_use_exactly_the_hosts():
    cands = [c for c in candidates(20) if c[0] != "spread"]  # spread's: test_model_spread.py
    assert ("rar", None) in cands
    assert len(cands) == len(set(cands))
    shapes = {tree.fanout for scheme, tree in cands if tree is not None}
    assert shapes == {(20,), (2, 9), (4, 4), (5, 3), (2, 3, 2)}
    for scheme, tree in cands:
        if tree is None:
            continue
        assert tree.workers == 20
        want = "gc" if tree.layers == 1 else "tree" if not any(tree.stragglers) else "cr"
        assert scheme == want
    gc_stragglers = {t.stragglers[0] for s, t in cands if s == "gc"}
    assert gc_stragglers == {0, 1, 2, 3, 4, 9, 19}  # s <= 3 and every (s+1) dividing 20
    assert sum(1 for s, t in cands if t is not None and t.fanout == (4, 4)) == 16
    assert [t.fanout for s, t in candidates(7, max_layers=1) if s == "gc"] == [(7,)] * 7


def test_candidates_for_one_and_two_hosts():
    assert candidates(1)[:2] == [("rar", None), ("gc", Tree((1,), (0,)))]
    assert candidates(2)[:3] == [("rar", None), ("gc", Tree((2,), (0,))), ("gc", Tree((2,), (1,)))]


def test_without_stragglers_redundancy_does_not_pay_on_a_slow_link():
    # Big vectors, a slow link, no stragglers: s > 0 only adds compute (the unneeded vectors
    # still share the links), so every tree ranks at least as well as cr with its fanout and
    # any s > 0, gc with s = 0 beats gc with s > 0, and rar ranks first (spread ties it).
    ranked = [p for p in rank(20, samples=20000, vector_bytes=4e6, bandwidth=12.5e6, latency=50e-6,
                              compute=ComputeModel("fixed", 1e-7), trials=20, top=None)
              if p.scheme != "spread"]
    assert ranked[0].scheme == "rar"
    tree_mean = {p.tree.fanout: p.mean for p in ranked if p.scheme == "tree"}
    cr = [p for p in ranked if p.scheme == "cr"]
    assert cr and set(tree_mean) == {p.tree.fanout for p in cr}
    for p in cr:
        assert tree_mean[p.tree.fanout] <= p.mean, p.shape
        assert ranked.index(p) > min(i for i, q in enumerate(ranked)
                                     if q.scheme == "tree" and q.tree.fanout == p.tree.fanout)
    gc = {p.tree.stragglers[0]: p.mean for p in ranked if p.scheme == "gc"}
    assert all(gc[0] <= mean for mean in gc.values())


def test_rar_ranks_first_without_stragglers_on_a_slow_network():
    best = rank(12, samples=20000, vector_bytes=4e6, bandwidth=12.5e6, latency=50e-6,
                compute=ComputeModel("fixed", 1e-5), trials=20, top=3)
    assert len(best) == 3
    assert best[0].scheme == "rar"
    assert best[0].mean < best[1].mean


def test_a_coded_scheme_beats_rar_under_heavy_stragglers():
    ranked = rank(12, samples=20000, vector_bytes=2e4, bandwidth=125e6, latency=50e-6,
                  compute=ComputeModel("straggle", 1e-5, prob=0.3, factor=10), trials=300,
                  top=None)
    order = [p.scheme for p in ranked]
    assert order[0] in ("cr", "gc")
    assert order.index("rar") > 0
    assert [p.mean for p in ranked] == sorted(p.mean for p in ranked)


# ---- CLI ----

def cli(*args):
    return CliRunner().invoke(main, list(args))


def test_cli_model_json():
    result = cli("model", "--fanout", "4", "--layers", "2", "--stragglers", "1", "--samples",
                 "20000", "--vector-bytes", "20kB", "--bandwidth", "1Gbit", "--latency", "50us",
                 "--compute", "straggle:1e-5,0.1,10", "--trials", "200", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["vector_bytes"] == 20000 and doc["bandwidth_bytes_per_s"] == 125e6
    assert doc["latency_s"] == pytest.approx(50e-6)
    assert doc["compute"] == "straggle:1e-05,0.1,10"
    assert set(doc["schemes"]) == {"cr", "spread", "gc", "tree", "rar"}
    for name, p in doc["schemes"].items():
        assert p["scheme"] == name and p["workers"] == 20
        assert 0 < p["p50"] <= p["p95"] and p["mean"] > 0
    assert doc["schemes"]["cr"]["fanout"] == [4, 4]
    assert doc["schemes"]["gc"]["stragglers"] == [1]
    assert doc["schemes"]["tree"]["stragglers"] == [0, 0]
    assert "fanout" not in doc["schemes"]["rar"]


def test_cli_model_table_one_scheme():
    result = cli("model", "--scheme", "gc", "--workers", "20", "--stragglers", "5",
                 "--vector-bytes", "20000", "--bandwidth", "100Mbit", "--compute", "fixed:1e-5",
                 "--trials", "10")
    assert result.exit_code == 0, result.output
    assert "links 100 Mbit/s" in result.output
    assert "star of 20, s 5" in result.output
    assert "rar" not in result.output.split("\n", 2)[2]


@pytest.mark.parametrize("args, message", [
    (["--bandwidth", "100Mbps"], "is ambiguous: write 100Mbit"),
    (["--bandwidth", "12.5mbps"], "write 12.5mbit for bits per second or 12.5MB for bytes"),
    (["--bandwidth", "100"], "needs a unit"),
    (["--bandwidth", "fast"], "is not a number with a unit"),
    (["--bandwidth", "0Gbit"], "must be > 0"),
    (["--latency", "50"], "needs a unit: s, ms, us or ns"),
    (["--latency", "3h"], "unknown unit 'h'"),
    (["--vector-bytes", "4mb"], "unknown unit 'mb'"),
    (["--compute", "straggle:1e-4,2,10"], "probability must be in [0, 1]"),
    (["--scheme", "gc", "--workers", "4", "--stragglers", "4"], "stragglers must be in 0..3"),
    (["--scheme", "all", "--workers", "7"], "drop --workers 7"),
])
def test_cli_model_usage_errors(args, message):
    result = cli("model", "--trials", "5", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_cli_plan_auto_prints_a_ranking():
    result = cli("plan", "--auto", "--hosts", "12", "--samples", "20000", "--vector-bytes", "20kB",
                 "--compute", "straggle:1e-5,0.3,10", "--trials", "100", "--top", "3")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("hosts       12 workers")
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["rank", "scheme"])
    ranked = lines[header + 1:header + 4]
    assert [line.split()[0] for line in ranked] == ["1", "2", "3"]
    assert ranked[0].split()[1] in ("cr", "gc")
    assert "best of the other schemes:" in result.output and " rar " in result.output


def test_cli_plan_auto_json():
    result = cli("plan", "--auto", "--hosts", "6", "--trials", "50", "--top", "2", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["hosts"] == 6 and doc["samples"] == 60000 and len(doc["ranking"]) == 2
    assert doc["ranking"][0]["mean"] <= doc["ranking"][1]["mean"]
    assert set(doc["best_per_scheme"]) >= {"rar", "gc"}


@pytest.mark.parametrize("args, message", [
    (["--auto"], "--auto needs --hosts"),
    (["--auto", "--hosts", "5", "--fanout", "3"], "drop --fanout"),
    (["--hosts", "5"], "--hosts is for --auto"),
    (["--samples", "10", "--bandwidth", "1Gbit"], "--bandwidth is for --auto"),
    (["--fanout", "3"], "Missing option '--samples'"),
])
def test_cli_plan_auto_usage_errors(args, message):
    result = cli("plan", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
