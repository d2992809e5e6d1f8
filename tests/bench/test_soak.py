"""benchmarks.soak: a short soak of a 13-daemon tree under kills, freezes and (as root) partitions.

Each test runs the soak as an operator would (``python -m benchmarks.soak``) and reads the
JSON it writes: every result exact, every failure explained by an injected fault, every
daemon alive at the end, every faulty subtree back within 10 s. Partitions need network
namespaces (root, iproute2); those tests are skipped with the reason otherwise, and every
namespace they create is gone afterwards, also when the soak is stopped half-way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import child_env, netns

pytestmark = pytest.mark.timeout(300)

REASON = netns.requirements()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"partitions need netns: {REASON}")
PREFIX = "crq"   # this file's namespaces: no other test, benchmark or soak uses it


def soak(tmp_path: Path, *options: str, timeout: float = 240) -> tuple[int, dict, str]:
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.soak", "--json", str(out),
                           "--workdir", str(tmp_path / "w"), "--netns-prefix", PREFIX, *options],
                          env=child_env(), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    text = proc.stdout + proc.stderr
    assert out.exists(), text
    return proc.returncode, json.loads(out.read_text()), text


def check_sound(doc: dict, text: str, steps: int) -> None:
    assert doc["wrong_results"] == [], text
    assert doc["max_relative_error"] < 1e-12, text
    assert doc["unexplained"] == [], text
    assert doc["problems"] == [] and doc["verdict"] == [], text
    assert doc["steps"] >= steps and doc["steps_completed"] >= steps * 0.9, text
    # Never more than s = 1 child of the master in a fault: the tree itself never fails.
    assert doc["steps_failed_tree_wide"] == [], text
    for fault in doc["faults"]:
        assert fault["rejoin"] is not None and fault["rejoin"] <= 10.0, (fault, text)
    for failure in doc["failures"]:
        fault = doc["faults"][failure["fault"]]
        assert failure["host"] in fault["affected"], (failure, fault)
    # Every daemon is alive at the end (its last reading is at the last steps) and not
    # bigger than after its warm-up by more than 10%.
    assert len(doc["memory"]) == 13
    for row in doc["memory"]:
        assert row["end"]["step"] >= steps - 1 and row["end"]["fds"] > 3, row
        assert (row["max_rss_growth_pct"] or 0.0) <= 10.0, row


def test_a_short_soak_on_loopback_is_exact_and_every_failure_explained(tmp_path):
    code, doc, text = soak(tmp_path, "--steps", "400", "--netns", "off", "--gap", "0.2,0.8",
                           "--seed", "3")
    assert code == 0, text
    check_sound(doc, text, 400)
    assert doc["network"] == "loopback"
    kinds = {f["kind"] for f in doc["faults"]}
    assert kinds == {"kill", "freeze-short", "freeze-long"}, text
    assert doc["stragglers_injected"] > 0
    assert "no partitions: they need network namespaces" in text
    assert doc["rejoin_s"].keys() == kinds


@needs_netns
def test_a_short_soak_with_partitions_rejoins_within_10_s(tmp_path):
    code, doc, text = soak(tmp_path, "--steps", "300", "--netns", "on", "--gap", "0.2,0.8",
                           "--faults", "partition,kill,freeze-short", "--partition", "1,4",
                           "--seed", "4")
    assert code == 0, text
    check_sound(doc, text, 300)
    partitions = [f for f in doc["faults"] if f["kind"] == "partition"]
    assert partitions, text
    assert all(1.0 <= f["held"] <= 10 for f in partitions), partitions
    assert "rejoin partition" in text
    assert netns.cluster_namespaces(PREFIX) == []


def _daemons_of(workdir: Path) -> list[int]:
    """Pids of crnetd processes whose command line names ``workdir`` (read, never killed)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b" daemon " in cmdline and b" --client-socket " + str(workdir).encode() in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize("network", ["off", pytest.param("on", marks=needs_netns)])
def test_a_soak_stopped_half_way_leaves_no_daemon_and_no_namespace(tmp_path, network):
    workdir = tmp_path / "w"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.soak", "--steps", "100000",
                             "--netns", network, "--netns-prefix", PREFIX, "--gap", "0.2,0.5",
                             "--workdir", str(workdir)],
                            env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (workdir / "logs").exists() or len(_daemons_of(workdir)) < 13:
            assert time.monotonic() < deadline, f"13 daemons not seen: {_daemons_of(workdir)}"
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        time.sleep(3)   # faults under way: a daemon frozen, a link down, one killed
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, out + err
    assert "stopped by a signal" in err
    assert _daemons_of(workdir) == []
    if network == "on":
        assert netns.cluster_namespaces(PREFIX) == []
    assert os.path.exists(workdir / "logs" / "master.log")
