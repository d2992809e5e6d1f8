"""examples/train_digits.py on an emulated cluster: crnet against DDP over Gloo (root).

    python -m benchmarks.bench_digits [--steps 100] [--rate 1gbit] [--compute-ms 16] \\
        [--straggle-prob 0.1] [--straggle-factor 10] [--straggle-groups 1] \\
        [--shapes 3,3:1,1 3,3:2,0] [--beyond-s fail [approximate]] [--patience S] [--out FILE]

One network namespace per host on a bridge, every link shaped (``benchmarks.netns``): for
crnet a ``crnetd`` and one training process per host (the master's included, as
``crnet run`` does), for DDP one training process per worker host, rank 0's host serving
the rendezvous. Three schemes: crnet's own loop on every shape; DDP on crnet (the
example's ``--ddp --backend crnet``: the DDP model on the ``"crnet"`` process group with
crnet's hook) on the first shape, placed as crnet's, torch's store on the master's host
(``--no-ddp-crnet`` leaves it out); and DDP over Gloo (``--no-ddp``). All run the very
same script with the same global batches, initial parameters and injected stragglers
(drawn from (seed, step, worker index)), so the table
compares the aggregation alone: mean step time, and wall-clock time to the target test
accuracy, measured by rank 0 from the end of step 0. ``--beyond-s fail approximate`` runs
crnet's loop on every shape once per mode of the master's ``--beyond-s`` (with
``--patience``, if given), each run's row saying how many steps had an approximate result
and their mean coverage; with ``--straggle-groups G`` the stragglers are correlated (groups
of G workers slow together: the example's ``--straggle-groups``). The namespaces are deleted at the
end, also on error or Ctrl-C. Needs the ``examples`` extra (scikit-learn, tqdm) next to
the ``bench`` one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from crnet.coding.plan import Tree
from crnet.tools.launch import LocalTree
from crnet.tools.procs import stop_processes
from crnet.tools.run import seats, training_env

from . import ROOT, child_env
from .netns import EmulatedCluster, hosting, requirements

EXAMPLE = ROOT / "examples" / "train_digits.py"
DDP_PORT = 29500
LIMIT = 900.0           # seconds one training run may take, start-up included


def parse_shape(text: str) -> Tree:
    """``3,3:1,1``: fanout per layer, then stragglers per layer."""
    fanout, _, stragglers = text.partition(":")
    return Tree(tuple(int(x) for x in fanout.split(",")),
                tuple(int(x) for x in (stragglers or "0").split(",")))


def script_args(a: argparse.Namespace, out: Path) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--steps", str(a.steps), "--dtype", a.dtype,
            "--straggle-prob", str(a.straggle_prob), "--straggle-factor", str(a.straggle_factor),
            "--straggle-groups", str(a.straggle_groups),
            "--compute-ms", str(a.compute_ms), "--target", str(a.target), "--seed", str(a.seed),
            "--json", str(out)]


def _start(cluster: EmulatedCluster, host: int, argv: list[str], env: dict, log: Path
           ) -> subprocess.Popen:
    with open(log, "wb") as f:          # the child keeps its own copy of the descriptor
        return cluster.popen(host, argv, env=env, stdin=subprocess.DEVNULL, stdout=f,
                             stderr=subprocess.STDOUT)


def _finish(procs: list[subprocess.Popen], logs: list[Path], out: Path) -> dict:
    """Wait for every process (up to LIMIT); rank 0's record, or an error with a log's end."""
    deadline = time.monotonic() + LIMIT
    try:
        for p in procs:
            p.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        stop_processes(procs, grace=5.0)
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed or not out.exists():
        i = failed[0] if failed else 0
        tail = logs[i].read_text(errors="replace")[-2000:]
        return {"error": f"process {i} exited with {procs[i].returncode}:\n{tail}"}
    return json.loads(out.read_text())


def run_crnet(cluster: EmulatedCluster, tree: Tree, a: argparse.Namespace, workdir: Path,
              ddp: bool = False, beyond_s: str = "fail") -> dict:
    """A crnetd and one training process per host; the master is host 0. ``ddp``: the
    example's DDP on crnet, torch's store served by rank 0 on the master's host.
    ``beyond_s``: the master's --beyond-s (approximate: with ``a.patience`` if given)."""
    names = list(tree.names())
    host_of = {name: i for i, name in enumerate(names)}
    workdir.mkdir(parents=True, exist_ok=True)
    beyond = {"beyond_s": beyond_s, **({"patience": a.patience}
                                       if beyond_s == "approximate" and a.patience else {})}
    lt = LocalTree(tree, a.samples, workdir=workdir, log_level="warning", **beyond,
                   **hosting(cluster, names))
    out = workdir / "rank0.json"
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []
    try:
        lt.start(wait=60)
        job = f"bench-digits-{uuid.uuid4().hex[:8]}"
        everyone = seats(tree)
        argv = [*script_args(a, out), *(["--ddp", "--backend", "crnet"] if ddp else [])]
        for seat in everyone:
            env = child_env(dict(os.environ, PYTHONUNBUFFERED="1",
                                 **training_env(seat, lt.socket_path(seat.host), job, len(everyone),
                                                master_port=DDP_PORT)))
            env["MASTER_ADDR"] = cluster.addresses[host_of[everyone[0].host]]
            logs.append(workdir / f"rank{seat.rank}.log")
            procs.append(_start(cluster, host_of[seat.host], argv, env, logs[-1]))
        return _finish(procs, logs, out)
    finally:
        stop_processes(procs, grace=5.0)
        lt.stop()


def run_ddp(cluster: EmulatedCluster, workers: int, a: argparse.Namespace, workdir: Path) -> dict:
    """One DDP rank per worker host (hosts 1..N); rank 0's host serves the rendezvous."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "rank0.json"
    procs: list[subprocess.Popen] = []
    logs: list[Path] = []
    try:
        for rank in range(workers):
            env = child_env(dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                                 RANK=str(rank), WORLD_SIZE=str(workers), LOCAL_RANK="0",
                                 LOCAL_WORLD_SIZE="1", MASTER_ADDR=cluster.addresses[1],
                                 MASTER_PORT=str(DDP_PORT), GLOO_SOCKET_IFNAME=cluster.interface))
            logs.append(workdir / f"rank{rank}.log")
            argv = [*script_args(a, out), "--ddp", "--samples", str(a.samples)]
            procs.append(_start(cluster, rank + 1, argv, env, logs[-1]))
        return _finish(procs, logs, out)
    finally:
        stop_processes(procs, grace=5.0)


def summary(name: str, r: dict) -> dict:
    if "error" in r:
        return {"name": name, "error": r["error"]}
    steps = np.diff(np.asarray(r["seconds"]))
    coverage = list((r.get("approximate_coverage") or {}).values())
    return {"name": name, "workers": r["workers"], "steps": len(r["seconds"]),
            "approximate_steps": r.get("approximate"),   # None: not a crnet loop
            "mean_coverage": float(np.mean(coverage)) if coverage else None,
            "mean_s": float(steps.mean()), "p50_s": float(np.median(steps)),
            "p95_s": float(np.percentile(steps, 95)), "target_step": r["target_step"],
            "target_s": r["target_s"], "final_accuracy": r["final_test_accuracy"],
            "final_accuracy_tail": r.get("final_test_accuracy_tail"),
            "stragglers_injected": r["stragglers_injected"], "step_times": steps.tolist()}


def _accuracy(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def table(rows: list[dict], target: float) -> str:
    head = (f"{'run':30} {'workers':>7} {'mean step':>10} {'median':>9} {'p95':>9} "
            f"{f'{target:.0%} at':>8} {'in':>8} {'final acc':>9} {'last 10':>7} "
            f"{'approx':>6} {'coverage':>8}")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['name']:30} failed: {r['error'].splitlines()[0]}")
            continue
        reached = r["target_step"] is not None
        approx, cov = r.get("approximate_steps"), r.get("mean_coverage")
        lines.append(f"{r['name']:30} {r['workers']:>7} {1e3 * r['mean_s']:>8.1f}ms "
                     f"{1e3 * r['p50_s']:>7.1f}ms {1e3 * r['p95_s']:>7.1f}ms "
                     f"{'step ' + str(r['target_step']) if reached else '-':>8} "
                     f"{(format(r['target_s'], '.2f') + ' s') if reached else '-':>8} "
                     f"{r['final_accuracy']:>9.4f} {_accuracy(r['final_accuracy_tail']):>7} "
                     f"{'-' if approx is None else approx:>6} "
                     f"{'-' if cov is None else format(cov, '.3f'):>8}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_digits", description=__doc__)
    p.add_argument("--shapes", nargs="+", default=["3,3:1,1", "3,3:2,0"],
                   help="crnet trees, fanout:stragglers per layer (3,3:2,0 is plan --auto's pick)")
    p.add_argument("--samples", type=int, default=240)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--straggle-prob", type=float, default=0.1)
    p.add_argument("--straggle-factor", type=float, default=10.0)
    p.add_argument("--straggle-groups", type=int, default=1, metavar="G",
                   help="stragglers slowed together in groups of G consecutive workers "
                        "(--straggle-prob per group); in a tree of fanout n, G = n is the "
                        "children of one parent")
    p.add_argument("--beyond-s", nargs="+", choices=["fail", "approximate"], default=["fail"],
                   help="crnet's loop runs once per mode of crnetd's --beyond-s (master), in "
                        "this order: e.g. fail approximate")
    p.add_argument("--patience", type=float, default=None,
                   help="crnetd's --patience (seconds per layer below a parent) in the "
                        "approximate runs (default: the daemons')")
    p.add_argument("--compute-ms", type=float, default=16.0,
                   help="emulated compute per micro-batch of 8 samples (train_digits.py's default)")
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", default="1gbit",
                   help="every host link, both directions ('none': unshaped veths)")
    p.add_argument("--no-ddp", action="store_true", help="leave DDP over Gloo out")
    p.add_argument("--no-ddp-crnet", action="store_true", help="leave DDP on crnet out")
    p.add_argument("--out", default="bench_digits.json")
    a = p.parse_args(argv)
    missing = requirements()
    if missing:
        sys.exit(f"bench_digits needs an emulated cluster: {missing}")
    trees = [parse_shape(s) for s in a.shapes]
    workers = {t.workers for t in trees}
    if len(workers) != 1:
        sys.exit(f"every shape must have the same number of workers, got {sorted(workers)}")
    n = workers.pop()
    # SIGTERM unwinds like Ctrl-C, so the namespaces are deleted on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    rows: list[dict] = []
    groups = f" in groups of {a.straggle_groups}" if a.straggle_groups > 1 else ""
    print(f"digits CNN, {n} workers, {a.samples} samples per step, {a.steps} steps, stragglers "
          f"p = {a.straggle_prob:g} x{a.straggle_factor:g}{groups}, {a.compute_ms:g} ms per 8 "
          f"samples, links {a.rate}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bd-") as tmp, \
            EmulatedCluster(n + 1, rate=None if a.rate == "none" else a.rate) as cluster:
        for shape, tree in zip(a.shapes, trees):
            for mode in a.beyond_s:
                name = f"crnet cr {shape.replace(':', ' s ')}" + (f" {mode}" if a.beyond_s != ["fail"]
                                                                  else "")
                print(f"  {name} ...", flush=True)
                rows.append(summary(name, run_crnet(cluster, tree, a, Path(tmp) / f"cr{len(rows)}",
                                                    beyond_s=mode)))
        if not a.no_ddp_crnet:
            name = f"ddp on crnet {a.shapes[0].replace(':', ' s ')}"
            print(f"  {name} ...", flush=True)
            rows.append(summary(name, run_crnet(cluster, trees[0], a, Path(tmp) / "ddpcr", ddp=True)))
        if not a.no_ddp:
            print("  ddp gloo ...", flush=True)
            rows.append(summary("ddp (gloo ring)", run_ddp(cluster, n, a, Path(tmp) / "ddp")))
    print(table(rows, a.target))
    Path(a.out).write_text(json.dumps({"args": vars(a), "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
