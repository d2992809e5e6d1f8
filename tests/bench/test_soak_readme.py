"""benchmarks.soak_readme: a short README-loop soak, run as an operator would.

Real training processes (``benchmarks.readme_trainer``: the README's ``train`` as printed) on a
7-daemon tree, one fault every few seconds of every kind the soak draws from. The JSON it
writes must show the promise of docs/faults.md: every replica equal to single-process
training, no call past the bound, the job never ended early, and it went on within 10 s of
every fault. Link cuts need network namespaces (root, iproute2): without them the soak says
so and draws from the other kinds; every namespace it made is gone afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import child_env, netns

pytestmark = pytest.mark.timeout(400)

PREFIX = "crk"   # this file's namespaces: no other test, benchmark or soak uses it


def soak_readme(tmp_path: Path, *options: str) -> tuple[int, dict, str]:
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.soak_readme", "--json", str(out),
                           "--workdir", str(tmp_path / "w"), "--netns-prefix", PREFIX,
                           "--fanout", "2", "--layers", "2", *options],
                          env=child_env(), capture_output=True, text=True, timeout=360,
                          stdin=subprocess.DEVNULL)
    text = proc.stdout + proc.stderr
    assert out.exists(), text
    return proc.returncode, json.loads(out.read_text()), text


@pytest.mark.parametrize("scheme", ["cr", "spread"])
def test_a_short_readme_loop_soak_keeps_the_promise(tmp_path, scheme):
    code, doc, text = soak_readme(tmp_path, "--scheme", scheme, "--steps", "500",
                                  "--every", "4", "--seed", "2")
    assert code == 0 and doc["verdict"] == [], text
    assert doc["differ"] == [] and doc["missing"] == [], text
    assert doc["waits_past_bound"] == [], text
    assert len(doc["applied"]) == 1 and doc["applied"][0] >= 400, text
    assert len(doc["faults"]) >= 3, text
    for fault in doc["faults"]:
        assert fault["recovery"] is not None and fault["recovery"] <= 10.0, (fault, text)
    # Every host's final parameters came from a process of the job (its last life).
    assert sorted(doc["lives"]) == sorted(["master", "0", "1", "0.0", "0.1", "1.0", "1.1"]), text
    if netns.requirements() is not None:
        assert "no link cuts: they need network namespaces" in text
    assert netns.cluster_namespaces(PREFIX) == [], "namespaces left behind"
