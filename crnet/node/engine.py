"""The step engine: every step at one node, from its first piece to its outcome.

The links hand it each step's pieces (the local vector, children's chunks, the
parent's result chunks, ring segments) as typed messages; it passes those of open
steps to the scheme (``crnet.schemes``), which combines them and sends pieces on
through the engine's ``Ports``. The engine owns what every scheme shares:

- one deadline per open step: a step that has not finished at this node within
  ``timeout`` of starting here fails (the master) or is reported to the parent,
  which counts this node as a straggler;
- outcomes: a step resolves with its full gradient or fails; everything up to
  ``resolved_through`` is decided; the last ``keep_results`` outcomes are kept for
  training processes and children that fell behind (``catch up``);
- who waits: a training process's request is answered the moment its step's outcome
  is known (``watch``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import defaults
from ..messages import Chunk, Fail, Message, Result, Segment
from ..schemes import Place, Scheme, driver
from ..schemes.buffers import BufferPool
from ..schemes.chunks import ChunkLayout
from ..stats import Stats
from .neighbours import Neighbours

log = logging.getLogger("crnet.node")


@dataclass(frozen=True)
class Resolved:
    step: int
    layout: ChunkLayout
    vector: np.ndarray


@dataclass(frozen=True)
class Failed:
    step: int
    reason: str


@dataclass(frozen=True)
class Lost:
    """The step is decided but its outcome is no longer held here."""

    step: int
    reason: str


@dataclass(frozen=True)
class Mismatched:
    """The step goes on, but this node's vector was refused by its parent."""

    step: int
    reason: str


Outcome = Resolved | Failed | Lost | Mismatched


@dataclass(frozen=True)
class EngineSettings:
    timeout: float = defaults.TIMEOUT
    keep_results: int = defaults.KEEP_RESULTS
    send_queue_bytes: int | None = None     # None: max(SEND_QUEUE_BYTES, 4 vectors)


class StepEngine:
    """Steps at one node; it is the ``Ports`` its scheme sends through."""

    def __init__(self, settings: EngineSettings, stats: Stats, neighbours: Neighbours):
        self.settings = settings
        self.stats = stats
        self.neighbours = neighbours
        self.place: Place | None = None
        self.scheme: Scheme | None = None
        self.resolved_through = -1
        self.newest_step = -1                   # the newest step seen here in any form
        self.pool = BufferPool()                # outputs and results, reused once unreferenced
        self._outcomes: collections.OrderedDict[int, Resolved | Failed] = collections.OrderedDict()
        self._deadlines: dict[int, asyncio.TimerHandle] = {}
        self._reported: set[int] = set()        # steps this node told its parent it failed
        self._waiters: dict[int, list[Callable[[Outcome], None]]] = {}

    @property
    def label(self) -> str:
        return "node (joining)" if self.place is None else self.place.label

    def start(self, place: Place) -> None:
        """This node knows its place and its share: steps may begin."""
        if self.place == place and self.scheme is not None:
            return  # rejoined the same place (the parent restarted): nothing changes
        self.place = place
        self.scheme = driver(place, self)

    def close(self) -> None:
        for handle in self._deadlines.values():
            handle.cancel()
        self._deadlines.clear()

    @property
    def open_steps(self) -> list[int]:
        return sorted(self._deadlines)

    # ---------------------------------------------------------------- the training process
    def submit(self, step: int, vector: np.ndarray) -> str | None:
        """This host's local vector for ``step``; returns why it does not fit, or None.
        Its outcome reaches whoever ``watch``es the step."""
        if step <= self.resolved_through:
            return None
        if self.scheme is None:
            return f"{self.label} has no share of the data yet"
        return self.scheme.local(step, vector)

    def watch(self, step: int, callback: Callable[[Outcome], None]) -> None:
        """Call ``callback`` once with ``step``'s outcome (now, if it is known)."""
        if step <= self.resolved_through:
            callback(self.outcome(step))
        else:
            self._waiters.setdefault(step, []).append(callback)

    def outcome(self, step: int) -> Outcome:
        """The outcome of a decided step (``step <= resolved_through``)."""
        found = self._outcomes.get(step)
        if found is not None:
            return found
        return Lost(step, f"the result of step {step} is no longer held by this daemon (it keeps "
                          f"the last {self.settings.keep_results}); the tree is at step "
                          f"{self.resolved_through}")

    # ---------------------------------------------------------------- children
    def child_chunk_dest(self, k: int, msg: Chunk, nbytes: int) -> memoryview | None:
        if msg.step <= self.resolved_through:
            self._catch_up(k, msg.step)
            return None  # a straggler's late chunk: dropped unread
        if self.scheme is None:
            return None  # not assigned yet (this node restarted): the child is a straggler
        return self.scheme.child_chunk_dest(k, msg, nbytes)

    def child_chunk(self, k: int, msg: Chunk) -> None:
        if self.scheme is not None and msg.step > self.resolved_through:
            self.scheme.child_chunk(k, msg)

    def child_result_dest(self, k: int, msg: Result, nbytes: int) -> memoryview | None:
        if msg.step <= self.resolved_through or self.scheme is None:
            return None
        return self.scheme.child_result_dest(k, msg, nbytes)

    def child_result(self, k: int, msg: Result) -> None:
        if self.scheme is not None and msg.step > self.resolved_through:
            self.scheme.child_result(k, msg)

    def child_failed(self, k: int, msg: Fail) -> None:
        log.info("step %d: child %d reports: %s", msg.step, k, msg.reason)
        if self.scheme is not None and msg.step > self.resolved_through:
            self.scheme.child_silent(k, msg.step, msg.reason)

    def child_lost(self, k: int) -> None:
        if self.scheme is not None:
            self.scheme.child_silent(k, None, "disconnected")

    def _catch_up(self, k: int, step: int) -> None:
        """A child sent a chunk for a decided step it may never have received (it joined
        while the step was under way): send it the outcome, once."""
        slot = self.neighbours.slots[k]
        if step > slot.missed_through or step in slot.caught_up or slot.link is None:
            return
        slot.caught_up.add(step)
        outcome = self.outcome(step)
        if isinstance(outcome, Resolved):
            layout = outcome.layout
            for c in range(layout.chunks):
                start, stop = layout.bounds(c)
                slot.link.send(Result(step, c, layout.total, layout.dtype.name),
                               outcome.vector[start:stop])
        else:
            slot.link.send(Fail(step, outcome.reason))

    # ---------------------------------------------------------------- the parent
    def parent_result_dest(self, msg: Result, nbytes: int) -> memoryview | None:
        if msg.step <= self.resolved_through or self.scheme is None:
            return None
        self.newest_step = max(self.newest_step, msg.step)
        return self.scheme.result_dest(msg, nbytes)

    def parent_result(self, msg: Result) -> None:
        if self.scheme is not None and msg.step > self.resolved_through:
            self.scheme.result(msg)

    def parent_failed(self, msg: Fail) -> None:
        if msg.mismatch:
            log.error("step %d: the parent rejected this node's vector: %s", msg.step, msg.reason)
            for callback in self._waiters.pop(msg.step, []):
                callback(Mismatched(msg.step, msg.reason))
            return
        self.fail(msg.step, msg.reason)

    def parent_lost(self, reason: str) -> None:
        """Steps under way here cannot finish without the parent: fail them."""
        for step in sorted(set(self._deadlines) | set(self._waiters)):
            self.fail(step, f"{self.label} {reason}")

    # ---------------------------------------------------------------- the ring predecessor
    def segment_dest(self, msg: Segment, nbytes: int) -> memoryview | None:
        if msg.step <= self.resolved_through or self.scheme is None:
            return None
        return self.scheme.segment_dest(msg, nbytes)

    def segment(self, msg: Segment) -> None:
        if self.scheme is not None and msg.step > self.resolved_through:
            self.scheme.segment(msg)

    # ---------------------------------------------------------------- Ports: what the scheme calls
    def open(self, step: int) -> None:
        if step <= self.resolved_through or step in self._deadlines:
            return
        self.newest_step = max(self.newest_step, step)
        loop = asyncio.get_running_loop()
        self._deadlines[step] = loop.call_later(self.settings.timeout, self._deadline, step)

    def _deadline(self, step: int) -> None:
        self._deadlines.pop(step, None)
        if step <= self.resolved_through or self.scheme is None:
            return
        stall = self.scheme.stalled(step)
        if stall is not None:
            self.stall(step, f"{self.label} did not get {stall.lacking} within "
                             f"{self.settings.timeout:g} s", stall.here)

    def stall(self, step: int, reason: str, here: bool = False) -> None:
        if step <= self.resolved_through:
            return
        master = self.place is not None and self.place.is_master
        if not master and step not in self._reported:
            self._reported.add(step)
            log.warning("step %d: %s; telling the parent", step, reason)
            self.neighbours.to_parent(Fail(step, reason))
        if master or here:
            self.fail(step, reason)

    def resolved(self, step: int, layout: ChunkLayout, vector: np.ndarray) -> None:
        self._keep(step, Resolved(step, layout, vector))
        self.stats.steps_done += 1
        log.debug("step %d done", step)
        self._decided(step)

    def fail(self, step: int, reason: str) -> None:
        if step <= self.resolved_through:
            return
        log.error("step %d failed: %s", step, reason)
        self._keep(step, Failed(step, reason))
        self.stats.steps_failed += 1
        failure = Fail(step, reason)
        for slot in self.neighbours.slots:
            if slot.link is not None:
                slot.link.send(failure)
        self._decided(step)

    def to_parent(self, msg: Message, payload=None) -> bool:
        return self.neighbours.to_parent(msg, payload)

    def to_child(self, k: int, msg: Message, payload=None) -> bool:
        link = self.neighbours.child(k)
        return link is not None and link.send(msg, payload)

    def to_children(self, msg: Result, payload) -> None:
        limit = self.settings.send_queue_bytes
        if limit is None:
            vector = msg.total * np.dtype(msg.dtype).itemsize
            limit = max(defaults.SEND_QUEUE_BYTES, defaults.SEND_QUEUE_VECTORS * vector)
        self.neighbours.to_children(msg.frame(payload), limit)

    def to_successor(self, step: int, msg: Message, payload) -> None:
        self.neighbours.to_successor(step, msg.frame(payload))

    def absent_children(self) -> dict[int, str]:
        return self.neighbours.absent_children()

    def alloc(self, total: int, dtype) -> np.ndarray:
        return self.pool.get(total, dtype)

    # ---------------------------------------------------------------- outcomes
    def _keep(self, step: int, outcome: Resolved | Failed) -> None:
        """Remember a step's outcome for the last ``keep_results`` steps."""
        self._outcomes[step] = outcome
        self._outcomes.move_to_end(step)
        while len(self._outcomes) > self.settings.keep_results:
            self._outcomes.popitem(last=False)

    def _decided(self, step: int) -> None:
        """Everything up to ``step`` is decided: stop its clocks, drop the scheme's state,
        answer whoever waits (an older step still open was superseded)."""
        self.resolved_through = max(self.resolved_through, step)
        self.newest_step = max(self.newest_step, step)
        for old in [s for s in self._deadlines if s <= step]:
            self._deadlines.pop(old).cancel()
        self._reported = {s for s in self._reported if s > step}
        if self.scheme is not None:
            self.scheme.forget(step)
        self.neighbours.forget(step)
        for waiting in sorted(s for s in self._waiters if s <= step):
            outcome = self._outcomes.get(waiting) or Lost(
                waiting, f"step {waiting} was passed over: {self.label} went on to step {step} "
                         "before it finished")
            for callback in self._waiters.pop(waiting):
                callback(outcome)
