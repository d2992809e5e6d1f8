"""benchmarks.allreduce_perf, run as a user would: every scheme's back-to-back allreduce on a
4-host tree of real daemons, one training process per host, and PyTorch's Gloo between 4
processes where torch is installed; every result exact, no step failed, and the table and
the JSON say so."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from benchmarks import child_env

pytestmark = pytest.mark.timeout(300)


def test_every_scheme_is_exact_and_the_table_says_so(tmp_path):
    out = tmp_path / "perf.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.allreduce_perf", "--sizes", "64K",
                           "1M", "--rounds", "1", "--steps", "4", "--json", str(out)],
                          env=child_env(), capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    rows = json.loads(out.read_text())
    schemes = ("cr", "rar", "spread") + (("gloo",) if importlib.util.find_spec("torch") else ())
    assert sorted({(r["scheme"], r["bytes"]) for r in rows}) == sorted(
        (s, b) for s in schemes for b in (64 << 10, 1 << 20))
    for r in rows:
        assert r["failed"] == 0 and r["wrong"] == 0 and r["time"] > 0, r
        assert r["busbw"] == pytest.approx(r["algbw"] * 2 * 3 / 4)
    table = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["64K"], ["1M"])]
    assert len(table) == 2 * len(schemes) and all(row[5:7] == ["0", "yes"] for row in table), \
        proc.stdout


def test_a_bad_option_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.allreduce_perf", "--schemes", "ring"],
                          env=child_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--schemes: from rar, spread, cr, gloo" in proc.stderr
