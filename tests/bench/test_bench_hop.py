"""`python -m benchmarks.bench_hop --quick --strict`: a real one-layer tree on loopback, its
baselines, and every crnet result checked against the exact sum (the script fails otherwise),
with strict daemons (an internal error in one fails the run, naming its log)."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)


def test_bench_hop_quick_checks_every_result_with_strict_daemons():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_hop", "--quick", "--strict"],
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every crnet result was checked against the exact sum" in proc.stdout, proc.stdout
    assert "crnet, client view: n*bytes / step wall" in proc.stdout, proc.stdout
    assert "a daemon failed" not in proc.stderr, proc.stderr
