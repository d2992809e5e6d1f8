"""Start a whole tree of real ``crnetd`` processes on one machine.

Used by ``crnet demo``, the end-to-end tests and the benchmarks; on real hosts
each daemon is started by its own systemd unit instead. By default every daemon
listens on 127.0.0.1; the benchmark passes ``addresses`` and ``spawn`` to put
each daemon in its own network namespace (``benchmarks.netns``). Every node is started
with ``--name`` equal to its place in the tree, so tests can kill "child 1 of
node 0" by name, and each one's log goes to ``<workdir>/logs/<name>.log``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..coding.plan import PEER_SCHEMES, Tree
from ..config.options import BY_NAME, argv
from ..defaults import SHUTDOWN_GRACE
from ..errors import CrnetTimeout, LaunchError
from ..protocol.auth import is_loopback
from ..protocol.tls import TlsFiles
from .procs import stop_processes

MASTER = ""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a daemon about to start. Taken below the kernel's
    ephemeral range where there is room: a port from that range (what bind to port 0
    gives) can become another socket's source port before the daemon binds it, and the
    daemon then fails with "address already in use".

    Nor is a port handed out twice in a row of calls: a tree takes every daemon's port
    before any daemon binds one, so a port free for the first call is still free for
    the next (1 pair in 16384 for a random pick; a 20-host tree has 190 pairs)."""
    low = _ephemeral_low()
    candidates = range(max(1024, low - 16384), low)
    for port in random.sample(candidates, min(64, len(candidates))):
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.append(port)
        return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# The ports free_port gave out last in this process, never given again while here.
_handed_out: collections.deque[int] = collections.deque(maxlen=4096)


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
    root = str(Path(__file__).resolve().parents[2])   # the folder that holds the crnet package
    return [sys.executable, "-c", _BOOTSTRAP.format(root=root), *args]


def _popen(name: str, argv: list, kwargs: dict) -> subprocess.Popen:
    return subprocess.Popen(argv, **kwargs)


class LocalTree:
    """A tree of crnetd processes on this machine (127.0.0.1 unless ``addresses``).

    ``options`` are crnetd's (``crnet.config.options.DAEMON_OPTIONS``, by name: ``timeout=5``,
    ``step_window=8``, ``strict=True``), given to every daemon that takes them (the
    master-only ones to the master); None leaves an option at crnetd's default. The ones
    the tree's layout decides (``SETS``) are LocalTree's own.
    """

    # What LocalTree gives each daemon itself (its place in the tree and its files).
    SETS = frozenset({"role", "listen", "parent", "name", "client_socket", "samples", "fanout",
                      "layers", "stragglers", "exit_with_stdin"})

    def __init__(self, tree: Tree, samples: int, workdir: str | os.PathLike | None = None, *,
                 addresses: dict[str, str] | None = None, spawn: SpawnFn = _popen,
                 port: int = 7070, secret: bool | None = None, tls: TlsFiles | None = None,
                 config: str | os.PathLike | None = None, **options: Any):
        """``secret``: authenticate every tree link with a cluster secret written into
        ``workdir`` (default: when the daemons listen beyond loopback; without one on
        loopback the daemons get ``--insecure``, which crnetd asks for there too: every
        user of this host may then join). ``tls``: mutual TLS on every tree link. ``config``: a
        crnetd --config file every daemon reads (the options given here win over it)."""
        unknown = sorted(set(options) - set(BY_NAME))
        if unknown:
            raise TypeError(f"LocalTree: no crnetd option {', '.join(unknown)}")
        own = sorted(set(options) & self.SETS)
        if own:
            raise TypeError(f"LocalTree: {', '.join(own)} follow from the tree; not an argument")
        self.tree = tree
        self.scheme = options.get("scheme") or "cr"
        self.samples = samples
        self._tmp: Path | None = None     # a directory of our own, removed by stop()
        if workdir is None:
            workdir = self._tmp = Path(tempfile.mkdtemp(prefix="crnet-"))
        self.workdir = Path(workdir)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        # One address per node: its own namespace's (then every node can use one
        # fixed port), or 127.0.0.1 for all (then each listener needs its own port).
        self.addresses = addresses or {name: "127.0.0.1" for name in tree.names()}
        self.spawn = spawn
        self.config = config
        self.options: dict[str, Any] = dict(options)   # crnetd's options, by name
        loopback = all(is_loopback(a) for a in self.addresses.values())
        if secret is None:
            secret = "secret_file" not in options and not loopback
        if secret:
            self.options["secret_file"] = self._write_secret()
        elif "secret_file" not in options and loopback:
            self.options.setdefault("insecure", True)
        if tls is not None:
            self.options.update(tls_cert=tls.cert, tls_key=tls.key, tls_ca=tls.ca)
        # Parents listen for children; with peers (a ring, spread) every host listens for them,
        # and so does every host of a tree the master may move to any shape (--plan auto).
        anywhere = self.scheme in PEER_SCHEMES or self.options.get("plan") == "auto"
        self.ports = {name: port if addresses else free_port() for name in tree.names()
                      if tree.children(name) or anywhere}
        self.procs: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()   # daemons stopped on purpose (signal()): any exit code
        # Every daemon's standard input is the read end of this pipe, and only this process
        # holds the write end: if it dies, even by SIGKILL, the daemons see end of file and
        # stop (--exit-with-stdin) rather than run on as orphans holding their ports.
        self._lifeline: tuple[int, int] | None = None

    @property
    def strict(self) -> bool:
        return bool(self.options.get("strict"))

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
        values = dict(self.options, client_socket=self.socket_path(name), exit_with_stdin=True)
        if name == MASTER:
            t = self.tree
            role = "master"
            values.update(samples=self.samples, layers=t.layers, fanout=list(t.fanout),
                          stragglers=list(t.stragglers))
        else:
            parent = self.tree.parent(name)
            assert parent is not None
            role = "node"
            values.update(name=name, parent=(self.addresses[parent], self.ports[parent]))
        if name in self.ports:
            values["listen"] = (self.addresses[name], self.ports[name])
        config = [] if self.config is None else ["--config", str(self.config)]
        return crnet_argv("daemon", *config, *argv(dict(values, role=role), role))

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
        codes. A temporary workdir is removed, unless strict daemons had ``problems``:
        then their logs stay where those name them."""
        codes = dict(zip(self.procs, stop_processes(self.procs.values(), grace)))
        if self._lifeline is not None:
            for fd in self._lifeline:
                os.close(fd)
            self._lifeline = None
        if self._tmp is not None and not (self.strict and self.problems()):
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        return codes

    def problems(self) -> list[str]:
        """What went wrong inside the daemons: a non-zero exit (other than the ones
        ``signal`` stopped on purpose) or a traceback in a log. Call after ``stop``."""
        found = []
        for name, proc in self.procs.items():
            label = self.filename(name)
            log = self.log_path(name)
            if proc.returncode not in (0, None) and name not in self.killed:
                found.append(f"crnetd {label} exited with {proc.returncode} (its log: {log})")
            if log.exists() and "Traceback" in log.read_text(errors="replace"):
                found.append(f"crnetd {label} logged a traceback ({log}):\n"
                             + log.read_text(errors="replace")[-3000:])
        return found

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
