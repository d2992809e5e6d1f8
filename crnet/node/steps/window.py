"""The step window at one node: which steps are decided, and which may take part.

``tree_step`` is the newest step the master decided (a result or a tree-wide
failure): after an error a training process goes on at ``tree_step + 1``, so
processes that drifted apart meet again on the same step. Steps more than
``ahead`` past it (past step 0 before the tree decided any) are refused to whoever
sent them: no step number from a peer moves the tree far ahead. Steps ``behind`` or
more behind it count as decided; the records of those within (``steps``, a
``record.StepTable``) say the rest. Pure state: no clocks, no sockets.
"""

from __future__ import annotations

from .record import StepTable

__all__ = ["StepWindow", "vouched", "vouched_floor"]


class StepWindow:
    def __init__(self, ahead: int, behind: int):
        self.ahead = ahead
        self.behind = behind
        self.tree_step = -1                     # the newest step the master decided
        self.tree_vector: tuple[int, str] | None = None   # (length, dtype) of the tree's vectors
        self.newest_step = -1                   # the newest step seen here in any form
        self.newest_decided = -1                # the newest step decided here in any way
        self.steps = StepTable()                # the records of the steps within the window

    def reset(self) -> None:
        """A new job: steps count from 0 again, and the tree's vector is not known."""
        self.tree_step = self.newest_step = self.newest_decided = -1
        self.tree_vector = None
        self.steps.clear()

    def is_decided(self, step: int) -> bool:
        return step <= self.tree_step - self.behind or self.steps.is_decided(step)

    @property
    def end(self) -> int:
        """The newest step that may take part here."""
        return max(self.tree_step, 0) + self.ahead

    @property
    def low(self) -> int:
        """Steps at or below this are behind the window."""
        return self.tree_step - self.behind

    def refusal(self, step: int) -> str | None:
        """Why ``step`` is too far ahead to take part in here, or None. The window runs from
        step 0 before the tree decided any: a step number from a peer is never trusted."""
        if step <= self.end:
            return None
        where = (f"which is at step {self.tree_step}" if self.tree_step >= 0 else
                 "which has not decided a step yet (steps count from 0)")
        return f"step {step} is more than {self.ahead} steps ahead of the tree, {where}"

    def seen(self, step: int) -> None:
        self.newest_step = max(self.newest_step, step)

    def learn(self, tree_step: int, vector: tuple[int, str] | None) -> bool:
        """What a peer knows of the tree (a WELCOME, a JOINED); True if ``tree_step`` moved."""
        if tree_step > self.tree_step or self.tree_vector is None:
            self.tree_vector = vector or self.tree_vector
        if tree_step <= self.tree_step:
            return False
        self.tree_step = tree_step
        self.seen(tree_step)
        return True

    def decided_here(self, step: int) -> None:
        """``step`` was decided here (its record says how)."""
        self.seen(step)
        self.newest_decided = max(self.newest_decided, step)

    def advance(self, step: int) -> bool:
        """The master decided ``step``: True if the tree moved on to it."""
        if step <= self.tree_step:
            return False
        self.tree_step = step
        return True

    def forget_behind(self) -> None:
        self.steps.drop_through(self.low)


def vouched(claims: list[int], stragglers: int, ahead: int) -> int:
    """The newest step the master decided, as far as children's claims (JOINED) show it to a
    node that knows nothing of its own (it restarted): the newest claim no more than ``ahead``
    past the (s+1)-th newest; -1 if fewer than s + 1 children claim a step. A child that
    decided nothing (-1) claims nothing. So up to ``stragglers`` children, however far ahead
    they claim the tree is, move it at most ``ahead`` past an honest child's claim: the
    window still holds the honest steps. (With fewer than 2s+1 children claiming, s children
    claiming an old step can hold such a node back: steps past its window are refused.)"""
    floor = vouched_floor(claims, stragglers)
    if floor < 0:
        return -1
    return max(c for c in claims if floor <= c <= floor + ahead)


def vouched_floor(claims: list[int], stragglers: int) -> int:
    """The (s+1)-th newest of the children's claims: a step at least one honest child says
    the tree reached, whatever up to ``stragglers`` children claim; -1 if fewer than s + 1
    claim one. Not a lone claim: at a job's start every honest child says -1 (it decided
    nothing), and a lone 10^6 (a child holding the secret) would move the tree there, every
    step refused (the authenticated fuzzer's JOINED claims found it)."""
    known = sorted((c for c in claims if c >= 0), reverse=True)
    return known[stragglers] if len(known) > stragglers else -1
