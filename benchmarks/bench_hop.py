"""One hop of the tree: a parent's aggregate receive throughput from n children.

What is measured
----------------
* ``crnet``: a one-layer tree ``Tree.regular(n, 1, 0)`` of real crnetd processes on
  127.0.0.1 (``crnet.tools.launch.LocalTree``). With s = 0 the master needs every byte of
  every child. Every child's training process (a blocking ``Client`` in a thread)
  submits a ``--mib`` MiB float32 vector at the same moment (a barrier), ``--steps``
  times per round. The master's own counters (read through a ``Client`` on the
  master's socket, which never submits) give

      throughput = delta bytes_up / delta receive_seconds

  where ``receive_seconds`` runs from the first child byte of a step to the
  master's decode of the last chunk, so it includes the master's decode and the
  RESULT chunks it streams back down while still receiving (s = 0: chunk c goes
  down as soon as all children's chunk c is in). Every result is checked against
  the exact sum (sample i's gradient is c_i * base, so it is cheap to build).
* ``crnet, client view`` (for context, not the target): n * vector bytes over the
  wall time from the barrier to the last client holding its result; this adds
  the result's trip back down and the shared-memory copies.
* ``baseline``: n plain sender *processes* (multiprocessing, spawn), each sending
  the same number of bytes per step with ``sendall`` over blocking TCP on
  127.0.0.1 to one receiver process that ``recv_into``s a preallocated buffer per
  sender, timed from the first byte received to the last. Two receivers are
  measured: ``selectors`` (one thread, non-blocking sockets) and ``threads`` (one
  blocking thread per connection); the faster one is the 100% reference.

crnet and the baselines are interleaved round by round, so drift on the machine
hits them alike; each row is the best of ``--repeat`` rounds (the median is shown
too). Before the first round come three unmeasured crnet steps (until then the
daemons are still allocating their result buffers, and on a VM those first-touch
page faults make a step up to 2x slower) and one transfer per baseline.

How to read it
--------------
``% of baseline`` is the share of raw loopback TCP receive bandwidth (the faster
of the two receivers) that the daemon achieves for the same byte count and the
same number of processes. On a small machine the processes share cores: the n
children (plus their training threads) and the parent compete exactly as the n
baseline senders and the receiver do.

The context table adds ``baseline + echo``: the threads receiver also sends every
byte it receives straight back to its sender, which reads it concurrently. That is
the byte count an s = 0 parent moves inside its receive window (the result goes
to every child while later chunks still arrive), with none of the daemon's own
work (decode, framing, buffer management), so it is roughly the ceiling for the
crnet row on a machine where the copies of both directions share the cores.
The per-round counter table shows how much of the receive window was decode.

Usage: python -m benchmarks.bench_hop [--children 3] [--mib 64] [--steps 5]
                                   [--chunk-mib auto|MiB ...] [--repeat 3] [--quick]
"""
from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing as mp
import os
import selectors
import socket
import statistics
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import numpy as np

from crnet import Client, defaults
from crnet.coding.plan import Tree
from crnet.schemes.chunks import AUTO, chunk_bytes_for
from crnet.tools.launch import MASTER, LocalTree

from ._machine import ForeignCpu, cpu_busy

MiB = 1 << 20


# --------------------------------------------------------------------------- crnet
class CrnetHop:
    """A running one-layer tree and its clients; ``round(steps)`` measures once."""

    def __init__(self, children: int, nbytes: int, chunk_bytes: int, samples: int,
                 secret: bool = False, tls=None, strict: bool = False):
        self.n = children
        self.dim = nbytes // 4
        self.tree = Tree.regular(children, 1, 0)
        self.lt = LocalTree(self.tree, samples, chunk_bytes=chunk_bytes, timeout=120.0,
                            keep_results=1, log_level="warning", secret=secret, tls=tls,
                            strict=strict)
        self.samples = samples
        self.step = 0
        self.clients: list[Client] = []
        self.master: Client | None = None

    def start(self) -> None:
        self.lt.start()
        names = [n for n in self.tree.names() if n != MASTER]
        self.clients = [Client(self.lt.socket_path(n), timeout=60) for n in names]
        # The master's client only reads counters: it never submits, so the master
        # does no result copy into shared memory for it.
        self.master = Client(self.lt.socket_path(MASTER), timeout=60)
        rng = np.random.default_rng(0)
        self.coef = rng.uniform(0.5, 1.5, self.samples)      # sample i's gradient: c_i * base
        self.base = (np.arange(self.dim) % 13 - 6).astype(np.float32)
        self.local = []
        for c in self.clients:
            w = sum(wt * self.coef[a:b].sum() for a, b, wt in c.assignment.ranges)
            self.local.append(np.float32(w))
        self.bufs = [c.buffer(self.dim, np.float32) for c in self.clients]  # shared input: no copy
        self.outs = [np.empty(self.dim, np.float32) for _ in self.clients]
        self.scratch = [np.empty(self.dim, np.float32) for _ in self.clients]
        for a in self.outs + self.scratch:
            a.fill(0)  # fault the pages in now, not inside a step

    def stop(self) -> None:
        for c in self.clients + ([self.master] if self.master else []):
            with contextlib.suppress(OSError):
                c.close()
        self.lt.stop()
        failed = self.lt.problems() if self.lt.strict else []
        if failed:   # --strict: a daemon's internal error fails the benchmark, naming its log
            raise SystemExit("bench_hop: a daemon failed (--strict):\n" + "\n".join(failed))

    def _steps(self, steps: int) -> list[float]:
        """``steps`` synchronized steps; returns each one's client-view wall time."""
        n = self.n
        started: list[float] = []
        # The action runs once per trip, when the last thread arrives, before any is released.
        go = threading.Barrier(n, action=lambda: started.append(time.perf_counter()))
        sync = threading.Barrier(n)
        done = [[0.0] * steps for _ in range(n)]
        errors: list[BaseException] = []
        first = self.step

        def work(i: int) -> None:
            c, buf, out = self.clients[i], self.bufs[i], self.outs[i]
            try:
                for t in range(steps):
                    step = first + t
                    scale = np.float32(1 + step % 7)       # a fresh vector every step
                    np.multiply(self.base, self.local[i] * scale, out=buf)
                    go.wait()
                    c.allreduce(buf, step=step, out=out, timeout=120)
                    done[i][t] = time.perf_counter()
                    sync.wait()                            # nobody checks while a step runs
                    self._check(out, self.scratch[i], scale)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)
                go.abort()
                sync.abort()

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]
        self.step += steps
        return [max(d[t] for d in done) - started[t] for t in range(steps)]

    def _check(self, out: np.ndarray, scratch: np.ndarray, scale: np.float32) -> None:
        """The result must be (sum_i c_i) * scale * base to float32 precision."""
        want = self.coef.sum() * float(scale)
        np.multiply(self.base, np.float32(want), out=scratch)  # no temporaries: no page faults
        np.subtract(out, scratch, out=scratch)
        err = float(np.max(np.abs(scratch, out=scratch)))
        tol = 1e-5 * max(1.0, abs(want) * 6)   # |base| <= 6
        if err > tol:
            raise AssertionError(f"result off by {err:.3g} (tolerance {tol:.3g})")

    def warm_up(self) -> None:
        """Until the daemons run in steady state. The master's client never asks for a
        result, so the master keeps every result for it up to --result-memory (it might
        catch up on them): until that is full, each step decodes into a fresh buffer
        and pays its first-touch page faults (half the hop's speed at 64 MiB)."""
        kept = -(-defaults.RESULT_MEMORY // (self.dim * 4))
        self._steps(3 + min(kept + 1, 64))   # (small vectors: their faults cost little)

    def round(self, steps: int) -> tuple[float, float, dict]:
        """(receive GB/s, client-view GB/s, counter deltas) over ``steps`` steps."""
        assert self.master is not None, "start() first"
        before = self.master.stats()["stats"]
        walls = self._steps(steps)
        after = self.master.stats()["stats"]
        delta = {k: after[k] - before[k] for k in ("bytes_up", "receive_seconds",
                                                    "decode_cpu_seconds", "steps_done")}
        if delta["steps_done"] != steps or delta["bytes_up"] != steps * self.n * self.dim * 4:
            raise AssertionError(f"unexpected counters {delta}")
        recv = delta["bytes_up"] / delta["receive_seconds"] / 1e9
        client = self.n * self.dim * 4 * steps / sum(walls) / 1e9
        delta["wall_seconds"] = sum(walls)
        return recv, client, delta


# --------------------------------------------------------------------------- baseline
def _sender(port: int, nbytes: int) -> None:
    """Baseline sender process: wait for a go byte, sendall nbytes, repeat until EOF.

    Go byte ``e`` (echo mode): also read nbytes back, concurrently, like a crnet
    child receiving the RESULT while it is still sending its message.
    """
    data = bytearray(nbytes)
    back = bytearray(nbytes)
    for b in (data, back):
        b[::4096] = b"\x01" * len(b[::4096])  # touch every page before timing
    view, back_view = memoryview(data), memoryview(back)
    with socket.create_connection(("127.0.0.1", port)) as s:
        while True:
            go = s.recv(1)
            if not go:
                return
            if go == b"e":
                th = threading.Thread(target=_recv_exactly, args=(s, back_view))
                th.start()
                s.sendall(view)
                th.join()
            else:
                s.sendall(view)


def _recv_exactly(s: socket.socket, view: memoryview) -> None:
    pos = 0
    while pos < len(view):
        got = s.recv_into(view[pos:])
        if got == 0:
            raise ConnectionError("peer went away")
        pos += got


def _recv_selectors(conns: list[socket.socket], bufs, nbytes) -> tuple[float, float]:
    sel = selectors.DefaultSelector()
    pos = {}
    for i, s in enumerate(conns):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
        pos[i] = 0
    views = [memoryview(b) for b in bufs]
    for s in conns:
        _send_go(s)
    first = math.inf  # until the first byte arrives
    left = len(conns)
    while left:
        for key, _ in sel.select():
            i = key.data
            try:
                got = conns[i].recv_into(views[i][pos[i]:])
            except BlockingIOError:
                continue
            if got == 0:
                raise ConnectionError("sender went away")
            if first == math.inf:
                first = time.perf_counter()
            pos[i] += got
            if pos[i] == nbytes:
                sel.unregister(key.fileobj)
                left -= 1
    last = time.perf_counter()
    sel.close()
    for s in conns:
        s.setblocking(True)
    return first, last


def _send_go(s: socket.socket) -> None:
    while True:
        try:
            s.send(b"g")
            return
        except BlockingIOError:
            time.sleep(0)


def _recv_threads(conns, bufs, nbytes, echo=False) -> tuple[float, float]:
    firsts = [math.inf] * len(conns)  # each connection's first byte
    lasts = [0.0] * len(conns)
    start = threading.Barrier(len(conns) + 1)

    def read(i):
        view, s, pos = memoryview(bufs[i]), conns[i], 0
        start.wait()
        while pos < nbytes:
            got = s.recv_into(view[pos:])
            if got == 0:
                raise ConnectionError("sender went away")
            if firsts[i] == math.inf:
                firsts[i] = time.perf_counter()
            if echo:  # send every received piece straight back (ends after the last echo)
                s.sendall(view[pos:pos + got])
            pos += got
        lasts[i] = time.perf_counter()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(conns))]
    for th in threads:
        th.start()
    start.wait()
    for s in conns:
        s.sendall(b"e" if echo else b"g")
    for th in threads:
        th.join()
    return min(firsts), max(lasts)


def _recv_echo(conns, bufs, nbytes) -> tuple[float, float]:
    return _recv_threads(conns, bufs, nbytes, echo=True)


def _receiver(listener: socket.socket, n: int, nbytes: int, pipe) -> None:
    """Baseline receiver process: accept n senders; then for every mode the main process
    asks for, one transfer of nbytes from every sender; sends back (first, last)."""
    conns = [listener.accept()[0] for _ in range(n)]
    bufs = [bytearray(nbytes) for _ in range(n)]
    for b in bufs:
        b[::4096] = b"\x01" * len(b[::4096])
    funcs = {"selectors": _recv_selectors, "threads": _recv_threads, "echo": _recv_echo}
    while True:
        mode = pipe.recv()
        if mode is None:
            break
        pipe.send(funcs[mode](conns, bufs, nbytes))
    for s in conns:
        s.close()


class Baseline:
    def __init__(self, n: int, nbytes: int):
        self.n, self.nbytes = n, nbytes
        self.ctx = mp.get_context("spawn")
        self.procs: list[BaseProcess] = []
        self.pipe: Connection | None = None

    def start(self) -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(self.n)
        port = listener.getsockname()[1]
        ours, theirs = self.ctx.Pipe()
        self.pipe = ours
        recv = self.ctx.Process(target=_receiver, args=(listener, self.n, self.nbytes, theirs),
                                daemon=True)
        recv.start()
        listener.close()
        self.procs.append(recv)
        for _ in range(self.n):
            p = self.ctx.Process(target=_sender, args=(port, self.nbytes), daemon=True)
            p.start()
            self.procs.append(p)

    def transfer(self, mode: str) -> float:
        """Seconds from the first to the last byte of one transfer from every sender."""
        assert self.pipe is not None, "start() first"
        self.pipe.send(mode)
        first, last = self.pipe.recv()
        return last - first

    def round(self, mode: str, steps: int) -> float:
        """Aggregate GB/s over ``steps`` transfers (bytes / summed windows), like crnet's."""
        secs = sum(self.transfer(mode) for _ in range(steps))
        return self.n * self.nbytes * steps / secs / 1e9

    def stop(self) -> None:
        if self.pipe is not None:
            with contextlib.suppress(OSError):
                self.pipe.send(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()


def chunk_label(chunk: int) -> str:
    return "auto" if chunk == AUTO else f"{chunk / MiB:g}MiB"


# --------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_hop",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="How to read it" + __doc__.split("How to read it")[1])
    ap.add_argument("--children", type=int, default=3, help="children of the parent (n)")
    ap.add_argument("--mib", type=float, default=64, help="vector size in MiB (float32)")
    ap.add_argument("--steps", type=int, default=5, help="allreduce steps per round")
    ap.add_argument("--chunk-mib", nargs="+", default=["auto"],
                    help="the tree's chunk size in MiB, or auto (crnetd's default, 4 MiB for "
                         "64 MiB vectors); several: one crnet tree each, same rounds (the curve)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; rows are the best round")
    ap.add_argument("--samples", type=int, default=None, help="batch size (default: children)")
    ap.add_argument("--secret", action="store_true",
                    help="authenticate the tree's links with a cluster secret (--secret-file)")
    ap.add_argument("--tls", action="store_true",
                    help="mutual TLS on the tree's links (a throwaway CA, benchmarks/certs.py)")
    ap.add_argument("--strict", action="store_true",
                    help="strict daemons: an internal error stops one (exit 70) and fails the "
                         "run, naming the daemon and its log (the tests run this way)")
    ap.add_argument("--quick", action="store_true",
                    help="tiny smoke run: 2 children, 4 MiB, 2 steps, 1 round")
    args = ap.parse_args()
    if args.quick:
        args.children, args.mib, args.steps, args.repeat, args.chunk_mib = 2, 4, 2, 1, ["1"]
    n = args.children
    nbytes = int(args.mib * MiB) // 4 * 4
    chunks = [AUTO if c == "auto" else max(1024, int(float(c) * MiB)) for c in args.chunk_mib]
    samples = args.samples or n
    print(f"bench_hop: {n} children -> 1 parent on 127.0.0.1, {nbytes / MiB:g} MiB float32 "
          f"per child per step, chunk {', '.join(map(chunk_label, chunks))} (auto here: "
          f"{chunk_bytes_for(nbytes) / MiB:g} MiB), {args.steps} steps per round, "
          f"best of {args.repeat} rounds"
          + ("; links authenticated (--secret-file)" if args.secret else "")
          + ("; mutual TLS" if args.tls else ""))
    busy = cpu_busy()
    print(f"{os.cpu_count()} CPUs; before starting, other processes kept "
          f"{'?' if busy is None else f'{100 * busy:.0f}%'} of them busy"
          + (" -- numbers will be noisy" if busy is not None and busy > 0.1 else ""))

    CRNETS = {c: "crnet" + (f" (chunk {chunk_label(c)})" if len(chunks) > 1 else "")
              + ": master bytes_up / receive_seconds" for c in chunks}
    CLIENTS = {c: "crnet" + (f" (chunk {chunk_label(c)})" if len(chunks) > 1 else "")
               + ", client view: n*bytes / step wall" for c in chunks}
    SEL = "baseline: selectors receiver"
    THR = "baseline: thread-per-connection receiver"
    ECHO = "baseline + echo: receiver sends it all back"
    tls = None
    if args.tls:
        import tempfile

        from .certs import make_cluster_certs
        tls = make_cluster_certs(tempfile.mkdtemp(prefix="crnet-certs-"))
    hops = {c: CrnetHop(n, nbytes, c, samples, secret=args.secret, tls=tls, strict=args.strict)
            for c in chunks}
    base = Baseline(n, nbytes)
    rows: dict[str, list[float]] = {name: [] for name in
                                    [*CRNETS.values(), SEL, THR, ECHO, *CLIENTS.values()]}
    deltas = []
    try:
        for hop in hops.values():
            hop.start()
        base.start()
        for hop in hops.values():
            hop.warm_up()
        for mode in ("selectors", "threads", "echo"):
            base.transfer(mode)  # warm-up
        for _ in range(args.repeat):
            foreign = ForeignCpu()
            ours = [p.pid for hop in hops.values() for p in hop.lt.procs.values()]
            foreign.start(ours + [p.pid for p in base.procs])
            for c, hop in hops.items():
                recv, client, delta = hop.round(args.steps)
                delta["chunk"] = c
                deltas.append(delta)
                rows[CRNETS[c]].append(recv)
                rows[CLIENTS[c]].append(client)
            rows[SEL].append(base.round("selectors", args.steps))
            rows[THR].append(base.round("threads", args.steps))
            rows[ECHO].append(base.round("echo", args.steps))
            foreign_share = foreign.stop()
            for d in deltas[-len(hops):]:
                d["foreign"] = foreign_share
    finally:
        base.stop()
        for hop in hops.values():
            hop.stop()

    best = {k: max(v) for k, v in rows.items()}
    ref_name = max((SEL, THR), key=best.__getitem__)
    ref = best[ref_name]
    w = max(len(k) for k in rows)

    def table(names):
        print(f"{'method':<{w}}  {'GB/s best':>9}  {'GB/s median':>11}  {'% of baseline':>13}")
        print(f"{'-' * w}  {'-' * 9}  {'-' * 11}  {'-' * 13}")
        for k in names:
            mark = "  (reference: the faster receiver)" if k == ref_name else ""
            print(f"{k:<{w}}  {best[k]:>9.2f}  {statistics.median(rows[k]):>11.2f}  "
                  f"{100 * best[k] / ref:>12.0f}%{mark}")

    print()
    table([*CRNETS.values(), SEL, THR])
    print()
    print("context (not the target):")
    print("  echo = the receiver also sends every byte straight back to its sender, which reads it")
    print("  concurrently: the byte count an s=0 master moves (it streams the result to every")
    print("  child while still receiving). client view = barrier -> last client holds its result.")
    table([ECHO, *CLIENTS.values()])
    print()
    print(f"{'method':<{w}}  % of echo (best; median)")
    for name in CRNETS.values():
        print(f"{name:<{w}}  {100 * best[name] / best[ECHO]:>5.0f}%; "
              f"{100 * statistics.median(rows[name]) / statistics.median(rows[ECHO]):.0f}%")
    print()
    print("master counters per round (deltas over the round's steps):")
    print(f"{'round':>5}  {'chunk':>6}  {'bytes_up MiB':>12}  {'receive s':>9}  "
          f"{'decode cpu s':>12}  "
          f"{'decode/receive':>14}  {'client wall s':>13}  {'others':>6}")
    for i, d in enumerate(deltas):
        others = "?" if d["foreign"] is None else f"{100 * d['foreign']:.0f}%"
        print(f"{i // len(hops):>5}  {chunk_label(d['chunk']):>6}  {d['bytes_up'] / MiB:>12.0f}  "
              f"{d['receive_seconds']:>9.3f}  "
              f"{d['decode_cpu_seconds']:>12.3f}  "
              f"{100 * d['decode_cpu_seconds'] / d['receive_seconds']:>13.0f}%  "
              f"{d['wall_seconds']:>13.3f}  {others:>6}")
    print("others: share of all CPUs used by processes outside this benchmark during the round")
    print("        (crnet and baselines together); anything but ~0% means that round was disturbed.")
    print("\n(GB = 1e9 bytes; every crnet result was checked against the exact sum.)")


if __name__ == "__main__":
    main()
