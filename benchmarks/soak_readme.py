"""The README-loop soak: real training processes on a tree of real daemons, a fault every 20 s.

    python -m benchmarks.soak_readme --scheme cr --minutes 30 [--fanout 3 --layers 2
        --stragglers 1] [--timeout 2] [--every 20] [--faults daemon,freeze,process,link]
        [--netns auto|on|off] [--seed 1] [--json out.json]

What runs: ``crnet.tools.launch.LocalTree`` (13 daemons for the default tree, each in its own
network namespace of ``benchmarks.netns`` as root, else on 127.0.0.1) and on every host,
the master's included, one training process (``benchmarks.readme_trainer``: the README's
``train`` as printed, the blocking ``Client``, exact gradients). The promise it checks
(docs/faults.md): no single fault of a daemon or a training process ends the job or makes
replicas differ; every call returns within --timeout + grace; after the fault the job goes
on within 10 s.

Faults, one at a time, every --every seconds, victim and kind drawn (--seed) from:

* ``daemon``: SIGKILL a host's crnetd (the master's too), start it again 0.5-2 s later;
* ``freeze``: SIGSTOP a host's crnetd for 0.2-1.0 x --timeout, then SIGCONT;
* ``process``: SIGKILL a host's training process, start it again 0.3-2 s later (as a
  supervisor would: the same command; it joins stale and takes the state);
* ``link`` (netns only): a host's link down for 1-4 s, then up again.

After each fault the soak waits until every process is past the step the furthest one was
on when the fault ended ("the job went on"); the seconds that took are its recovery.

The run has --steps steps, or with --minutes as many as its first --calibrate seconds say
the pace allows (x 1.15 for the faults' cost). The verdict fails (exit 1) on: a process
that raised or exited unasked (the job ended early), replicas that differ from
single-process training over the steps they applied (by more than 1e-9 of the largest
parameter) or from each other (in any bit), one allreduce longer than
--timeout + grace + 0.5 s (the trip), a recovery over 10 s, a daemon that died unasked or
logged a traceback. Exit 2 on bad options.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from crnet.coding.plan import Tree
from crnet.node.steps.settings import EngineSettings
from crnet.tools.launch import LocalTree

from . import child_env, netns
from .fuzz_trainers import gradients
from .readme_trainer import single_process, updates

RECOVERY_LIMIT = 10.0   # seconds: the job going on later than this after a fault fails the run
TRIP = 0.5              # seconds a call may take beyond the daemon's bound (its way there and back)
KINDS = ("daemon", "freeze", "process", "link")
TOLERANCE = 1e-9        # a replica's largest error against single-process training, relative
LR = 0.5


def label(name: str) -> str:
    return LocalTree.filename(name)


class Trainers:
    """The training processes, one per host, each restartable in its seat."""

    def __init__(self, lt: LocalTree, out: Path, spec: dict, env: dict):
        self.lt, self.out, self.spec, self.env = lt, out, spec, env
        self.procs: dict[str, subprocess.Popen] = {}
        self.lives: Counter = Counter()
        self.killed: set[int] = set()     # pids this soak killed on purpose

    def start(self, name: str) -> None:
        self.lives[name] += 1
        spec = dict(self.spec, name=name, socket=self.lt.socket_path(name),
                    life=self.lives[name], out=str(self.out))
        with open(self.out / f"{label(name)}.log", "ab") as log:   # the child keeps its own
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.readme_trainer", json.dumps(spec)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        self.killed.add(proc.pid)
        proc.kill()
        proc.wait()

    def step(self, name: str) -> int:
        try:
            return int((self.out / f"{label(name)}.step").read_text())
        except (OSError, ValueError):
            return -1

    def steps(self) -> dict[str, int]:
        return {n: self.step(n) for n in self.procs}

    def unasked(self) -> list[str]:
        """Processes that ended with an error, or that exited on their own before the end."""
        return [f"the training process on {label(n)} exited with {p.returncode}"
                for n, p in self.procs.items()
                if p.poll() is not None and p.returncode != 0 and p.pid not in self.killed]

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs.values())

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


class Soak:
    def __init__(self, args, lt: LocalTree, cluster, trainers: Trainers):
        self.args, self.lt, self.cluster, self.trainers = args, lt, cluster, trainers
        self.rng = random.Random(args.seed)
        self.names = list(lt.tree.names())
        self.host_of = {n: i for i, n in enumerate(self.names)}
        self.kinds = [k for k in args.faults if k != "link" or cluster is not None]
        self.faults: list[dict] = []
        self.problems: list[str] = []
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def check(self) -> None:
        """Stop at the first process that ended unasked: the job ended early."""
        if (bad := self.trainers.unasked()):
            raise JobEnded("; ".join(bad))

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.check()
            time.sleep(min(0.2, left))

    def run(self, steps: int) -> None:
        while min(self.trainers.steps().values()) < 10:   # every process in the job
            self.sleep(0.2)
        stop_at = steps - max(50, int(self.args.every * self.pace() * 2))
        while True:
            self.sleep(self.args.every)
            if max(self.trainers.steps().values()) >= stop_at or not self.trainers.running():
                break
            self.inject(self.rng.choice(self.kinds), self.rng.choice(self.names))
        while self.trainers.running():
            self.sleep(0.5)
        self.check()

    def pace(self) -> float:
        """Steps per second so far."""
        return max(1.0, max(self.trainers.steps().values()) / max(self.now(), 1.0))

    def inject(self, kind: str, victim: str) -> None:
        a, lt, t = self.args, self.lt, self.trainers
        fault: dict[str, Any] = dict(id=len(self.faults), kind=kind, victim=label(victim),
                     start=round(self.now(), 2), step=max(t.steps().values()))
        if kind == "daemon":
            lt.signal(victim, signal.SIGKILL)
            self.sleep(self.rng.uniform(0.5, 2.0))
            lt.start_node(victim)
            lt.wait_sockets([victim], 30)
        elif kind == "freeze":
            lt.signal(victim, signal.SIGSTOP)
            try:
                time.sleep(self.rng.uniform(0.2, 1.0) * a.timeout)
            finally:
                lt.signal(victim, signal.SIGCONT)
        elif kind == "process":
            t.kill(victim)
            self.sleep(self.rng.uniform(0.3, 2.0))
            t.start(victim)
        else:
            self.cluster.set_link(self.host_of[victim], False)
            try:
                time.sleep(self.rng.uniform(1.0, 4.0))
            finally:
                self.cluster.set_link(self.host_of[victim], True)
        ended = self.now()
        fault["held"] = round(ended - fault["start"], 2)
        target = max(t.steps().values())
        deadline = time.monotonic() + 60
        while min(t.steps().values()) <= target and time.monotonic() < deadline \
                and t.running():
            self.sleep(0.05)
        fault["recovery"] = round(self.now() - ended, 2) if t.running() else None
        self.faults.append(fault)
        print(f"[{fault['start']:7.1f} s] fault #{fault['id']} {kind:<7} {label(victim):<6} "
              f"step {fault['step']}: held {fault['held']:.1f} s, the job went on "
              f"{fault['recovery']} s after", file=sys.stderr, flush=True)


class JobEnded(RuntimeError):
    """A training process ended unasked: the job did not survive the fault."""


def outcome(args, out: Path, names: list[str], grads: np.ndarray, bound: float) -> dict:
    """Every host's last life, compared with single-process training; every slow call."""
    lives, waits = {}, []
    for name in names:
        files = sorted(out.glob(f"{label(name)}.life-*.json"),
                       key=lambda p: int(p.stem.rsplit("-", 1)[1]))
        all_lives = [json.loads(p.read_text()) for p in files]
        lives[name] = all_lives
        path = out / f"{label(name)}.waits"
        if path.exists():
            waits += [dict(json.loads(line), host=label(name))
                      for line in path.read_text().splitlines() if line]
    finished = {n: ls[-1] for n, ls in lives.items() if ls}
    missing = [label(n) for n in names if n not in finished]
    applied = {n: round(updates(np.array(d["w"]), grads, LR)) for n, d in finished.items()}
    differ, errors = [], []
    ref = next(iter(finished), "")     # the first host's replica: the others must equal it
    for n, d in finished.items():
        w = np.array(d["w"])
        want = single_process(grads, applied[n], LR)
        # Relative to the parameters' scale: a component whose exact gradient is 0 gathers
        # the decoding's rounding (real coefficients, ~1e-16 a step) over tens of thousands
        # of steps, which no per-element tolerance of a few ulps allows for.
        error = float(np.max(np.abs(w - want)) / max(1.0, float(np.max(np.abs(want)))))
        errors.append(error)
        if error > TOLERANCE or applied[n] != applied[ref] \
                or not np.array_equal(w, np.array(finished[ref]["w"])):
            differ.append(label(n))
    keys = ("calls", "failed_here", "tree_wide", "lost", "refused", "resyncs", "reconnects")
    total = {k: sum(d[k] for ls in lives.values() for d in ls) for k in keys}
    return dict(applied=sorted(set(applied.values())), differ=differ, missing=missing,
                max_relative_error=max(errors, default=None),
                waits_past_bound=waits, bound=bound,
                longest=max((d["longest"] for ls in lives.values() for d in ls), default=None),
                longest_state=max((d["longest_state"] for ls in lives.values() for d in ls),
                                  default=None),
                **total)


def soak_main(args) -> int:
    tree = Tree.regular(args.fanout, args.layers, args.stragglers)
    use_netns = args.netns == "on" or (args.netns == "auto" and netns.requirements() is None)
    if args.netns == "on" and (why := netns.requirements()) is not None:
        print(f"soak_readme: --netns on: {why}", file=sys.stderr)
        return 2
    if "link" in args.faults and not use_netns:
        print("soak_readme: no link cuts: they need network namespaces "
              f"({netns.requirements() or '--netns off'}); loopback only", file=sys.stderr)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="crsoak-readme-"))
    out = workdir / "trainers"
    out.mkdir(parents=True, exist_ok=True)
    names = list(tree.names())
    samples = 4 * len(names)
    bound = EngineSettings(timeout=args.timeout).answer_within + TRIP
    options: dict = dict(workdir=workdir, timeout=args.timeout, log_level="warning",
                         scheme=args.scheme)
    cluster = None
    if use_netns:
        cluster = netns.EmulatedCluster(len(names), rate=None, prefix=args.netns_prefix).up()
        options.update(netns.hosting(cluster, names))
    lt = LocalTree(tree, samples, **options)
    env = child_env()
    env.update(CRNET_WORLD_SIZE=str(len(names)))
    spec = dict(job=f"soak-{args.seed}-{int(time.time())}", steps=args.steps or 1 << 30,
                samples=samples, elements=args.elements, compute_ms=args.compute_ms,
                straggle_prob=args.straggle_prob, straggle_factor=args.straggle_factor,
                seed=args.seed, lr=LR, bound=bound)
    trainers = Trainers(lt, out, spec, env)
    soak = Soak(args, lt, cluster, trainers)
    ended_early = None
    try:
        lt.start(wait=60)
        steps = args.steps
        if steps is None:     # as many steps as --minutes hold at the pace of a first run
            steps = calibrate(args, lt, out, dict(spec, job=spec["job"] + "-pace"), env)
            print(f"soak_readme: {steps} steps for {args.minutes:g} minutes", file=sys.stderr)
        trainers.spec["steps"] = steps
        soak.t0 = time.monotonic()
        for name in names:
            trainers.start(name)
        try:
            soak.run(steps)
        except JobEnded as e:
            ended_early = str(e)
    finally:
        trainers.stop()
        if cluster is not None:
            for i in range(len(names)):
                with contextlib.suppress(Exception):
                    cluster.set_link(i, True)
        for name in names:
            if lt.alive(name):
                lt.signal(name, signal.SIGCONT)
        codes = lt.stop()
        if cluster is not None:
            cluster.down()
    elapsed = soak.now()
    grads = gradients(samples, args.elements)
    doc = dict(scheme=args.scheme, tree=dict(fanout=args.fanout, layers=args.layers,
                                             stragglers=args.stragglers),
               timeout=args.timeout, netns=use_netns, steps=steps, seconds=round(elapsed, 1),
               faults=soak.faults, by_kind=dict(Counter(f["kind"] for f in soak.faults)),
               lives=dict((label(n), k) for n, k in trainers.lives.items()),
               **outcome(args, out, names, grads, bound))
    problems = sorted(set(lt.problems())) + [
        f"crnetd {label(n)} exited with {c} at the end" for n, c in codes.items()
        if c not in (0, None) and n not in lt.killed]
    verdict = []
    if ended_early:
        verdict.append(f"the job ended early: {ended_early}")
    if doc["missing"]:
        verdict.append(f"no final parameters from {', '.join(doc['missing'])}")
    if doc["differ"]:
        verdict.append(f"replicas differ from single-process training: {', '.join(doc['differ'])}")
    if doc["waits_past_bound"]:
        verdict.append(f"{len(doc['waits_past_bound'])} calls waited past {bound:g} s")
    slow = [f for f in soak.faults if f["recovery"] is None or f["recovery"] > RECOVERY_LIMIT]
    if slow:
        verdict.append(f"{len(slow)} faults after which the job went on later than "
                       f"{RECOVERY_LIMIT:g} s")
    verdict += problems
    doc["verdict"] = verdict
    print_report(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if verdict or args.workdir:
        print(f"daemon and process logs: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if verdict else 0


def calibrate(args, lt: LocalTree, out: Path, spec: dict, env: dict) -> int:
    """Steps for --minutes: a job of its own without faults for --calibrate seconds, its pace
    x 1.15 for what the faults cost. (Its processes are stopped; the tree serves the next
    job as the first.)"""
    pace_dir = out / "pace"
    pace_dir.mkdir(exist_ok=True)
    t = Trainers(lt, pace_dir, dict(spec, steps=1 << 30), env)
    for name in lt.tree.names():
        t.start(name)
    try:
        while min(t.steps().values()) < 10:
            if t.unasked():
                raise JobEnded("; ".join(t.unasked()))
            time.sleep(0.2)
        first, began = max(t.steps().values()), time.monotonic()
        time.sleep(args.calibrate)
        pace = (max(t.steps().values()) - first) / (time.monotonic() - began)
    finally:
        t.stop()
    return int(pace * args.minutes * 60 * 1.15) + 100


def print_report(doc: dict) -> None:
    p = print
    p(f"README-loop soak: {doc['scheme']}, tree {doc['tree']}, --timeout {doc['timeout']:g}, "
      f"{'netns' if doc['netns'] else 'loopback'}: {doc['steps']} steps in "
      f"{doc['seconds'] / 60:.1f} min")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(doc["by_kind"].items()))
    p(f"faults               {len(doc['faults'])} ({kinds})")
    rec = [f["recovery"] for f in doc["faults"] if f["recovery"] is not None]
    if rec:
        p(f"job went on after    median {np.median(rec):.2f} s, longest {max(rec):.2f} s")
    p(f"steps applied        {doc['applied']} (of {doc['steps']}; the rest failed tree-wide)")
    err = doc["max_relative_error"]
    p(f"replicas differing   {len(doc['differ'])} (largest error against single-process "
      f"training {'-' if err is None else f'{err:.2g}'}, relative to the largest parameter)")
    p(f"allreduce calls      {doc['calls']}: failed here {doc['failed_here']}, tree-wide "
      f"{doc['tree_wide']}, lost {doc['lost']}, refused {doc['refused']}")
    p(f"state taken          {doc['resyncs']} times; reconnects {doc['reconnects']}; "
      f"process lives {sum(doc['lives'].values())} on {len(doc['lives'])} hosts")
    p(f"longest allreduce    {doc['longest']:.2f} s (bound {doc['bound']:g} s); waits past it "
      f"{len(doc['waits_past_bound'])}; longest request_state {doc['longest_state']:.2f} s")
    p("verdict              " + ("OK" if not doc["verdict"] else "FAIL: " + "; ".join(doc["verdict"])))


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    if not kinds or set(kinds) - set(KINDS):
        raise argparse.ArgumentTypeError(f"kinds from {', '.join(KINDS)}, comma-separated")
    return kinds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.soak_readme", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scheme", choices=["cr", "spread", "rar"], default="cr")
    ap.add_argument("--minutes", type=float, default=30.0,
                    help="how long the job runs (default 30), unless --steps")
    ap.add_argument("--steps", type=int, default=None, help="the job's steps (instead of --minutes)")
    ap.add_argument("--calibrate", type=float, default=20.0,
                    help="seconds of a first job that measure the pace for --minutes")
    ap.add_argument("--fanout", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--stragglers", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=2.0, help="crnetd --timeout (seconds)")
    ap.add_argument("--every", type=float, default=20.0, help="seconds between two faults")
    ap.add_argument("--faults", type=_kinds, default=list(KINDS),
                    help=f"kinds to draw from (default {','.join(KINDS)}; link needs netns)")
    ap.add_argument("--elements", type=int, default=4096, help="gradient length (float64)")
    ap.add_argument("--compute-ms", type=float, default=40.0, help="a step's compute per process")
    ap.add_argument("--straggle-prob", type=float, default=0.05)
    ap.add_argument("--straggle-factor", type=float, default=5.0)
    ap.add_argument("--netns", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--netns-prefix", default="crr")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None, help="logs, kept (default: a temporary directory, "
                    "removed after a run that passed)")
    ap.add_argument("--json", default=None, help="write the faults and counts here")
    args = ap.parse_args(argv)
    if args.steps is not None and args.steps < 100:
        ap.error("--steps: at least 100")
    return soak_main(args)


if __name__ == "__main__":
    sys.exit(main())
