"""The counters a node keeps; a training process reads them with ``Client.stats()``.

``Stats`` holds plain totals. ``StepTimes`` holds what is observed once per step (how
long a step took here, when each child's part arrived, which children a step was
decoded without): the daemon's metrics endpoint (``crnet/node/observe/metrics.py``) and
``crnet status`` read both at the moment they are asked, so nothing on the hot path
knows about either.
"""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass, field, fields

from .windows import Measured

# Seconds: a step on a fast LAN takes milliseconds; a straggling one up to --timeout.
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                30.0, 60.0)
RECENT_STEPS = 100    # how far back "how often did this child straggle" looks


class Histogram:
    """Cumulative-bucket counts, a sum and a count: a Prometheus histogram's data."""

    def __init__(self, bounds: tuple[float, ...] = STEP_BUCKETS):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)     # per bucket (not cumulative); last: +Inf
        self.sum = 0.0
        self.count = 0
        self.last: float | None = None

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1
        self.last = value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it), ending with (inf, count)."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((bound, total))
        return out


@dataclass
class ChildRecord:
    """One child slot, as its parent saw the steps it took part in."""

    lag: Histogram = field(default_factory=Histogram)   # its first chunk after the step's first
    skipped: int = 0                                    # steps decoded without it
    recent: collections.deque = field(default_factory=lambda: collections.deque(
        maxlen=RECENT_STEPS))                           # per recent step: was it left out?


@dataclass
class StepTimes:
    step_seconds: Histogram = field(default_factory=Histogram)   # begun here -> decided
    children: dict[int, ChildRecord] = field(default_factory=dict)   # by slot index
    # The last exact steps' times here (begun -> decided): a parent's patience beyond s.
    recent_seconds: collections.deque = field(default_factory=lambda: collections.deque(
        maxlen=RECENT_STEPS))

    def child(self, k: int) -> ChildRecord:
        record = self.children.get(k)
        if record is None:
            record = self.children[k] = ChildRecord()
        return record


@dataclass
class Stats:
    steps_done: int = 0
    steps_failed: int = 0
    steps_failed_here: int = 0         # of those, failed for this subtree only (cut off)
    children_skipped: int = 0          # children a step was decoded without
    times_skipped: int = 0             # steps this node's parent finished without it
    pieces_withdrawn: int = 0          # spread: pieces not sent, their owners decoded without them
    sums_refused: int = 0              # spread: relayed chunks of the sum unlike their owner's digest
    results_direct: int = 0            # results received straight into a training process's
    #                                    shared output, delivered without a copy
    steps_approximate: int = 0         # of steps_done, results decoded from fewer than n - s
    approximate_coverage: float = 0.0  # the sum of those results' coverages (mean: / count)
    decode_seconds: float = 0.0
    decode_cpu_seconds: float = 0.0    # the same decodes' CPU time (this thread's)
    receive_seconds: float = 0.0       # first child byte of a step -> its quorum decoded
    bytes_up: int = 0                  # received from children (or the ring predecessor)
    bytes_down: int = 0                # received from the parent
    times: StepTimes = field(default_factory=StepTimes, repr=False)
    measured: Measured = field(default_factory=Measured, repr=False)   # crnet tune's windows

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("times", "measured")}
