"""What it costs a training loop to look at the tree's progress between micro-batches.

    python -m benchmarks.bench_progress [--reads 1000000]

A real daemon (a one-worker tree on 127.0.0.1) writes the progress into shared memory;
this times ``Client.tree_step`` and ``Client.finished(step)`` through the public API,
best of 5 runs of ``--reads`` reads each.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from crnet import Client
from crnet.coding.plan import Tree
from crnet.tools.launch import LocalTree


def per_read(fn, reads: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(reads):
            fn()
        best = min(best, time.perf_counter() - started)
    return best / reads


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_progress")
    p.add_argument("--reads", type=int, default=1_000_000)
    a = p.parse_args()
    tree = Tree.regular(1, 1, 0)
    with LocalTree(tree, 4, log_level="warning") as lt, Client(lt.socket_path("0")) as c:
        c.allreduce(np.ones(4), step=0)           # the tree is at step 0
        loop = per_read(lambda: None, a.reads)    # the cost of the timing loop itself
        rows = [("c.tree_step", per_read(lambda: c.tree_step, a.reads)),
                ("c.finished(0)", per_read(lambda: c.finished(0), a.reads)),
                ("c.finished(1)", per_read(lambda: c.finished(1), a.reads))]
        assert c.tree_step == 0 and c.finished(0) and not c.finished(1)
    print(f"{'read':<16} {'ns per read':>12} {'minus the loop':>15}")
    for name, seconds in rows:
        print(f"{name:<16} {1e9 * seconds:12.0f} {1e9 * (seconds - loop):15.0f}")
    print(f"(best of 5 x {a.reads} reads; the empty loop costs {1e9 * loop:.0f} ns)")


if __name__ == "__main__":
    main()
