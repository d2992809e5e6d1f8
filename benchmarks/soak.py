"""Soak: a tree of real crnetd processes under random faults for many steps, every result checked.

    python -m benchmarks.soak --steps 10000 [--fanout 3 --layers 2 --stragglers 1] [--timeout 2]
        [--faults kill,freeze,partition] [--netns auto|on|off] [--seed 1] [--json out.json]

What runs: ``crnet.tools.launch.LocalTree`` (13 strict daemons for the default tree) and, for every
host, one training process: an asyncio task of this process that uses the public
``AsyncClient`` only and runs the README's loop (catch up on steps the tree finished without
it, skip a failed step, go on where the tree is after a lost one, ask again when refused,
reconnect when its daemon restarts). As root (``--netns auto``, the default) every daemon runs
in its own network namespace of ``benchmarks.netns``, so links can be cut; otherwise on
127.0.0.1 and without partitions. The training processes stay in the root namespace: the
client socket is a Unix socket, which a network namespace does not separate.

Results: sample i's gradient is a fixed vector of small integers, times (step + 1), so the
sum every step must return is an integer vector known in advance. A result is right when it
is that vector to 1e-9 relative: the codes' real coefficients leave rounding of ~1e-13 (the
run prints the largest seen), while a lost, doubled or stale share is off by at least 1.

Faults, injected at random intervals (--gap) for the whole run:

* straggle: every step, each process computes --compute-ms, or with --straggle-prob that
  times uniform(2, --straggle-factor); it stops computing once the tree finished the step.
* kill: SIGKILL a worker's daemon, restart it (same --name) 0-2 s later.
* freeze: SIGSTOP, then SIGCONT after 0.2-0.8 x --timeout (``freeze-short``) or 1.2-3 x
  --timeout (``freeze-long``).
* partition (netns only): the host's link down for --partition seconds, then up again.

Never more than s children of one parent are in a fault at once, and a host already inside a
faulty subtree is left alone: a fault lasts from its injection until every host of the
victim's subtree has a result of a step decided after the fault ended ("rejoined"; the time
from the end of the fault to then is its rejoin time). Each fault is logged (to stderr, as it
ends) with its times and the steps it covers: from the oldest step a process of the subtree
was on at injection to the newest step any process was on when it rejoined. A failure a
process sees (StepFailed, StepLost, a timeout, its daemon gone) is explained by a fault when
the process is in the fault's subtree and the step is one the fault covers (a tree-wide
failure: any fault covering the step); its daemon gone needs a kill, and no answer from its
daemon a freeze, of that very daemon. Anything else is reported as unexplained.

Memory: every daemon's RSS and open descriptors are read from /proc once a second. "start"
is its first reading, "end" the reading after the last step. RSS growth is judged per run of a
daemon (a restart begins a new one), not from the start: from the first reading --warmup steps
after the run joined the tree (its caches and the kept results fill up first) to its last
reading (at the end, or just before it was killed). The report shows each daemon's longest run
and fails on any run that grew more than 10%; a run shorter than its warm-up is not judged.

Exit status 1 when a result was wrong, a failure was unexplained, a fault's subtree did not
rejoin within 10 s, a daemon's RSS grew more than 10%, a daemon died unasked or logged a
traceback, or a process did not reach the last step; 2 on bad options.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from crnet import AsyncClient, CrnetError, DaemonNotRunning, StepFailed, StepLost, StepRefused
from crnet.coding.plan import Tree
from crnet.errors import AssignmentChanged, CrnetTimeout
from crnet.tools.launch import MASTER, LocalTree

from . import netns
from .fuzz_trainers import gradients

REJOIN_LIMIT = 10.0     # seconds: a subtree back in the tree later than this fails the run
RSS_LIMIT = 10.0        # percent: RSS growth (warm -> end) beyond this fails the run
REJOIN_WAIT = 120.0     # seconds to wait for a rejoin before calling it lost
SLICE = 0.002           # seconds of emulated compute between two looks at the tree's progress
TOLERANCE = 1e-9        # relative error of a right result (see the module docstring)
SAMPLES, ELEMENTS = 60, 32


def label(name: str) -> str:
    return LocalTree.filename(name)


def subtree(tree: Tree, name: str) -> list[str]:
    return [name] + [n for c in tree.children(name) for n in subtree(tree, c)]


# ---------------------------------------------------------------------- what is recorded

@dataclass
class Failure:
    """One call of one process that did not return the step's result."""
    host: str
    step: int
    kind: str           # StepFailed, StepLost, CrnetTimeout, DaemonNotRunning, ...
    reason: str
    tree_wide: bool
    at: float           # seconds since the run began
    fault: int | None = None   # the fault that explains it


@dataclass
class Fault:
    id: int
    kind: str
    victim: str
    affected: list[str]
    start: float
    first_step: int
    held: float = 0.0           # seconds the fault was applied
    end: float | None = None
    end_step: int | None = None
    rejoin: float | None = None   # seconds from the end until the subtree was back
    back: float | None = None     # when it was (seconds since the run began)
    last_step: int | None = None
    failures: int = 0


@dataclass
class MemoryReading:
    step: int
    rss_kib: int
    fds: int


@dataclass
class Incarnation:
    """One run of one daemon (a restart makes a new one)."""
    pid: int
    started_step: int          # the tree's step when it was (back) in the tree
    readings: list[MemoryReading] = field(default_factory=list)


def read_memory(pid: int) -> tuple[int, int] | None:
    """(VmRSS in KiB, open descriptors) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None


# ---------------------------------------------------------------------- a training process

class Trainer:
    """One host's training process, the README's loop, checking every result it gets."""

    def __init__(self, soak: Soak, name: str, rng: random.Random):
        self.soak, self.name, self.rng = soak, name, rng
        self.step = 0                  # the step it is on
        self.newest = -1               # the newest step it holds the result of
        self.results = 0
        self.refused = 0
        self.stragglers = 0
        self.max_error = 0.0
        self.wrong: list[tuple[int, float]] = []

    async def run(self, stop: asyncio.Event) -> None:
        s, c = self.soak, None
        like = np.zeros(s.grads.shape[1])
        while not stop.is_set() and self.step <= s.last_step:
            try:
                if c is None:
                    c = await AsyncClient.connect(s.lt.socket_path(self.name), timeout=REJOIN_WAIT)
                    self.step = max(self.step, c.tree_step + 1)
                step = self.step
                if step <= c.tree_step:      # the tree finished it without us: take the result
                    result = await c.result(step, like=like)
                else:
                    await self.compute(c, step)
                    pos, weight = c.assignment.positions()
                    vec = (step + 1) * (weight @ s.grads[pos])
                    c.mark_current()         # the vector depends on no parameters: never stale
                    result = await c.allreduce(vec, step=step)
                self.check(step, result)
                self.step = step + 1
            except StepRefused:              # ahead of what its (restarted) daemon knows
                self.refused += 1
                await asyncio.sleep(0.1)
            except StepFailed as e:
                self.failed(e, e.tree_wide)
                self.step = self.step + 1 if e.tree_wide else max(self.step, e.tree_step) + 1
            except StepLost as e:
                self.failed(e)
                self.step = max(self.step, e.tree_step) + 1
            except AssignmentChanged as e:   # redo the step with the new share
                self.failed(e)
            except (CrnetTimeout, DaemonNotRunning) as e:   # frozen or killed: connect again
                if c is not None:            # (each attempt to reconnect is not one more failure)
                    self.failed(e)
                    c.close()
                c = None
                await asyncio.sleep(0.1)
            except CrnetError as e:          # MismatchError, JobEnded: nothing here causes them
                self.failed(e)
                self.step += 1
        if c is not None:
            c.close()

    async def compute(self, c: AsyncClient, step: int) -> None:
        s = self.soak.args
        seconds = s.compute_ms / 1000
        if self.rng.random() < s.straggle_prob:
            self.stragglers += 1
            seconds *= self.rng.uniform(2, s.straggle_factor)
        end = time.monotonic() + seconds
        while not c.finished(step) and (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(SLICE, left))

    def check(self, step: int, result: np.ndarray) -> None:
        want = (step + 1) * self.soak.total
        if result.shape != want.shape:
            self.wrong.append((step, float("inf")))
        else:
            error = float(np.max(np.abs(result - want)) / max(1.0, float(np.max(np.abs(want)))))
            self.max_error = max(self.max_error, error)
            if error > TOLERANCE:
                self.wrong.append((step, error))
        self.results += 1
        self.newest = max(self.newest, step)

    def failed(self, e: CrnetError, tree_wide: bool = False) -> None:
        self.soak.failures.append(Failure(self.name, self.step, type(e).__name__, str(e), tree_wide,
                                          self.soak.now()))


# ---------------------------------------------------------------------- the run

class Soak:
    def __init__(self, args, lt: LocalTree, cluster: netns.EmulatedCluster | None):
        self.args, self.lt, self.cluster = args, lt, cluster
        self.tree = lt.tree
        self.rng = random.Random(args.seed)
        self.grads = gradients(lt.samples, ELEMENTS)
        self.total = self.grads.sum(axis=0)
        self.names = list(self.tree.names())
        self.host_of = {name: i for i, name in enumerate(self.names)}
        self.trainers = {n: Trainer(self, n, random.Random(self.rng.random())) for n in self.names}
        self.failures: list[Failure] = []
        self.faults: list[Fault] = []
        self.active: dict[int, Fault] = {}
        self.memory: dict[str, list[Incarnation]] = {n: [] for n in self.names}
        self.last_step = 1 << 62    # set near the end: every process stops after it
        self.kinds = [k for k in args.faults if k != "partition" or cluster is not None]
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def tree_step(self) -> int:
        """The newest step any process holds the result of."""
        return max(t.newest for t in self.trainers.values())

    async def run(self) -> None:
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(t.run(stop)) for t in self.trainers.values()]
        sampler = asyncio.ensure_future(self.sample_memory())
        faults: set[asyncio.Future] = set()
        try:
            await self.until(lambda: min(t.newest for t in self.trainers.values()) >= 2, "a warm tree")
            while self.tree_step() < self.args.steps - 1:
                await asyncio.sleep(self.rng.uniform(*self.args.gap))
                self.reap(tasks)
                picked = self.pick()
                if picked is not None:
                    faults.add(asyncio.ensure_future(self.inject(*picked)))
                for done in [f for f in faults if f.done()]:
                    done.result()    # a fault that could not be injected or undone ends the run
                    faults.discard(done)
            if faults:
                await asyncio.gather(*faults)
            # The end: every process goes on to the same last step, which nobody began yet
            # (a process is at most one step past the newest result), and stops after it.
            self.last_step = self.tree_step() + 2
            await self.until(lambda: all(t.done() for t in tasks),
                             f"every process at step {self.last_step}", timeout=REJOIN_WAIT)
            for task in tasks:
                task.result()    # a training process's bug: its traceback, not a report
            self.read_memory_now()
        finally:
            stop.set()
            for name in self.names:
                if self.lt.alive(name):
                    self.lt.signal(name, signal.SIGCONT)
            if self.cluster is not None:
                for f in self.active.values():
                    if f.kind == "partition":
                        self.cluster.set_link(self.host_of[f.victim], True)
            for other in [*faults, sampler]:
                other.cancel()
            await asyncio.wait(tasks, timeout=30)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, *faults, sampler, return_exceptions=True)

    def reap(self, tasks) -> None:
        for task in tasks:   # a training process's bug ends the run at once, with its traceback
            if task.done():
                task.result()
                raise RuntimeError("a training process stopped")

    async def until(self, check, what: str, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
            await asyncio.sleep(0.05)

    def pick(self) -> tuple[str, str] | None:
        """A fault and a victim that keep at most s faulty children under every parent."""
        busy = {n for f in self.active.values() for n in f.affected}
        victims = {f.victim for f in self.active.values()}
        candidates = []
        for name in self.names[1:]:
            parent = self.tree.parent(name)
            assert parent is not None
            s = self.tree.stragglers[self.tree.layer(parent)]
            down = sum(1 for c in self.tree.children(parent) if c in victims)
            if name not in busy and down < s and not set(subtree(self.tree, name)) & busy:
                candidates.append(name)
        if not candidates:
            return None
        return self.rng.choice(self.kinds), self.rng.choice(candidates)

    async def inject(self, kind: str, victim: str) -> None:
        affected = subtree(self.tree, victim)
        fault = Fault(len(self.faults), kind, victim, affected, self.now(),
                      first_step=min(self.trainers[n].step for n in affected))
        self.faults.append(fault)
        self.active[fault.id] = fault
        a, lt = self.args, self.lt
        try:
            if kind == "kill":
                lt.signal(victim, signal.SIGKILL)
                await asyncio.sleep(self.rng.uniform(0, 2))
                lt.start_node(victim)
                restarted = Incarnation(lt.procs[victim].pid, started_step=1 << 62)
                self.memory[victim].append(restarted)
            elif kind.startswith("freeze"):
                low, high = (0.2, 0.8) if kind == "freeze-short" else (1.2, 3.0)
                lt.signal(victim, signal.SIGSTOP)
                await asyncio.sleep(self.rng.uniform(low, high) * a.timeout)
                lt.signal(victim, signal.SIGCONT)
            else:
                assert self.cluster is not None
                self.cluster.set_link(self.host_of[victim], False)
                await asyncio.sleep(self.rng.uniform(*a.partition))
                self.cluster.set_link(self.host_of[victim], True)
            fault.end, fault.end_step = self.now(), self.tree_step()
            fault.held = fault.end - fault.start
            with contextlib.suppress(RuntimeError):   # not back: the report says so
                await self.until(lambda: all(self.trainers[n].newest > (fault.end_step or 0)
                                             for n in affected),
                                 f"{label(victim)} back", timeout=REJOIN_WAIT)
                fault.back = self.now()
                fault.rejoin = fault.back - fault.end
                if kind == "kill":   # its warm-up counts from when it is back in the tree
                    restarted.started_step = self.tree_step()
        finally:
            fault.last_step = max(t.step for t in self.trainers.values())
            del self.active[fault.id]
        print(f"[{fault.start:8.1f} s] fault #{fault.id} {kind} {label(victim)} "
              f"(subtree {' '.join(map(label, affected))}): held {fault.held:.1f} s, steps "
              f"{fault.first_step}-{fault.last_step}, rejoined "
              + (f"{fault.rejoin:.2f} s after" if fault.rejoin is not None else "NEVER"),
              file=sys.stderr, flush=True)

    async def sample_memory(self) -> None:
        for name in self.names:
            self.memory[name].append(Incarnation(self.lt.procs[name].pid, 0))
        while True:
            self.read_memory_now()
            await asyncio.sleep(1.0)

    def read_memory_now(self) -> None:
        step = self.tree_step()
        for runs in self.memory.values():
            if runs and (got := read_memory(runs[-1].pid)) is not None:
                runs[-1].readings.append(MemoryReading(step, *got))


# ---------------------------------------------------------------------- the verdict

# What only a fault of the process's own daemon causes: its daemon gone, or not answering.
OWN_DAEMON = {"DaemonNotRunning": ("kill",), "CrnetTimeout": ("freeze-short", "freeze-long")}


def explain(failures: list[Failure], faults: list[Fault]) -> None:
    """Point each failure at the fault that explains it (see the module docstring): of the
    faults that could cause it and cover its step, the one under way when it happened."""
    for f in failures:
        could = [fault for fault in faults
                 if fault.first_step <= f.step <= (fault.last_step if fault.last_step is not None
                                                   else 1 << 62)
                 and (f.tree_wide or f.host in fault.affected)
                 and (f.kind not in OWN_DAEMON
                      or (fault.victim == f.host and fault.kind in OWN_DAEMON[f.kind]))]
        during = [fault for fault in could
                  if fault.start <= f.at <= (fault.back if fault.back is not None else f.at)]
        if could:
            fault = (during or could)[0]
            f.fault = fault.id
            fault.failures += 1


def shape(reason: str) -> str:
    """A reason with its step numbers and times taken out, to group alike failures."""
    reason = re.sub(r"\b(step|steps|at step) -?\d+", r"\1 N", reason)
    return re.sub(r"\d+(\.\d+)? s\b", "T s", reason)[:160]


def warm_span(run: Incarnation, warmup: int) -> tuple[MemoryReading, MemoryReading] | None:
    """(warm, last) readings of one run of a daemon; None if it did not live past its warm-up."""
    warm = next((r for r in run.readings if r.step >= run.started_step + warmup), None)
    if warm is None or warm is run.readings[-1]:
        return None
    return warm, run.readings[-1]


def memory_rows(soak: Soak, warmup: int) -> list[dict]:
    """Per daemon: its first and last readings, and RSS growth over each of its runs that
    got warm (the longest such run is shown; the largest growth of any run is judged)."""
    rows = []
    for name, runs in soak.memory.items():
        if not runs[0].readings or not runs[-1].readings:
            continue
        spans = [span for run in runs if (span := warm_span(run, warmup)) is not None]
        growths = [100.0 * (last.rss_kib - warm.rss_kib) / warm.rss_kib for warm, last in spans]
        longest = max(range(len(spans)), key=lambda i: spans[i][1].step - spans[i][0].step,
                      default=None)
        rows.append({"daemon": label(name), "restarts": len(runs) - 1,
                     "start": asdict(runs[0].readings[0]), "end": asdict(runs[-1].readings[-1]),
                     "warm": asdict(spans[longest][0]) if longest is not None else None,
                     "warm_end": asdict(spans[longest][1]) if longest is not None else None,
                     "rss_growth_pct": growths[longest] if longest is not None else None,
                     "max_rss_growth_pct": max(growths, default=None)})
    return rows


def report(soak: Soak, problems: list[str], elapsed: float) -> tuple[dict, list[str]]:
    a, tree = soak.args, soak.tree
    explain(soak.failures, soak.faults)
    trainers = soak.trainers.values()
    wrong = [(t.name, step, err) for t in trainers for step, err in t.wrong]
    unexplained = [f for f in soak.failures if f.fault is None]
    rejoins = {k: [f.rejoin for f in soak.faults if f.kind == k] for k in soak.kinds}
    never = [f for f in soak.faults if f.rejoin is None]
    slow = [f for f in soak.faults if f.rejoin is not None and f.rejoin > REJOIN_LIMIT]
    rows = memory_rows(soak, a.warmup)
    grown = [r for r in rows if (r["max_rss_growth_pct"] or 0.0) > RSS_LIMIT]
    master = soak.trainers[MASTER]
    behind = [t.name for t in trainers if t.newest < soak.last_step]
    tree_wide = sorted({f.step for f in soak.failures if f.tree_wide})
    failed_steps = sorted({f.step for f in soak.failures if f.kind in ("StepFailed", "StepLost")})
    verdict = ([f"{len(wrong)} wrong results"] * bool(wrong)
               + [f"{len(unexplained)} unexplained failures"] * bool(unexplained)
               + [f"{len(never)} faults whose subtree never rejoined"] * bool(never)
               + [f"{len(slow)} rejoins over {REJOIN_LIMIT:g} s"] * bool(slow)
               + [f"RSS grew over {RSS_LIMIT:g}% in {', '.join(r['daemon'] for r in grown)}"] * bool(grown)
               + [f"processes behind at the end: {', '.join(map(label, behind))}"] * bool(behind)
               + problems)
    doc = {
        "tree": {"fanout": list(tree.fanout), "stragglers": list(tree.stragglers),
                 "daemons": len(soak.names)},
        "network": "netns" if soak.cluster is not None else "loopback",
        "options": {k: v for k, v in vars(a).items() if k != "json"},
        "seconds": elapsed,
        "steps": soak.last_step + 1,
        "steps_completed": master.results,
        "steps_failed_tree_wide": tree_wide,
        "steps_failed_somewhere": len(failed_steps),
        "results_checked": sum(t.results for t in trainers),
        "wrong_results": wrong,
        "max_relative_error": max(t.max_error for t in trainers),
        "stragglers_injected": sum(t.stragglers for t in trainers),
        "refused": sum(t.refused for t in trainers),
        "faults": [asdict(f) for f in soak.faults],
        "failures": [asdict(f) for f in soak.failures],
        "unexplained": [asdict(f) for f in unexplained],
        "rejoin_s": rejoins,
        "memory": rows,
        "problems": problems,
        "verdict": verdict,
    }
    return doc, verdict


def print_report(doc: dict, soak: Soak) -> None:
    p = print
    t = doc["tree"]
    p(f"tree                 fanout {','.join(map(str, t['fanout']))}, stragglers "
      f"{','.join(map(str, t['stragglers']))}: {t['daemons']} daemons on {doc['network']}, "
      f"--timeout {soak.args.timeout:g}, seed {soak.args.seed}, {doc['seconds']:.0f} s")
    p(f"steps                {doc['steps']} (the master's process got {doc['steps_completed']} results)")
    p(f"steps failed         {len(doc['steps_failed_tree_wide'])} tree-wide "
      f"{doc['steps_failed_tree_wide'][:20]}; {doc['steps_failed_somewhere']} steps failed or lost "
      f"for some process")
    p(f"wrong results        {len(doc['wrong_results'])} of {doc['results_checked']} checked "
      f"(largest relative error {doc['max_relative_error']:.1e})")
    p(f"stragglers injected  {doc['stragglers_injected']}; {doc['refused']} requests refused "
      "(ahead of a restarted daemon) and asked again")
    kinds = Counter(f.kind for f in soak.faults)
    p(f"faults               {len(soak.faults)}: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    for kind, times in doc["rejoin_s"].items():
        got = [x for x in times if x is not None]
        if times:
            p(f"rejoin {kind:<13} max {max(got, default=float('nan')):.2f} s, median "
              f"{float(np.median(got)) if got else float('nan'):.2f} s over {len(got)}"
              + (f", {len(times) - len(got)} NEVER" if len(got) < len(times) else ""))
            if kind == "partition":
                p("                     " + " ".join(f"{x:.2f}" if x is not None else "NEVER"
                                                     for x in times))
    p("failures, by kind and reason (each explained by a fault of the kinds shown):")
    groups: dict[tuple, list[Failure]] = {}
    for f in soak.failures:
        groups.setdefault((f.kind, f.tree_wide, shape(f.reason)), []).append(f)
    by_id = {f.id: f for f in soak.faults}
    for (kind, wide, reason), fs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        causes = Counter(by_id[f.fault].kind if f.fault is not None else "UNEXPLAINED" for f in fs)
        p(f"  {len(fs):5d} {kind}{' (tree-wide)' if wide else ''} <- "
          + ", ".join(f"{k} {n}" for k, n in causes.most_common()) + f": {reason}")
    for f in doc["unexplained"]:
        p(f"  UNEXPLAINED {label(f['host'])} step {f['step']} at {f['at']:.1f} s {f['kind']}: "
          f"{f['reason']}")
    p("daemon   restarts  RSS MiB start -> end    fds start -> end    RSS growth over its longest "
      "run (warm -> end, steps)")
    for r in doc["memory"]:
        start, end, warm, last = r["start"], r["end"], r["warm"], r["warm_end"]
        growth = (f"{r['rss_growth_pct']:+.1f}% ({warm['rss_kib'] / 1024:.1f} -> "
                  f"{last['rss_kib'] / 1024:.1f} MiB, steps {warm['step']}..{last['step']})"
                  if warm else "n/a (no run lived past its warm-up)")
        if (r["max_rss_growth_pct"] or 0.0) > (r["rss_growth_pct"] or 0.0):
            growth += f"; largest of any run {r['max_rss_growth_pct']:+.1f}%"
        p(f"{r['daemon']:<8} {r['restarts']:>8}  {start['rss_kib'] / 1024:9.1f} -> "
          f"{end['rss_kib'] / 1024:5.1f}  {start['fds']:9d} -> {end['fds']:3d}    {growth}")
    p("verdict              " + ("OK" if not doc["verdict"] else "FAIL: " + "; ".join(doc["verdict"])))


# ---------------------------------------------------------------------- setting up

async def soak_main(args) -> int:
    tree = Tree.regular(args.fanout, args.layers, args.stragglers)
    use_netns = args.netns == "on" or (args.netns == "auto" and netns.requirements() is None)
    if args.netns == "on" and (why := netns.requirements()) is not None:
        print(f"soak: --netns on: {why}", file=sys.stderr)
        return 2
    if not use_netns and set(args.faults) == {"partition"}:
        print("soak: --faults partition alone needs network namespaces", file=sys.stderr)
        return 2
    if "partition" in args.faults and not use_netns:
        print("soak: no partitions: they need network namespaces "
              f"({netns.requirements() or '--netns off'}); loopback only", file=sys.stderr)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="crsoak-"))
    names = list(tree.names())
    cluster = None
    options: dict = dict(workdir=workdir, timeout=args.timeout, log_level="warning", strict=True,
                         keep_results=8)
    if use_netns:
        cluster = netns.EmulatedCluster(len(names), rate=None, prefix=args.netns_prefix).up()
        options.update(netns.hosting(cluster, names))
    lt = LocalTree(tree, SAMPLES, **options)
    soak = None
    try:
        lt.start(wait=60)
        soak = Soak(args, lt, cluster)
        await soak.run()
    finally:
        codes = lt.stop()
        if cluster is not None:
            cluster.down()
    elapsed = soak.now()
    problems = lt.problems()
    problems += [f"crnetd {label(n)} exited with {c} at the end" for n, c in codes.items()
                 if c not in (0, None) and n not in lt.killed]
    doc, verdict = report(soak, sorted(set(problems)), elapsed)
    print_report(doc, soak)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if verdict or args.workdir:
        print(f"daemon logs: {workdir / 'logs'}")
    else:   # a temporary directory of a run that passed: nothing in it to look at
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if verdict else 0


def _pair(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000, help="steps the tree runs (default 1000)")
    ap.add_argument("--fanout", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--stragglers", type=int, default=1, help="s: tolerated per parent, and the "
                    "most children of one parent in a fault at once")
    ap.add_argument("--timeout", type=float, default=2.0, help="crnetd --timeout (seconds)")
    ap.add_argument("--faults", default="kill,freeze-short,freeze-long,partition",
                    help="kinds to inject, comma-separated (default all; partition needs netns)")
    ap.add_argument("--gap", type=_pair, default=(0.5, 3.0), help="seconds between two faults: LOW,HIGH")
    ap.add_argument("--partition", type=_pair, default=(1.0, 6.0), help="seconds a link is down: LOW,HIGH")
    ap.add_argument("--compute-ms", type=float, default=5.0, help="a step's compute per process")
    ap.add_argument("--straggle-prob", type=float, default=0.1)
    ap.add_argument("--straggle-factor", type=float, default=10.0)
    ap.add_argument("--warmup", type=int, default=None,
                    help="steps after a daemon joined before its RSS baseline (default 5%% of "
                         "--steps, between 50 and 500)")
    ap.add_argument("--netns", choices=["auto", "on", "off"], default="auto",
                    help="a network namespace per daemon (root): auto = when possible")
    ap.add_argument("--netns-prefix", default="crs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None,
                    help="daemon logs and sockets, kept (default: a new temporary directory, "
                         "removed after a run that passed)")
    ap.add_argument("--json", default=None, help="write every fault, failure and reading here")
    args = ap.parse_args(argv)
    args.faults = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = set(args.faults) - {"kill", "freeze-short", "freeze-long", "partition"}
    if unknown or not args.faults:
        ap.error(f"--faults: unknown kinds {sorted(unknown)}" if unknown else "--faults: none given")
    if args.warmup is None:
        args.warmup = max(50, min(500, args.steps // 20))
    return asyncio.run(_until_signalled(soak_main(args)))


async def _until_signalled(coro):
    """Run ``coro``; SIGTERM or SIGINT cancels it, so its cleanup (daemons, namespaces) runs."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        print("soak: stopped by a signal; daemons and namespaces removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
