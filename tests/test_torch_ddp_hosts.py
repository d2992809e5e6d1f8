"""A DDP script launched by torchrun on many hosts, each with its own crnetd: on emulated
hosts (network namespaces on a bridge, benchmarks.netns), as docs/torch.md's "many hosts"
shows it.

Three hosts; on each a crnetd (the master on the first, the others ``--role node --parent
<master>:7070``, every link authenticated with the cluster secret) and one ``torchrun
--nnodes 3 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint <first host>:29400``
whose two processes find their host's daemon through CRNET_CLIENT_SOCKET. Every process
must end with the same parameters, those of single-process training on the same global
batches (float64, 1e-9). Needs root and iproute2 (skipped with the reason otherwise), and
torch. The namespaces use the prefix ``ctd`` plus a per-instance tag, and are deleted
with everything running in them, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks import netns
from crnet.launch import LocalTree
from crnet.plan import Tree

torch = pytest.importorskip("torch")

from .conftest import rel_error  # noqa: E402
from .test_torch_ddp import single_process  # noqa: E402

REASON = netns.requirements()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"emulated cluster: {REASON}"),
              pytest.mark.timeout(200)]

REPO = Path(__file__).resolve().parent.parent
PREFIX = "ctd"
TREE = Tree.regular(2, 1, 1)      # the master and 2 workers, 1 straggler tolerated
K = 2                             # processes per host (torchrun's --nproc-per-node)
SAMPLES = 24
STEPS = 8
RDZV_PORT = 29400


def test_torchrun_on_every_host_trains_like_one_process(tmp_path):
    names = list(TREE.names())
    hosts = len(names)
    world = hosts * K
    cluster = netns.EmulatedCluster(hosts, rate=None, prefix=PREFIX)
    host_of = {name: i for i, name in enumerate(names)}
    procs: list[subprocess.Popen] = []
    lt = LocalTree(TREE, SAMPLES, workdir=tmp_path / "tree", log_level="warning", strict=True,
                   local_processes=K, timeout=30,
                   addresses={n: cluster.addresses[host_of[n]] for n in names},
                   spawn=lambda name, argv, kw: cluster.popen(host_of[name], argv, **kw))
    cluster.up()
    try:
        assert "secret_file" in lt.options          # beyond loopback: the cluster secret
        lt.start(wait=60)
        env = dict(os.environ, TMPDIR=str(tmp_path), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        env.pop("CRNET_JOB", None)                   # rank 0 names the job through torch's store
        for name in names:
            host = host_of[name]
            with open(tmp_path / f"host{host}.log", "wb") as log:   # the child keeps its own copy
                procs.append(cluster.popen(host, [
                    sys.executable, "-m", "torch.distributed.run", "--nnodes", str(hosts),
                    "--nproc-per-node", str(K), "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"{cluster.addresses[0]}:{RDZV_PORT}", "--rdzv-id", "hosts",
                    # every namespace has the machine's hostname, which resolves to none of
                    # the hosts' addresses: each host says its own, and the first that it
                    # hosts the rendezvous store (real hosts find both from their names)
                    "--local-addr", cluster.addresses[host],
                    "--rdzv-conf", f"is_host={int(host == 0)}",
                    "--max-restarts", "0", str(REPO / "tests" / "ddp_script.py"),
                    "--out", str(tmp_path), "--steps", str(STEPS)],
                    env=dict(env, CRNET_CLIENT_SOCKET=lt.socket_path(name)), cwd=REPO,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            assert p.returncode == 0, "\n".join(
                f"host {h}: " + (tmp_path / f"host{h}.log").read_text(errors="replace")[-1500:]
                for h in range(hosts))
    finally:
        lt.stop()
        cluster.down()                               # stops whatever still runs inside
    assert cluster.exists() == [] and netns.cluster_namespaces(PREFIX, cluster.tag) == []
    assert lt.problems() == []

    params = [np.load(tmp_path / f"params-{rank}.npy") for rank in range(world)]
    err = rel_error(params[0], single_process(SAMPLES, STEPS))
    print(f"DDP on crnet, {hosts} emulated hosts x {K}: max rel. difference {err:.1e} "
          "vs single-process training")
    assert err <= 1e-9, err
    for rank, got in enumerate(params):
        assert np.array_equal(got, params[0]), rank      # the very same updates everywhere
    for rank in range(world):
        r = json.loads((tmp_path / f"run-{rank}.json").read_text())
        assert r["reductions"] == r["applied"] == STEPS and r["skipped"] == r["resyncs"] == 0, r
