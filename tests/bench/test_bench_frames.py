"""`python -m benchmarks.bench_frames`: it runs, every frame is delivered by both readers,
and it prints one cost per step of the hot path."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_bench_frames_prints_every_step_of_the_hot_path():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_frames", "--frames", "2000",
                           "--repeat", "1"], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    costs = {line[:18].strip(): float(line[18:]) for line in proc.stdout.splitlines()[2:]}
    assert set(costs) == {"encode", "read (reference)", "read (compiled)", "parse",
                          "add_into (50 kB)"}, proc.stdout
    assert all(us > 0 for us in costs.values()), costs
