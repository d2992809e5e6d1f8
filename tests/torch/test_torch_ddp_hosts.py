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
import subprocess
import sys
import time

import pytest

from benchmarks import netns

torch = pytest.importorskip("torch")

from ..helpers import REPO  # noqa: E402
from .ddp_hosts import (  # noqa: E402
    HOSTS,
    RDZV_PORT,
    STEPS,
    TREE,
    K,
    check_training,
    daemons_on_hosts,
    training_env,
)
from .test_torch_ddp import SCRIPT  # noqa: E402

REASON = netns.requirements()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"emulated cluster: {REASON}"),
              pytest.mark.timeout(200)]

PREFIX = "ctd"


def test_torchrun_on_every_host_trains_like_one_process(tmp_path):
    procs: list[subprocess.Popen] = []
    with daemons_on_hosts(tmp_path, PREFIX) as (cluster, lt):
        env = training_env(tmp_path)
        for host, name in enumerate(TREE.names()):
            with open(tmp_path / f"host{host}.log", "wb") as log:   # the child keeps its own copy
                procs.append(cluster.popen(host, [
                    sys.executable, "-m", "torch.distributed.run", "--nnodes", str(HOSTS),
                    "--nproc-per-node", str(K), "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"{cluster.addresses[0]}:{RDZV_PORT}", "--rdzv-id", "hosts",
                    # every namespace has the machine's hostname, which resolves to none of
                    # the hosts' addresses: each host says its own, and the first that it
                    # hosts the rendezvous store (real hosts find both from their names)
                    "--local-addr", cluster.addresses[host],
                    "--rdzv-conf", f"is_host={int(host == 0)}",
                    "--max-restarts", "0", str(SCRIPT), "--out", str(tmp_path), "--steps", str(STEPS)],
                    env=dict(env, CRNET_CLIENT_SOCKET=lt.socket_path(name)), cwd=REPO,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            assert p.returncode == 0, "\n".join(
                f"host {h}: " + (tmp_path / f"host{h}.log").read_text(errors="replace")[-1500:]
                for h in range(HOSTS))
    err = check_training(tmp_path)
    print(f"DDP on crnet, {HOSTS} emulated hosts x {K}: max rel. difference {err:.1e} "
          "vs single-process training")
