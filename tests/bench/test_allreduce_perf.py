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

from benchmarks import child_env, netns

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
    schemes = ("cr", "rar", "spread", "spread-direct") + (
        ("gloo",) if importlib.util.find_spec("torch") else ())
    assert sorted({(r["scheme"], r["bytes"]) for r in rows}) == sorted(
        (s, b) for s in schemes for b in (64 << 10, 1 << 20))
    for r in rows:
        assert r["failed"] == 0 and r["wrong"] == 0 and r["time"] > 0, r
        assert r["busbw"] == pytest.approx(r["algbw"] * 2 * 3 / 4)
        # Every row's processes' CPU per step, Gloo's peers too: the per-byte comparison.
        assert r["client_cpu"] is not None and r["client_cpu"] > 0, r
    table = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] in (["64K"], ["1M"])]
    assert len(table) == 2 * len(schemes) and all(row[5:7] == ["0", "yes"] for row in table), \
        proc.stdout
    assert all(float(row[9]) > 0 for row in table), proc.stdout   # CPU ns/B, Gloo's included


@pytest.mark.parametrize("argv, said", [
    (["--schemes", "ring"], "--schemes: from rar, spread, spread-direct, cr, gloo"),
    (["--rate", "fast"], "--rate: "),
])
def test_a_bad_option_is_a_usage_error(argv, said):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.allreduce_perf", *argv],
                          env=child_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(netns.requirements() is not None,
                    reason=f"emulated hosts need netns: {netns.requirements()}")
def test_on_unshaped_veth_links_every_result_is_exact_and_no_namespace_is_left(tmp_path):
    out = tmp_path / "perf.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.allreduce_perf", "--mtu", "9000",
                           "--schemes", "rar,spread", "--sizes", "1M", "--rounds", "1",
                           "--steps", "3", "--json", str(out)],
                          env=child_env(), capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unshaped veth, MTU 9000" in proc.stdout
    rows = json.loads(out.read_text())
    assert sorted(r["scheme"] for r in rows) == ["rar", "spread"]
    assert all(r["failed"] == 0 and r["wrong"] == 0 for r in rows), rows
    assert netns.cluster_namespaces("crp") == []


@pytest.mark.skipif(netns.requirements() is not None,
                    reason=f"emulated hosts need netns: {netns.requirements()}")
def test_on_shaped_links_every_result_is_exact_and_the_plot_is_drawn(tmp_path):
    plot = tmp_path / "busbw.png"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.allreduce_perf", "--rate", "1gbit",
                           "--hosts", "3", "--schemes", "rar,spread", "--sizes", "64K", "1M",
                           "--rounds", "1", "--steps", "3", "--plot", str(plot)],
                          env=child_env(), capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1gbit veth, MTU 1500" in proc.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert netns.cluster_namespaces("crp") == []
