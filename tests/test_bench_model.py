"""The benchmark's pure parts: presets resolved by the model, its predictions per scheme, the
report's tables, and ``python -m benchmarks``'s options (no emulated cluster is built)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from benchmarks import report
from benchmarks.__main__ import main
from benchmarks.presets import PRESETS
from benchmarks.runner import predict, preset_tree, resolve


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
