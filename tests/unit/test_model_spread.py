"""The run-time model of ``spread`` (crnet/tune/model_spread.py), its place in ``crnet.tune.model``'s
ranking, and ``crnet model`` / ``crnet plan --auto`` with it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from crnet.cli import main
from crnet.coding.plan import Tree
from crnet.schemes.spread.owners import MIN_SHARE_BYTES
from crnet.tune.model import candidates, predict, rank, step_times, step_times_from_draws
from crnet.tune.model_spread import owner_ranks, spread_step_times
from crnet.tune.workload import ComputeModel

STRAGGLE = ComputeModel("straggle", 2e-5, prob=0.1, factor=10)
SLOW_LINKS = dict(vector_bytes=4e6, bandwidth=12.5e6, latency=60e-6)   # the bandwidth preset
FAST_LINKS = dict(vector_bytes=2e4, bandwidth=125e6, latency=60e-6)    # the stragglers preset


def test_owner_ranks_follow_the_daemons_rule():
    assert owner_ranks(4e6, 21) == tuple(range(21))         # 190 kB each
    assert owner_ranks(2e4, 21) == (0,)                      # small: the master alone
    assert owner_ranks(10 * MIN_SHARE_BYTES, 21) == tuple(i * 21 // 10 for i in range(10))


def test_one_layer_by_hand():
    # 3 workers + master, 4 owners (every host); a share alone on a link takes 1 s.
    tree, m = Tree((3,), (1,)), 4 * MIN_SHARE_BYTES
    net = dict(vector_bytes=m, bandwidth=m / 4, latency=0.1)
    # Every worker sends 3 pieces in turn (it keeps its own), each a share larger than the
    # kernel takes at once, so each costs 1 s + a gap of one latency: the sender's limit,
    # T + 0.1 + 3 x 1.1, is later than the master's shared downlink (two pieces at 0.1: both
    # in at 2.1). The master needs 2 of 3: D = 3.4; then its share to 3 hosts: + 0.1 + 3 x 1.1.
    got = spread_step_times(tree, np.array([[0.0, 0.0, 10.0], [10.0, 0.0, 0.0]]), **net)
    np.testing.assert_allclose(got, [6.8, 6.8])
    assert spread_step_times(tree, np.array([0.0, 0.0, 10.0]), **net) == pytest.approx(6.8)


def test_one_owner_the_master_shared_downlink_decides():
    # A small vector: the master owns everything, each worker sends it one whole piece. Three
    # at once share its downlink (all in at 3 s, M/B = 1); then 3 sends of 1 s: gc's model.
    tree, net = Tree((3,), (1,)), dict(vector_bytes=1000.0, bandwidth=1000.0, latency=0.0)
    draws = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 50.0], [0.0, 2.0, 0.0]])
    got = spread_step_times(tree, draws, **net)
    np.testing.assert_allclose(got, [6.0, 5.0, 5.0])   # 2 pieces at once: 2 s, 1 alone: 1 s
    gc = step_times_from_draws("gc", compute_times=draws, workers=3, stragglers=1, **net)
    np.testing.assert_allclose(got, gc)


def test_two_layers_by_hand():
    # Columns: "0", "1", then "0.0", "0.1" (children of "0") and "1.0", "1.1". 7 hosts, 7
    # owners, 6 pieces per worker: a piece arrives T + 6 (the pieces never overlap at the
    # master). "0" needs both children and its own piece: max(6, 16, 26) = 26; "1" waits for
    # its own piece (106); the master needs 1 of 2: D = 26, then 6 sends of 1 s.
    m = 7 * MIN_SHARE_BYTES
    tree, net = Tree((2, 2), (1, 0)), dict(vector_bytes=m, bandwidth=m / 7, latency=0.0)
    got = spread_step_times(tree, np.array([[0.0, 100.0, 10.0, 20.0, 30.0, 40.0]]), **net)
    np.testing.assert_allclose(got, [32.0])
    # A straggling leaf under "1" is tolerated nowhere below the master: s_2 = 0.
    got = spread_step_times(tree, np.array([[0.0, 0.0, 10.0, 20.0, 30.0, 900.0]]), **net)
    np.testing.assert_allclose(got, [32.0])
    with pytest.raises(ValueError, match="6 workers"):
        spread_step_times(tree, np.zeros((1, 5)), **net)


def test_spread_moves_the_rings_traffic_where_links_are_the_bottleneck():
    tree, fixed = Tree((4, 4), (1, 1)), ComputeModel("fixed", 1e-7)
    run = dict(samples=20000, compute=fixed, trials=5, **SLOW_LINKS)
    spread = predict("spread", tree=tree, **run)
    cr = predict("cr", tree=tree, chunk_bytes=1 << 20, **run)
    rar = predict("rar", workers=20, **run)
    assert (spread.scheme, spread.shape, spread.workers) == ("spread", "fanout 4,4, s 1,1", 20)
    assert spread.mean < cr.mean / 3
    assert spread.mean == pytest.approx(rar.mean, rel=0.02)
    # 40 shares of M/21 in turn, each with a gap of one latency, and the two hops' latencies
    # (compute is 2 x 3334 samples at 0.1 us).
    assert spread.mean == pytest.approx(40 * (4e6 / 21 / 12.5e6 + 60e-6) + 2 * 60e-6 + 3334e-7,
                                        rel=1e-6)


def test_spread_is_cr_on_small_vectors():
    tree = Tree((5, 3), (4, 0))
    run = dict(samples=20000, compute=STRAGGLE, trials=2000, **FAST_LINKS)
    spread, cr = predict("spread", tree=tree, **run), predict("cr", tree=tree, **run)
    assert spread.max_load == cr.max_load
    assert spread.mean == pytest.approx(cr.mean, rel=0.1)


def test_step_times_from_draws_for_spread():
    tree = Tree((4, 4), (1, 1))
    draws = np.random.default_rng(3).uniform(0.0, 0.5, size=(7, 20))
    got = step_times_from_draws("spread", tree=tree, compute_times=draws, **SLOW_LINKS)
    assert got.shape == (7,)
    np.testing.assert_allclose(got, spread_step_times(tree, draws, **SLOW_LINKS))
    assert step_times_from_draws("spread", tree=tree, compute_times=draws[0],
                                 **SLOW_LINKS).shape == (1,)
    # The same seed, the same draws: step_times is step_times_from_draws on them.
    sim = step_times("spread", tree=tree, samples=20000, compute=STRAGGLE, trials=50, seed=4,
                     **FAST_LINKS)
    assert sim.shape == (50,) and np.all(sim > 0)
    with pytest.raises(ValueError, match="needs a tree"):
        step_times("spread", workers=20, samples=20000, compute=STRAGGLE, **FAST_LINKS)


def test_candidates_try_spread_on_every_shape():
    cands = candidates(20)
    others = {t for s, t in cands if s in ("cr", "tree", "gc")}
    spread = [t for s, t in cands if s == "spread"]
    assert len(spread) == len(set(spread)) and set(spread) == others   # the star and s = 0 too
    assert Tree((20,), (0,)) in spread and Tree((4, 4), (0, 0)) in spread
    assert candidates(1) == [("rar", None), ("gc", Tree((1,), (0,))), ("spread", Tree((1,), (0,)))]
    assert candidates(2) == [("rar", None), ("gc", Tree((2,), (0,))), ("gc", Tree((2,), (1,))),
                             ("spread", Tree((2,), (0,))), ("spread", Tree((2,), (1,)))]


def test_rank_lists_spread_and_puts_it_ahead_of_cr_on_slow_links():
    ranked = rank(20, samples=20000, compute=ComputeModel("fixed", 1e-7), trials=5, top=None,
                  **SLOW_LINKS)
    assert len(ranked) == len(candidates(20))
    spread = [p for p in ranked if p.scheme == "spread"]
    assert spread and all(p.tree is not None for p in spread)
    best_cr = min(p.mean for p in ranked if p.scheme == "cr")
    assert min(p.mean for p in spread) < best_cr / 3
    assert ranked.index(spread[0]) < 2   # spread and the ring share the lead


# ---- CLI ----

def cli(*args):
    return CliRunner().invoke(main, list(args))


def test_cli_model_scheme_spread():
    result = cli("model", "--scheme", "spread", "--fanout", "4", "--layers", "2",
                 "--stragglers", "1", "--samples", "20000", "--vector-bytes", "4MB",
                 "--bandwidth", "100Mbit", "--compute", "fixed:1e-7", "--trials", "5", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert set(doc["schemes"]) == {"spread"}
    p = doc["schemes"]["spread"]
    assert (p["fanout"], p["stragglers"], p["workers"]) == ([4, 4], [1, 1], 20)
    assert p["mean"] == pytest.approx(40 * (4e6 / 21 / 12.5e6 + 50e-6) + 2 * 50e-6 + 3334e-7,
                                      rel=1e-6)
    text = cli("model", "--scheme", "spread", "--fanout", "4", "--layers", "2", "--trials", "5")
    assert text.exit_code == 0, text.output
    assert "spread  fanout 4,4, s 1,1" in text.output
    assert "spread" in cli("model", "--trials", "5").output   # --scheme all


def test_cli_plan_auto_ranks_spread():
    result = cli("plan", "--auto", "--hosts", "20", "--samples", "20000", "--vector-bytes", "4MB",
                 "--bandwidth", "100Mbit", "--compute", "fixed:1e-7", "--trials", "5", "--top",
                 "3", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["candidates"] == len(candidates(20))
    assert "spread" in {p["scheme"] for p in doc["ranking"]}
    assert set(doc["best_per_scheme"]) == {"cr", "spread", "gc", "tree", "rar"}
    text = cli("plan", "--auto", "--hosts", "12", "--vector-bytes", "20kB", "--trials", "20")
    assert text.exit_code == 0, text.output
    assert " spread " in text.output
