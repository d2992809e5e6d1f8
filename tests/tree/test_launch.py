"""crnet/tools/launch.py: daemons start the same crnet as their launcher, wherever it runs, and
stop with it."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import crnet
from crnet.coding.plan import Tree
from crnet.tools.launch import MASTER, LocalTree, crnet_argv

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def shadowing_dir(tmp_path):
    """A directory holding a folder named crnet, as the one that holds the clone does: a
    process that imported it instead of the package fails loudly."""
    (tmp_path / "crnet").mkdir()
    (tmp_path / "crnet" / "__init__.py").write_text(
        'raise ImportError("the current directory\'s crnet/ was imported")\n')
    return tmp_path


def test_daemons_start_from_a_directory_holding_a_crnet_folder(shadowing_dir, monkeypatch):
    monkeypatch.chdir(shadowing_dir)
    lt = LocalTree(Tree((2,), (1,)), 60, workdir=shadowing_dir / "tree", strict=True)
    try:
        lt.start(wait=30)          # LaunchError with the daemon's log if one failed to import
        assert all(lt.alive(name) for name in lt.procs)
    finally:
        lt.stop()
    assert not lt.problems()


def test_daemons_import_crnet_from_where_the_launcher_did(tmp_path):
    """``crnet_argv``'s processes import the crnet the launching process imported, whatever
    else the path offers first (here a stand-in package on PYTHONPATH): a benchmark run
    from another checkout measures that checkout's daemons, not the installed ones. (The
    path it put first was the package's own folder, so any crnet found first won.)"""
    import crnet
    decoy = tmp_path / "decoy" / "crnet"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("")
    argv = crnet_argv()
    argv[2] = argv[2].replace("from crnet.cli import main; main(prog_name='crnet')",
                              "import crnet; print(crnet.__file__)")
    assert "print(crnet.__file__)" in argv[2]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(decoy.parent)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == crnet.__file__


def test_demo_from_a_directory_holding_a_crnet_folder(shadowing_dir):
    """``crnet demo`` from the directory that holds the clone: the daemons and the training
    processes it starts, and --json's summary whole."""
    proc = subprocess.run(crnet_argv("demo", "--steps", "3", "--fanout", "2", "--layers", "1",
                                     "--compute-ms", "1", "--samples", "200", "--json"),
                          cwd=shadowing_dir, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "was imported" not in proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["max_rel_error"] <= 1e-6
    assert summary["final_loss"] > 0
    assert isinstance(summary["stragglers_injected"], int)


def test_a_stopping_tree_logs_no_join_progress(tmp_path):
    """At shutdown the master closes its children's links itself (or they stop first):
    neither "n/3 workers joined" nor "child k disconnected" once its shutdown began."""
    lt = LocalTree(Tree((3,), (1,)), 60, workdir=tmp_path, strict=True)
    try:
        lt.start(wait=30)
        master_log = lt.log_path(MASTER)
        deadline = time.monotonic() + 20
        while "all workers joined" not in master_log.read_text():
            assert time.monotonic() < deadline, master_log.read_text()
            time.sleep(0.05)
        lt.signal(MASTER, signal.SIGTERM)
        assert lt.procs[MASTER].wait(10) == 0
    finally:
        lt.stop()
    assert not lt.problems()
    after = master_log.read_text().split("all workers joined")[1]
    assert "master stopped" in after
    assert "workers joined" not in after and "disconnected" not in after, after


class _Stop(Exception):
    pass


@pytest.mark.parametrize("at", [2, 5], ids=["between-spawns", "while-waiting"])
def test_a_start_abandoned_at_a_checkpoint_leaves_no_daemon(tmp_path, at):
    """What the checkpoint raises comes out of start() (crnet run's signal while starting),
    and every daemon started by then is stopped: none is left out of ``procs``."""
    calls = 0

    def checkpoint():
        nonlocal calls
        calls += 1
        if calls == at:
            raise _Stop

    lt = LocalTree(Tree((3,), (1,)), 60, workdir=tmp_path, strict=True)
    try:
        with pytest.raises(_Stop):
            lt.start(wait=30, checkpoint=checkpoint)
        # 4 daemons: calls 1-4 precede each spawn, later ones come while waiting.
        assert len(lt.procs) == min(at - 1, 4)
        assert all(proc.poll() is not None for proc in lt.procs.values())
    finally:
        lt.stop()


def test_free_ports_come_from_below_the_ephemeral_range():
    """A daemon's port is not one the kernel may give a connection as its source port
    in the meantime (that made a daemon fail with "address already in use")."""
    from crnet.tools.launch import _ephemeral_low, free_port
    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))   # it is free


def test_a_tree_never_gets_one_port_twice():
    """Ports are taken for every daemon before any binds: two picks of one free port
    made the second daemon fail with "address already in use" (CI, test_spread)."""
    from crnet.tools.launch import free_port
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)


LAUNCHER = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
from crnet.tools.launch import LocalTree
from crnet.coding.plan import Tree
lt = LocalTree(Tree((2,), (1,)), 60, workdir=sys.argv[1], strict=True).start(wait=30)
print(json.dumps([p.pid for p in lt.procs.values()]), flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_daemons_stop_when_their_launcher_is_killed(tmp_path):
    """A launcher killed outright (SIGKILL: no cleanup runs) takes its daemons with it:
    they see their standard input close (--exit-with-stdin) and stop in order, instead of
    running on as orphans that hold their ports and sockets."""
    root = str(Path(crnet.__file__).resolve().parent.parent)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path), root],
                                stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        pids = json.loads(launcher.stdout.readline())
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        launcher.kill()
        launcher.wait(10)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids):
            assert time.monotonic() < deadline, "daemons outlived their launcher"
            time.sleep(0.1)
        for log in (tmp_path / "logs").glob("*.log"):
            assert "standard input closed" in log.read_text(), log.read_text()[-2000:]
    finally:
        launcher.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


MASTER_ARGS = ["--role", "master", "--listen", "127.0.0.1:0", "--samples", "4", "--fanout", "2",
               "--layers", "1", "--stragglers", "0", "--insecure"]


def test_exit_with_stdin_needs_a_pipe(tmp_path):
    argv = crnet_argv("daemon", *MASTER_ARGS, "--client-socket", str(tmp_path / "s.sock"),
                      "--exit-with-stdin", "--check-config")
    refused = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert refused.returncode == 2 and "not a pipe" in refused.stderr, refused.stderr
    taken = subprocess.run(argv, input="", capture_output=True, text=True)
    assert taken.returncode == 0, taken.stderr
