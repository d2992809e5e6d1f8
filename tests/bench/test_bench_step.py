"""`python -m benchmarks.bench_step --strict`, two small sizes: it runs a real 13-daemon tree, every client's
result is exact (the script checks each against the sum and fails otherwise), and its CPU
table has every process's time per step."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)


def test_bench_step_quick_reports_each_processes_cpu_per_step():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_step", "--sizes", "1K", "16K",
                           "--steps", "60", "--strict"],
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["size", "L0"]
                and "clients" in line)
    rows = {line.split()[0]: [float(x) for x in line.split()[1:]] for line in lines[head + 1:head + 3]}
    assert set(rows) == {"1K", "16K"}, proc.stdout
    for size, (master, inner, leaf, clients, total, allreduce_us) in rows.items():
        assert min(master, inner, leaf, clients, allreduce_us) > 0, (size, proc.stdout)
        # every process's share (the daemons' as layer means, rounded to 0.01 ms)
        parts = master + 3 * inner + 9 * leaf + clients
        assert abs(total - parts) <= 0.01 * total + 0.15, (size, proc.stdout)
