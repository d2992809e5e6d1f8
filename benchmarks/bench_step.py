"""Step time of a whole loopback CodedReduce tree, per vector size, with a breakdown.

What is measured
----------------
A ``Tree.regular(fanout, layers, stragglers)`` tree (default 3, 2, 1: 12 workers and
the master, 13 crnetd processes) runs on 127.0.0.1 via ``crnet.tools.launch.LocalTree``.
Every node's training process is a blocking ``Client`` in a thread of this
process (13 threads); for each float32 vector size (``--sizes``) they run
``--warmup`` unmeasured steps (default keep-results + 1: until then every daemon
is still growing its ring of kept results, and on a VM first-touch page faults
make those steps up to 3x slower), then ``steps`` measured steps. In each step all threads
meet at a barrier, then all submit (``allreduce`` of a vector already in the shared
input, with ``out=`` a preallocated array); the master's client submits too (its
share is empty) and receives the result like everyone else. Sample i's gradient is
c_i * base, so local vectors are cheap and every client's result is checked
against the exact sum after the step (outside the timing).

* step time: from the barrier tripping (everything ready to submit) to the last
  of the 13 clients holding its result (median over the measured steps). It
  includes the daemons' result copy into shared memory and the client's copy out.
* throughput: vector bytes / median step time.
* decode: the critical path of decoding is roughly leaf -> its layer-1 parent's
  decode -> ... -> master's decode, so for every step we take, for every layer
  that decodes (0..layers-1), the max over its nodes of their ``decode_cpu_seconds``
  increment in that step (CPU time: a daemon descheduled mid-decode does not
  count), add them up (default: master + slowest layer-1 node), and report the
  median over the steps. (Every client reads its daemon's counters after every
  step, outside the timing.) With s > 0 the slowest layer-1 node may be one the
  master did not wait for, so this leans high.
* transfer (estimate): bytes that cross the busiest link per step divided by a
  single-stream loopback TCP bandwidth measured in the same run (one sender
  process, one receiver). See ``transfer_estimate`` for why this and not the
  master's ``receive_seconds``.
* other = step time - decode - transfer: scheduling 13 daemons + 13 client
  threads on the machine's cores, the other links' copies that share those
  cores, shared-memory copies, Python overhead, pipeline fill.

How to read it
--------------
Small vectors measure latency (a step is a few round trips through 13 processes:
mostly "other"); large vectors measure how close the tree gets to moving and
decoding its bytes. ``all links`` is context, not part of the breakdown: the bytes
of every link (each carries one vector up and one down per step) over the same
loopback bandwidth -- on a machine with fewer cores than busy daemons, all links
share the CPUs that do loopback "transfer", so when step time approaches it the
tree is bound by the machine's memory copies, not by the protocol.

Memory: per vector size V bytes the run holds roughly 110 V (13 daemons with their
kept results, receive buffers and shared memory, 13 clients' output arrays), so
16M float32 (64 MiB) needs about 7 GiB; sizes that do not fit in MemAvailable are
skipped with a message. Daemons keep ``--keep-results`` (default 2) results.

Usage: python -m benchmarks.bench_step [--sizes 1K 16K 256K 1M 4M 16M] [--fanout 3]
          [--layers 2] [--stragglers 1] [--chunk-mib auto|MiB] [--steps N] [--quick]
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import socket
import statistics
import threading
import time

import numpy as np

from crnet import Client
from crnet.coding.plan import Tree
from crnet.schemes.chunks import AUTO, chunk_bytes_for
from crnet.tools.launch import MASTER, LocalTree

from ._machine import ForeignCpu, cpu_busy

MiB = 1 << 20
SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
DEFAULT_SIZES = ["1K", "16K", "256K", "1M", "4M", "16M"]
MEMORY_FACTOR = 110  # bytes held per vector byte, see the module docstring


def parse_size(text: str) -> int:
    """'16M' -> 16 * 2**20 elements; plain integers are taken as they are."""
    text = text.strip().upper()
    if text and text[-1] in SUFFIX:
        return int(float(text[:-1]) * SUFFIX[text[-1]])
    return int(text)


def fmt_size(n: int) -> str:
    for s, f in (("M", SUFFIX["M"]), ("K", SUFFIX["K"])):
        if n >= f and n % f == 0:
            return f"{n // f}{s}"
    return str(n)


def default_steps(elems: int) -> int:
    """Fewer steps for big vectors: ~2 s of measured steps at the large end."""
    if elems <= 64 * 1024:
        return 30
    if elems <= 256 * 1024:
        return 20
    if elems <= 1 << 20:
        return 12
    if elems <= 4 << 20:
        return 10
    return 8


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


# --------------------------------------------------------------------------- loopback
def _stream_sender(port: int, nbytes: int, times: int) -> None:
    data = bytearray(nbytes)
    data[::4096] = b"\x01" * len(data[::4096])
    with socket.create_connection(("127.0.0.1", port)) as s:
        for _ in range(times):
            s.recv(1)
            s.sendall(data)


def loopback_bandwidth(nbytes: int, times: int) -> float:
    """Best-of-``times`` single-stream TCP bandwidth over 127.0.0.1, bytes/s.

    One spawned sender process, this process receiving into a preallocated buffer;
    each transfer is timed from the go byte to the last byte received.
    """
    ctx = mp.get_context("spawn")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        proc = ctx.Process(target=_stream_sender,
                           args=(listener.getsockname()[1], nbytes, times + 1), daemon=True)
        proc.start()
        conn, _ = listener.accept()
    buf = bytearray(nbytes)
    buf[::4096] = b"\x01" * len(buf[::4096])
    view = memoryview(buf)
    best = 0.0
    try:
        with conn:
            for i in range(times + 1):  # the first transfer warms up
                conn.sendall(b"g")
                t0 = time.perf_counter()
                pos = 0
                while pos < nbytes:
                    got = conn.recv_into(view[pos:])
                    if not got:
                        raise ConnectionError("loopback sender went away")
                    pos += got
                if i:
                    best = max(best, nbytes / (time.perf_counter() - t0))
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return best


def transfer_estimate(tree: Tree, vec_bytes: int, bandwidth: float) -> tuple[float, float]:
    """(busiest link, all links) seconds per step for ``vec_bytes`` vectors.

    Every link of a CodedReduce tree carries one full-length vector up (the
    child's coded message) and one down (the result goes to every child, the
    stragglers included), so the busiest link moves 2 V per step. On loopback
    both directions are CPU copies, hence 2 V, not V, over the single-stream
    bandwidth. With chunk pipelining the hops overlap, so this is the transfer a
    step cannot avoid on its critical path.

    Why not the master's ``receive_seconds``: it runs from the first child byte
    at the master to the master's last decode, so it contains the master's decode,
    the layer-1 nodes' decode (they send only after decoding) and every wait in
    between: subtracting it and the decode share would count decode twice, and
    what remains would not be transfer. It is shown as a context column instead.
    """
    links = tree.workers
    return 2 * vec_bytes / bandwidth, links * 2 * vec_bytes / bandwidth


# --------------------------------------------------------------------------- the tree
class StepBench:
    def __init__(self, tree: Tree, samples: int, chunk_bytes: int, keep_results: int,
                 secret: bool = False, tls=None, strict: bool = False):
        self.tree = tree
        self.names = list(tree.names())
        self.lt = LocalTree(tree, samples, chunk_bytes=chunk_bytes, timeout=120.0,
                            keep_results=keep_results, log_level="warning", secret=secret,
                            tls=tls, strict=strict)
        self.samples = samples
        self.step = 0
        self.clients: dict[str, Client] = {}

    def start(self) -> None:
        self.lt.start(wait=60)
        self.clients = {n: Client(self.lt.socket_path(n), timeout=90) for n in self.names}
        self.coef = np.random.default_rng(0).uniform(0.5, 1.5, self.samples)
        self.weight = {n: float(sum(w * self.coef[a:b].sum() for a, b, w in c.assignment.ranges))
                       for n, c in self.clients.items()}

    def stop(self) -> None:
        for c in self.clients.values():
            with contextlib.suppress(OSError):
                c.close()
        self.lt.stop()
        failed = self.lt.problems() if self.lt.strict else []
        if failed:   # --strict: a daemon's internal error fails the benchmark, naming its log
            raise SystemExit("bench_step: a daemon failed (--strict):\n" + "\n".join(failed))

    def run_size(self, elems: int, steps: int, warmup: int = 1) -> dict:
        """``warmup`` unmeasured steps, then ``steps`` measured ones: times and counters."""
        base = (np.arange(elems) % 13 - 6).astype(np.float32)
        names = self.names
        k = len(names)
        warmup = max(1, warmup)
        total = warmup + steps
        first = self.step
        t_done = {n: [0.0] * total for n in names}
        client_cpu = {n: [0.0] * total for n in names}   # each allreduce's CPU in its thread
        counters: dict[str, list[dict]] = {n: [] for n in names}  # each daemon's, after each step
        errors: list[BaseException] = []

        t_start: list[float] = []
        # The action runs once per barrier trip, before any thread is released.
        go = threading.Barrier(k, action=lambda: t_start.append(time.perf_counter()))
        sync = threading.Barrier(k)

        def work(name: str) -> None:
            c = self.clients[name]
            try:
                buf = c.buffer(elems, np.float32)      # shared input: no copy on submit
                out = np.empty(elems, np.float32)
                scratch = np.empty(elems, np.float32)  # for checking without temporaries
                out.fill(0)                            # fault the pages in outside the timing
                scratch.fill(0)
                w = np.float32(self.weight[name])
                for t in range(total):
                    step = first + t
                    scale = np.float32(1 + step % 7)   # a fresh vector every step
                    np.multiply(base, w * scale, out=buf)
                    go.wait()
                    cpu0 = time.thread_time()
                    c.allreduce(buf, step=step, out=out, timeout=120)
                    t_done[name][t] = time.perf_counter()
                    client_cpu[name][t] = time.thread_time() - cpu0
                    sync.wait()                        # nobody checks while a step runs
                    # Final for this step: a daemon answers DONE only once it resolved it.
                    counters[name].append(c.stats()["stats"])
                    want = self.coef.sum() * float(scale)
                    np.multiply(base, np.float32(want), out=scratch)
                    np.subtract(out, scratch, out=scratch)
                    err = float(np.max(np.abs(scratch, out=scratch)))
                    if err > 1e-5 * max(1.0, 6 * abs(want)):
                        raise AssertionError(f"{name or 'master'} step {step}: off by {err:.3g}")
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)
                go.abort()
                sync.abort()

        threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in names]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]
        self.step += total
        windows = [(t_start[t], max(t_done[n][t] for n in names)) for t in range(warmup, total)]
        step_times = [end - start for start, end in windows]
        # per_step[n][i]: daemon n's counter increments during measured step i
        per_step = {n: [{key: counters[n][t][key] - counters[n][t - 1][key]
                         for key in ("decode_cpu_seconds", "receive_seconds", "steps_done")}
                        for t in range(warmup, total)]
                    for n in names}
        for n, rows in per_step.items():
            done = sum(row["steps_done"] for row in rows)
            if done != steps:
                raise AssertionError(f"{n or 'master'} finished {done} of {steps} steps")
        calls = [client_cpu[n][t] for n in names for t in range(warmup, total)]
        return {"times": step_times, "windows": windows, "per_step": per_step,
                "client_cpu": statistics.median(calls)}


def critical_decode(tree: Tree, row: dict) -> float:
    """One step's decode on the critical path: per decoding layer, the slowest node."""
    return sum(max(row[n]["decode_cpu_seconds"] for n in tree.names() if tree.layer(n) == layer)
               for layer in range(tree.layers))


def step_rows(per_step: dict, i: int) -> dict:
    return {n: rows[i] for n, rows in per_step.items()}


# --------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_step",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="How to read it" + __doc__.split("How to read it")[1])
    ap.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES,
                    help="float32 vector lengths (K/M suffixes are powers of 2)")
    ap.add_argument("--fanout", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--stragglers", type=int, default=1)
    ap.add_argument("--samples", type=int, default=60, help="global batch size")
    ap.add_argument("--chunk-mib", default="auto",
                    help="the tree's chunk size in MiB, or auto (crnetd's default: 1 MiB up to "
                         "16 MiB vectors, then 1/16 of the vector up to 4 MiB)")
    ap.add_argument("--steps", type=int, default=None,
                    help="measured steps per size (default: 30 for small .. 4 for 16M)")
    ap.add_argument("--keep-results", type=int, default=2, help="results each daemon keeps")
    ap.add_argument("--warmup", type=int, default=None,
                    help="unmeasured steps per size (default: keep-results + 1)")
    ap.add_argument("--secret", action="store_true",
                    help="authenticate the tree's links with a cluster secret (--secret-file)")
    ap.add_argument("--tls", action="store_true",
                    help="mutual TLS on the tree's links (a throwaway CA, benchmarks/certs.py)")
    ap.add_argument("--strict", action="store_true",
                    help="strict daemons: an internal error stops one (exit 70) and fails the "
                         "run, naming the daemon and its log (the tests run this way)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: sizes 1K and 64K, 3 steps each (well under 30 s)")
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.steps = ["1K", "64K"], 3
    sizes = [parse_size(s) for s in args.sizes]
    tree = Tree.regular(args.fanout, args.layers, args.stragglers)
    chunk = AUTO if args.chunk_mib == "auto" else max(1024, int(float(args.chunk_mib) * MiB))

    avail = mem_available()
    runnable = []
    for elems in sizes:
        need = MEMORY_FACTOR * elems * 4 * (len(list(tree.names())) / 13)
        if need > 0.8 * avail:
            print(f"skipping {fmt_size(elems)}: needs ~{need / 2**30:.1f} GiB, "
                  f"{avail / 2**30:.1f} GiB available")
        else:
            runnable.append(elems)
    busy = cpu_busy()
    print(f"bench_step: tree fanout {list(tree.fanout)}, stragglers {list(tree.stragglers)} "
          f"({tree.workers} workers + master), {args.samples} samples, chunk "
          f"{'auto' if chunk == AUTO else f'{chunk / MiB:g} MiB'}, "
          f"MemAvailable {avail / 2**30:.1f} GiB")
    print(f"{os.cpu_count()} CPUs; before starting, other processes kept "
          f"{'?' if busy is None else f'{100 * busy:.0f}%'} of them busy"
          + (" -- numbers will be noisy" if busy is not None and busy > 0.1 else ""))

    bw_bytes = 16 * MiB if args.quick else 64 * MiB
    bandwidth = loopback_bandwidth(bw_bytes, 3 if args.quick else 5)
    print(f"single-stream loopback TCP: {bandwidth / 1e9:.2f} GB/s "
          f"(best of {3 if args.quick else 5} x {bw_bytes // MiB} MiB)")

    warmup = args.warmup if args.warmup is not None else args.keep_results + 1
    tls = None
    if args.tls:
        import tempfile

        from .certs import make_cluster_certs
        tls = make_cluster_certs(tempfile.mkdtemp(prefix="crnet-certs-"))
    print("links: " + ("mutual TLS, " if args.tls else "")
          + ("authenticated" if args.secret else "no secret"))
    bench = StepBench(tree, args.samples, chunk, args.keep_results, secret=args.secret, tls=tls,
                      strict=args.strict)
    results = []
    try:
        bench.start()
        for elems in runnable:
            steps = args.steps or default_steps(elems)
            foreign = ForeignCpu()
            foreign.start(p.pid for p in bench.lt.procs.values())
            r = bench.run_size(elems, steps, warmup)
            r["foreign"] = foreign.stop()
            r["cpu"] = {name: foreign.used.get(proc.pid, 0.0) / (steps + warmup)
                        for name, proc in bench.lt.procs.items()}
            r["cpu"]["bench"] = foreign.used.get(os.getpid(), 0.0) / (steps + warmup)
            results.append((elems, steps, r))
            used = chunk_bytes_for(4 * elems, chunk) / MiB
            print(f"  {fmt_size(elems):>5}: {warmup} warm-up + {steps} steps, chunks of "
                  f"{used:g} MiB, median "
                  f"{1e3 * statistics.median(r['times']):.2f} ms", flush=True)
    finally:
        bench.stop()

    print()
    hdr = (f"{'size':>5} {'MiB':>7} {'steps':>5} {'median ms':>10} {'min ms':>8} {'max ms':>8} "
           f"{'GB/s':>6} | {'decode ms':>9} {'%':>4} {'transfer ms':>11} {'%':>4} "
           f"{'other ms':>9} {'%':>4} | {'all links ms':>12} {'master recv ms':>14} {'others':>6}")
    print(hdr)
    print("-" * len(hdr))
    for elems, steps, r in results:
        nbytes = 4 * elems
        med = statistics.median(r["times"])
        # Medians over the steps, so one step that got descheduled doesn't skew the split.
        dec = statistics.median(critical_decode(tree, step_rows(r["per_step"], i))
                                for i in range(steps))
        xfer, all_links = transfer_estimate(tree, nbytes, bandwidth)
        other = med - dec - xfer
        recv = statistics.median(row["receive_seconds"] for row in r["per_step"][MASTER])
        others = "?" if r["foreign"] is None else f"{100 * r['foreign']:.0f}%"
        print(f"{fmt_size(elems):>5} {nbytes / MiB:>7.3f} {steps:>5} {1e3 * med:>10.2f} "
              f"{1e3 * min(r['times']):>8.2f} {1e3 * max(r['times']):>8.2f} {nbytes / med / 1e9:>6.3f} | "
              f"{1e3 * dec:>9.2f} {100 * dec / med:>3.0f}% {1e3 * xfer:>11.2f} {100 * xfer / med:>3.0f}% "
              f"{1e3 * other:>9.2f} {100 * other / med:>3.0f}% | "
              f"{1e3 * all_links:>12.2f} {1e3 * recv:>14.2f} {others:>6}")
    print()
    print("decode per step by layer, ms (median over steps of the layer's slowest node and of")
    print("its mean; CPU time of the decode kernels, so a daemon descheduled mid-decode does")
    print("not count), and the worst step's critical-path decode:")
    cols = "".join(f" {f'L{l} max':>9} {f'L{l} mean':>9}" for l in range(tree.layers))
    print(f"{'size':>5}{cols} {'worst step':>10}")
    for elems, steps, r in results:
        line = f"{fmt_size(elems):>5}"
        for layer in range(tree.layers):
            nodes = [n for n in tree.names() if tree.layer(n) == layer]
            per = [[r["per_step"][n][i]["decode_cpu_seconds"] * 1e3 for n in nodes]
                   for i in range(steps)]
            line += (f" {statistics.median(max(p) for p in per):>9.2f}"
                     f" {statistics.median(statistics.mean(p) for p in per):>9.2f}")
        worst = max(critical_decode(tree, step_rows(r["per_step"], i)) for i in range(steps))
        print(f"{line} {1e3 * worst:>10.2f}")
    print()
    print("CPU per step, ms (each process's user + system time over the size's steps, warm-up")
    print("included, each client's stats request and check too), and one allreduce's CPU in")
    print("its client thread (median):")
    layers = [f"L{l} daemon" for l in range(tree.layers + 1)]
    print(f"{'size':>5}" + "".join(f" {name:>10}" for name in layers)
          + f" {'clients':>8} {'all':>7} {'allreduce us':>12}")
    for elems, _, r in results:
        cpu = r["cpu"]
        line = f"{fmt_size(elems):>5}"
        for layer in range(tree.layers + 1):
            line += f" {1e3 * statistics.mean(cpu[n] for n in tree.names() if tree.layer(n) == layer):>10.2f}"
        print(f"{line} {1e3 * cpu['bench']:>8.2f} {1e3 * sum(cpu.values()):>7.2f} "
              f"{1e6 * r['client_cpu']:>12.0f}")
    print("(clients: this process, the 13 client threads; all: every process of the run;")
    print(" per step, so a 2-core machine needs at least all / 2 of wall time for it)")
    print()
    print("step time: barrier -> last of all clients (master's included) holding its result;")
    print("           GB/s = vector bytes / median step time.")
    print("decode: median over steps of (sum over decoding layers of the slowest node's")
    print("        decode_cpu_seconds increment in that step: CPU time, not wall clock).")
    print("transfer: 2 x vector bytes (busiest link: one vector up, one down) / loopback GB/s.")
    print("other: the rest. all links: every link's 2 x vector bytes / loopback GB/s (context).")
    print("master recv: median of the master's receive_seconds per step (first child byte ->")
    print("             its last decode).")
    print("others: share of all CPUs that processes outside this benchmark used while the size")
    print("        ran (anything but ~0% means that row was disturbed; counted in clock ticks,")
    print("        so it is rough for rows that take well under a second).")
    print("(GB = 1e9 bytes; every client's result was checked against the exact sum.)")


if __name__ == "__main__":
    main()
