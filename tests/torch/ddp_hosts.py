"""What the DDP tests on emulated hosts share: a crnetd on every host, the training
processes' environment, and the check of what tests/torch/ddp_script.py wrote.

Three hosts (network namespaces on a bridge, ``benchmarks.netns``); on each a crnetd (the
master on the first, the others ``--role node --parent <master>:7070``, every link
authenticated with the cluster secret) expecting K = 2 local processes. Import torch
(``pytest.importorskip``) before this module: the check trains the reference model.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from benchmarks import netns
from crnet.coding.plan import Tree
from crnet.tools.launch import LocalTree

from ..helpers import REPO
from ..helpers.vectors import rel_error
from .test_torch_ddp import single_process

TREE = Tree.regular(2, 1, 1)      # the master and 2 workers, 1 straggler tolerated
HOSTS = len(list(TREE.names()))
K = 2                             # processes per host (torchrun's --nproc-per-node)
WORLD = HOSTS * K
SAMPLES = 24
STEPS = 8
RDZV_PORT = 29400


@contextlib.contextmanager
def daemons_on_hosts(tmp_path: Path, prefix: str) -> Iterator[tuple[netns.EmulatedCluster, LocalTree]]:
    """Emulated hosts, host i running the crnetd of the tree's i-th node (``TREE.names()``).

    Afterwards the daemons are stopped and the namespaces deleted with everything still
    running in them, also on failure; then (if the body succeeded) it checks that no
    namespace is left and no daemon logged a problem.
    """
    names = list(TREE.names())
    cluster = netns.EmulatedCluster(HOSTS, rate=None, prefix=prefix)
    lt = LocalTree(TREE, SAMPLES, workdir=tmp_path / "tree", log_level="warning", strict=True,
                   local_processes=K, timeout=30,
                   addresses={n: cluster.addresses[i] for i, n in enumerate(names)},
                   spawn=lambda name, argv, kw: cluster.popen(names.index(name), argv, **kw))
    cluster.up()
    try:
        assert "secret_file" in lt.options          # beyond loopback: the cluster secret
        lt.start(wait=60)
        yield cluster, lt
    finally:
        lt.stop()
        cluster.down()                               # stops whatever still runs inside
    assert cluster.exists() == [] and netns.cluster_namespaces(prefix, cluster.tag) == []
    assert lt.problems() == []


def training_env(tmp_path: Path) -> dict[str, str]:
    """The environment of the training processes: this checkout's crnet, one thread each."""
    env = dict(os.environ, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("CRNET_JOB", None)                       # rank 0 names the job through torch's store
    return env


def check_training(out: Path) -> float:
    """Every process's parameters (``out/params-<rank>.npy``) are the very same and those of
    single-process training (float64, 1e-9), after one crnet step per training step and
    none skipped; returns the largest relative difference from single-process training."""
    params = [np.load(out / f"params-{rank}.npy") for rank in range(WORLD)]
    err = rel_error(params[0], single_process(SAMPLES, STEPS))
    assert err <= 1e-9, err
    for rank, got in enumerate(params):
        assert np.array_equal(got, params[0]), rank      # the very same updates everywhere
    for rank in range(WORLD):
        r = json.loads((out / f"run-{rank}.json").read_text())
        assert r["reductions"] == r["applied"] == STEPS and r["skipped"] == r["resyncs"] == 0, r
    return err
