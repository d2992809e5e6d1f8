"""crnet tune's fit: compute laws drawn by crnet.tune.workload are recovered, links from (bytes,
seconds) pairs and rates; and what the daemons measure, read into per-host samples."""

from __future__ import annotations

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.tune.fit import fit_compute, fit_links, host_throughput, ks_distance
from crnet.tune.model import candidates
from crnet.tune.tuning import HostMeasured, Measurements, Running, TuneError, measurements, tune
from crnet.tune.workload import ComputeModel

LOAD = 50.0


def draws(text: str, steps: int, workers: int = 8, seed: int = 1, jitter: float = 0.0) -> np.ndarray:
    """Per-sample times as the daemons would measure them: ``workers`` hosts of ``LOAD``
    samples each, ``steps`` steps of the law (crnet.tune.workload's own draw), times the load,
    over the load; with multiplicative noise of up to ``jitter``."""
    rng = np.random.default_rng(seed)
    times = ComputeModel.parse(text).sample(np.full(workers, LOAD), rng, steps)
    if jitter:
        times = times * rng.uniform(1 - jitter, 1 + jitter, times.shape)
    return (times / LOAD).ravel()


def test_a_fixed_law_is_recovered_exactly():
    fit = fit_compute(draws("fixed:2e-4", 16))
    assert fit.model == ComputeModel("fixed", 2e-4)
    assert fit.distance == 0.0 and fit.samples == 128
    # 4% noise is still "fixed" (coefficient of variation within 5%): its mean.
    noisy = fit_compute(draws("fixed:2e-4", 16, jitter=0.04))
    assert noisy.model.kind == "fixed" and noisy.model.per_sample_s == pytest.approx(2e-4, rel=0.01)


@pytest.mark.parametrize("text, a, p, f", [("straggle:1e-4,0.1,10", 1e-4, 0.1, 10),
                                           ("straggle:2e-5,0.3,3", 2e-5, 0.3, 3),
                                           ("straggle:5e-3,0.05,2", 5e-3, 0.05, 2)])
def test_a_straggle_law_is_recovered(text, a, p, f):
    """512 draws (64 steps of 8 hosts): A and F exactly, P within 0.05; with 5% noise on
    every time, A and F within 2%."""
    fit = fit_compute(draws(text, 64))
    law = fit.model
    assert law.kind == "straggle", law
    assert law.per_sample_s == pytest.approx(a, rel=1e-6)
    assert law.factor == pytest.approx(f, rel=1e-6)
    assert abs(law.prob - p) <= 0.05
    noisy = fit_compute(draws(text, 64, jitter=0.05)).model
    assert noisy.kind == "straggle", noisy
    assert noisy.per_sample_s == pytest.approx(a, rel=0.02)
    assert noisy.factor == pytest.approx(f, rel=0.02)
    assert abs(noisy.prob - p) <= 0.05


@pytest.mark.parametrize("text, a, mean_excess", [("shifted-exp:1e-4,1e4", 1e-4, 1e-4),
                                                  ("shifted-exp:5e-5,1e3", 5e-5, 1e-3)])
def test_a_shifted_exponential_law_is_recovered(text, a, mean_excess):
    """512 draws: 1/MU (the mean excess) within 15%, A within 10% of A + 1/MU (the minimum
    of 512 draws lies 1/(512 MU) above A, which the fit corrects for), and the mean of the
    law within 10%."""
    for seed in range(3):
        x = draws(text, 64, seed=seed)
        law = fit_compute(x).model
        assert law.kind == "shifted_exp", law
        assert 1 / law.mu == pytest.approx(mean_excess, rel=0.15)
        assert abs(law.per_sample_s - a) <= 0.1 * (a + mean_excess)
        assert law.mean_time(1) == pytest.approx(a + mean_excess, rel=0.1)


def test_any_other_law_is_taken_as_measured():
    """Times of no law above (log-normal): the empirical law, which draws the measured
    times themselves: its mean is theirs, its distance to them 0."""
    x = np.random.default_rng(0).lognormal(-8, 0.6, 400)
    fit = fit_compute(x)
    assert fit.model.kind == "empirical" and fit.model == fit.empirical
    assert fit.model.mean_time(1) == pytest.approx(x.mean(), rel=1e-9)
    assert fit.distance == pytest.approx(0.0, abs=1e-12)
    assert min(fit.model.multipliers) == 1.0


def test_the_fit_refuses_what_is_no_time():
    with pytest.raises(ValueError):
        fit_compute([])
    with pytest.raises(ValueError):
        fit_compute([1e-3, -1e-3])
    assert fit_compute([0.0, 0.0]).model == ComputeModel("fixed", 0.0)


def test_ks_distance():
    law = ComputeModel("straggle", 1e-3, prob=0.25, factor=4)
    assert ks_distance(law, [1e-3, 1e-3, 1e-3, 4e-3]) == 0.0
    assert ks_distance(law, [1e-3] * 4) == pytest.approx(0.25)
    assert ks_distance(ComputeModel("fixed", 1.0), [2.0]) == 1.0


def test_links_from_pairs_rates_and_round_trips():
    rng = np.random.default_rng(3)
    bandwidth, latency = 1.25e8, 50e-6          # 1 Gbit/s, 50 us
    sizes = rng.uniform(1e4, 4e6, 40)
    seconds = (latency + sizes / bandwidth) * rng.uniform(0.99, 1.01, sizes.size)
    line = fit_links(list(zip(sizes, seconds)), intercept=True)
    assert line.bandwidth == pytest.approx(bandwidth, rel=0.03)
    assert line.latency == pytest.approx(latency, rel=0.3)
    assert line.pairs == 40
    # Counts summed over many transfers: bytes over seconds; the latency from round trips.
    summed = fit_links([(3e6, 0.03), (1e6, 0.01)], rtts=[100e-6, 120e-6, 1e-3])
    assert summed.bandwidth == pytest.approx(1e8)
    assert summed.latency == pytest.approx(60e-6)
    # Rates (the kernel's delivery estimates) win over the pairs: their median.
    rated = fit_links([(1e6, 1.0)], rates=[1e8, 3e8, 2e8])
    assert rated.bandwidth == pytest.approx(2e8) and rated.latency == 0.0
    with pytest.raises(ValueError, match="no link"):
        fit_links([(0, 1.0), (1e6, 0.0)])


def test_a_host_link_that_large_vectors_kept_busy_gives_the_bandwidth_not_the_rates():
    """Measured on a cr star of 4 over 100 Mbit/s tbf links (12.5 MB/s), 8 steps of 4 MB:
    the master sends every child its result at once through its one host link; each child
    sends its vector into the master's, a quarter of it each. The kernel's delivery-rate
    estimates ran 4-5x over the link: a token bucket lets each flight's head through at
    the wire's speed."""
    master = [(32_002_216, 10.132), (32_002_216, 10.384), (32_002_220, 10.516),
              (32_002_220, 10.256)]
    children = [[(32_002_302, busy)] for busy in (7.300, 9.812, 11.028, 8.336)]
    rates = [12_022_668, 57_920_000, 3_433_031, 65_818_181, 60_333_333]   # each host's best
    hosts = [host_throughput(master), *(host_throughput(c) for c in children)]
    assert host_throughput(master) == pytest.approx(4 * 32_002_218 / 10.516)
    pairs = [p for h in (master, *children) for p in h]
    fit = fit_links(pairs, rates=rates, hosts=hosts, vector_bytes=4_000_000)
    assert fit.bandwidth == pytest.approx(12.17e6, rel=0.01)
    # The rates alone: 4.6x the link.
    assert fit_links(pairs, rates=rates).bandwidth > 4 * 12.5e6
    # Small vectors keep a link busy a few ms, which the busy time's ticks and delayed ACKs
    # swamp: the rates then (20 kB vectors over a 1 Gbit/s link, 5 MB/s by the busy time).
    small = fit_links([(2e6, 0.4)], rates=[1.2e8, 1.3e8], hosts=[5e6], vector_bytes=20_000)
    assert small.bandwidth == pytest.approx(1.25e8)
    assert host_throughput([(0, 1.0), (5, 0.0)]) is None


def window(steps, micros):
    return {"steps": list(steps), "micros": list(micros)}


def status_node(name, children=(), measured=None):
    return {"name": name, "host": "h", "address": None, "state": "joined", "tree_step": 9,
            "steps_done": 10, "last_step_seconds": None, "straggled": None, "recent": None,
            "measured": measured, "children": list(children)}


def section(load, compute=(), periods=None, config=None, links=()):
    periods = window([], []) if periods is None else periods
    return {"window": 64, "processes": max(1, len(compute)), "local_samples": load,
            "compute": [{"process": k, **w} for k, w in enumerate(compute)], "arrivals": [],
            "periods": periods, "links": list(links), "summed": None, "config": config}


CONFIG = {"scheme": "cr", "fanout": [2], "stragglers": [1], "samples": 20, "chunk_bytes": 0,
          "vector_bytes": 4000}


def test_measurements_per_host():
    """A host's time per step is its slowest process's, over the steps all of them measured;
    per sample: over the host's load. Nodes that sent nothing are named."""
    link = {"link": "child", "peer": "0", "up": True, "rtt_us": 300, "min_rtt_us": 100,
            "bytes": 10 ** 6, "busy_us": 10 ** 4, "rate": 5 * 10 ** 8}
    tree = status_node("", [
        status_node("0", measured=section(10, [window([1, 2, 3], [1000, 2000, 3000]),
                                               window([2, 3, 4], [2500, 1000, 9000])])),
        status_node("1")],
        measured=section(0, periods=window([2, 3], [4000, 6000]), config=CONFIG, links=[link]))
    m = measurements(tree)
    assert m.running == Running("cr", Tree((2,), (1,)), 20, 0, 4000)
    assert m.unmeasured == ("1",)
    master, zero = m.hosts
    assert master.per_sample == () and master.links == ((10 ** 6, 0.01),)
    assert master.min_rtts == (1e-4,) and master.best_rate == 5e8
    assert zero.per_sample == pytest.approx((2500e-6 / 10, 3000e-6 / 10))
    assert m.periods == pytest.approx((4e-3, 6e-3))
    with pytest.raises(TuneError, match="no share"):
        measurements(status_node("", measured=None))
    with pytest.raises(TuneError, match="no step has finished"):
        measurements(status_node("", measured=section(0, config={**CONFIG, "vector_bytes": None})))


def test_tune_ranks_every_candidate_with_the_running_configuration_placed():
    """Hosts measured under a straggle law: the law is recovered, every scheme and shape for
    6 workers is ranked best first, and the running configuration is predicted and placed."""
    x = draws("straggle:1e-4,0.1,10", 32, workers=6)
    hosts = tuple(HostMeasured(str(k), None, 10, tuple(x[k::6]), ((10 ** 7, 0.1),), (1e-4,), 1e8)
                  for k in range(6))
    run = Running("cr", Tree((2, 2), (1, 0)), 60, 0, 400_000)
    t = tune(Measurements(run, hosts, (0.01, 0.02), ()), trials=200)
    assert t.compute.model.kind == "straggle"
    assert t.compute.model.factor == pytest.approx(10)
    assert t.links.bandwidth == 1e8 and t.links.latency == pytest.approx(5e-5)
    assert len(t.ranking) == len(candidates(6))
    assert [p.mean for p in t.ranking] == sorted(p.mean for p in t.ranking)
    assert t.running.scheme == "cr" and t.running.tree == run.tree
    assert t.running_rank is not None
    placed = t.ranking[t.running_rank - 1]
    assert (placed.scheme, placed.tree) == ("cr", run.tree)
    assert t.measured_mean == pytest.approx(0.015)
    doc = t.to_json(top=3)
    assert len(doc["ranking"]) == 3 and doc["running"]["rank"] == t.running_rank
    # Overrides win over the links' fit; nothing measured to fit is an error that says so.
    assert tune(Measurements(run, hosts, (), ()), trials=50, bandwidth=1e9).links.bandwidth == 1e9
    empty = tuple(HostMeasured(h.name, None, 10, (), h.links, h.min_rtts, h.best_rate) for h in hosts)
    with pytest.raises(TuneError, match="two steps"):
        tune(Measurements(run, empty, (), ()), trials=50)


def test_a_hosts_throughput_counts_the_links_a_step_keeps_busy_together():
    """An interior parent of a 4,4 tree sends its four children their results together,
    and its own sum up to the master before: the four down-links' bytes over their busy
    time, not all five links' (which counts the up-link's bytes in the down-links' time)."""
    from crnet.tune.tuning import link_throughput

    def link(kind, nbytes, busy):
        return {"link": kind, "peer": "x", "up": True, "rtt_us": 100, "min_rtt_us": 50,
                "bytes": nbytes, "busy_us": int(busy * 1e6), "rate": 5 * 10 ** 7}

    # 8 steps of 4 MB: down at the host link's 12.4 MB/s, up at a quarter of the master's
    m = {"links": [*(link("child", 32_000_000, 10.3) for _ in range(4)),
                   link("parent", 32_000_000, 10.0)], "summed": None}
    assert link_throughput(m) == pytest.approx(4 * 32e6 / 10.3)      # 12.4 MB/s, not 15.5
    m["summed"] = {"links": 19, "bytes": 19 * 10 ** 6, "busy_us": 10 ** 6, "min_rtt_us": 50,
                   "rate": None}
    assert link_throughput(m) == pytest.approx(19e6)     # spread's peers, summed: 19 MB/s
    assert link_throughput({"links": [link("child", None, 1.0)], "summed": None}) is None


@pytest.mark.parametrize("scheme, stragglers, clamped", [
    ("rar", [0], True), ("cr", [0], True), ("cr", [1], False), ("spread", [1], False)])
def test_a_hosts_compute_counts_only_as_far_as_the_masters_clock_allows(scheme, stragglers, clamped):
    """Issue 39 row 10: one host said its compute was 100x on half its steps (a forged
    measured section); the fitted law, and --plan auto, followed it from rar to spread.
    Where a step waits for every worker, its period at the master bounds every worker's
    compute of it: the lie is cut to what the master saw. Where stragglers are left out
    (s > 0), a straggler's compute may outlast the step, and nothing is cut."""
    link = {"link": "child", "peer": "0", "up": True, "rtt_us": 300, "min_rtt_us": 100,
            "bytes": 10 ** 7, "busy_us": 10 ** 5, "rate": 10 ** 8}
    steps = list(range(1, 33))
    honest = window(steps, [10_000] * 32)
    liar = window(steps, [10_000 if s % 2 else 1_000_000 for s in steps])
    config = {**CONFIG, "scheme": scheme, "fanout": [3], "stragglers": stragglers}
    tree = status_node("", [status_node(str(k), measured=section(10, [w]))
                            for k, w in enumerate([honest, honest, liar])],
                       measured=section(0, periods=window(steps, [12_000] * 32), config=config,
                                        links=[link]))
    m = measurements(tree)
    lied = max(m.hosts[-1].per_sample)
    assert lied == pytest.approx(12e-3 / 10 if clamped else 1.0 / 10)
    assert (tune(m, trials=50).compute.model.kind == "straggle") is not clamped
