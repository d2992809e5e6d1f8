"""The command line: `crnet plan` output and errors, `crnet demo` end to end."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def crnet(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "crnet", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_plan_json_has_the_documented_shape():
    proc = crnet("plan", "--fanout", "4", "--layers", "2", "--stragglers", "1", "--samples",
                 "60000", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"workers", "optimal_load", "max_local_samples", "samples", "nodes"}
    assert doc["workers"] == 20 and doc["samples"] == 60000
    assert doc["optimal_load"] == pytest.approx(1 / (2 + 4))
    assert doc["max_local_samples"] == 10000
    assert doc["nodes"][0] == {"name": "", "layer": 0, "local": [],
                               "responsibility": [[0, 60000, 1.0]]}
    for node in doc["nodes"]:
        assert set(node) == {"name", "layer", "local", "responsibility"}
        assert all(len(r) == 3 for r in node["local"] + node["responsibility"])


def test_plan_table_and_per_layer_lists():
    proc = crnet("plan", "--fanout", "4,3", "--stragglers", "1,0", "--samples", "1000")
    assert proc.returncode == 0, proc.stderr
    assert "N = 16" in proc.stdout
    assert "layer 2: any 0 of the 3 children" in proc.stdout
    assert "0.2" in proc.stdout  # a node row


@pytest.mark.parametrize("args, message", [
    (["--fanout", "x", "--samples", "5"], "is not an integer or a comma list"),
    (["--fanout", "3", "--stragglers", "3", "--samples", "5"], "stragglers must be in 0..2"),
    (["--fanout", "3,3", "--layers", "3", "--samples", "5"], "lists 2 values but the tree has 3"),
    (["--fanout", "3"], "Missing option '--samples'"),
    (["--samples", "0"], "0 is not in the range x>=1"),
    (["--bogus"], "No such option"),
])
def test_plan_usage_errors(args, message):
    proc = crnet("plan", *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_demo_trains_exactly_with_stragglers():
    proc = crnet("demo", "--steps", "8", "--straggle-prob", "0.3", "--compute-ms", "5", "--json",
                 timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(summary) == {"steps", "mean_step_s", "max_rel_error", "stragglers_skipped"}
    assert summary["steps"] == 8
    assert summary["max_rel_error"] <= 1e-6
    assert summary["stragglers_skipped"] > 0
    assert summary["mean_step_s"] > 0
