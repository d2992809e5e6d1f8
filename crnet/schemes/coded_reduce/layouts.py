"""The layout vote of one CodedReduce node: which layout (length, dtype) each step's vectors
have, and which of the step's ``UpStep`` s a piece goes into. The driver asks it for every
piece (``accept``, ``held``), and tells it what settles a layout.

A step's layout (its vectors' length and dtype) is never set by the first child's
chunk. A node takes it from, in this order:

1. the tree's: the last result's (``Steps.tree_vector``). A vector of another layout
   is refused to whoever sent it (FAIL MISMATCH; a child is then out of the step), and
   a step that began with one begins again when a vector of the tree's layout comes;
2. this node's training process's vector, once it is in;
3. the layout that n - s children agree on, which is what a decode needs anyway.

Until one of these settles a step's layout here (at the tree's first step, or when
a new model's vectors come), the first chunk's layout is the step's only for now:
children's chunks of another layout are held apart, one ``UpStep`` per layout, as
long as n - s children could still agree on it, and the first layout that the
process's vector or a decode settles is the step's. The senders of every other
layout are told MISMATCH (and are out of the step), as is a child whose layout can
no longer win (with no majority possible the first layout stays: s = 0, or too many
children out). So a lone hostile child cannot impose its dtype or length on the
honest majority (unless n - s = 1, where any one child decides the step anyway);
when all vectors change together (a new model), the new layout decodes and becomes
the tree's. A child keeps to the layout of its first chunk within a step. A child's
receive buffer is allocated at its first chunk of the step, and no vector larger
than this host's memory is taken at all (the engine closes that connection first,
``EngineSettings``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ...coding.codes import GradientCode
from ...protocol.messages import Fail, FailKind
from ..base import Place, Ports
from ..buffers import fresh
from ..chunks import ChunkLayout
from .step import UpStep

log = logging.getLogger("crnet.node")

__all__ = ["LayoutVote", "fits"]


def fits(layout: ChunkLayout, total: int, dtype: str) -> bool:
    return layout.total == total and layout.dtype_name == dtype


class LayoutVote:
    """The layouts of the steps under way at one node: the step's ``UpStep`` (``ups``, the
    driver's table, which the vote may replace a step's entry in) and the ones held apart
    for other layouts (``rivals``) until one is settled."""

    def __init__(self, place: Place, ports: Ports, code: GradientCode | None, ups: dict[int, UpStep],
                 new_up: Callable[[int, ChunkLayout, Callable], UpStep],
                 up_for: Callable[[int, int, str], UpStep | None],
                 check_quorum: Callable[[UpStep], None]):
        self.place = place
        self.ports = ports
        self.code = code
        self.ups = ups
        self.new_up = new_up              # a new UpStep (not in ``ups``)
        self.up_for = up_for              # the step's UpStep, begun if new
        self.check_quorum = check_quorum  # fail the step if it can no longer be decoded
        # Children's vectors of other layouts than the step's, held apart while nothing
        # settled the step's layout: step -> layout -> UpStep.
        self.rivals: dict[int, dict[tuple[int, str], UpStep]] = {}

    def accept(self, step: int, total: int, dtype: str) -> UpStep | None:
        """The UpStep a vector of this layout joins. A step that began with vectors that
        do not fit the tree's (the last result's) begins again when one that does arrives:
        those were wrong, and their senders are told, not this one. If every vector of a
        step has a new layout, the tree's changes with it (a new model)."""
        up = self.up_for(step, total, dtype)
        if up is None or fits(up.layout, total, dtype) or self.ports.steps.tree_vector != (total, dtype):
            return up
        wrong = f"{up.layout.describe()}, but the tree's is {total} x {dtype}"
        log.warning("step %d began here with vectors of %s: beginning it again", step, wrong)
        for k in up.senders:
            self.ports.send.to_child(k, Fail(step, f"this subtree's vector is {wrong}", FailKind.MISMATCH))
        if up.local is not None:
            self.ports.steps.refuse_local(step, f"this process's vector is {wrong}")
        silent = {**up.silent, **{k: f"its vector is {up.layout.describe()}" for k in up.senders}}
        del self.ups[step]
        again = self.up_for(step, total, dtype)
        if again is not None:
            again.silent.update(silent)
            self.settle(again)   # the tree's layout: any held apart are refused
            if self.ups.get(step) is again:
                self.check_quorum(again)
        return self.ups.get(step)

    def settled(self, up: UpStep) -> bool:
        """Is ``up``'s layout the step's for sure: the tree's, this node's process's, or one
        decoded from already?"""
        return (up.local is not None or up.decoded
                or self.ports.steps.tree_vector == (up.layout.total, up.layout.dtype_name))

    def held(self, up: UpStep, k: int, total: int, dtype: str) -> UpStep:
        """Where child ``k``'s chunk of a ``total`` x ``dtype`` vector goes: into the step's
        UpStep ``up``, or, while nothing settled the step's layout, into one held apart for
        its layout. A child keeps to the layout of its first chunk of the step: a chunk of
        another goes where it does not fit (and is refused)."""
        rivals = self.rivals.get(up.step, {})
        for sent in (up, *rivals.values()):
            if k in sent.senders:
                return sent
        if fits(up.layout, total, dtype) or self.settled(up):
            return up
        held = rivals.get((total, dtype))
        if held is None:
            held = self.new_up(up.step, self.place.layout(total, dtype), fresh)
        if not self.may_win(up, held, k):
            return up   # no majority for it: the step's layout stays, and k is refused
        if (total, dtype) not in rivals:
            log.warning("step %d: child %d's vector is %d x %s, but the step began here with "
                        "%s: holding it apart until the step's layout is settled",
                        up.step, k, total, dtype, up.layout.describe())
            self.rivals.setdefault(up.step, {})[(total, dtype)] = held
        return held

    def may_win(self, up: UpStep, held: UpStep, k: int | None = None) -> bool:
        """Could n - s children still agree on ``held``'s layout (with child ``k``)? The
        others are out of the step here (``up.silent``) or sent another layout."""
        assert self.code is not None
        committed = set(up.silent) | up.senders
        for rival in self.rivals.get(up.step, {}).values():
            committed |= rival.senders
        if k is not None:
            committed.add(k)
        backers = held.senders - up.silent.keys()
        if k is not None:
            backers = backers | {k}
        return len(backers) + self.code.n - len(committed) >= held.needed

    def drop_hopeless(self, up: UpStep) -> None:
        """Children dropped out of the step or chose a layout: one held apart that can no
        longer be decoded is refused (its senders are out of the step)."""
        for key, held in list(self.rivals.get(up.step, {}).items()):
            if self.may_win(up, held):
                continue
            del self.rivals[up.step][key]
            self.refuse(up, held)
        if not self.rivals.get(up.step, True):
            del self.rivals[up.step]
        self.check_quorum(up)

    def refuse(self, up: UpStep, other: UpStep) -> None:
        """``other``'s senders are told their vector does not fit the step's (``up``'s), and
        are out of the step."""
        wrong = f"{other.layout.describe()}, but the step's is {up.layout.describe()}"
        for k in sorted(other.senders):
            if k not in up.silent:
                self.ports.send.to_child(k, Fail(up.step, f"this subtree's vector is {wrong}",
                                            FailKind.MISMATCH))
                up.silent[k] = f"its vector is {other.layout.describe()}"

    def switch(self, up: UpStep, total: int, dtype: str, whose: str) -> UpStep | None:
        """The step began here with ``up``'s layout, which nothing settled; ``whose`` is
        ``total`` x ``dtype``, which settles it: the step goes on with the children's chunks
        of that layout held apart so far, and ``up``'s senders are told theirs does not fit.
        Returns the step's UpStep (None if that decided the step)."""
        step = up.step
        assert up.local is None
        held = self.rivals.get(step, {}).pop((total, dtype), None)
        if held is None:
            held = self.new_up(step, self.place.layout(total, dtype), self.ports.memory.alloc)
        log.warning("step %d began here with vectors of %s, but the step's is %s (%s)",
                    step, up.layout.describe(), held.layout.describe(), whose)
        held.silent.update(up.silent)
        self.refuse(held, up)
        held.silent.update(self.ports.send.absent_children())
        self.ups[step] = held
        self.settle(held)
        if self.ups.get(step) is held:
            self.check_quorum(held)
        return self.ups.get(step)

    def settle(self, up: UpStep) -> None:
        """``up``'s layout is the step's: children's vectors of other layouts held apart are
        refused, and their senders are out of the step."""
        rivals = self.rivals.pop(up.step, None)
        if not rivals:
            return
        for held in rivals.values():
            self.refuse(up, held)
        self.check_quorum(up)
