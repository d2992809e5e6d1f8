"""crnet.tools.procs.stop_processes: SIGCONT, SIGTERM (or SIGKILL), grace, SIGKILL, reap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from crnet.tools.procs import stop_processes

pytestmark = pytest.mark.timeout(60)

# Prints "ready" once its SIGTERM handler is set; then exits 3 on SIGTERM, or never.
SLEEPER = """
import signal, sys, time
if sys.argv[1] == "exit3":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
else:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:   # short sleeps: a SIGTERM that lands just before a long sleep would wait for it
    time.sleep(0.05)
"""


def sleeper(on_term: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, on_term], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "Z"


def test_term_then_kill_after_grace():
    polite, stubborn = sleeper("exit3"), sleeper("ignore")
    started = time.monotonic()
    assert stop_processes([polite, stubborn], grace=0.5) == [3, -signal.SIGKILL]
    assert 0.5 <= time.monotonic() - started < 5


def test_a_stopped_process_is_continued_so_it_can_act_on_term():
    proc = sleeper("exit3")
    proc.send_signal(signal.SIGSTOP)
    assert stop_processes([proc], grace=5.0) == [3]


def test_term_false_kills_at_once():
    proc = sleeper("exit3")
    started = time.monotonic()
    assert stop_processes([proc], grace=5.0, term=False) == [-signal.SIGKILL]
    assert time.monotonic() - started < 2


def test_exited_processes_keep_their_code():
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    done.wait()
    assert stop_processes([done], grace=1.0) == [7]
    assert stop_processes([], grace=1.0) == []


def test_bare_pids_of_processes_we_did_not_start():
    # A shell starts two sleepers and exits: they are not our children.
    script = ("sleep 600 >/dev/null 2>&1 & echo $!; "
              "(trap '' TERM; exec sleep 600 >/dev/null 2>&1) & echo $!")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True,
                         timeout=10).stdout
    pids = [int(p) for p in out.split()]
    started = time.monotonic()
    assert stop_processes(pids, grace=0.5) == [None, None]
    assert all(gone(pid) for pid in pids)
    assert time.monotonic() - started < 5
