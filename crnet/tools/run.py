"""``crnet run``: a whole crnet tree and its training processes on one machine.

Like ``torchrun --standalone``: ``Run`` starts a local tree of real ``crnetd`` processes
(``crnet.tools.launch.LocalTree``), then K training processes per host of the tree (the
master's host included: its share of the batch is empty, but it takes part in every
step), each told where its daemon is and who it is through its environment
(``training_env``). Their output comes back line by line, each line prefixed with its
host's name. ``Run.run`` guarantees that every process it started is stopped when it
returns or raises, whatever happened (see its docstring).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..coding.plan import Tree
from ..defaults import TIMEOUT
from ..errors import LaunchError
from .launch import LocalTree, free_port

__all__ = ["DEFAULT_SAMPLES", "FAILURE_GRACE", "STOP_GRACE", "Run", "Seat", "seats",
           "training_env"]

DEFAULT_SAMPLES = 1024   # the global batch of a step when --samples is not given
FAILURE_GRACE = 5.0      # seconds the others may go on after a training process failed
STOP_GRACE = 5.0         # seconds between a stopping signal (SIGTERM, or one forwarded) and SIGKILL
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL = 0.05              # seconds between looks at the processes
READERS_GRACE = 2.0      # seconds the last output lines may take to come through at the end
DAEMON_FAILED = 70       # --strict: a daemon failed though every training process succeeded
                         # (EX_SOFTWARE, the code a strict daemon exits with)


@dataclass(frozen=True)
class Seat:
    """One training process: its host (tree name), its index among the host's K, its rank."""

    host: str
    local: int
    rank: int
    label: str   # what its output lines start with, in brackets: master, 0.1, or 0.1/1 when K > 1


def seats(tree: Tree, local_processes: int = 1) -> list[Seat]:
    """Every training process of the tree, ranked host by host (master first, then layer by
    layer, as ``Tree.names``) and within a host by local index."""
    out: list[Seat] = []
    for host in tree.names():
        name = LocalTree.filename(host)
        for local in range(local_processes):
            label = name if local_processes == 1 else f"{name}/{local}"
            out.append(Seat(host, local, len(out), label))
    return out


def training_env(seat: Seat, socket_path: str, job: str, world_size: int,
                 local_processes: int = 1, master_port: int | None = None) -> dict[str, str]:
    """What ``crnet run`` adds to a training process's environment: crnet's variables, and
    torchrun's (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, and with
    ``master_port`` ``MASTER_ADDR``/``MASTER_PORT`` for torch's store), so that
    ``dist.init_process_group("crnet")`` works unchanged."""
    env = {"CRNET_CLIENT_SOCKET": socket_path, "CRNET_JOB": job, "CRNET_HOST": seat.host,
           "CRNET_LOCAL_PROCESS": str(seat.local), "CRNET_RANK": str(seat.rank),
           "CRNET_WORLD_SIZE": str(world_size),
           "RANK": str(seat.rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(seat.local),
           "LOCAL_WORLD_SIZE": str(local_processes)}
    if master_port is not None:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
    return env


def exit_code(returncode: int) -> int:
    """A shell's exit status for a process's ``returncode``: killed by signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class _Interrupted(BaseException):
    """A stopping signal arrived while the tree was starting: there is nothing to forward to."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _Lines:
    """Whole lines to the launcher's stdout and stderr from many threads, one at a time.

    A sink that fails (a closed terminal, ``| head``) is dropped silently: the training
    processes' pipes are still drained, so no process blocks on its output.
    """

    def __init__(self, stdout: BinaryIO, stderr: BinaryIO):
        self.stdout, self.stderr = stdout, stderr
        self._lock = threading.Lock()
        self._broken: set[int] = set()

    def write(self, sink: BinaryIO, line: bytes) -> None:
        with self._lock:
            if id(sink) in self._broken:
                return
            try:
                sink.write(line)
                sink.flush()
            except (OSError, ValueError):
                self._broken.add(id(sink))

    def say(self, message: str) -> None:
        """One of the launcher's own messages, on stderr."""
        self.write(self.stderr, f"crnet run: {message}\n".encode(errors="replace"))


def _forward_lines(pipe: BinaryIO, prefix: bytes, sink: BinaryIO, lines: _Lines) -> None:
    """Copy ``pipe`` to ``sink`` line by line, each line prefixed (a last line without its
    newline gets one)."""
    with pipe:
        for line in iter(pipe.readline, b""):
            lines.write(sink, prefix + line + (b"" if line.endswith(b"\n") else b"\n"))


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """``sig`` to the process group ``proc`` leads: the process and whatever it started."""
    # Gone already (PermissionError: what macOS says for a group left with only a zombie).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


class Run:
    """One ``crnet run``: a LocalTree, then ``command`` once per training process.

    ``run()`` returns the exit code: the first non-zero exit code of a training process
    (a process killed by signal N counts as 128+N), else 128+N if the launcher was
    stopped by signal N, else 0. When it returns or raises, whatever happened (every
    process finished, one failed, SIGINT/SIGTERM/SIGHUP, an exception in the launcher),
    every training process and every daemon it started has been stopped:

    - each training process runs in its own process group, so helpers it starts
      (data-loader workers) are signalled and stopped with it; its stdin is /dev/null;
    - the first training process to fail (non-zero exit) is named on stderr; the others
      get ``failure_grace`` seconds to finish, then SIGTERM, then SIGKILL after
      ``stop_grace`` seconds;
    - SIGINT, SIGTERM and SIGHUP are forwarded to every training process group; what is
      left after ``stop_grace`` seconds (or at a second such signal) is SIGKILLed;
    - the daemons are stopped last (``LocalTree.stop``);
    - with ``strict``, every daemon is strict (an internal error stops it with exit code
      70): a daemon that exits fails the run like a training process that does, and at the
      end every daemon that failed or logged a traceback is named with its log.

    Daemon logs go to ``<workdir>/logs``. Without ``workdir`` it is a fresh temporary
    directory, removed at the end unless ``keep_logs`` or the exit code is not 0 (then
    where the logs are is printed on stderr).
    """

    def __init__(self, tree: Tree, command: Sequence[str], *, samples: int = DEFAULT_SAMPLES,
                 local_processes: int = 1, scheme: str = "cr", timeout: float = TIMEOUT,
                 job: str | None = None, workdir: str | os.PathLike | None = None,
                 keep_logs: bool = False, failure_grace: float = FAILURE_GRACE,
                 stop_grace: float = STOP_GRACE, strict: bool = False, stdout: BinaryIO,
                 stderr: BinaryIO):
        if not command:
            raise ValueError("crnet run needs a command to start")
        self.tree = tree
        self.command = list(command)
        self.samples = samples
        self.local_processes = local_processes
        self.scheme = scheme
        self.timeout = timeout
        self.job = job or f"run-{uuid.uuid4().hex[:12]}"
        self.workdir = None if workdir is None else Path(workdir)
        self.keep_logs = keep_logs or workdir is not None
        self.failure_grace = failure_grace
        self.stop_grace = stop_grace
        self.strict = strict
        self.lines = _Lines(stdout, stderr)
        self.seats = seats(tree, local_processes)
        self.procs: dict[Seat, subprocess.Popen] = {}
        self.codes: dict[Seat, int] = {}          # exit codes, in the order they were seen
        self.lt: LocalTree | None = None
        self._readers: list[threading.Thread] = []
        self._signals: list[int] = []

    # ---- the whole run ------------------------------------------------------------------

    def run(self) -> int:
        """Start the tree and the training processes, supervise them, stop everything."""
        if shutil.which(self.command[0]) is None:
            raise LaunchError(f"{self.command[0]}: command not found")
        previous: dict[signal.Signals, Any] = {}   # the handlers to put back
        workdir = self.workdir
        code = 1   # if the launcher itself fails
        try:
            for sig in FORWARDED:
                previous[sig] = signal.signal(sig, self._on_signal)
            if workdir is None:
                workdir = Path(tempfile.mkdtemp(prefix="crnet-run-"))
            # A secret even on 127.0.0.1: other users of this host cannot join the tree.
            self.lt = LocalTree(self.tree, self.samples, workdir=workdir, timeout=self.timeout,
                                scheme=self.scheme, local_processes=self.local_processes,
                                strict=self.strict, secret=True)
            self.lines.say(f"{len(self.seats)} training processes on a tree of "
                           f"{self.tree.workers + 1} crnetd (scheme {self.scheme}, "
                           f"{self.samples} samples per step), job {self.job}, daemon logs in "
                           f"{workdir / 'logs'}")
            self.lt.start(checkpoint=self._interrupt_start)
            self._start_training(self.lt)
            self._supervise()
            code = self._exit_code()
        except _Interrupted as e:
            self.lines.say(f"{signal.Signals(e.signum).name} while starting the tree: stopped")
            code = 128 + e.signum
        finally:
            try:
                self._stop_training()
            finally:
                if self.lt is not None:
                    self.lt.stop()
                    # The tree's secret is no use once its daemons are gone: a kept
                    # workdir keeps the logs only.
                    (self.lt.workdir / "secret").unlink(missing_ok=True)
                    if self.strict:
                        code = self._daemon_problems(code)
                # The pipes close when the processes are gone (or a helper that left its
                # group still holds one: then its output is not waited for).
                deadline = time.monotonic() + READERS_GRACE
                for reader in self._readers:
                    reader.join(max(0.0, deadline - time.monotonic()))
                for sig, handler in previous.items():
                    signal.signal(sig, signal.SIG_DFL if handler is None else handler)
                if workdir is not None and (code != 0 or self.keep_logs):
                    self.lines.say(f"daemon logs in {workdir / 'logs'}")
                elif workdir is not None and self.workdir is None:
                    shutil.rmtree(workdir, ignore_errors=True)
        return code

    def _on_signal(self, signum: int, frame) -> None:
        self._signals.append(signum)   # forwarded by _supervise, or ends the start-up

    def _interrupt_start(self) -> None:
        """While the tree starts, a stopping signal ends the start-up: there is nothing to
        forward it to yet."""
        if self._signals:
            raise _Interrupted(self._signals[0])

    def _start_training(self, lt: LocalTree) -> None:
        master_port = free_port()     # torch's store, should the command use torch.distributed
        for seat in self.seats:
            env = dict(os.environ, **training_env(seat, lt.socket_path(seat.host), self.job,
                                                  len(self.seats), self.local_processes, master_port))
            env.setdefault("PYTHONUNBUFFERED", "1")   # lines as they are printed, not at exit
            try:
                proc = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
            except OSError as e:
                raise LaunchError(f"cannot start {self.command[0]}: {e}") from None
            self.procs[seat] = proc
            prefix = f"[{seat.label}] ".encode()
            for pipe, sink in ((proc.stdout, self.lines.stdout), (proc.stderr, self.lines.stderr)):
                assert pipe is not None
                reader = threading.Thread(target=_forward_lines, args=(pipe, prefix, sink, self.lines),
                                          name=f"crnet-run-{seat.label}", daemon=True)
                reader.start()
                self._readers.append(reader)

    # ---- supervision --------------------------------------------------------------------

    def _supervise(self) -> None:
        """Wait for every training process; act on the first failure and on signals."""
        stopping = False                 # a process failed or a signal came: no more "first"
        term_at: float | None = None     # SIGTERM to the others (the first failure + grace)
        kill_at: float | None = None     # SIGKILL to every group (a stop + grace)
        give_up_at: float | None = None  # stop waiting for processes SIGKILL did not end
        handled = 0                      # signals acted on
        daemons_down: set[str] = set()
        while True:
            now = time.monotonic()
            for seat, proc in self.procs.items():
                if seat in self.codes or proc.poll() is None:
                    continue
                self.codes[seat] = exit_code(proc.returncode)
                if self.codes[seat] != 0 and not stopping:
                    stopping = True
                    self.lines.say(f"[{seat.label}] failed first (exit code {self.codes[seat]}); "
                                   f"the others still running get {self.failure_grace:g} s, "
                                   "then SIGTERM")
                    term_at = now + self.failure_grace
            if len(self.codes) == len(self.procs):
                return
            if self._report_daemons(daemons_down) and self.strict and not stopping:
                stopping = True          # a strict daemon's internal error fails the run
                self.lines.say(f"a daemon failed (--strict); the training processes get "
                               f"{self.failure_grace:g} s, then SIGTERM")
                term_at = now + self.failure_grace
            for sig in self._signals[handled:]:
                handled += 1
                if handled == 1:
                    stopping = True
                    self.lines.say(f"{signal.Signals(sig).name}: forwarded to the training "
                                   f"processes (SIGKILL in {self.stop_grace:g} s)")
                    self._signal_running(sig)
                    kill_at = now + self.stop_grace
                else:                    # a second one: no more waiting
                    kill_at = now
            if term_at is not None and now >= term_at:
                self._signal_running(signal.SIGTERM)
                term_at = None
                kill_at = min(kill_at or now + self.stop_grace, now + self.stop_grace)
            if kill_at is not None and now >= kill_at:
                self._signal_running(signal.SIGKILL)
                kill_at = None
                give_up_at = now + self.stop_grace
            if give_up_at is not None and now >= give_up_at:
                return
            time.sleep(POLL)

    def _signal_running(self, sig: int) -> None:
        for seat, proc in self.procs.items():
            if seat not in self.codes:
                _signal_group(proc, signal.SIGCONT)   # a stopped process cannot act on sig
                _signal_group(proc, sig)

    def _report_daemons(self, down: set[str]) -> bool:
        """Say once on stderr that a daemon exited (its processes will see errors, not hang);
        True if one did since the last look."""
        assert self.lt is not None
        exited = False
        for name, proc in self.lt.procs.items():
            if name not in down and proc.poll() is not None:
                down.add(name)
                exited = True
                self.lines.say(f"crnetd {LocalTree.filename(name)} exited with code "
                               f"{proc.returncode}; its log: {self.lt.log_path(name)}")
        return exited

    def _daemon_problems(self, code: int) -> int:
        """--strict, once the daemons are stopped: name every daemon that failed or logged a
        traceback (and its log); a run whose processes all succeeded then exits with
        ``DAEMON_FAILED``."""
        assert self.lt is not None
        problems = self.lt.problems()
        for problem in problems:
            self.lines.say(problem)
        return DAEMON_FAILED if problems and code == 0 else code

    def _exit_code(self) -> int:
        for code in self.codes.values():
            if code != 0:
                return code
        return 128 + self._signals[0] if self._signals else 0

    def _stop_training(self) -> None:
        """SIGTERM every training process group still running, SIGKILL after the grace,
        then SIGKILL what is left of every group (helpers of processes that exited)."""
        running = [p for p in self.procs.values() if p.poll() is None]
        for proc in running:
            _signal_group(proc, signal.SIGCONT)
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(POLL)
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGKILL)
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel (D)
                proc.wait(self.stop_grace)
