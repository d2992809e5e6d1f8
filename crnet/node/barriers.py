"""Barriers: every training process of the job waits until all ``processes`` are there.

A job's processes start at different times (imports, data loading); a step does not
wait for anyone, so a job that must start together (a broadcast of the initial
parameters, then step 0 with everyone) says so with a barrier. Each node counts the
processes at barrier ``key`` in its subtree (its own, plus what each child reported)
and reports the sum up whenever it changes; the master, once the count reaches the
number of processes the barrier was called with, releases it down the tree, and every
node lets its waiting processes go.

A barrier that never fills (a process that never comes) leaves the waiting processes
to their timeout. A new job forgets them all.

A child may be broken or hostile, so what it says counts for no more than it can know:
a barrier is its key and its number of processes (a report of another number is another
barrier, which the real one's processes never see); a child's count is bounded by the
processes attached in its subtree (``attached_below``, the JOB counts of ``jobs.py``); and
each child has at most ``OPEN`` barriers counted here: a new one drops that child's own
oldest report, never a barrier this host's processes wait at nor another child's count.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ..messages import Barrier
from ..peer_text import shown
from ..schemes.base import Place
from .neighbours import Neighbours
from .signal import Signal

log = logging.getLogger("crnet.node")

OPEN = 64          # barriers one child may have counted at a node at once


@dataclass
class _Open:
    processes: int
    local: int = 0
    children: dict[int, int] = field(default_factory=dict)   # slot -> count reported
    waiters: Signal[None] = field(default_factory=Signal)   # this host's, released together
    reported: int = -1


Key = tuple[str, int]     # a barrier: its key and how many processes it waits for


def _everyone(k: int) -> int:
    """No bound: for a node told nothing of the processes below it."""
    return 1 << 62


class Barriers:
    def __init__(self, neighbours: Neighbours, place: Callable[[], Place | None],
                 attached_below: Callable[[int], int] = _everyone):
        self.neighbours = neighbours
        self._place = place
        self._attached_below = attached_below     # child slot -> its processes of the job
        self._open: OrderedDict[Key, _Open] = OrderedDict()

    def arrive(self, key: str, processes: int, release: Callable[[], None]) -> Callable[[], None]:
        """A process of this host is at barrier ``key``; ``release()`` once all are. The
        function returned says it left while it waited: it no longer counts (if it comes
        back, it arrives again); once released, or its job over, it does nothing."""
        at = (key, processes)
        b = self._get(at)
        b.local += 1
        stop = b.waiters.connect(lambda _: release())
        self._update(at, b)
        left = False

        def leave() -> None:
            nonlocal left
            if left or self._open.get(at) is not b:
                return
            left = True
            stop()
            b.local -= 1
            self._update(at, b)
        return leave

    def from_child(self, k: int, msg: Barrier) -> None:
        at = (msg.key, msg.processes)
        b = self._open.get(at)
        if b is None and not msg.arrived:
            return                       # nothing counted, nothing to keep
        if b is None:
            b = self._get(at)
        b.children[k] = msg.arrived
        self._update(at, b)
        mine = [key for key, o in self._open.items() if k in o.children]
        for key in mine[:-OPEN]:         # the child's oldest beyond its share
            log.warning("barrier %s: child slot %d has more than %d barriers open; its count "
                        "at the oldest is dropped", shown(key[0]), k, OPEN)
            self._drop_count(key, k)

    def released(self, msg: Barrier) -> None:
        """The master released barrier ``key``: tell the subtree and this host."""
        self._release((msg.key, msg.processes))

    def child_lost(self, k: int) -> None:
        """Its processes are gone with it (a restarted child reports them again)."""
        for key in list(self._open):
            self._drop_count(key, k)

    def recount(self) -> None:
        """The processes attached below changed (``jobs.py``): so may the counts."""
        for key, b in list(self._open.items()):
            self._update(key, b)

    def parent_up(self) -> None:
        """A (new) parent link: it has heard nothing of this subtree's barriers yet."""
        for at, b in list(self._open.items()):
            b.reported = -1
            self._update(at, b)

    def new_job(self) -> None:
        self._open.clear()

    def _get(self, at: Key) -> _Open:
        b = self._open.get(at)
        if b is None:
            b = self._open[at] = _Open(at[1])
        return b

    def _drop_count(self, at: Key, k: int) -> None:
        b = self._open.get(at)
        if b is None or b.children.pop(k, None) is None:
            return
        if not b.local and not b.children:
            del self._open[at]           # nobody counted at it any more
            if b.reported > 0:
                self.neighbours.to_parent(Barrier(at[0], 0, at[1]))
        else:
            self._update(at, b)

    def _arrived(self, b: _Open) -> int:
        """Who is at ``b``: this host's processes, and each child's count up to the
        processes attached in its subtree."""
        return b.local + sum(min(n, self._attached_below(k)) for k, n in b.children.items())

    def _update(self, at: Key, b: _Open) -> None:
        arrived = self._arrived(b)
        place = self._place()
        if place is not None and place.is_master:
            if arrived >= b.processes:
                self._release(at)
            return
        if arrived != b.reported and self.neighbours.to_parent(Barrier(at[0], min(
                arrived, b.processes), b.processes)):
            b.reported = arrived

    def _release(self, at: Key) -> None:
        key, processes = at
        b = self._open.pop(at, None)
        msg = Barrier(key, processes, processes)
        for slot in self.neighbours.slots:
            if slot.link is not None:
                slot.link.send(msg)
        if b is not None:
            b.waiters.emit(None)
