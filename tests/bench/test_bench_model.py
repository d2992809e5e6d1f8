"""The benchmark's pure parts: presets resolved by the model, its predictions per scheme, the
report's tables, and ``python -m benchmarks``'s options (no emulated cluster is built)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from benchmarks import report
from benchmarks.__main__ import main
from benchmarks.presets import PRESETS
from benchmarks.runner import VARIANTS, crnetd_scheme, predict, preset_tree, resolve
from crnet.coding.plan import Tree
from crnet.config.options import BY_NAME
from crnet.tune.workload import ComputeModel


def test_help_lists_spread_and_the_large_preset():
    result = CliRunner().invoke(main, ["--help"], prog_name="python -m benchmarks")
    assert result.exit_code == 0, result.output
    assert "cr,spread,gc,tree,rar,gloo" in result.output
    assert "large" in result.output


def test_unknown_schemes_are_refused_before_anything_runs():
    result = CliRunner().invoke(main, ["--schemes", "cr,allgather"])
    assert result.exit_code == 2
    assert "only cr, spread, gc, tree, rar, gloo" in result.output


def test_spread_runs_on_crs_tree():
    preset, _ = resolve(PRESETS["bandwidth"])
    assert preset_tree(preset, "spread") == preset_tree(preset, "cr") == preset.cr_tree


@pytest.mark.parametrize("name", ["bandwidth", "large"])
def test_spread_beats_crs_tree_where_vectors_are_large(name):
    preset, _ = resolve(PRESETS[name])
    got = {s: predict(preset, s, trials=500) for s in ("spread", "cr", "rar")}
    assert got["spread"]["mean_s"] < got["cr"]["mean_s"]
    assert got["spread"]["same_draws_mean_s"] < got["cr"]["same_draws_mean_s"]
    if name == "bandwidth":   # no stragglers: the ring's traffic, in two hops
        assert got["spread"]["mean_s"] == pytest.approx(got["rar"]["mean_s"], rel=0.02)
    else:                     # stragglers: ahead of the ring too
        assert got["spread"]["mean_s"] < 0.8 * got["rar"]["mean_s"]


def test_large_preset():
    p = PRESETS["large"]
    assert (p.workers, p.vector_bytes, p.rate) == (20, 4_000_000, "1gbit")
    assert p.compute.startswith("straggle:") and p.deadline >= 120 and p.timeout >= 10


def _row(mean):
    return {"mean_s": mean, "p50_s": mean, "p95_s": mean, "steps": 10, "steps_completed": 10,
            "model": {"mean_s": mean, "same_draws_mean_s": mean}, "step_times": [mean]}


def test_report_lists_spread_and_judges_its_pick_on_crs_shape():
    preset, _ = resolve(replace(PRESETS["bandwidth"], steps=10))
    cfg = {"cr_fanout": list(preset.cr_tree.fanout), "cr_stragglers": list(preset.cr_tree.stragglers),
           "tree_fanout": list(preset.cr_tree.fanout)}
    doc = {"preset": "bandwidth", "config": cfg,
           "schemes": {"cr": _row(2.0), "spread": _row(0.5), "rar": _row(0.6)},
           "plan_auto": {"scheme": "spread", "shape": "fanout 4,4, s 1,1",
                         "tree": [cfg["cr_fanout"], cfg["cr_stragglers"]]}}
    text = report.table(doc)
    assert [line.split()[0] for line in text.splitlines()[2:5]] == ["cr", "spread", "rar"]
    assert "plan --auto picks spread (fanout 4,4, s 1,1): measured 1.00x" in text
    doc["plan_auto"] = {"scheme": "spread", "shape": "fanout 20, s 0", "tree": [[20], [0]]}
    assert "not measured in this run (best measured: spread)" in report.table(doc)
    assert set(report.summary(doc)["schemes"]) == {"cr", "spread", "rar"}


def test_correlated_preset_slows_more_than_s_siblings_at_once():
    """Every group of the law at the bottom lies in one parent's children and is more than
    that parent tolerates, fewer than all of them (the parent still has children to decode
    from), and the master needs that parent (s = 0)."""
    preset, _ = resolve(PRESETS["correlated"])
    tree = preset_tree(preset, "cr")
    assert tree == Tree((2, 4), (0, 1)) == preset.cr_tree
    law = ComputeModel.parse(preset.compute)
    assert law.kind == "grouped" and law.prob > 0 and law.factor > 1
    workers = [name for name in tree.names() if name]
    groups: dict[int, list[str]] = {}
    for w, name in enumerate(workers):
        groups.setdefault(law.group_of(w), []).append(name)
    assert groups[0] == ["0", "1"]          # the master's children: slow together, no decode
    for members in list(groups.values())[1:]:
        parents = {tree.parent(name) for name in members}
        assert len(parents) == 1, members
        code = tree.code_of(parents.pop())
        assert code is not None and code.s < len(members) < code.n
    assert tree.stragglers[0] == 0
    # cr-approx is cr with the master's --beyond-s approximate and the preset's patience,
    # options crnetd has; a patience well within the timeout; the model has no row for it.
    scheme, options = crnetd_scheme("cr-approx", preset)
    assert (scheme, options) == ("cr", {"beyond_s": "approximate", "patience": preset.patience})
    assert set(options) <= set(BY_NAME) and crnetd_scheme("cr", preset) == ("cr", {})
    assert 0 < preset.patience * tree.layers < preset.timeout / 10
    assert predict(preset, "cr-approx")["mean_s"] is None
    assert predict(preset, "cr", trials=200)["mean_s"] > 0
    assert set(report.APPROX) == set(VARIANTS) and set(report.ROWS) == {*report.ORDER, *VARIANTS}


def test_report_shows_the_approximate_steps_and_coverage():
    cfg = {"cr_fanout": [4, 4], "cr_stragglers": [1, 1]}
    approx = {**_row(0.1), "approximate_steps": 3, "mean_coverage": 0.8125}
    doc = {"preset": "correlated", "config": cfg, "schemes": {"cr-approx": approx, "cr": _row(0.2)},
           "plan_auto": {"scheme": "cr", "shape": "fanout 4,4, s 1,1", "tree": [[4, 4], [1, 1]]}}
    lines = report.table(doc).splitlines()
    assert lines[2].startswith("cr ") and lines[3].startswith("cr-approx ")
    assert "3 approximate, mean coverage 0.812" in lines[3]
    assert "scheme that completed every step (cr)" in lines[-1]   # not cr-approx: not exact
    assert report.summary(doc)["schemes"]["cr-approx"]["approximate_steps"] == 3


def test_cr_approx_is_a_scheme_the_cli_knows():
    result = CliRunner().invoke(main, ["--schemes", "cr,cr-approxx"])
    assert result.exit_code == 2 and "or cr-approx" in result.output
    help_text = CliRunner().invoke(main, ["--help"], prog_name="python -m benchmarks").output
    assert "cr-approx" in help_text and "correlated" in help_text


def test_the_fast_presets_are_unshaped_and_differ_only_in_stragglers():
    fast, calm = PRESETS["fast"], PRESETS["fast-calm"]
    assert (fast.workers, fast.vector_bytes, fast.rate) == (8, 64 << 20, None)
    assert replace(fast, name="fast-calm", compute=calm.compute, about=calm.about) == calm
    # 200 ms of uncoded compute: 2,500 samples per worker at 80 us.
    per_sample = ComputeModel.parse(calm.compute)
    assert per_sample.compute_time(calm.samples // calm.workers, 0, 0, 0) == pytest.approx(0.2)


@pytest.mark.parametrize("bandwidth", [2e8, 1e9])
def test_on_fast_links_the_model_picks_spread_with_stragglers_and_the_ring_without(bandwidth):
    fast, _ = resolve(replace(PRESETS["fast"], bandwidth=bandwidth))
    calm, auto = resolve(replace(PRESETS["fast-calm"], bandwidth=bandwidth))
    assert auto["scheme"] == "rar"
    got = {s: predict(fast, s, trials=500)["mean_s"] for s in ("spread", "rar")}
    assert got["spread"] < got["rar"] / 1.5
    quiet = {s: predict(calm, s, trials=500)["mean_s"] for s in ("spread", "rar")}
    assert quiet["spread"] == pytest.approx(quiet["rar"], rel=0.05)


def test_calibration_on_unshaped_links_measures_the_rate_a_host_moves_bytes_at(monkeypatch, tmp_path):
    """A ring of N workers whose rounds cost latency + M/(N B): calibrate gives back both."""
    from benchmarks import runner

    latency, rate = 2e-3, 3e8
    n = PRESETS["fast"].workers

    def ring(cluster, preset, scheme, workdir, *rest):
        assert scheme == "rar" and preset.compute == "fixed:0"
        return {"mean_s": 2 * (n - 1) * (latency + preset.vector_bytes / n / rate)}

    monkeypatch.setattr(runner, "run_crnet", ring)
    got = runner.calibrate(None, PRESETS["fast"], ["spread", "rar"], tmp_path)
    assert set(got) == {"crnet"}
    # The small vector's bytes are counted at 10 Gbit/s there: a few us off, no more.
    assert got["crnet"]["latency_s"] == pytest.approx(latency, rel=0.01)
    assert got["crnet"]["bandwidth_Bps"] == pytest.approx(rate, rel=0.01)
    # A shaped link's rate is the shaper's: only the latency is fitted.
    shaped = runner.calibrate(None, replace(PRESETS["fast"], rate="1gbit"), ["rar"], tmp_path)
    assert shaped["crnet"]["bandwidth_Bps"] == 1.25e8
