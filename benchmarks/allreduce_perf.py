"""Back-to-back allreduce per vector size and scheme, as nccl-tests' all_reduce_perf prints it.

    python -m benchmarks.allreduce_perf [--hosts 4] [--schemes rar,spread,spread-direct,cr,gloo]
        [--sizes 1M 16M 64M] [--dtype float32] [--steps N] [--rounds 3] [--mtu 1500]
        [--rate 10gbit] [--secret] [--json out.json] [--plot busbw.png]

What runs: for every round, size and scheme (the schemes alternating, so that a busy machine
weighs on all of them alike), a tree of its own of ``--hosts`` crnetd processes on 127.0.0.1
(with ``--mtu``, as root: each in a network namespace of its own, on unshaped veth links of
that MTU, ``benchmarks/netns.py``; with ``--rate`` too, each link shaped to that rate both
ways with tbf, as ``python -m benchmarks`` shapes its presets' links; on veth the daemons
share a cluster secret, on 127.0.0.1 only with ``--secret``: with one, spread checks every
chunk of its sum a host relays, docs/spread.md):
``crnet.tools.launch.LocalTree``, the master and ``hosts - 1`` workers, one layer, no
stragglers (``spread-direct``: spread with the master's ``--spread-sum direct``, its sum
straight from every owner, not round the ring); and on every host one training process (a
process of its own, the blocking ``Client``, as a user's would be, on its zero-copy path:
the vector in ``Client.buffer``,
the sum into ``Client.result_buffer``). Each step all of them meet at a barrier, then call
``allreduce`` at once; the master's process (which adds nothing in cr and spread) takes
the result too. Every result is checked against the exact sum (integers in
float32: exact whatever the order of the additions). ``gloo`` is PyTorch's Gloo
``all_reduce`` (its ring, for CPU tensors) between ``--hosts`` processes on the same hosts, all
of them contributing (``benchmarks/gloo_peer.py``: back to back, each step's sum checked);
it is there where torch is installed (the ``bench`` extra), and has no daemons.

Per size and scheme it prints (the median step over ``--steps`` measured steps, after
``--warmup``; the best round's median, and the spread of the rounds):

* time: from the last process leaving the barrier (Gloo: calling all_reduce) to the last
  holding its result;
* algbw: vector bytes / time; busbw: algbw x 2(N-1)/N, N the hosts (nccl-tests' bus
  bandwidth for allreduce: what each link must carry, comparable across host counts);
* failed: steps that raised (StepFailed, StepLost, a timeout) instead of a result;
* exact: every result equal to the exact sum;
* CPU per step: the daemons' (all of them, /proc, over the tree's whole run) and the
  training processes' inside their allreduce calls (Gloo's peers': inside all_reduce, from
  their second step on), all hosts together; CPU ns/B: both per byte of the vector.

``--plot FILE``: busbw against size, one line per scheme (the best round's). Sizes are
bytes of the vector (``1M`` = 2^20 bytes). Exit 1 if any step failed or any result was
wrong; 2 on bad options.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from crnet.coding.plan import Tree
from crnet.tools.launch import LocalTree, free_port

from . import netns
from .bench_step import parse_size
from .runner import cpu_seconds

SCHEMES = ("rar", "spread", "spread-direct", "cr", "gloo")
# A scheme name beyond crnetd's own: the scheme and the master's options it runs with.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "spread-direct": ("spread", {"spread_sum": "direct"})}
def default_steps(nbytes: int) -> int:
    return 40 if nbytes <= 1 << 20 else 20 if nbytes <= 16 << 20 else 8


def host(name: str, socket_path: str, sizes: list[int], dtype: str, steps: dict, warmup: int,
         barrier, out) -> None:
    """One host's training process: every size's steps; (starts, ends, failed, wrong, CPU)
    per size to ``out``."""
    from crnet import Client, CrnetError

    dt = np.dtype(dtype)
    c = Client(socket_path, timeout=120)
    # Every sample's gradient is base: this host's vector is its share's weight x base, and
    # the sum every host gets is the batch's size x base.
    weight = sum(w * (b - a) for a, b, w in c.assignment.ranges)
    samples = c.assignment.samples
    step = 0
    report = []
    for nbytes in sizes:
        n = nbytes // dt.itemsize
        base = (np.arange(n) % 13 - 6).astype(dt)
        # The zero-copy path of the client's docs: the gradient computed into the shared
        # input, the sum read from the shared output (Gloo's all_reduce is in place).
        vec = c.buffer(n, dt)
        res = c.result_buffer(n, dt)
        starts, ends, failed, wrong = [], [], 0, 0
        cpu = 0.0   # this process's CPU inside allreduce, measured steps only
        for t in range(warmup + steps[nbytes]):
            scale = 1 + step % 5
            np.multiply(base, dt.type(weight * scale), out=vec)
            barrier.wait()
            t0, c0 = time.monotonic(), time.process_time()
            try:
                c.allreduce(vec, step=step, out=res, timeout=120)
            except CrnetError:
                ok = False
            else:
                ok = True
            t1, c1 = time.monotonic(), time.process_time()
            step += 1
            if t >= warmup:
                starts.append(t0)
                ends.append(t1)
                failed += not ok
                cpu += c1 - c0
            barrier.wait()    # nobody checks while a step runs
            if ok and t >= warmup:
                wrong += not np.array_equal(res, base * dt.type(samples * scale))
        report.append(dict(starts=starts, ends=ends, failed=failed, wrong=wrong, cpu=cpu))
    c.close()
    out.put((name, report))


def run_tree(scheme: str, hosts: int, sizes: list[int], dtype: str, steps: dict,
             warmup: int, timeout: float, cluster=None, secret: bool | None = None) -> list[dict]:
    """``cluster``: an ``EmulatedCluster`` whose hosts the daemons run on (the training
    processes stay here: their daemons' sockets are files). ``secret``: a cluster secret
    (default: on veth, not on 127.0.0.1, as ``LocalTree`` does)."""
    tree = Tree.regular(hosts - 1, 1, 0)
    names = list(tree.names())
    crnetd, options = VARIANTS.get(scheme, (scheme, {}))
    lt = LocalTree(tree, hosts - 1, scheme=crnetd, timeout=timeout, log_level="warning",
                   secret=secret, **options,
                   **({} if cluster is None else netns.hosting(cluster, names)))
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(names))
    out = ctx.Queue()
    procs = []
    try:
        lt.start(wait=60)
        daemons = [lt.procs[n].pid for n in names]
        cpu0 = cpu_seconds(daemons)
        for name in names:
            p = ctx.Process(target=host, args=(name, lt.socket_path(name), sizes, dtype, steps,
                                               warmup, barrier, out), daemon=True)
            p.start()
            procs.append(p)
        reports = dict(out.get(timeout=1800) for _ in names)
        daemon_cpu = cpu_seconds(daemons) - cpu0
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        lt.stop()
    rows = []
    total_steps = sum(steps[s] for s in sizes)
    for i, nbytes in enumerate(sizes):
        per = [reports[n][i] for n in names]
        k = steps[nbytes]
        times = [max(r["ends"][t] for r in per) - max(r["starts"][t] for r in per)
                 for t in range(k)]
        med = statistics.median(times)
        rows.append(dict(scheme=scheme, bytes=nbytes, hosts=hosts, time=med,
                         algbw=nbytes / med, busbw=nbytes / med * 2 * (hosts - 1) / hosts,
                         failed=max(r["failed"] for r in per), wrong=sum(r["wrong"] for r in per),
                         daemon_cpu=daemon_cpu / (total_steps + warmup * len(sizes)),
                         client_cpu=sum(r["cpu"] for r in per) / k))
    return rows


def run_gloo(hosts: int, nbytes: int, dtype: str, steps: int, warmup: int,
             timeout: float, cluster=None) -> dict:
    """PyTorch's Gloo: ``hosts`` peers (on ``cluster``'s hosts, else 127.0.0.1),
    ``warmup + steps`` all_reduce back to back."""
    from .gloo_run import run_gloo as gloo

    def spawn(i: int, argv: list, env: dict) -> subprocess.Popen:
        start = subprocess.Popen if cluster is None else (
            lambda argv, **kw: cluster.popen(i, argv, **kw))
        return start(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    where = ["127.0.0.1"] * hosts if cluster is None else cluster.addresses
    ifnames = None if cluster is None else [cluster.interface] * hosts
    with tempfile.TemporaryDirectory(prefix="crnet-perf-gloo-") as workdir:
        got = gloo(spawn, where, ifnames, elements=nbytes // np.dtype(dtype).itemsize,
                   dtype=dtype, steps=warmup + steps, compute="fixed:0", loads=[1] * hosts,
                   seed=0, deadline=3600.0, timeout=timeout, workdir=Path(workdir),
                   port=free_port())
    records = [r for r in got["records"] if r is not None]
    done = got["steps_completed"]
    times = [max(r["completion_times"][t] for r in records) - max(r["start_times"][t] for r in records)
             for t in range(warmup, done)] if len(records) == hosts else []
    med = statistics.median(times) if times else float("nan")
    # Each peer's CPU inside all_reduce per step from its step 1 on (gloo_peer: step 0 holds
    # the start-up), summed over the peers, as the crnet rows sum their processes'.
    per_step = [r["cpu_allreduce_s"] / r["cpu_steps"] for r in records if r.get("cpu_steps")]
    return dict(scheme="gloo", bytes=nbytes, hosts=hosts, time=med, algbw=nbytes / med,
                busbw=nbytes / med * 2 * (hosts - 1) / hosts,
                failed=warmup + steps - done, wrong=0 if got["correct"] else 1,
                daemon_cpu=None, client_cpu=sum(per_step) if len(per_step) == hosts else None)


def fmt_bytes(n: int) -> str:
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= f:
            return f"{n / f:g}{unit}"
    return str(n)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def cpu_per_byte(row: dict) -> str:
    """Every host's CPU for one step (daemons and processes) per byte of the vector, in ns."""
    if row["client_cpu"] is None:
        return "-"
    return f"{(row['client_cpu'] + (row['daemon_cpu'] or 0.0)) / row['bytes'] * 1e9:.2f}"


def print_table(results: dict, sizes: list[int], schemes: list[str], hosts: int,
                where: str) -> None:
    print(f"\nallreduce, {hosts} hosts, {where}; the best round's median step "
          "(all rounds' medians in brackets)")
    print(f"{'size':>6} {'scheme':>13} {'time ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11} "
          f"{'failed':>7} {'exact':>6} {'daemons CPU ms':>15} {'procs CPU ms':>13} "
          f"{'CPU ns/B':>9}  rounds ms")
    for nbytes in sizes:
        for s in schemes:
            rows = results[(s, nbytes)]
            best = min(rows, key=lambda r: r["time"])
            print(f"{fmt_bytes(nbytes):>6} {s:>13} {best['time'] * 1e3:9.2f} "
                  f"{best['algbw'] / 1e9:11.3f} {best['busbw'] / 1e9:11.3f} "
                  f"{sum(r['failed'] for r in rows):7d} "
                  f"{'yes' if not any(r['wrong'] for r in rows) else 'NO':>6} "
                  f"{_ms(best['daemon_cpu']):>15} {_ms(best['client_cpu']):>13} "
                  f"{cpu_per_byte(best):>9}  "
                  + "[" + ", ".join(f"{r['time'] * 1e3:.1f}" for r in rows) + "]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.allreduce_perf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=4, help="crnetd processes, the master included")
    ap.add_argument("--schemes", default=",".join(
        s for s in SCHEMES if s != "gloo" or importlib.util.find_spec("torch") is not None),
        help=f"from {','.join(SCHEMES)} (default: all; gloo where torch is installed)")
    ap.add_argument("--sizes", nargs="+", default=["1M", "16M", "64M"],
                    help="vector bytes (K, M, G suffixes: powers of 2)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--steps", type=int, default=None, help="measured steps per size")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=30.0, help="crnetd --timeout")
    ap.add_argument("--mtu", type=int, default=None,
                    help="hosts in network namespaces on unshaped veth links of this MTU (root), "
                         "instead of 127.0.0.1")
    ap.add_argument("--rate", default=None,
                    help="shape every link to this rate with tbf (e.g. 1gbit, 10gbit; root; "
                         "MTU 1500 unless --mtu)")
    ap.add_argument("--secret", action="store_true",
                    help="a cluster secret on 127.0.0.1 too, as every deployment has (veth: always); "
                         "with it spread checks its relayed sums (docs/spread.md)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="busbw against size, one line per scheme (PNG)")
    args = ap.parse_args(argv)
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    if not schemes or set(schemes) - set(SCHEMES):
        ap.error(f"--schemes: from {', '.join(SCHEMES)}")
    if "gloo" in schemes and importlib.util.find_spec("torch") is None:
        ap.error("--schemes: gloo needs torch (pip install -e '.[bench]')")
    if args.hosts < 2:
        ap.error("--hosts: at least 2")
    itemsize = np.dtype(args.dtype).itemsize
    sizes = [parse_size(s) for s in args.sizes]
    if any(s < itemsize * args.hosts for s in sizes):
        ap.error("--sizes: each at least one element per host")
    steps = {s: args.steps or default_steps(s) for s in sizes}
    results: dict = {(s, n): [] for s in schemes for n in sizes}
    cluster = None
    where = "127.0.0.1"
    if args.rate is not None:
        try:
            netns.tbf_args(args.rate)
        except ValueError as e:
            ap.error(f"--rate: {e}")
    if args.mtu is not None or args.rate is not None:
        if (why := netns.requirements()) is not None:
            ap.error(f"--{'mtu' if args.mtu is not None else 'rate'}: {why}")
        mtu = args.mtu or 1500
        cluster = netns.EmulatedCluster(args.hosts, rate=args.rate, mtu=mtu, prefix="crp").up()
        where = f"{'unshaped' if args.rate is None else args.rate} veth, MTU {mtu}"
    try:
        run_rounds(args, schemes, sizes, steps, results, cluster)
    finally:
        if cluster is not None:
            cluster.down()
    print_table(results, sizes, schemes, args.hosts, where)
    if args.plot:
        why = plot(results, sizes, schemes, args.hosts, where, Path(args.plot))
        if why is not None:
            print(f"no plot: {why}", file=sys.stderr)
    if args.json:
        with contextlib.suppress(OSError):
            Path(args.json).write_text(json.dumps(
                [dict(r, round=i) for rows in results.values() for i, r in enumerate(rows)],
                indent=1))
    bad = any(r["failed"] or r["wrong"] for rows in results.values() for r in rows)
    return 1 if bad else 0


def plot(results: dict, sizes: list[int], schemes: list[str], hosts: int, where: str,
         path: Path) -> str | None:
    """busbw (the best round's) against the vector's size, one line per scheme; None, or why
    there is no plot."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for s in schemes:
        best = [min(results[(s, n)], key=lambda r: r["time"]) for n in sizes]
        ax.plot(sizes, [r["busbw"] / 1e9 for r in best], marker="o", label=s)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [fmt_bytes(n) for n in sizes])
    ax.set_xlabel("vector size")
    ax.set_ylabel("busbw GB/s")
    ax.set_title(f"allreduce, {hosts} hosts, {where}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def run_rounds(args, schemes: list[str], sizes: list[int], steps: dict, results: dict,
               cluster) -> None:
    for r in range(args.rounds):
        order = schemes if r % 2 == 0 else schemes[::-1]
        for nbytes in sizes:
            for scheme in order:   # a tree per size: its daemons' CPU is that size's
                t0 = time.monotonic()
                if scheme == "gloo":
                    results[(scheme, nbytes)].append(run_gloo(
                        args.hosts, nbytes, args.dtype, steps[nbytes], args.warmup, args.timeout,
                        cluster))
                else:
                    for row in run_tree(scheme, args.hosts, [nbytes], args.dtype, steps,
                                        args.warmup, args.timeout, cluster,
                                        True if args.secret else None):
                        results[(scheme, row["bytes"])].append(row)
                print(f"round {r + 1}: {fmt_bytes(nbytes)} {scheme} in "
                      f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
