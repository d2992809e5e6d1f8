"""docs/torch.md's Slurm command, run as written on a throwaway Slurm cluster of emulated hosts.

The hosts of tests/torch/ddp_hosts.py (three network namespaces, a crnetd on each) become Slurm
nodes node0..node2 (tests/torch/slurm_cluster.py: munged, slurmctld on node0, a slurmd on every
node, each host with its own hostname and an /etc/hosts naming all three). A batch job
of three nodes (``sbatch --nodes 3``, submitted on node0) runs the ``srun ... torchrun ...``
line of docs/torch.md, taken from the file with H = 3, K = 2 and train.py replaced by
tests/torch/ddp_script.py: one torchrun per node, whose rendezvous endpoint is the job's first
node by name. Every one of the 6 processes must end with the same parameters, those of
single-process training (float64, 1e-9). Each host's crnetd seats K processes, and the
tree sums only with all of them, so the job trains only with one torchrun on every node.

The only differences from a real cluster: every path the job uses is the same on every
node (one machine), so each host's crnetd socket is reached through the same path,
``CRNET_CLIENT_SOCKET`` (bind-mounted per host to a link to that host's socket), which
srun passes on from the submitting environment; and ``torchrun`` is this interpreter's.

Needs root, iproute2, Slurm and munge (slurm-wlm, munge), and torch; skipped with the
reason otherwise. Slurm's daemons, munged, the crnetds and the namespaces are stopped
and deleted also on failure.
"""

from __future__ import annotations

import re
import stat
import subprocess
import sys
import time

import pytest

from benchmarks import netns

from . import slurm_cluster

torch = pytest.importorskip("torch")

from ..helpers import REPO  # noqa: E402
from .ddp_hosts import (  # noqa: E402
    HOSTS,
    STEPS,
    TREE,
    K,
    check_training,
    daemons_on_hosts,
    training_env,
)
from .test_torch_ddp import SCRIPT  # noqa: E402

REASON = netns.requirements() or slurm_cluster.requirements()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"Slurm on emulated hosts: {REASON}"),
              pytest.mark.timeout(300)]

PREFIX = "csl"
DOCS = REPO / "docs" / "torch.md"


def docs_command(script_args: str) -> str:
    """The ``srun`` command of docs/torch.md, for H hosts of K processes running tests/torch/ddp_script.py."""
    blocks = re.findall(r"```sh\n(.*?)```", DOCS.read_text(), re.S)
    [command] = [b for b in blocks if b.startswith("srun ")]
    command = re.sub(r"(--n?nodes) H\b", rf"\1 {HOSTS}", command)
    command = re.sub(r"(--nproc-per-node) K\b", rf"\1 {K}", command)
    assert re.search(r"\b[HK]\b", command) is None and command.count(" train.py") == 1, command
    return command.replace(" train.py", f" {SCRIPT} {script_args}")


def test_the_docs_srun_command_trains_like_one_process(tmp_path):
    out = tmp_path / "out"
    bin_dir, sock_dir = tmp_path / "bin", tmp_path / "crnet"
    for d in (out, bin_dir, sock_dir):
        d.mkdir()
    torchrun = bin_dir / "torchrun"     # what torch's console script does, with this interpreter
    torchrun.write_text(f'#!/bin/sh\nexec {sys.executable} -m torch.distributed.run "$@"\n')
    torchrun.chmod(torchrun.stat().st_mode | stat.S_IXUSR)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nset -e\n" + docs_command(f"--out {out} --steps {STEPS}"))
    with daemons_on_hosts(tmp_path, PREFIX) as (cluster, lt):
        mounts = []
        for host, name in enumerate(TREE.names()):   # host i's sock_dir: a link to its crnetd
            (tmp_path / f"host{host}").mkdir()
            (tmp_path / f"host{host}" / "client.sock").symlink_to(lt.socket_path(name))
            mounts.append([(tmp_path / f"host{host}", sock_dir)])
        slurm = slurm_cluster.SlurmCluster(cluster, tmp_path / "slurm", mounts)
        try:
            slurm.start(wait=60)
            env = dict(training_env(tmp_path), CRNET_CLIENT_SOCKET=str(sock_dir / "client.sock"),
                       PATH=f"{bin_dir}:{slurm.env['PATH']}")
            started = time.monotonic()
            job = slurm.popen(0, ["sbatch", "--wait", "--nodes", str(HOSTS), "--time", "5",
                                  "--output", str(tmp_path / "job.out"), "--chdir", str(REPO),
                                  str(script)], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                said, _ = job.communicate(timeout=200)
            except subprocess.TimeoutExpired:
                job.kill()
                said, _ = job.communicate()
            took = time.monotonic() - started
            job_out = (tmp_path / "job.out").read_text(errors="replace") if (
                tmp_path / "job.out").exists() else "(no job output)"
            assert job.returncode == 0, f"sbatch: {said}\njob output:\n{job_out[-3000:]}\n{slurm.logs()}"
            assert re.fullmatch(r"Submitted batch job \d+\n", said), said
        finally:
            slurm.stop()
    err = check_training(out)
    print(f"DDP on crnet under Slurm, {HOSTS} emulated nodes x {K}: the job took {took:.0f} s, "
          f"max rel. difference {err:.1e} vs single-process training")
