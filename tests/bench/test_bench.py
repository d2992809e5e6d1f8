"""`python -m benchmarks --preset quick` end to end on an emulated cluster (root and iproute2 needed)."""

import json
import subprocess
import sys

import pytest

from benchmarks.netns import list_namespaces, requirements

problem = requirements()
pytestmark = [pytest.mark.skipif(problem is not None, reason=f"emulated cluster: {problem}"),
              pytest.mark.timeout(300)]


def test_quick_preset_runs_every_scheme_exactly(tmp_path):
    schemes = ["cr", "gc", "tree", "rar"]
    try:
        import torch.distributed  # noqa: F401
        schemes.append("gloo")
    except ImportError:
        pass
    out = tmp_path / "bench.json"
    before = set(list_namespaces())
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--preset", "quick", "--schemes", ",".join(schemes),
         "--out", str(out), "--plot", str(tmp_path / "bench.png"), "--json", "--burst", "1MB",
         "--strict"],
        capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["preset"] == "quick"
    assert set(summary["schemes"]) == set(schemes)
    for name, s in summary["schemes"].items():
        assert s["mean_s"] > 0 and s["p95_s"] >= s["mean_s"] * 0.5 and s["model_s"] > 0, name
    doc = json.loads(out.read_text())["presets"][0]
    assert doc["config"]["burst"] == "1000000"      # --burst reached the preset the cluster is built from
    for name, r in doc["schemes"].items():
        assert r["correct"], f"{name} returned a wrong sum"
        assert r["steps_completed"] == r["steps"], name
    assert set(list_namespaces()) <= before, "the emulated cluster was not deleted"
