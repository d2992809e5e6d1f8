"""``python -m benchmarks.bench_tune`` on real daemons (loopback, no network namespaces): a
poor start runs, ``crnet tune`` (the CLI) answers from the live daemons, its pick runs, and
every row is checked exact; the start's spelling errors are usage errors."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from benchmarks.bench_tune import auto_summary, parse_config, run_on, summary
from benchmarks.presets import Preset
from crnet.coding.plan import Tree

from .test_bench_correlated import Loopback

pytestmark = pytest.mark.timeout(180)


def test_a_poor_start_is_tuned_and_every_row_is_exact(tmp_path):
    preset = Preset("t", workers=4, cr_tree=Tree((4,), (1,)), gc_stragglers=1, samples=400,
                    elements=64, rate=None, compute="straggle:1e-4,0.3,20", steps=6,
                    deadline=60.0, timeout=10.0)
    lines: list[str] = []
    doc = run_on(Loopback(5), preset, "rar", 6, ["cr", "rar"], tmp_path, 0, True, lines.append,
                 plan_auto=True)
    tune = doc["tune"]
    # tune measured the start (the ring: its running configuration) over the steps it saw.
    assert tune["running"]["scheme"] == "rar" and tune["measured"]["steps"] >= 3
    assert tune["ranking"] and tune["running"]["rank"] >= 1
    rows = doc["rows"]
    assert set(rows) == {"start", "tuned", "cr", "rar", "auto"}
    assert rows["tuned"]["config"].split()[0] == tune["ranking"][0]["scheme"]
    for name, r in rows.items():
        assert r["correct"] and not r["errors"], name
        assert r["steps_completed"] == r["steps"], name
    assert rows["start"]["steps"] == 6
    (line,) = summary(doc)
    assert line.startswith("t ") and line.rstrip().endswith("yes")
    # --plan auto: on the same daemons, job 2 runs what the master chose from job 1 (a ring
    # waits for 20 x stragglers in 3 steps of 10: anything else is far faster), exact.
    auto = rows["auto"]
    assert auto["exact_both"] and auto["config"] != "rar"
    assert auto_summary(doc).rstrip().endswith("yes")


@pytest.mark.parametrize("text", ["ring", "cr:x", "cr:2,2:1,a"])
def test_a_bad_start_is_a_usage_error(text):
    with pytest.raises(click.BadParameter):
        parse_config(text)


def test_the_configs_parse():
    assert parse_config("rar") == ("rar", None, None)
    assert parse_config("gc:3") == ("gc", None, 3)
    assert parse_config("cr:4,4:1,1") == ("cr", Tree((4, 4), (1, 1)), None)
    assert parse_config("tree:5,4") == ("tree", Tree((5, 4), (0, 0)), None)


def test_the_cli_names_a_bad_start_without_a_traceback():
    p = subprocess.run([sys.executable, "-m", "benchmarks.bench_tune", "--start", "nope=rar"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "PRESET=CONFIG" in p.stderr and "Traceback" not in p.stderr
