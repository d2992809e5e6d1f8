"""Barriers: every training process of the job waits until all ``processes`` are there.

A job's processes start at different times (imports, data loading); a step does not
wait for anyone, so a job that must start together (a broadcast of the initial
parameters, then step 0 with everyone) says so with a barrier. Each node counts the
processes at barrier ``key`` in its subtree (its own, plus what each child reported)
and reports the sum up whenever it changes; the master, once the count reaches the
number of processes the barrier was called with, releases it down the tree, and every
node lets its waiting processes go.

A barrier that never fills (a process that never comes) leaves the waiting processes
to their timeout. A node keeps at most ``OPEN`` barriers; a new job forgets them all.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..messages import Barrier
from ..schemes.base import Place
from .neighbours import Neighbours
from .signal import Signal

log = logging.getLogger("crnet.node")

OPEN = 64


@dataclass
class _Open:
    processes: int
    local: int = 0
    children: dict[int, int] = field(default_factory=dict)   # slot -> count reported
    waiters: Signal[None] = field(default_factory=Signal)   # this host's, released together
    reported: int = -1

    @property
    def arrived(self) -> int:
        return self.local + sum(self.children.values())


class Barriers:
    def __init__(self, neighbours: Neighbours, place: Callable[[], Place | None]):
        self.neighbours = neighbours
        self._place = place
        self._open: OrderedDict[str, _Open] = OrderedDict()

    def arrive(self, key: str, processes: int, release: Callable[[], None]) -> Callable[[], None]:
        """A process of this host is at barrier ``key``; ``release()`` once all are. The
        function returned says it left while it waited: it no longer counts (if it comes
        back, it arrives again); once released, or its job over, it does nothing."""
        b = self._get(key, processes)
        b.local += 1
        stop = b.waiters.connect(lambda _: release())
        self._update(key, b)
        left = False

        def leave() -> None:
            nonlocal left
            if left or self._open.get(key) is not b:
                return
            left = True
            stop()
            b.local -= 1
            self._update(key, b)
        return leave

    def from_child(self, k: int, msg: Barrier) -> None:
        b = self._get(msg.key, msg.processes)
        b.children[k] = msg.arrived
        self._update(msg.key, b)

    def released(self, msg: Barrier) -> None:
        """The master released barrier ``key``: tell the subtree and this host."""
        self._release(msg.key, msg.processes)

    def child_lost(self, k: int) -> None:
        """Its processes are gone with it (a restarted child reports them again)."""
        for key, b in list(self._open.items()):
            if b.children.pop(k, None) is not None:
                self._update(key, b)

    def parent_up(self) -> None:
        """A (new) parent link: it has heard nothing of this subtree's barriers yet."""
        for key, b in list(self._open.items()):
            b.reported = -1
            self._update(key, b)

    def new_job(self) -> None:
        self._open.clear()

    def _get(self, key: str, processes: int) -> _Open:
        b = self._open.get(key)
        if b is None:
            b = self._open[key] = _Open(processes)
            while len(self._open) > OPEN:
                old, _ = self._open.popitem(last=False)
                log.warning("barrier %r dropped: more than %d barriers open", old[:64], OPEN)
        return b

    def _update(self, key: str, b: _Open) -> None:
        place = self._place()
        if place is not None and place.is_master:
            if b.arrived >= b.processes:
                self._release(key, b.processes)
            return
        if b.arrived != b.reported and self.neighbours.to_parent(Barrier(key, min(
                b.arrived, b.processes), b.processes)):
            b.reported = b.arrived

    def _release(self, key: str, processes: int) -> None:
        b = self._open.pop(key, None)
        msg = Barrier(key, processes, processes)
        for slot in self.neighbours.slots:
            if slot.link is not None:
                slot.link.send(msg)
        if b is not None:
            b.waiters.emit(None)
