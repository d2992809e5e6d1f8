"""Ring allreduce at one ring member: reduce-scatter, then all-gather (the RAR baseline).

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

``RingAllreduce`` drives one ``RingStep`` per step at every member over the engine's
``Ports``: segments go to the ring successor. The master is a member too, the last rank
of a ring of N + 1, contributing nothing (zeros): it needs each step's result (for its
own training process) and gets it the way every member does, from the all-gather, so
every link carries 2N/(N+1) of the vector, the same for all, and the master's link takes
one flow, not N. (It used to be outside the ring, fed each rank's reduced segment: every
uplink then carried 1/N of the vector more than the ring needs, and the master's downlink
took N flows at once, TCP incast.) The master also keeps the workers as a star, as in
every scheme: a worker's failure or its lost link fails the step for the whole ring at once.
Every member's result is received straight into the shared output of the training process
waiting on the step (``Memory.alloc_result``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ...coding.kernels import add_into, coded_sum
from ...errors import ProtocolError
from ..base import Origin, Place, Ports, Scheme, Stall, Takes
from ..buffers import fresh
from ..chunks import ChunkLayout, byte_view
from .messages import Phase, Segment

log = logging.getLogger("crnet.schemes")

REDUCE, GATHER = Phase.REDUCE, Phase.GATHER

ONES = np.ones(2)            # coded_sum's coefficients for a + b
PIPELINE_DEPTH = 4          # parts a large segment is cut into
MIN_PART_BYTES = 32 << 10   # and none smaller: each part is a frame (~0.1 ms of Python per end)
# ... nor shorter than this on its link: where a link is faster than the hosts (loopback,
# 10-100 Gbit/s), the CPUs bound a step and every frame's fixed cost is paid in full (4
# hosts on 127.0.0.1, 4 MB: 9.1-9.7 ms a step against 12.5-13.1 with 256 kB parts,
# docs/benchmarks.md); on slower links it changes little or nothing (1 Gbit/s: 125 kB;
# 100 Mbit/s: 12.5 kB, below MIN_PART_BYTES).
MIN_PART_SECONDS = 1e-3


def ring_parts(layout: ChunkLayout, size: int, rate: float | None = None) -> int:
    """How many parts a segment of a ring step is cut into, at most (the one rule).

    A part of ``1/PIPELINE_DEPTH`` of a segment keeps the link busy as long as one hop
    (reduce the part, send it on, its first byte across) takes less than 3/4 of a
    segment's transmission: 11 ms of a 4 MB vector's 15 ms segments on a ring of 20
    workers and the master at 100 Mbit/s. Parts stay at least ``MIN_PART_BYTES`` (2.6 ms
    at 100 Mbit/s, 0.26 ms at 1 Gbit/s) so the per-frame cost stays small next to the
    bytes, which leaves small vectors, whose steps are latency-bound, in one part per
    segment. (With 64 KiB, that ring's segments went in 3 parts of 63.5 kB, which an
    emulator's tbf with a 64 KiB bucket segmented in software: docs/lab/ring.md.) The
    tree's chunk size (``--chunk-bytes``) caps a part: smaller chunks, more parts.

    ``rate``: what the sender's link to its successor carries (bytes/s, as TCP counted
    it), if known: a part then takes at least ``MIN_PART_SECONDS`` on it, so a fast link
    gets fewer, larger parts. Each segment's first sender picks its count this way and
    says it in every part (``Segment.parts``); every rank it passes keeps that cut. Without
    a rate the count is the most a segment may be cut into, which every rank computes the
    same from the step's layout (``RingStep.check`` takes no more).
    """
    item = layout.dtype.itemsize
    seg_elems = layout.total // size                      # the smallest segment
    seg_bytes = seg_elems * item
    least = max(MIN_PART_BYTES, seg_bytes // PIPELINE_DEPTH)
    if rate is not None and rate > 0:
        least = max(least, int(rate * MIN_PART_SECONDS))
    part_bytes = min(layout.chunk_elems * item, least)
    parts = -(-seg_bytes // max(item, part_bytes))
    return max(1, min(parts, seg_elems, 1 << 16))


class RingPieces:
    """Where a ring of ``size`` cuts a step's vector: ``size`` segments, each in parts."""

    def __init__(self, layout: ChunkLayout, size: int):
        edges = np.linspace(0, layout.total, size + 1).round().astype(np.int64)
        self.segments = list(zip(edges[:-1].tolist(), edges[1:].tolist()))
        self._bounds: dict[tuple[int, int, int], tuple[int, int]] = {}

    def bounds(self, segment: int, part: int, parts: int) -> tuple[int, int]:
        """Part ``part`` of segment ``segment`` cut in ``parts``: element bounds, as even as
        they come (asked several times for every part that arrives: computed once)."""
        key = (segment, part, parts)
        found = self._bounds.get(key)
        if found is None:
            a, b = self.segments[segment]
            n = b - a
            found = self._bounds[key] = (a + n * part // parts, a + n * (part + 1) // parts)
        return found


@dataclass(frozen=True)
class Send:
    """Pass ``payload`` (part ``part`` of ``parts`` of segment ``segment`` of phase/round)
    to the successor."""

    phase: Phase
    round: int
    segment: int
    payload: np.ndarray
    part: int = 0
    parts: int = 1


class RingStep:
    """One step of ring allreduce at rank ``rank`` of ``size`` (at least 2: the master and
    one worker). ``parts``: how many parts this rank cuts the segment it starts (its own,
    segment ``rank``) into; default, and at most, ``ring_parts``'s count without a rate."""

    def __init__(self, step: int, layout: ChunkLayout, rank: int, size: int, alloc=fresh,
                 result_alloc=fresh, parts: int | None = None):
        if size < 2:
            raise ValueError(f"a ring has at least 2 members (the master and a worker), not {size}")
        self.step, self.layout, self.rank, self.size = step, layout, rank, size
        self.pieces = RingPieces(layout, size)
        self.most_parts = ring_parts(layout, size)
        self.parts = self.most_parts if parts is None else max(1, min(parts, self.most_parts))
        # Each segment's cut, as its first sender chose it: taken from its first part here
        # (``check``), and the same in every later one.
        self._cuts = {rank: self.parts}
        # acc is sent part by part and each part is final once sent; all-gather lands
        # in ``result`` so nothing queued for sending is ever overwritten. Neither is
        # last step's, for the same reason (see buffers.py).
        self._alloc = alloc
        self._acc: np.ndarray | None = None
        self._incoming = alloc(layout.total, layout.dtype)   # reduce-scatter arrivals
        # Allocated when first written (the own segment's last reduce, or the first
        # all-gather part): the local vector is in by then, so ``result_alloc`` may give
        # the shared output of the training process waiting on the step (Memory.alloc_result).
        self._result_alloc = result_alloc
        self.result: np.ndarray | None = None
        self._early: list[tuple[int, int, int]] = []         # arrivals before the local vector
        # Elements, not parts, counted: the segments' cuts differ. Done when this rank has
        # reduced the whole segment it owns, (rank + 1) mod N, and gathered all the others.
        a, b = self.pieces.segments[(rank + 1) % size]
        self._owned_left = b - a
        self._gather_left = layout.total - (b - a)

    @property
    def complete(self) -> bool:
        return self._owned_left == 0 and self._gather_left == 0

    @property
    def has_local(self) -> bool:
        return self._acc is not None

    def check(self, phase, rnd, segment, nbytes, part=0, parts=0) -> str | None:
        """Why an incoming part's header is wrong, or None. ``parts``: the segment's cut, as
        its first sender chose it (0: ``most_parts``); the first part of a segment that
        comes here sets it for the step, and the rest must agree."""
        if phase not in (REDUCE, GATHER) or not isinstance(rnd, int) or not 0 <= rnd < self.size - 1:
            return f"bad ring round {phase!r}/{rnd!r}"
        expect = self._expected(phase, rnd)
        if segment != expect:
            return f"{phase} round {rnd}: segment {segment!r}, expected {expect}"
        parts = parts or self.most_parts
        if not isinstance(parts, int) or not 1 <= parts <= self.most_parts:
            # Finer than the rule's cut would cost every rank the segment passes more frames.
            return f"segment {segment}: cut in {parts!r} parts, at most {self.most_parts}"
        cut = self._cuts.setdefault(segment, parts)
        if cut != parts:
            return f"segment {segment}: cut in {parts} parts, earlier in {cut}"
        if not isinstance(part, int) or not 0 <= part < parts:
            return f"segment {segment}: part {part!r} out of range 0..{parts - 1}"
        a, b = self.pieces.bounds(segment, part, parts)
        if nbytes != (b - a) * self.layout.dtype.itemsize:
            return (f"segment {segment} part {part} has {nbytes} bytes, "
                    f"expected {(b - a) * self.layout.dtype.itemsize}")
        return None

    def dest(self, phase: str, segment: int, part: int = 0) -> memoryview:
        """Where the predecessor's part is received (its header passed ``check``)."""
        buf = self._incoming if phase == REDUCE else self._result()
        a, b = self.pieces.bounds(segment, part, self._cuts[segment])
        return byte_view(buf[a:b])

    def local_arrived(self, vector: np.ndarray | None) -> list[Send]:
        """This rank's vector, or None: it adds nothing (the master), as a zero vector would."""
        self._acc = self._alloc(self.layout.total, self.layout.dtype)
        if vector is None:
            self._acc.fill(0)
        else:
            # A copy, though the ring could reduce into _incoming and read ``vector`` where
            # it lies: that is the process's shared input, which it may write again while
            # the step still runs (it gave up waiting: CrnetTimeout), and every rank's sum
            # would take the new bytes.
            np.copyto(self._acc, vector)
        sends = [self._send(REDUCE, 0, self.rank, part, self._acc) for part in range(self.parts)]
        for rnd, segment, part in self._early:
            sends += self._reduce(rnd, segment, part)
        self._early.clear()
        return sends

    def received(self, phase: str, rnd: int, segment: int, part: int = 0) -> list[Send]:
        if phase == GATHER:
            a, b = self.pieces.bounds(segment, part, self._cuts[segment])
            self._gather_left -= b - a
            if rnd + 1 < self.size - 1:
                return [self._send(GATHER, rnd + 1, segment, part, self.result)]
            return []
        if self._acc is None:
            self._early.append((rnd, segment, part))
            return []
        return self._reduce(rnd, segment, part)

    def _reduce(self, rnd: int, segment: int, part: int) -> list[Send]:
        assert self._acc is not None  # arrivals before the local vector wait in _early
        a, b = self.pieces.bounds(segment, part, self._cuts[segment])
        if rnd + 1 < self.size - 1:
            add_into(self._acc[a:b], self._incoming[a:b])
            return [self._send(REDUCE, rnd + 1, segment, part, self._acc)]
        # Fully reduced: this rank owns segment (rank + 1) mod N; its all-gather starts.
        # The last addition is written straight into the result (the same bits as adding
        # into acc, then copying: 1 x a + 1 x b is a + b): one pass over the part, not two.
        coded_sum(self._result()[a:b], ONES, (self._acc[a:b], self._incoming[a:b]))
        self._owned_left -= b - a
        return [self._send(GATHER, 0, segment, part, self.result)]

    def _result(self) -> np.ndarray:
        if self.result is None:
            self.result = self._result_alloc(self.layout.total, self.layout.dtype)
        return self.result

    def _send(self, phase, rnd, segment, part, source) -> Send:
        parts = self._cuts[segment]
        a, b = self.pieces.bounds(segment, part, parts)
        return Send(phase, rnd, segment, source[a:b], part, parts)

    def _expected(self, phase: str, rnd: int) -> int:
        """The segment the predecessor (rank - 1) sends in this phase and round."""
        pred = self.rank - 1
        if phase == REDUCE:
            return (pred - rnd) % self.size
        return (pred + 1 - rnd) % self.size


class RingAllreduce(Scheme):
    """rar: every member, the master included, runs one RingStep per step."""

    SUMS_OVER_PEERS = True
    TAKES = (Takes(Segment, Origin.PEER, "segment", dest="segment_dest"),)   # from the predecessor

    def __init__(self, place: Place, ports: Ports):
        super().__init__(place, ports)
        if place.ring is None:
            raise ValueError(f"{place.label}: a ring member needs its ring place (rank, successor)")
        self.ring = place.ring
        self._successor = (place.ring.rank + 1) % place.ring.size
        assert ports.peers is not None, "a ring member sends to its successor"
        self.peers = ports.peers
        self.steps: dict[int, RingStep] = {}

    def local(self, step: int, vector: np.ndarray) -> str | None:
        if self.place.is_master:   # the master adds nothing; its process only waits
            return None
        ring = self._step(step, vector.size, vector.dtype)
        if ring is None:
            return None
        problem = ring.layout.mismatch(self.place.layout(vector.size, vector.dtype), step)
        if problem is None:
            self._send(ring, ring.local_arrived(vector))
        return problem

    def segment_dest(self, rank: int, msg: Segment, nbytes: int) -> memoryview | None:
        ring = self._step(msg.step, msg.total, msg.dtype)
        if ring is None:
            return None
        problem = ring.check(msg.phase, msg.round, msg.segment, nbytes, msg.part, msg.parts)
        if problem or ring.layout.total != msg.total or ring.layout.dtype_name != msg.dtype:
            raise ProtocolError(f"ring step {msg.step}: {problem or 'vector shape differs'}")
        self.ports.stats.bytes_up += nbytes
        return ring.dest(msg.phase, msg.segment, msg.part)

    def segment(self, rank: int, msg: Segment) -> None:
        ring = self.steps.get(msg.step)
        if ring is not None:
            self._send(ring, ring.received(msg.phase, msg.round, msg.segment, msg.part))

    def _step(self, step: int, total: int, dtype) -> RingStep | None:
        """The step's RingStep, begun with a ``total`` x ``dtype`` layout if new (its layout
        is built only then: this runs for every part that arrives)."""
        if self.ports.steps.is_decided(step):
            return None
        ring = self.steps.get(step)
        if ring is None:
            layout = self.place.layout(total, dtype)
            # The segment this rank starts is cut to suit its link to the successor.
            rate = self.peers.link_rate(self._successor)
            ring = self.steps[step] = RingStep(step, layout, self.ring.rank, self.ring.size,
                                               alloc=self.ports.memory.alloc,
                                               result_alloc=self._result_alloc(step),
                                               parts=ring_parts(layout, self.ring.size, rate))
            if self.place.is_master:
                # Its share (zeros) goes round at once: the step's layout is the one the
                # first part from the predecessor has (a worker's vector's).
                self._send(ring, ring.local_arrived(None))
        return ring

    def _send(self, ring: RingStep, sends: list[Send]) -> None:
        layout = ring.layout
        for send in sends:
            self.peers.to_peer(self._successor, ring.step, Segment(ring.step, send.phase, send.round,
                                                       send.segment, layout.total,
                                                       layout.dtype_name, send.part, send.parts),
                                    send.payload)
        if not ring.complete:
            return
        del self.steps[ring.step]
        assert ring.result is not None   # written by the last reduce, at the latest
        self.ports.steps.resolved(ring.step, layout, ring.result)

    def _result_alloc(self, step: int):
        """A step's result goes straight into the shared output of the training process
        waiting on it. Every member sends all-gather parts from it to its successor, and
        those sends leave at once (Memory.alloc_result's ``sent``)."""
        return lambda total, dtype: self.ports.memory.alloc_result(step, total, dtype, sent=True)

    def child_silent(self, k: int, step: int | None, why: str) -> None:
        if self.place.is_master and step is not None:
            self.ports.steps.stall(step, f"ring allreduce failed at worker {k}: {why}", here=True)

    def stalled(self, step: int) -> Stall | None:
        ring = self.steps.get(step)
        if self.place.is_master:
            waiting = ("the ring's first segment" if ring is None else "the ring's segments")
            return Stall(f"{waiting} (a ring waits for every worker)", here=True)
        waiting = ("its local vector" if ring is None or not ring.has_local
                   else "the ring's segments")
        # Told, the master fails the step for the whole ring at once.
        return Stall(f"{waiting} (a ring waits for every worker)")

    def forget(self, step: int, resolved: bool) -> None:
        self.steps.pop(step, None)
