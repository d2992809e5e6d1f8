"""``python -m benchmarks``'s cr-approx row on real daemons (loopback, no network namespaces):
``runner.run_crnet`` starts the tree with ``--beyond-s approximate`` and the preset's
``--patience``, the emulated workers' correlated stragglers (``grouped``) leave the master
short of n - s children in the steps the law says, and every process checks its
approximate result against the coverage ``Client.last_result_info`` gives."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from benchmarks.presets import Preset
from benchmarks.runner import run_crnet
from crnet.coding.plan import Tree
from crnet.tune.workload import ComputeModel

pytestmark = pytest.mark.timeout(120)

SEED = 5
COMPUTE = "grouped:1e-4,0.5,100,2"   # 200 samples a worker: 20 ms, a slow pair 2 s


class Loopback:
    """What run_crnet needs of an emulated cluster: an address per host (each its own
    127.0.x.y, so every daemon can listen on the same port) and a way to start processes."""

    def __init__(self, hosts: int):
        self.addresses = [f"127.0.213.{i + 1}" for i in range(hosts)]

    def popen(self, host: int, argv, **kw) -> subprocess.Popen:
        return subprocess.Popen(argv, **kw)


def test_cr_approx_row_counts_the_approximate_steps_and_their_coverage(tmp_path):
    # The master has 4 children, s = 1 (FRC: pairs {0, 1} and {2, 3} hold the same parts);
    # a slow pair is a whole FRC group: its parts are lost, coverage exactly 0.5.
    tree = Tree((4,), (1,))
    preset = Preset("t", workers=4, cr_tree=tree, gc_stragglers=1, samples=400, elements=64,
                    rate=None, compute=COMPUTE, steps=8, deadline=60.0, timeout=10.0,
                    patience=0.25)
    law = ComputeModel.parse(COMPUTE)
    slow = np.array([[law.compute_time(200, SEED, t, 2 * g) > 0.1 for g in range(2)]
                     for t in range(preset.steps)])
    one_pair = {t for t in range(preset.steps) if slow[t].sum() == 1}
    assert one_pair and not slow.all(axis=1).any(), "pick a seed with such steps"
    r = run_crnet(Loopback(5), preset, "cr-approx", tmp_path, seed=SEED, strict=True)
    assert r["scheme"] == "cr-approx" and r["correct"] and not r["errors"]
    assert r["steps_completed"] == preset.steps
    # Every process was there before step 0 (a start barrier): the steps the law slows a
    # pair in, and only those, are approximate.
    observer = json.loads((tmp_path / "w0.json").read_text())
    approx = {t: c for t, c, _ in observer["approximate"]}
    assert set(approx) == one_pair
    assert all(c == pytest.approx(0.5, abs=1e-12) for c in approx.values())
    assert r["approximate_steps"] == len(one_pair) and r["mean_coverage"] == pytest.approx(0.5)
    # Steps with a slow pair took the patience (0.25 s), not the slow pair's 2 s.
    assert max(r["step_times"]) < 1.5
