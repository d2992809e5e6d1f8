"""``crnet run``: a whole crnet tree and its training processes on one machine.

Like ``torchrun --standalone``: ``Run`` starts a local tree of real ``crnetd`` processes
(``crnet.tools.launch.LocalTree``), then K training processes per host of the tree (the
master's host included: its share of the batch is empty, but it takes part in every
step), each told where its daemon is and who it is through its environment
(``training_env``). Their output comes back line by line, each line prefixed with its
host's name. With ``max_restarts`` K (torchrun's ``--max-restarts``), a training process or
a daemon that dies while the run goes on is started again, up to K restarts in all.
``Run.run`` guarantees that every process it started is stopped when it returns or
raises, whatever happened (see its docstring).
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
from ..errors import CrnetTimeout, LaunchError
from .launch import LocalTree, free_port
from .procs import pid_in_use

__all__ = ["DEFAULT_SAMPLES", "FAILURE_GRACE", "RESTART_PAUSE", "STOP_GRACE", "Run", "Seat",
           "seats", "training_env"]

DEFAULT_SAMPLES = 1024   # the global batch of a step when --samples is not given
FAILURE_GRACE = 5.0      # seconds the others may go on after a training process failed
STOP_GRACE = 5.0         # seconds between a stopping signal (SIGTERM, or one forwarded) and SIGKILL
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL = 0.05              # seconds between looks at the processes
READERS_GRACE = 2.0      # seconds the last output lines may take to come through at the end
DAEMON_FAILED = 70       # --strict: a daemon failed though every training process succeeded
                         # (EX_SOFTWARE, the code a strict daemon exits with)
RESTART_PAUSE = 0.5      # seconds between a death and its restart (--max-restarts): no tight crash loop
RESTART_BACKOFF = 16     # ... doubled for each earlier restart of the same seat or daemon, up to x16
DAEMON_START_WAIT = 30.0  # seconds a restarted daemon may take to open its client socket


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
    """``sig`` to the process group ``proc`` leads: the process and whatever it started.

    Once ``proc`` is reaped its pid may be another process's: the kernel frees a pid only
    when no process uses it as its pid or its group's, so while helpers of ``proc`` are
    left in the group no other process can have it. A process now at that pid therefore
    means the group is empty, and the number someone else's: nothing is signalled."""
    if proc.returncode is not None and pid_in_use(proc.pid):
        return
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
    - with ``max_restarts`` K > 0, a training process that fails (non-zero exit, or killed
      by a signal) while the run goes on is started again after ``restart_pause`` seconds,
      with the same command and environment (its seat), and a daemon that exits is
      started again with the same arguments (its processes are restarted only once it is
      back). Every restart, of a process or a daemon, takes one of the run's K; each is
      announced on stderr. A restarted process joins the running job (its client is
      ``stale``: the README's loop takes the others' state);
    - the first training process to fail with no restart left (with K = 0: the first to
      fail) is named on stderr; the others get ``failure_grace`` seconds to finish, then
      SIGTERM, then SIGKILL after ``stop_grace`` seconds;
    - SIGINT, SIGTERM and SIGHUP are forwarded to every training process group; what is
      left after ``stop_grace`` seconds (or at a second such signal) is SIGKILLed;
    - the daemons are stopped last (``LocalTree.stop``);
    - a restart waits ``restart_pause``, doubled for each earlier restart of the same seat
      or daemon (at most ``RESTART_BACKOFF`` times over);
    - a daemon that exits with no restart left is named on stderr and fails the run like a
      training process that does (its processes could not go on); with ``strict``, every
      daemon is strict (an internal error stops it with exit code 70), and at the end every
      daemon that failed or logged a traceback (a restarted one's log keeps its earlier
      lives) is named with its log.

    Daemon logs go to ``<workdir>/logs``. Without ``workdir`` it is a fresh temporary
    directory, removed at the end unless ``keep_logs`` or the exit code is not 0 (then
    where the logs are is printed on stderr).
    """

    def __init__(self, tree: Tree, command: Sequence[str], *, samples: int = DEFAULT_SAMPLES,
                 local_processes: int = 1, scheme: str = "cr", timeout: float = TIMEOUT,
                 job: str | None = None, workdir: str | os.PathLike | None = None,
                 keep_logs: bool = False, failure_grace: float = FAILURE_GRACE,
                 stop_grace: float = STOP_GRACE, strict: bool = False, max_restarts: int = 0,
                 restart_pause: float = RESTART_PAUSE, stdout: BinaryIO, stderr: BinaryIO):
        if not command:
            raise ValueError("crnet run needs a command to start")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, not {max_restarts}")
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
        self.max_restarts = max_restarts
        self.restart_pause = restart_pause
        self.restarts = 0                         # restarts taken so far, of processes and daemons
        self._restarted: dict[Seat | str, int] = {}   # each seat's and daemon's (_pause)
        self.lines = _Lines(stdout, stderr)
        self.seats = seats(tree, local_processes)
        self.procs: dict[Seat, subprocess.Popen] = {}   # each seat's latest process
        self.codes: dict[Seat, int] = {}          # final exit codes, in the order they were seen
        self._envs: dict[Seat, dict[str, str]] = {}     # what each seat is started with, every time
        self._started: list[subprocess.Popen] = []      # every training process, restarts included
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
            # A secret even on 127.0.0.1: other users of this host cannot join the tree. Every
            # host on one machine: its CPUs bound a step, so spread's sum goes straight from owners.
            self.lt = LocalTree(self.tree, self.samples, workdir=workdir, timeout=self.timeout,
                                scheme=self.scheme, local_processes=self.local_processes,
                                strict=self.strict, secret=True, spread_sum="direct")
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
            self._envs[seat] = env
            self._start_seat(seat)

    def _start_seat(self, seat: Seat) -> None:
        """Start ``seat``'s training process (again, on a restart: the same command and
        environment) and the threads that forward its output."""
        try:
            proc = subprocess.Popen(self.command, env=self._envs[seat], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as e:
            raise LaunchError(f"cannot start {self.command[0]}: {e}") from None
        self.procs[seat] = proc
        self._started.append(proc)
        prefix = f"[{seat.label}] ".encode()
        for pipe, sink in ((proc.stdout, self.lines.stdout), (proc.stderr, self.lines.stderr)):
            assert pipe is not None
            reader = threading.Thread(target=_forward_lines, args=(pipe, prefix, sink, self.lines),
                                      name=f"crnet-run-{seat.label}", daemon=True)
            reader.start()
            self._readers.append(reader)

    # ---- supervision --------------------------------------------------------------------

    def _supervise(self) -> None:
        """Wait for every training process; restart what dies while restarts are left; act
        on the first failure with none left and on signals."""
        assert self.lt is not None
        stopping = False                 # a failure with no restart left or a signal: no more
                                         # "first", no more restarts
        term_at: float | None = None     # SIGTERM to the others (the first failure + grace)
        kill_at: float | None = None     # SIGKILL to every group (a stop + grace)
        give_up_at: float | None = None  # stop waiting for processes SIGKILL did not end
        handled = 0                      # signals acted on
        daemons_down: set[str] = set()   # exits already seen (a daemon started again leaves it)
        seats_due: dict[Seat, tuple[float, int]] = {}   # restarts to come: (when, the exit code)
        daemons_due: dict[str, float] = {}              # daemons to start again, and when
        while True:
            now = time.monotonic()
            for seat, proc in self.procs.items():
                if seat in self.codes or seat in seats_due or proc.poll() is None:
                    continue
                code = exit_code(proc.returncode)
                if code != 0 and not stopping and self._take_restart():
                    pause = self._pause(seat)
                    self.lines.say(f"[{seat.label}] exited with code {code}: "
                                   f"{self._restart_taken()} in {pause:g} s")
                    seats_due[seat] = (now + pause, code)
                    continue
                self.codes[seat] = code
                if code != 0 and not stopping:
                    stopping = True
                    self.lines.say(f"[{seat.label}] failed first (exit code {code}"
                                   f"{self._none_left()}); the others still running get "
                                   f"{self.failure_grace:g} s, then SIGTERM")
                    term_at = now + self.failure_grace
            if len(self.codes) == len(self.procs):
                return
            for name in self._daemons_exited(daemons_down):
                said = (f"crnetd {LocalTree.filename(name)} exited with code "
                        f"{self.lt.procs[name].returncode}; its log: {self.lt.log_path(name)}")
                if not stopping and self._take_restart():
                    pause = self._pause(name)
                    self.lines.say(f"{said}: {self._restart_taken()} in {pause:g} s")
                    daemons_due[name] = now + pause
                    continue
                self.lines.say(said + self._none_left())
                if not stopping:
                    # Gone for good: its processes cannot go on (they would try to reconnect
                    # for a minute first), so the run fails now, as when a process fails.
                    stopping = True
                    why = "(--strict)" if self.strict else "with no restart left"
                    self.lines.say(f"a daemon failed {why}; the training processes get "
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
            if stopping:                 # restarts to come are off: their failures are final
                for seat, (_, code) in seats_due.items():
                    self.codes[seat] = code
                seats_due.clear()
                daemons_due.clear()
                if len(self.codes) == len(self.procs):
                    return
            for name, at in list(daemons_due.items()):   # daemons first: their processes need them
                if now >= at:
                    del daemons_due[name]
                    self._restart_daemon(name)
                    daemons_down.discard(name)   # its next exit is a new one
            for seat, (at, _) in list(seats_due.items()):
                if now >= at and seat.host not in daemons_due and not self._signals:
                    del seats_due[seat]
                    _signal_group(self.procs[seat], signal.SIGKILL)   # helpers it left behind
                    self._start_seat(seat)
            now = time.monotonic()       # a daemon's restart may have taken a while
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

    def _take_restart(self) -> bool:
        """One restart from the run's budget, if one is left."""
        if self.restarts >= self.max_restarts:
            return False
        self.restarts += 1
        return True

    def _pause(self, who: Seat | str) -> float:
        """How long before ``who`` (a seat, a daemon) starts again: ``restart_pause``, doubled
        for each of its earlier restarts, at most ``RESTART_BACKOFF`` times over: what fails
        at once again and again (a port another process holds) does not spend the run's
        restarts in a few seconds."""
        earlier = self._restarted.get(who, 0)
        self._restarted[who] = earlier + 1
        return self.restart_pause * min(2 ** earlier, RESTART_BACKOFF)

    def _restart_taken(self) -> str:
        return f"restart {self.restarts} of {self.max_restarts}"

    def _none_left(self) -> str:
        """What a failure with restarts allowed but none left adds to its message."""
        return f", no restart left of {self.max_restarts}" if self.max_restarts else ""

    def _restart_daemon(self, name: str) -> None:
        """Start daemon ``name`` again with the same arguments and wait for its client socket.
        One that exits meanwhile, or does not open its socket in time (then it is killed),
        is seen as exited again by the next look; a stopping signal ends the wait (it is
        in ``lt.procs``: stopped with the others)."""
        assert self.lt is not None
        label = LocalTree.filename(name)
        proc = self.lt.start_node(name)
        try:
            self.lt.wait_sockets([name], DAEMON_START_WAIT, self._interrupt_start)
        except (_Interrupted, LaunchError):   # a signal to act on; an exit the next look sees
            return
        except CrnetTimeout:
            self.lines.say(f"crnetd {label} did not open its socket within {DAEMON_START_WAIT:g} s "
                           "of its restart: killed")
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
            return
        self.lines.say(f"crnetd {label} started again (pid {proc.pid})")

    def _signal_running(self, sig: int) -> None:
        for seat, proc in self.procs.items():
            if seat not in self.codes:
                _signal_group(proc, signal.SIGCONT)   # a stopped process cannot act on sig
                _signal_group(proc, sig)

    def _daemons_exited(self, down: set[str]) -> list[str]:
        """The daemons that exited since the last look (``down``: the exits seen already)."""
        assert self.lt is not None
        exited = [name for name, proc in self.lt.procs.items()
                  if name not in down and proc.poll() is not None]
        down.update(exited)
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
        then SIGKILL what is left of every group (helpers of processes that exited, in
        every life of a restarted seat)."""
        running = [p for p in self.procs.values() if p.poll() is None]
        for proc in running:
            _signal_group(proc, signal.SIGCONT)
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        while any(p.poll() is None for p in running) and time.monotonic() < deadline:
            time.sleep(POLL)
        for proc in self._started:
            _signal_group(proc, signal.SIGKILL)
        for proc in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel (D)
                proc.wait(self.stop_grace)
