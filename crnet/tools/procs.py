"""Stopping processes: one sequence for the launcher, the benchmarks and the emulated cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable

__all__ = ["pid_in_use", "stop_processes"]

POLL = 0.02   # seconds between looks at processes that have not exited yet


def stop_processes(procs: Iterable[subprocess.Popen | int], grace: float, *,
                   term: bool = True) -> list[int | None]:
    """Stop ``procs`` and return their exit codes, in the same order.

    Each one still running gets SIGCONT first (a SIGSTOPped process cannot act on SIGTERM),
    then SIGTERM, or SIGKILL right away with ``term=False``. All of them together get
    ``grace`` seconds to exit; what is left then is SIGKILLed. A ``Popen`` is reaped and
    its exit code returned (negative: the signal that ended it). A bare pid, a process we
    did not start (found in a network namespace, say), is waited for until it is gone or a
    zombie, at most ``grace`` seconds after its SIGKILL; its code is None, since only its
    parent can reap it.
    """
    procs = list(procs)
    running = [p for p in procs if _running(p)]
    for p in running:
        _signal(p, signal.SIGCONT)
        _signal(p, signal.SIGTERM if term else signal.SIGKILL)
    left = _wait(running, time.monotonic() + grace)
    for p in left:
        _signal(p, signal.SIGKILL)
    _wait(left, time.monotonic() + grace)
    return [p.wait() if isinstance(p, subprocess.Popen) else None for p in procs]


def pid_in_use(pid: int) -> bool:
    """Whether a process has the number ``pid`` now: any user's, a zombie too."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running(p: subprocess.Popen | int) -> bool:
    if isinstance(p, subprocess.Popen):
        return p.poll() is None   # reaps it if it has exited
    if not pid_in_use(p):
        return False
    try:   # a zombie has exited: waiting for its parent to reap it gains nothing
        with open(f"/proc/{p}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal(p: subprocess.Popen | int, sig: int) -> None:
    try:
        if isinstance(p, subprocess.Popen):
            p.send_signal(sig)    # does nothing once the Popen has reaped it
        else:
            os.kill(p, sig)
    except ProcessLookupError:
        pass


def _wait(procs: list, deadline: float) -> list:
    """Those of ``procs`` still running at ``deadline`` (none once all have exited)."""
    while True:
        procs = [p for p in procs if _running(p)]
        if not procs or time.monotonic() >= deadline:
            return procs
        time.sleep(POLL)
