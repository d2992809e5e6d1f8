"""The README's training loop, taken from README.md itself (``benchmarks.readme_trainer``), on
threads of this process.

Each host's training process is a thread running ``train`` with the blocking Client;
its compute is emulated per micro-batch (a sleep, ten times longer when it straggles),
and its gradient is exact, so the final parameters say whether every step was applied.
Processes may start at different times, and one may be killed (its client closed
mid-step) and started again from the initial parameters, as a supervisor would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from benchmarks.readme_trainer import readme_train, single_process
from crnet import Client, DaemonBusy, DaemonNotRunning, StepFailed


class Killed(Exception):
    """The emulated death of a training process in the middle of a step."""


class CountingClient(Client):
    """The blocking Client, counting the loop's state requests (its resyncs), the steps
    that failed for it, and how long its longest allreduce took."""

    resyncs = 0
    failed_here = 0
    failed_tree_wide = 0
    longest = 0.0

    def request_state(self, like, out=None, timeout=None):
        self.resyncs += 1
        return super().request_state(like, out, timeout)

    def allreduce(self, *args, **kwargs):
        started = time.monotonic()
        try:
            return super().allreduce(*args, **kwargs)
        except StepFailed as e:
            if e.tree_wide:
                self.failed_tree_wide += 1
            else:
                self.failed_here += 1
            raise
        finally:
            self.longest = max(self.longest, time.monotonic() - started)


def connect(path, wait: float = 10.0, **kwargs) -> CountingClient:
    """A process (re)started on a daemon that may not have seen its predecessor go yet, or
    that is starting again itself."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return CountingClient(path, timeout=60, **kwargs)
        except (DaemonBusy, DaemonNotRunning):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Host:
    """One training process: the README's loop with emulated compute, and what happened."""

    def __init__(self, lt, name, grads, pieces, piece_s, straggle, seed, start_s=0.0,
                 kill_at=None, job=None, revive=False):
        self.lt, self.name, self.grads = lt, name, grads
        self.start_s, self.kill_at, self.job = start_s, kill_at, job   # kill_at: a step
        self.revive = revive      # started again when its daemon died under it, too
        self.pieces, self.piece_s, self.straggle = pieces, piece_s, straggle
        self.rng = np.random.default_rng(seed)
        self.resyncs = 0
        self.failed_here = self.failed_tree_wide = 0
        self.longest = 0.0        # seconds, the longest allreduce of any of its lives
        self.abandoned = 0      # steps it stopped computing because the tree finished them
        self.behind: list[int] = []   # at the start of each step: steps the tree was ahead
        self.catch_ups: list[float] = []   # seconds from a start behind to one level again
        self._behind_since: float | None = None
        self.w = None
        self.error = None
        self.lives = 0            # processes started on this host (a restart is a second)
        self.reconnects = 0       # times its client reconnected to a restarted daemon

    def run(self, train, steps, lr):
        time.sleep(self.start_s)
        try:
            while True:
                self.lives += 1
                try:
                    with connect(self.lt.socket_path(self.name), wait=30 if self.revive else 10,
                                 job=self.job) as c:
                        self.c = c
                        try:   # a new process: the initial parameters, whatever the tree did
                            self.w = train(c, np.zeros(self.grads.shape[1]), steps,
                                           self.micro_batches, self.gradient, lr)
                        finally:
                            self.resyncs += c.resyncs
                            self.failed_here += c.failed_here
                            self.failed_tree_wide += c.failed_tree_wide
                            self.longest = max(self.longest, c.longest)
                            self.reconnects += c.reconnects
                    return
                except Killed:
                    time.sleep(0.3)   # dead; then started again
                except DaemonNotRunning:
                    if not self.revive:
                        raise
                    time.sleep(0.3)   # died with its daemon; its supervisor starts it again
        except BaseException as e:  # noqa: BLE001 -- reported by the test
            self.error = e

    def micro_batches(self, a, step):
        behind = max(0, self.c.tree_step + 1 - step)
        self.behind.append(behind)
        now = time.monotonic()
        if behind and self._behind_since is None:
            self._behind_since = now
        elif not behind and self._behind_since is not None:
            self.catch_ups.append(now - self._behind_since)
            self._behind_since = None
        slow = self.rng.random() < self.straggle[0]
        delay = self.piece_s * (self.straggle[1] if slow else 1)
        if step == self.kill_at and self.lives == 1:
            raise Killed(step)
        ranges = list(a.ranges)
        done = 0
        try:
            for k in range(self.pieces):
                time.sleep(delay)                  # the emulated compute of this piece
                yield ranges[k::self.pieces]
                done += 1
        finally:                                   # the loop broke off: the tree had finished
            if done < self.pieces:
                self.abandoned += 1

    def gradient(self, w, piece):
        g = np.zeros_like(w)
        for start, stop, weight in piece:
            g += weight * self.grads[start:stop].sum(axis=0)
        return g


def run_hosts(lt, tree, grads, steps, lr=0.5, pieces=5, piece_s=0.002, straggle=(0.0, 1.0),
              stagger_s=0.0, kill=None, job=None, names=None, revive=False,
              during: Callable[[list[Host]], None] | None = None, join_s: float = 240):
    """The README's loop on every host (or on ``names``); the k-th starts ``k * stagger_s``
    late; ``kill``: (host index, step) where that host's process dies and starts again;
    ``during(hosts)``: run in this thread while they train (a fault)."""
    train = readme_train()
    names = list(tree.names()) if names is None else names
    hosts = [Host(lt, name, grads, pieces, piece_s, straggle, seed=i, start_s=i * stagger_s,
                  kill_at=kill[1] if kill is not None and kill[0] == i else None, job=job,
                  revive=revive)
             for i, name in enumerate(names)]
    threads = [threading.Thread(target=h.run, args=(train, steps, lr)) for h in hosts]
    started = time.monotonic()
    for t in threads:
        t.start()
    if during is not None:
        during(hosts)
    for t in threads:
        t.join(join_s)
    return hosts, time.monotonic() - started


def assert_every_step_applied(hosts, grads, steps, lr=0.5, resyncs=0):
    want = single_process(grads, steps, lr)
    for h in hosts:
        assert h.error is None, (h.name, h.error)
        assert h.resyncs == (resyncs if h.kill_at is not None else 0), h.name
        np.testing.assert_allclose(h.w, want, rtol=1e-9, atol=1e-12)
