"""Benchmark crnet.coding.kernels.coded_sum against numpy and against a plain copy.

For each vector size and input count k it reports an effective bandwidth,
counting (k+1) * bytes moved (k vectors read, one written) over the best of
``--repeat`` timed runs after one warm-up run, for

* ``coded_sum``: the compiled one-pass kernel;
* numpy: what a numpy user would write, ``np.multiply(x0, c0, out=out)``
  then ``out += c * x`` for the other inputs (same byte count, for
  comparability, although numpy really moves more: every ``c * x`` is a
  full-size temporary);
* ``np.copyto(dst, src)`` (2 * bytes): the machine's practical streaming
  bandwidth, measured in the same run as the ceiling to compare against.

Usage: python -m benchmarks.bench_kernels [--sizes 1M 16M 64M] [--repeat 5]
"""
from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import numpy as np

from crnet.coding import kernels

DTYPE = np.float32
SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'16M' -> 16 * 2**20 elements; plain integers are taken as they are."""
    text = text.strip().upper()
    if text and text[-1] in SUFFIX:
        return int(float(text[:-1]) * SUFFIX[text[-1]])
    return int(text)


def best_time(fn: Callable[[], None], repeat: int) -> float:
    fn()  # warm-up: page faults, caches, lazy allocation
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def numpy_loop(out: np.ndarray, coeffs: list[float], inputs: list[np.ndarray]) -> None:
    np.multiply(inputs[0], coeffs[0], out=out)
    for c, x in zip(coeffs[1:], inputs[1:]):
        out += c * x


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_kernels",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["1M", "16M", "64M"],
                    help="vector lengths in float32 elements (K/M/G suffixes are powers of 2)")
    ap.add_argument("--ks", nargs="+", type=int, default=[1, 2, 4, 8],
                    help="numbers of inputs to sum")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per case (best is kept)")
    args = ap.parse_args()

    if not kernels.HAVE_CYTHON:
        print("WARNING: crnet.coding._core is not built; timing the NumPy fallback")
    itemsize = np.dtype(DTYPE).itemsize
    header = (f"{'elements':>10} {'k':>2} {'coded_sum GB/s':>15} {'numpy GB/s':>11} "
              f"{'speedup vs numpy':>17} {'% of copyto':>12} {'copyto GB/s':>12}")
    print(f"float32, best of {args.repeat} after warm-up; GB = 1e9 bytes")
    print(header)
    print("-" * len(header))
    for size in map(parse_size, args.sizes):
        nbytes = size * itemsize
        # Filled (not np.empty) so every page is mapped before timing starts;
        # distinct nonzero values keep denormals and zero pages out of the way.
        inputs = [np.full(size, 1.0 + j / 8, dtype=DTYPE) for j in range(max(args.ks))]
        coeffs = [0.5 + j / 16 for j in range(max(args.ks))]
        out = np.full(size, 1.0, dtype=DTYPE)

        # The copy is timed before and after the k rows and the faster one
        # kept, so drift during the run cannot flatter the "% of copyto".
        copy = functools.partial(np.copyto, out, inputs[0])
        copy_s = best_time(copy, args.repeat)
        rows = []
        for k in args.ks:
            xs, cs = inputs[:k], coeffs[:k]
            ours_s = best_time(functools.partial(kernels.coded_sum, out, cs, xs), args.repeat)
            numpy_s = best_time(functools.partial(numpy_loop, out, cs, xs), args.repeat)
            rows.append((k, ours_s, numpy_s))
        copy_s = min(copy_s, best_time(copy, args.repeat))
        copy_bw = 2 * nbytes / copy_s / 1e9
        for k, ours_s, numpy_s in rows:
            moved = (k + 1) * nbytes
            ours_bw, numpy_bw = moved / ours_s / 1e9, moved / numpy_s / 1e9
            print(f"{size:>10} {k:>2} {ours_bw:>15.1f} {numpy_bw:>11.1f} "
                  f"{numpy_s / ours_s:>16.2f}x {100 * ours_bw / copy_bw:>11.0f}% "
                  f"{copy_bw:>12.1f}", flush=True)
        del inputs, out, copy


if __name__ == "__main__":
    main()
