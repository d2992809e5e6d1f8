"""Start a whole tree of real ``crnetd`` processes on one machine.

Used by ``crnet demo``, the end-to-end tests and the benchmarks; on real hosts
each daemon is started by its own systemd unit instead. By default every daemon
listens on 127.0.0.1; the benchmark passes ``addresses`` and ``spawn`` to put
each daemon in its own network namespace (``benchmarks.netns``). Every node is started
with ``--name`` equal to its place in the tree, so tests can kill "child 1 of
node 0" by name, and each one's log goes to ``<workdir>/logs/<name>.log``.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .auth import is_loopback
from .defaults import CHUNK_BYTES, KEEP_RESULTS, SHUTDOWN_GRACE, TIMEOUT
from .errors import CrnetTimeout, LaunchError
from .plan import Tree
from .procs import stop_processes
from .tls import TlsFiles

MASTER = ""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a daemon about to start. Taken below the kernel's
    ephemeral range where there is room: a port from that range (what bind to port 0
    gives) can become another socket's source port before the daemon binds it, and the
    daemon then fails with "address already in use"."""
    low = _ephemeral_low()
    for port in random.sample(range(max(1024, low - 16384), low), min(64, max(0, low - 1024))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out as a source port (Linux; else a common value)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


SpawnFn = Callable[[str, list, dict], subprocess.Popen]

# ``python -m crnet`` puts the current directory first on the child's sys.path: a folder
# named crnet there (the clone itself, run from the directory that holds it) would be
# imported instead of the package (a namespace package: "cannot import name
# '__version__'"). The daemons drop that entry and import crnet from where this process
# did (python -P does the first half, from 3.11 on only).
_BOOTSTRAP = ("import sys; sys.path[:] = [p for p in sys.path if p]; r = {root!r}; "
              "r in sys.path or sys.path.insert(0, r); "
              "from crnet.cli import main; main(prog_name='crnet')")


def crnet_argv(*args: str) -> list[str]:
    """``python -m crnet ARGS`` that the current directory cannot shadow."""
    root = str(Path(__file__).resolve().parent.parent)
    return [sys.executable, "-c", _BOOTSTRAP.format(root=root), *args]


def _popen(name: str, argv: list, kwargs: dict) -> subprocess.Popen:
    return subprocess.Popen(argv, **kwargs)


class LocalTree:
    """A tree of crnetd processes on this machine (127.0.0.1 unless ``addresses``)."""

    def __init__(self, tree: Tree, samples: int, workdir: str | os.PathLike | None = None,
                 timeout: float = TIMEOUT, chunk_bytes: int = CHUNK_BYTES, code_kind: str = "auto",
                 log_level: str = "info", keep_results: int = KEEP_RESULTS, scheme: str = "cr",
                 addresses: dict[str, str] | None = None, spawn: SpawnFn = _popen,
                 port: int = 7070, strict: bool = False, send_queue_bytes: int | None = None,
                 window: int | None = None, result_memory: int | None = None,
                 local_processes: int = 1, secret: bool | None = None,
                 tls: TlsFiles | None = None):
        """``secret``: authenticate every tree link with a cluster secret written into
        ``workdir`` (default: when the daemons listen beyond loopback, which crnetd
        refuses to do without one). ``tls``: mutual TLS on every tree link."""
        self.tree = tree
        self.scheme = scheme
        self.samples = samples
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="crnet-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        # One address per node: its own namespace's (then every node can use one
        # fixed port), or 127.0.0.1 for all (then each listener needs its own port).
        self.addresses = addresses or {name: "127.0.0.1" for name in tree.names()}
        self.spawn = spawn
        self.options: dict[str, object] = {"--timeout": timeout, "--log-level": log_level,
                                           "--keep-results": keep_results}
        if send_queue_bytes is not None:
            self.options["--max-send-queue"] = send_queue_bytes
        if window is not None:
            self.options["--step-window"] = window
        if result_memory is not None:
            self.options["--result-memory"] = result_memory
        if local_processes != 1:
            self.options["--local-processes"] = local_processes
        if secret is None:
            secret = not all(is_loopback(a) for a in self.addresses.values())
        if secret:
            self.options["--secret-file"] = self._write_secret()
        if tls is not None:
            self.options.update({"--tls-cert": tls.cert, "--tls-key": tls.key, "--tls-ca": tls.ca})
        self.strict = strict
        self.master_options: dict[str, object] = {
            "--chunk-bytes": chunk_bytes or "auto", "--code": code_kind, "--scheme": scheme}
        # Parents listen for children; in a ring every worker listens for its predecessor.
        self.ports = {name: port if addresses else free_port() for name in tree.names()
                      if tree.children(name) or scheme == "rar"}
        self.procs: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()   # daemons stopped on purpose (signal()): any exit code
        # Every daemon's standard input is the read end of this pipe, and only this process
        # holds the write end: if it dies, even by SIGKILL, the daemons see end of file and
        # stop (--exit-with-stdin) rather than run on as orphans holding their ports.
        self._lifeline: tuple[int, int] | None = None

    def _write_secret(self) -> Path:
        path = self.workdir / "secret"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        return path

    @staticmethod
    def filename(name: str) -> str:
        return name or "master"

    def socket_path(self, name: str) -> str:
        return str(self.workdir / f"{self.filename(name)}.sock")

    def log_path(self, name: str) -> Path:
        return self.workdir / "logs" / f"{self.filename(name)}.log"

    def command(self, name: str) -> list[str]:
        cmd = crnet_argv("daemon", "--client-socket", self.socket_path(name))
        if name == MASTER:
            t = self.tree
            cmd += ["--role", "master", "--samples", str(self.samples), "--layers", str(t.layers),
                    "--fanout", ",".join(map(str, t.fanout)),
                    "--stragglers", ",".join(map(str, t.stragglers))]
            for k, v in self.master_options.items():
                cmd += [k, str(v)]
        else:
            parent = self.tree.parent(name)
            assert parent is not None
            cmd += ["--role", "node", "--name", name,
                    "--parent", f"{self.addresses[parent]}:{self.ports[parent]}"]
        if name in self.ports:
            cmd += ["--listen", f"{self.addresses[name]}:{self.ports[name]}"]
        for k, v in self.options.items():
            cmd += [k, str(v)]
        if self.strict:
            cmd.append("--strict")
        cmd.append("--exit-with-stdin")
        return cmd

    def start_node(self, name: str) -> subprocess.Popen:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path(name))  # left behind by a killed daemon
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self._lifeline is None:
            self._lifeline = os.pipe()   # neither end inherited by anything else it starts
        with open(self.log_path(name), "ab") as log:  # the child keeps its own descriptor
            proc = self.spawn(name, self.command(name), dict(
                stdout=log, stderr=subprocess.STDOUT, stdin=self._lifeline[0], env=env,
                start_new_session=True))
        self.procs[name] = proc
        self.killed.discard(name)
        return proc

    def start(self, wait: float = 30.0, checkpoint: Callable[[], None] = lambda: None) -> LocalTree:
        """Start every daemon, parents first; wait until every client socket is up.

        ``checkpoint`` is called before each daemon starts and while waiting: what it raises
        abandons the start and stops what has started. (A signal handler that raised instead
        could land between a fork and ``procs`` learning of the child, which would outlive
        ``stop()``.)
        """
        try:
            for name in self.tree.names():
                checkpoint()
                self.start_node(name)
            self.wait_sockets(list(self.tree.names()), wait, checkpoint)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_sockets(self, names, wait: float, checkpoint: Callable[[], None] = lambda: None) -> None:
        deadline = time.monotonic() + wait
        for name in names:
            while not os.path.exists(self.socket_path(name)):
                checkpoint()
                proc = self.procs[name]
                if proc.poll() is not None:
                    raise LaunchError(f"crnetd {self.filename(name)} exited with {proc.returncode}:\n"
                                       + self.log_path(name).read_text()[-2000:])
                if time.monotonic() > deadline:
                    raise CrnetTimeout(f"crnetd {self.filename(name)} did not start within {wait} s")
                time.sleep(0.02)

    def signal(self, name: str, sig: int = signal.SIGKILL) -> None:
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            self.killed.add(name)
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait()

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def stop(self, grace: float = SHUTDOWN_GRACE + 3.0) -> dict[str, int | None]:
        """Stop every daemon (SIGTERM, then SIGKILL after ``grace``: longer than a daemon's
        own bounded shutdown, so that bound is what a slow shutdown hits); returns exit
        codes."""
        codes = dict(zip(self.procs, stop_processes(self.procs.values(), grace)))
        if self._lifeline is not None:
            for fd in self._lifeline:
                os.close(fd)
            self._lifeline = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return codes

    def problems(self) -> list[str]:
        """What went wrong inside the daemons: a non-zero exit (other than the ones
        ``signal`` stopped on purpose) or a traceback in a log. Call after ``stop``."""
        found = []
        for name, proc in self.procs.items():
            label = self.filename(name)
            if proc.returncode not in (0, None) and name not in self.killed:
                found.append(f"crnetd {label} exited with {proc.returncode}")
            log = self.log_path(name)
            if log.exists() and "Traceback" in log.read_text(errors="replace"):
                found.append(f"crnetd {label} logged a traceback:\n"
                             + log.read_text(errors="replace")[-3000:])
        return found

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
