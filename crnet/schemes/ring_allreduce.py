"""Ring allreduce at one worker: reduce-scatter, then all-gather (the RAR baseline).

Free of sockets. The vector is cut into N segments. In reduce-scatter round r,
rank k sends segment (k - r) mod N to its successor and adds the segment it
receives from its predecessor into its own copy; after N-1 rounds rank k holds
the full sum of segment (k + 1) mod N. All-gather passes the reduced segments
around the ring for N-1 more rounds. What a rank receives in round r is exactly
what it sends in round r+1, so the schedule is driven by arrivals alone.

Pipelined, as Gloo and NCCL are: each segment is cut into ``ring_parts`` parts,
and a rank forwards part j of round r as soon as it has reduced it, while the
round's later parts are still arriving. Unpipelined, every round costs a whole
segment's transmission plus one hop's latency (the last byte in, the reduction,
the first byte out); pipelined, the link stays busy and only the first part of
the whole schedule pays that hop.

Every rank must take part in every round: one straggler stalls the whole ring,
which is the point of the comparison with CodedReduce.

``RingAllreduce`` drives a worker's ``RingStep`` over the engine's ``Ports``: segments
go to the ring successor. The master joins the workers as a star, relays failures and
keeps a copy of each step's result (for its own training process): each rank sends it
the segment it fully reduced, part by part, as soon as each part is (``RingCopy``), so
every uplink carries 1/N of the vector more instead of rank 0's carrying all of it
next to its ring traffic (which made rank 0's link the ring's bottleneck). Segments
under ``MIN_PART_BYTES`` are latency-bound and cheaper in one piece: there rank 0 sends
the whole result once it has it, as N small frames would cost the master more.
A worker's result and the master's copy are received straight into the shared output of
the training process waiting on the step (``Ports.alloc_result``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..errors import ProtocolError
from ..kernels import add_into
from ..messages import Phase, Result, Segment
from .base import Place, Ports, Scheme, Stall
from .buffers import fresh
from .chunks import ChunkLayout, byte_view

log = logging.getLogger("crnet.schemes")

REDUCE, GATHER = Phase.REDUCE, Phase.GATHER

PIPELINE_DEPTH = 4          # parts a large segment is cut into
MIN_PART_BYTES = 64 << 10   # and none smaller: each part is a frame (~0.1 ms of Python per end)


def ring_parts(layout: ChunkLayout, size: int) -> int:
    """How many parts every segment of a ring step is cut into: the one rule.

    A part of ``1/PIPELINE_DEPTH`` of a segment keeps the link busy as long as one hop
    (reduce the part, send it on, its first byte across) takes less than 3/4 of a
    segment's transmission: 12 ms of a 4 MB vector's 16 ms segments on 20 workers
    at 100 Mbit/s. Parts stay at least ``MIN_PART_BYTES`` (5 ms at 100 Mbit/s, 0.5 ms
    at 1 Gbit/s) so the per-frame cost stays small next to the bytes, which leaves
    small vectors, whose steps are latency-bound, in one part per segment. The tree's
    chunk size (``--chunk-bytes``) caps a part: smaller chunks, more parts. Every rank
    computes the same count from the step's layout.
    """
    item = layout.dtype.itemsize
    seg_elems = layout.total // size                      # the smallest segment
    seg_bytes = seg_elems * item
    part_bytes = min(layout.chunk_elems * item, max(MIN_PART_BYTES, seg_bytes // PIPELINE_DEPTH))
    parts = -(-seg_bytes // max(item, part_bytes))
    return max(1, min(parts, seg_elems, 1 << 16))


class RingPieces:
    """Where a ring of ``size`` cuts a step's vector: ``size`` segments, ``parts`` parts each."""

    def __init__(self, layout: ChunkLayout, size: int):
        edges = np.linspace(0, layout.total, size + 1).round().astype(np.int64)
        self.segments = list(zip(edges[:-1].tolist(), edges[1:].tolist()))
        self.parts = ring_parts(layout, size)
        self._bounds: dict[int, tuple[int, int]] = {}
        # The master's copy: from every rank (its reduced segment), or all of it from rank 0.
        self.spread = (layout.total // size) * layout.dtype.itemsize >= MIN_PART_BYTES

    def bounds(self, segment: int, part: int) -> tuple[int, int]:
        """Part ``part`` of segment ``segment``: element bounds, as even as they come
        (asked several times for every part that arrives: computed once)."""
        key = segment * self.parts + part
        found = self._bounds.get(key)
        if found is None:
            a, b = self.segments[segment]
            n, parts = b - a, self.parts
            found = self._bounds[key] = (a + n * part // parts, a + n * (part + 1) // parts)
        return found


@dataclass(frozen=True)
class Send:
    """Pass ``payload`` (part ``part`` of segment ``segment`` of phase/round) to the successor,
    or (``master``) the fully reduced part to the master as its copy."""

    phase: Phase
    round: int
    segment: int
    payload: np.ndarray
    part: int = 0
    master: bool = False


class RingStep:
    """One step of ring allreduce at rank ``rank`` of ``size``."""

    def __init__(self, step: int, layout: ChunkLayout, rank: int, size: int, alloc=fresh,
                 result_alloc=fresh):
        self.step, self.layout, self.rank, self.size = step, layout, rank, size
        self.pieces = RingPieces(layout, size)
        self.parts = self.pieces.parts
        # acc is sent part by part and each part is final once sent; all-gather lands
        # in ``result`` so nothing queued for sending is ever overwritten. Neither is
        # last step's, for the same reason (see buffers.py).
        self._alloc = alloc
        self._acc: np.ndarray | None = None
        self._incoming = alloc(layout.total, layout.dtype)   # reduce-scatter arrivals
        # Allocated when first written (the own segment's last reduce, or the first
        # all-gather part): the local vector is in by then, so ``result_alloc`` may give
        # the shared output of the training process waiting on the step (Ports.alloc_result).
        self._result_alloc = result_alloc
        self.result: np.ndarray | None = None
        self._early: list[tuple[int, int, int]] = []         # arrivals before the local vector
        self._gathered = 0                                    # all-gather parts received
        self._owned = self.parts if size == 1 else 0          # own segment's parts fully reduced

    @property
    def complete(self) -> bool:
        return self._owned == self.parts and self._gathered == (self.size - 1) * self.parts

    def check(self, phase, rnd, segment, nbytes, part=0) -> str | None:
        """Why an incoming segment header is wrong, or None."""
        if phase not in (REDUCE, GATHER) or not isinstance(rnd, int) or not 0 <= rnd < self.size - 1:
            return f"bad ring round {phase!r}/{rnd!r}"
        expect = self._expected(phase, rnd)
        if segment != expect:
            return f"{phase} round {rnd}: segment {segment!r}, expected {expect}"
        if not isinstance(part, int) or not 0 <= part < self.parts:
            return f"segment {segment}: part {part!r} out of range 0..{self.parts - 1}"
        a, b = self.pieces.bounds(segment, part)
        if nbytes != (b - a) * self.layout.dtype.itemsize:
            return (f"segment {segment} part {part} has {nbytes} bytes, "
                    f"expected {(b - a) * self.layout.dtype.itemsize}")
        return None

    def dest(self, phase: str, segment: int, part: int = 0) -> memoryview:
        """Where the predecessor's part is received."""
        buf = self._incoming if phase == REDUCE else self._result()
        a, b = self.pieces.bounds(segment, part)
        return byte_view(buf[a:b])

    def local_arrived(self, vector: np.ndarray) -> list[Send]:
        # A copy, though the ring could reduce into _incoming and read ``vector`` where it
        # lies: that is the process's shared input, which it may write again while the
        # step still runs (it gave up waiting: CrnetTimeout), and every rank's sum would
        # take the new bytes.
        self._acc = self._alloc(self.layout.total, self.layout.dtype)
        np.copyto(self._acc, vector)
        if self.size == 1:
            self.result = self._acc
            return [self._send(GATHER, 0, 0, part, self.result, master=True)
                    for part in range(self.parts)]
        sends = [self._send(REDUCE, 0, self.rank, part, self._acc) for part in range(self.parts)]
        for rnd, segment, part in self._early:
            sends += self._reduce(rnd, segment, part)
        self._early.clear()
        return sends

    def received(self, phase: str, rnd: int, segment: int, part: int = 0) -> list[Send]:
        if phase == GATHER:
            self._gathered += 1
            sends = []
            if rnd + 1 < self.size - 1:
                sends.append(self._send(GATHER, rnd + 1, segment, part, self.result))
            return sends + self._whole_copy()
        if self._acc is None:
            self._early.append((rnd, segment, part))
            return []
        return self._reduce(rnd, segment, part)

    def _reduce(self, rnd: int, segment: int, part: int) -> list[Send]:
        assert self._acc is not None  # arrivals before the local vector wait in _early
        a, b = self.pieces.bounds(segment, part)
        add_into(self._acc[a:b], self._incoming[a:b])
        if rnd + 1 < self.size - 1:
            return [self._send(REDUCE, rnd + 1, segment, part, self._acc)]
        # Fully reduced: this rank owns segment (rank + 1) mod N; its all-gather starts.
        self._result()[a:b] = self._acc[a:b]
        self._owned += 1
        sends = [self._send(GATHER, 0, segment, part, self.result)]
        if self.pieces.spread:
            sends.append(self._send(GATHER, 0, segment, part, self.result, master=True))
        return sends + self._whole_copy()   # (if the all-gather came in first)

    def _whole_copy(self) -> list[Send]:
        """Small segments: rank 0 sends the master the whole result, once it has it."""
        if self.pieces.spread or self.rank != 0 or not self.complete:
            return []
        return [self._send(GATHER, 0, seg, p, self.result, master=True)
                for seg in range(self.size) for p in range(self.parts)]

    def _result(self) -> np.ndarray:
        if self.result is None:
            self.result = self._result_alloc(self.layout.total, self.layout.dtype)
        return self.result

    def _send(self, phase, rnd, segment, part, source, master=False) -> Send:
        a, b = self.pieces.bounds(segment, part)
        return Send(phase, rnd, segment, source[a:b], part, master)

    def _expected(self, phase: str, rnd: int) -> int:
        """The segment the predecessor (rank - 1) sends in this phase and round."""
        pred = self.rank - 1
        if phase == REDUCE:
            return (pred - rnd) % self.size
        return (pred + 1 - rnd) % self.size


class RingCopy:
    """The master's copy of a ring step's result, one RESULT per part, numbered
    ``segment * parts + part``: rank k sends the segment it reduced, (k + 1) mod N,
    or (small segments: not ``spread``) rank 0 sends them all."""

    def __init__(self, step: int, layout: ChunkLayout, size: int, alloc=fresh):
        self.step, self.layout, self.size = step, layout, size
        self.pieces = RingPieces(layout, size)
        self.vector = alloc(layout.total, layout.dtype)
        self._have: set[int] = set()
        # Empty parts (a ring of more ranks than the vector has elements) are never sent.
        self._need = sum(1 for seg in range(size) for part in range(self.pieces.parts)
                         if self.pieces.bounds(seg, part)[1] > self.pieces.bounds(seg, part)[0])

    @property
    def complete(self) -> bool:
        return len(self._have) == self._need

    def check(self, rank: int, total, dtype_name, index, nbytes) -> str | None:
        """Why rank ``rank``'s RESULT header does not fit, or None."""
        if dtype_name != self.layout.dtype_name or total != self.layout.total:
            return f"vector is {total} x {dtype_name} but the step's is {self.layout.describe()}"
        segment, part = divmod(index, self.pieces.parts)
        if not self.pieces.spread:
            if rank != 0 or not 0 <= segment < self.size:
                return f"part {index} from rank {rank}: only rank 0 sends the result, 0..{self._need - 1}"
        elif segment != (rank + 1) % self.size:
            return f"part {index} is of segment {segment}, but rank {rank} reduces {(rank + 1) % self.size}"
        a, b = self.pieces.bounds(segment, part)
        if nbytes != (b - a) * self.layout.dtype.itemsize:
            return f"part {index} has {nbytes} bytes, expected {(b - a) * self.layout.dtype.itemsize}"
        return None

    def dest(self, index: int) -> memoryview | None:
        """Where part ``index`` is received, or None if it already was."""
        if index in self._have:
            return None
        a, b = self.pieces.bounds(*divmod(index, self.pieces.parts))
        return byte_view(self.vector[a:b])

    def arrived(self, index: int) -> None:
        self._have.add(index)


class RingAllreduce(Scheme):
    """rar: a worker runs one RingStep per step; the master collects every rank's part."""

    def __init__(self, place: Place, ports: Ports):
        super().__init__(place, ports)
        if not place.is_master and place.ring is None:
            raise ValueError(f"{place.label}: a ring worker needs its ring place (rank, successor)")
        self.steps: dict[int, RingStep] = {}
        self.results: dict[int, RingCopy] = {}       # the master: its copies, from every rank

    # -- a worker -----------------------------------------------------------------------
    def local(self, step: int, vector: np.ndarray) -> str | None:
        if self.place.is_master:
            self.ports.open(step)
            return None
        ring = self._step(step, vector.size, vector.dtype)
        if ring is None:
            return None
        problem = ring.layout.mismatch(self.place.layout(vector.size, vector.dtype), step)
        if problem is None:
            self._send(ring, ring.local_arrived(vector))
        return problem

    def segment_dest(self, msg: Segment, nbytes: int) -> memoryview | None:
        if self.place.is_master:
            return super().segment_dest(msg, nbytes)
        ring = self._step(msg.step, msg.total, msg.dtype)
        if ring is None:
            return None
        problem = ring.check(msg.phase, msg.round, msg.segment, nbytes, msg.part)
        if problem or ring.layout.total != msg.total or ring.layout.dtype_name != msg.dtype:
            raise ProtocolError(f"ring step {msg.step}: {problem or 'vector shape differs'}")
        self.ports.stats.bytes_up += nbytes
        return ring.dest(msg.phase, msg.segment, msg.part)

    def segment(self, msg: Segment) -> None:
        ring = self.steps.get(msg.step)
        if ring is not None:
            self._send(ring, ring.received(msg.phase, msg.round, msg.segment, msg.part))

    def _step(self, step: int, total: int, dtype) -> RingStep | None:
        """The step's RingStep, begun with a ``total`` x ``dtype`` layout if new (its layout
        is built only then: this runs for every part that arrives)."""
        if self.ports.is_decided(step):
            return None
        ring = self.steps.get(step)
        if ring is None:
            assert self.place.ring is not None
            layout = self.place.layout(total, dtype)
            ring = self.steps[step] = RingStep(step, layout, self.place.ring.rank,
                                               self.place.ring.size, alloc=self.ports.alloc,
                                               result_alloc=self._result_alloc(step))
            self.ports.open(step)
        return ring

    def _send(self, ring: RingStep, sends: list[Send]) -> None:
        layout = ring.layout
        for send in sends:
            if send.master:
                if send.payload.size:      # an empty part is not sent (RingCopy expects none)
                    self.ports.to_parent(Result(ring.step, send.segment * ring.parts + send.part,
                                                layout.total, layout.dtype_name), send.payload)
            else:
                self.ports.to_successor(ring.step, Segment(ring.step, send.phase, send.round,
                                                           send.segment, layout.total,
                                                           layout.dtype_name, send.part),
                                        send.payload)
        if not ring.complete:
            return
        del self.steps[ring.step]
        assert ring.result is not None   # written by the last reduce, at the latest
        self.ports.resolved(ring.step, layout, ring.result)

    def _result_alloc(self, step: int):
        """A step's result, a worker's or the master's copy, goes straight into the shared
        output of the training process waiting on it. A worker sends from it (all-gather
        parts to the successor, its segment to the master), and those sends leave at once;
        the master sends nothing from its copy (Ports.alloc_result)."""
        sent = not self.place.is_master
        return lambda total, dtype: self.ports.alloc_result(step, total, dtype, sent)

    # -- the master -----------------------------------------------------------------------
    def child_result_dest(self, k: int, msg: Result, nbytes: int) -> memoryview | None:
        if not self.place.is_master:
            return super().child_result_dest(k, msg, nbytes)
        result = self.results.get(msg.step)
        if result is None:
            self.ports.open(msg.step)
            result = self.results[msg.step] = RingCopy(
                msg.step, self.place.layout(msg.total, msg.dtype), self.place.fanout,
                alloc=self._result_alloc(msg.step))
        problem = result.check(k, msg.total, msg.dtype, msg.chunk, nbytes)
        if problem:
            raise ProtocolError(f"RESULT for step {msg.step} from rank {k}: {problem}")
        self.ports.stats.bytes_up += nbytes
        return result.dest(msg.chunk)

    def child_result(self, k: int, msg: Result) -> None:
        result = self.results.get(msg.step)
        if result is None:
            return
        result.arrived(msg.chunk)
        if result.complete:
            del self.results[msg.step]
            self.ports.resolved(msg.step, result.layout, result.vector)

    def child_silent(self, k: int, step: int | None, why: str) -> None:
        if self.place.is_master and step is not None:
            self.ports.stall(step, f"ring allreduce failed at worker {k}: {why}", here=True)

    def stalled(self, step: int) -> Stall | None:
        if self.place.is_master:
            return Stall("the ring's result (a ring waits for every worker)", here=True)
        waiting = "its local vector" if step not in self.steps else "the ring's segments"
        # Told, the master fails the step for the whole ring at once.
        return Stall(f"{waiting} (a ring waits for every worker)")

    def forget(self, step: int, resolved: bool) -> None:
        self.steps.pop(step, None)
        self.results.pop(step, None)
