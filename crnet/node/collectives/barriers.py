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

A vote (``vote_key``) is a barrier that also names a broadcast's root, for processes that
call ``broadcast(root=True/False)`` and so do not know the root's rank: the root arrives
as the root (``arrive(root=True)``), and each count up says which hosts' processes in the
subtree arrived as roots (a child's, only hosts in its subtree). When the vote fills, the
master's release names them: one host, or two if two processes said they were the root,
and every receiver then takes that host's copy of the broadcast only. A host that holds
the secret counts only its own processes, so a vote of every seat cannot fill before the
real root is there (of fewer, see docs/operations.md); if it says its own process is
the root, the receivers are told there are two, and a copy it sends without saying so is
never the one taken. Each node remembers the last ``DECIDED`` votes, for the processes
that come later.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ...errors import ProtocolError
from ...peer_text import shown
from ...protocol.messages import MAX_ROOTS, VOTE, Barrier
from ...schemes.base import Place
from ..neighbours import Neighbours
from ..signal import Signal

log = logging.getLogger("crnet.node")

OPEN = 64          # barriers one child may have counted at a node at once
DECIDED = 64       # votes a node remembers the roots of, for processes that come later


Roots = tuple[str, ...]   # the hosts whose process arrived at a vote as the root


@dataclass
class _Open:
    processes: int
    local: int = 0
    root_here: int = 0                                       # of ``local``: arrived as the root
    children: dict[int, int] = field(default_factory=dict)   # slot -> count reported
    child_roots: dict[int, Roots] = field(default_factory=dict)   # slot -> roots reported
    waiters: Signal[Roots] = field(default_factory=Signal)  # this host's, released together
    reported: int = -1
    reported_roots: Roots = ()


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
        self._decided: OrderedDict[Key, Roots] = OrderedDict()    # votes released here

    def decided(self, key: str, processes: int) -> Roots | None:
        """The roots vote ``key`` of ``processes`` named, if it was released here."""
        return self._decided.get((key, processes))

    def arrive(self, key: str, processes: int, release: Callable[[Roots], None],
               root: bool = False) -> Callable[[], None]:
        """A process of this host is at barrier ``key`` (``root``: at a vote, as the root);
        ``release(roots)`` once all are. The function returned says it left while it
        waited: it no longer counts (if it comes back, it arrives again); once released,
        or its job over, it does nothing."""
        at = (key, processes)
        b = self._get(at)
        b.local += 1
        b.root_here += root
        stop = b.waiters.connect(release)
        self._update(at, b)
        left = False

        def leave() -> None:
            nonlocal left
            if left or self._open.get(at) is not b:
                return
            left = True
            stop()
            b.local -= 1
            b.root_here -= root
            self._update(at, b)
        return leave

    def from_child(self, k: int, msg: Barrier) -> None:
        at = (msg.key, msg.processes)
        b = self._open.get(at)
        if b is None and not msg.arrived:
            return                       # nothing counted, nothing to keep
        roots = self._roots_below(k, msg)
        if b is None:
            b = self._get(at)
        b.children[k] = msg.arrived
        b.child_roots[k] = roots
        self._update(at, b)
        mine = [key for key, o in self._open.items() if k in o.children]
        for key in mine[:-OPEN]:         # the child's oldest beyond its share
            log.warning("barrier %s: child slot %d has more than %d barriers open; its count "
                        "at the oldest is dropped", shown(key[0]), k, OPEN)
            self._drop_count(key, k)

    def _roots_below(self, k: int, msg: Barrier) -> Roots:
        """The roots child ``k`` reports at a vote, if they are hosts in its subtree (a
        ``ProtocolError`` if not)."""
        place = self._place()
        if not msg.roots or not msg.key.startswith(VOTE) or place is None:
            return ()
        child = place.tree.children(place.name)[k]
        for root in msg.roots:
            if root != child and not root.startswith(child + "."):
                raise ProtocolError(f"BARRIER {shown(msg.key)}: root {shown(root)} is not in "
                                    f"the subtree of child {child}")
        return msg.roots

    def released(self, msg: Barrier) -> None:
        """The master released barrier ``key``: tell the subtree and this host."""
        self._release((msg.key, msg.processes), msg.roots)

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
            b.reported, b.reported_roots = -1, ()
            self._update(at, b)

    def new_job(self) -> None:
        self._open.clear()
        self._decided.clear()

    def _get(self, at: Key) -> _Open:
        b = self._open.get(at)
        if b is None:
            b = self._open[at] = _Open(at[1])
        return b

    def _drop_count(self, at: Key, k: int) -> None:
        b = self._open.get(at)
        if b is None or b.children.pop(k, None) is None:
            return
        b.child_roots.pop(k, None)
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

    def _roots(self, b: _Open, place: Place) -> Roots:
        """The hosts whose process arrived at ``b`` as the root: this one, and what each
        child that has processes of the job below it reported (``MAX_ROOTS`` at most:
        two say that there is more than one)."""
        roots = [place.name] if b.root_here else []
        for k, below in b.child_roots.items():
            if self._attached_below(k) > 0:
                roots += [r for r in below if r not in roots]
        return tuple(roots[:MAX_ROOTS])

    def _update(self, at: Key, b: _Open) -> None:
        arrived = self._arrived(b)
        place = self._place()
        vote = at[0].startswith(VOTE)
        roots = self._roots(b, place) if vote and place is not None else ()
        if place is not None and place.is_master:
            if arrived >= b.processes:
                self._release(at, roots if vote else None)
            return
        if (arrived, roots) != (b.reported, b.reported_roots) and self.neighbours.to_parent(
                Barrier(at[0], min(arrived, b.processes), b.processes, roots if vote else None)):
            b.reported, b.reported_roots = arrived, roots

    def _release(self, at: Key, roots: Roots | None) -> None:
        key, processes = at
        b = self._open.pop(at, None)
        msg = Barrier(key, processes, processes, roots)
        for slot in self.neighbours.slots:
            if slot.link is not None:
                slot.link.send(msg)
        if roots is not None:
            self._decided[at] = roots
            self._decided.move_to_end(at)
            while len(self._decided) > DECIDED:
                self._decided.popitem(last=False)
        if b is not None:
            b.waiters.emit(roots or ())
