"""The per-frame cost of the hot path, in one process: encode, read, parse, reduce.

What is measured
----------------
Microseconds per frame (best of ``--repeat`` rounds of ``--frames`` frames, one core)
for the pieces every ring part and tree chunk goes through, on a 16-element SEGMENT
(so the bytes cost nothing and only the per-frame work is left):

* ``encode``: ``Segment.frame(payload)``: the header map, msgpack, the prefix.
* ``read (reference)`` / ``read (compiled)``: ``wire.PyFrameReader`` and
  ``wire.FrameReader`` (``crnet/protocol/_frames.pyx``) taking the frame's bytes as a
  BufferedProtocol gets them (``get_buffer``, ``buffer_updated``, ``awaiting``) and
  handing over the header and the payload's destination.
* ``parse``: ``messages.parse``: the typed, validated message.
* ``add_into (50 kB)``: ``kernels.add_into`` of a ring part of 12,500 float32.

On a machine whose cores are shared by 40 processes (the bandwidth preset) each of
these costs two to three times as much (cold caches); the ratios hold.

Usage: python -m benchmarks.bench_frames [--frames 200000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from crnet.coding.kernels import add_into
from crnet.protocol.messages import parse
from crnet.protocol.wire import FrameReader, PyFrameReader
from crnet.schemes.ring_allreduce.messages import Phase, Segment


def per_frame(fn, frames: int, repeat: int) -> float:
    """Best microseconds per call of ``fn`` over ``repeat`` rounds of ``frames`` calls."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(frames):
            fn()
        best = min(best, (time.perf_counter() - t0) / frames)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_frames",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    payload = np.zeros(16, np.float32)
    msg = Segment(5, Phase.REDUCE, 3, 7, 1_000_000, "float32", 2)
    data = b"".join(bytes(part) for part in msg.frame(payload))
    dest = memoryview(bytearray(payload.nbytes))
    rows = [("encode", per_frame(lambda: msg.frame(payload), args.frames, args.repeat))]
    for name, cls in (("read (reference)", PyFrameReader), ("read (compiled)", FrameReader)):
        delivered: list = []

        def on_frame(msg_type, header, payload, got=delivered) -> None:
            got.append(msg_type)
        reader = cls(lambda t, h, n: dest, on_frame)

        def read(reader=reader):
            buf = reader.get_buffer(-1)
            buf[:len(data)] = data
            reader.buffer_updated(len(data))
            return reader.awaiting
        rows.append((name, per_frame(read, args.frames, args.repeat)))
        assert len(delivered) == args.frames * args.repeat, "a frame was not delivered"
    header = msg.header()
    rows.append(("parse", per_frame(lambda: parse(msg.TYPE, header, payload.nbytes),
                                    args.frames, args.repeat)))
    acc, part = np.zeros(12_500, np.float32), np.ones(12_500, np.float32)
    rows.append(("add_into (50 kB)", per_frame(lambda: add_into(acc, part),
                                               args.frames // 10, args.repeat)))
    print(f"bench_frames: a 16-element SEGMENT, best of {args.repeat} x {args.frames} frames")
    print(f"{'step':<18} {'us/frame':>9}")
    for name, us in rows:
        print(f"{name:<18} {us:>9.2f}")


if __name__ == "__main__":
    main()
