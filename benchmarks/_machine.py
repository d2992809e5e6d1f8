"""How busy the machine is: shared by the benchmark scripts to flag noisy runs."""

from __future__ import annotations

import os
import time


def cpu_busy(seconds: float = 1.0) -> float | None:
    """Share of all CPUs busy over ``seconds`` (from /proc/stat), before we start anything."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
    except OSError:
        return None
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


class ForeignCpu:
    """How much of the machine processes other than ours used during a window.

    Busy CPU time of the whole machine (/proc/stat) minus that of our own
    processes (/proc/<pid>/stat), as a share of all CPUs: a run that overlapped
    someone else's work shows it here. None where /proc is not available.
    """

    TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    @staticmethod
    def _machine() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
        except OSError:
            return None
        # total, busy in processes (user + nice + system: irq/softirq time, much of it
        # our own loopback traffic, is not charged to any process, so it is left out)
        return sum(v), v[0] + v[1] + v[2]

    @staticmethod
    def _proc(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            return 0
        return int(fields[11]) + int(fields[12])  # utime + stime, in ticks

    def start(self, pids) -> None:
        self.pids = set(pids) | {os.getpid()}
        self.m0 = self._machine()
        self.p0 = {p: self._proc(p) for p in self.pids}

    def stop(self, pids=()) -> float | None:
        m1 = self._machine()
        # CPU seconds each of our processes used in the window (``used``).
        self.used = {p: (self._proc(p) - self.p0.get(p, 0)) / self.TICK
                     for p in self.pids | set(pids)}
        if self.m0 is None or m1 is None:
            return None
        ours = sum(self.used.values()) * self.TICK
        total = m1[0] - self.m0[0]
        return max(0.0, (m1[1] - self.m0[1] - ours) / max(1, total))
