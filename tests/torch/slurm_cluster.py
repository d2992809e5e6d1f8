"""A throwaway Slurm cluster on emulated hosts (``benchmarks.netns``), for one test.

Host i of the emulated cluster becomes Slurm node ``node<i>``: everything that runs "on"
it (its slurmd, and the submitting shell on the first host) runs in its network namespace
and in UTS and mount namespaces of its own, where the hostname is ``node<i>``, /etc/hosts
(bind-mounted from the work directory) maps every ``node<j>`` to host j's address, and
the caller's per-host bind mounts are in place. So a node's name resolves to its address
on every host, as on a real cluster, and slurmd finds its node name from the hostname.
The mounts are private to those namespaces: nothing changes on the machine itself.

One munged serves them all (a Unix socket works across network namespaces), with a key,
socket, pid, seed and log file in the work directory, not the machine's /run/munge.
slurmctld runs on node0; slurm.conf (in the work directory, found through ``SLURM_CONF``)
has no accounting, no cgroups (``proctrack/linuxproc``, ``task/none``), and every spool,
state, pid and log file in the work directory. ``stop()`` stops the daemons and munged and
deletes the work directory; whatever they started dies with the emulated cluster's
namespaces (its ``down()``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.netns import EmulatedCluster
from crnet.tools.procs import stop_processes

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "unshare",
            "mount", "hostname")
PARTITION = "crnet"

# Runs argv in fresh UTS and mount namespaces set up as host $1: its hostname, /etc/hosts,
# then pairs of (source, target) bind mounts; "--" ends them.
_ON_HOST = """set -e
hostname "$1"; mount --bind "$2" /etc/hosts; shift 2
while [ "$1" != -- ]; do mount --bind "$1" "$2"; shift 2; done
shift; exec "$@"
"""


def requirements() -> str | None:
    """None if a Slurm cluster can be run here (given an emulated cluster), else why not."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    return (f"missing {', '.join(missing)} (Debian packages: slurmd slurmctld slurm-client munge, "
            "util-linux mount hostname)" if missing else None)


class SlurmCluster:
    """Slurm on ``cluster``'s hosts: munged, slurmctld on node0, a slurmd on every host.

    ``mounts[i]`` are extra (source, target) bind mounts seen by whatever runs on host i,
    its jobs included: the same path can name a different file on every host.
    """

    def __init__(self, cluster: EmulatedCluster, workdir: Path,
                 mounts: Sequence[Sequence[tuple[str, str]]] = ()):
        self.cluster = cluster
        self.workdir = Path(workdir)
        self.nodes = [f"node{i}" for i in range(cluster.hosts)]
        self.mounts = list(mounts) or [[] for _ in self.nodes]
        self.conf = self.workdir / "slurm.conf"
        self.munge_socket = self.workdir / "munge" / "munge.socket"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self._munged: subprocess.Popen | None = None
        self._daemons: list[subprocess.Popen] = []

    # -------------------------------------------------- running things on a host

    def host_argv(self, host: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` on host ``host`` (inside ``cluster.popen``)."""
        binds = [os.fspath(p) for pair in self.mounts[host] for p in pair]
        return ["unshare", "--uts", "--mount", "sh", "-c", _ON_HOST, "on-host", self.nodes[host],
                str(self.workdir / "hosts"), *binds, "--", *map(os.fspath, argv)]

    def popen(self, host: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
              **kw) -> subprocess.Popen:
        return self.cluster.popen(host, self.host_argv(host, argv), env=self.env if env is None
                                  else dict(env, SLURM_CONF=str(self.conf)), **kw)

    def run(self, host: int, argv: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess:
        return self.cluster.run(host, self.host_argv(host, argv), env=self.env, timeout=timeout,
                                stdin=subprocess.DEVNULL, capture_output=True, text=True)

    # -------------------------------------------------- lifecycle

    def start(self, wait: float = 60) -> None:
        """Write the configuration, start munged and the daemons, wait until every node is idle."""
        self._write_files()
        logs = self.workdir / "logs"
        munge = self.workdir / "munge"
        # --force: munged wants every directory above its socket open to all (the work
        # directory is not), for clients of other users; here every client is root
        with open(logs / "munged.log", "wb") as log:   # in the foreground it logs to stderr
            self._munged = subprocess.Popen(
                ["munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                 f"--key-file={munge / 'munge.key'}", f"--pid-file={munge / 'munged.pid'}",
                 f"--seed-file={munge / 'munged.seed'}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._wait_for(lambda: self.munge_socket.exists(), wait, "munged's socket")
        self._daemons.append(self.popen(0, ["slurmctld", "-D", "-i"], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        for i in range(len(self.nodes)):
            self._daemons.append(self.popen(i, ["slurmd", "-D"], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        self._wait_for(self._all_idle, wait, "every node idle")

    def stop(self) -> None:
        """Stop the slurm daemons, then munged; delete the work directory (the munge key,
        Slurm's state and logs: a failing test's message has the logs). Idempotent."""
        stop_processes(self._daemons, grace=5.0)
        self._daemons.clear()
        if self._munged is not None:
            stop_processes([self._munged], grace=5.0)
            self._munged = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self) -> str:
        """The tail of every daemon's log, for a failed test's message."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                         for p in sorted((self.workdir / "logs").glob("*.log")))

    # -------------------------------------------------- internals

    def _all_idle(self) -> bool:
        for d in self._daemons:
            if d.poll() is not None:
                raise RuntimeError(f"{d.args[-3:]} exited with {d.returncode}:\n{self.logs()}")
        proc = self.run(0, ["sinfo", "--noheader", "--Node", "--format=%N %t"])
        states = dict(line.split() for line in proc.stdout.splitlines() if line.strip())
        return proc.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes)

    def _wait_for(self, ready, wait: float, what: str) -> None:
        deadline = time.monotonic() + wait
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm: no {what} after {wait} s\n{self.logs()}")
            time.sleep(0.2)

    def _write_files(self) -> None:
        w = self.workdir
        for d in ("munge", "logs", "state", *(f"spool/{n}" for n in self.nodes)):
            (w / d).mkdir(parents=True, exist_ok=True, mode=0o700)
        key = w / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        (w / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{a} {n}\n" for a, n in zip(self.cluster.addresses, self.nodes)))
        nodes = "".join(f"NodeName={n} NodeAddr={a} CPUs=1 State=UNKNOWN\n"
                        for n, a in zip(self.nodes, self.cluster.addresses))
        # slurmd loads a cgroup plugin even when no other plugin uses cgroups, and its
        # autodetection fails under `ip netns exec` (a fresh /sys, no cgroup filesystem):
        # named, the v1 plugin loads without looking, and nothing here asks it for more
        (w / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        self.conf.write_text(f"""\
ClusterName=crnettest
SlurmctldHost={self.nodes[0]}({self.cluster.addresses[0]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={w / 'state'}
SlurmdSpoolDir={w / 'spool'}/%n
SlurmctldPidFile={w / 'state'}/slurmctld.pid
SlurmdPidFile={w / 'spool'}/slurmd-%n.pid
SlurmctldLogFile={w / 'logs'}/slurmctld.log
SlurmdLogFile={w / 'logs'}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/linear
SlurmdParameters=config_overrides
ReturnToService=2
{nodes}PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
