"""The master's choice among state answers (``request_state``): its own host's first, else
the state that two child slots agree on.

Any process of the job may answer a state request. The master is the root of trust, and
so are the processes on its host: while one of them can answer (it is of the job and is
not itself waiting for a state), its answer is the one, at once, and the answers that
come up from the children only wait (the first is logged as kept aside).

Once none of them can answer (they all asked, or left, or none is attached), the
children's answers vote, child slot by child slot. A host that holds the cluster secret
can answer first with any state, but its answer reaches the master through one child
slot only (an interior host can forge its whole subtree anyway, so slots, not hosts, are
what vote), and each slot brings at most one copy of a request's answer up (each node
relays the first it hears). So the master takes:

- the first state that the copies of two different child slots agree on, byte for byte
  (with the step it was taken after: a digest of both, ``digest_of``);
- the copy of the only child slot that has processes of the job attached below it;
- or, ``window`` seconds after a request's first complete copy, the state every copy of
  it received so far is, if they are all the same (only one slot's processes could
  answer: the others all ask). The window is the daemons' step ``--timeout``: an up-to-date
  process that reaches no step boundary within it is a straggler anyway.

Copies that disagree, with no two slots agreeing, decide nothing: one (throttled)
warning names the slots, the copies still to come may decide, and the master asks once
more (``split``: honest processes that answered after different steps, e.g. a straggler,
most likely answer the next request after the same one); if that splits too, the askers
time out as they do when nobody answers.

What is left: where only the bad host's slot and one other can answer, the bad host can
block the answer (the askers time out), not replace it; where the other's answer comes
more than ``window`` after the bad one's (or no other slot's process can answer), it can
replace it.

Memory: the master counts the answers to the newest ``ASKED`` requests it sent down only;
of each it keeps the bytes of at most ``KEPT`` distinct states (copies being assembled
that keep theirs count); the other copies vote by their digest only, computed piece by
piece as they arrive (``Broadcasts`` drops each piece once hashed).

A process here counts as asking from its WANT_STATE until it is given a state (or
leaves); ``StateRequests`` says when.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import numpy as np

from ... import defaults
from ...peer_text import Throttle, shown

log = logging.getLogger("crnet.node")

KEPT = 2      # distinct states of one request whose bytes the master keeps
ASKED = 2     # the newest requests sent down whose answers the master counts


def digest_of(step: int, dtype: np.dtype, total: int):
    """A hash of a state answer (hashlib.blake2b), begun with what the asker is told
    besides the bytes: the step it was taken after, and its shape. ``update`` it with the
    vector's bytes, in order."""
    return hashlib.blake2b(repr((step, np.dtype(dtype).str, total)).encode())


@dataclass(frozen=True)
class Answer:
    """A complete state answer: broadcast ``at`` from host ``root``, after step ``step``."""

    at: tuple[str, str]
    root: str
    step: int
    vector: np.ndarray


@dataclass
class _Vote:
    """One request's complete copies from the children, in the order they came."""

    slots: dict[int, bytes] = field(default_factory=dict)     # child slot -> its copy's digest
    kept: dict[bytes, Answer] = field(default_factory=dict)   # at most KEPT states, by digest
    first: float | None = None     # when its first complete copy came
    again: bool = False            # a request the master made again (for a split one)
    split: bool = False            # its copies disagree with no two slots agreeing
    asked_again: bool = False

    def decided(self, now: float, window: float, attached: Collection[int] | None) -> Answer | None:
        seen: dict[bytes, int] = {}
        for d in self.slots.values():     # the first state a second slot agrees on
            seen[d] = seen.get(d, 0) + 1
            if seen[d] == 2 and d in self.kept:
                return self.kept[d]
        if attached is not None and len(attached) == 1:
            only = self.slots.get(next(iter(attached)))
            if only is not None and only in self.kept:
                return self.kept[only]
        if self.first is not None and now >= self.first + window and len(seen) == 1:
            return self.kept.get(next(iter(seen)))
        return None


class StateAnswers:
    def __init__(self, here: Callable[[], Collection[object]] | None = None,
                 window: float = defaults.TIMEOUT, warnings: Throttle | None = None):
        """``here()``: this host's processes of the job (``JobCounts.here``); ``window``:
        the daemons' step timeout."""
        self._here = here
        self.window = window
        self._warnings = warnings or Throttle(log)
        self._asking: set[object] = set()    # of them: asked for a state, not given one yet
        self._votes: OrderedDict[str, _Vote] = OrderedDict()    # the requests sent down

    # ------------------------------------------------------------ this host's processes
    def asked(self, process: object) -> None:
        self._asking.add(process)

    def served(self, process: object) -> None:
        self._asking.discard(process)

    def left(self, process: object) -> None:
        self._asking.discard(process)

    def vouches(self, process: object) -> bool:
        """Whether this host's ``process`` answers for the job here (``here()`` names it)."""
        return self._here is None or process in self._here()

    def can_answer_here(self) -> bool:
        """Whether a process of the job on this host can answer a state request."""
        return self._here is not None and any(p not in self._asking for p in self._here())

    # ------------------------------------------------------------ the children's copies
    def opened(self, key: str, again: bool = False) -> None:
        """The master sent the request of broadcast ``key`` down: its answers count.
        ``again``: it is the master's own, made for a request whose answers split."""
        self._votes.setdefault(key, _Vote(again=again))
        while len(self._votes) > ASKED:
            self._votes.popitem(last=False)

    def counts(self, key: str, slot: int) -> bool:
        """Whether a copy of ``key`` from child ``slot`` counts: an answer to a request the
        master sent down (one of the newest), and the slot's first."""
        vote = self._votes.get(key)
        return vote is not None and slot not in vote.slots

    def keeps(self, key: str, keeping: int) -> bool:
        """Whether a copy of ``key`` now begun keeps its bytes, with ``keeping`` others
        being assembled that keep theirs: else it votes by digest only."""
        vote = self._votes.get(key)
        return vote is not None and len(vote.kept) + keeping < KEPT

    def copy(self, key: str, slot: int, digest: bytes, answer: Answer | None, now: float) -> None:
        """Child ``slot``'s complete copy of ``key``: its digest, and its state if it kept
        its bytes."""
        vote = self._votes.get(key)
        if vote is None or slot in vote.slots:
            return
        if self.can_answer_here() and not vote.slots and answer is not None:
            log.info("state answer %s from node %s kept aside: a process on the master's host "
                     "answers", shown(key), shown(answer.root))
        vote.slots[slot] = digest
        if vote.first is None:
            vote.first = now
        if answer is not None and digest not in vote.kept and len(vote.kept) < KEPT:
            vote.kept[digest] = answer

    def decision(self, now: float, attached: Collection[int] | None) -> Answer | None:
        """The state every asker gets, if one is decided: never while a process here can
        answer. ``attached``: the child slots with processes of the job below them (None:
        not counted)."""
        if self.can_answer_here():
            return None
        for key, vote in self._votes.items():
            answer = vote.decided(now, self.window, attached)
            if answer is not None:
                return answer
            if len(set(vote.slots.values())) > 1 and not vote.split:
                vote.split = True
                groups: dict[bytes, list[int]] = {}
                for slot, d in vote.slots.items():
                    groups.setdefault(d, []).append(slot)
                self._warnings.warning(
                    "state answers disagree", "state answers to %s disagree: child slots %s "
                    "sent different states, and no two slots agree: none is taken until two "
                    "do%s", shown(key), " / ".join(", ".join(map(str, g)) for g in groups.values()),
                    "" if vote.again else " (asking once more)")
        return None

    def split(self) -> bool:
        """Whether a request's answers split (``decision`` said so) and the master should
        ask once more: once per request an asker made, never for its own."""
        for vote in self._votes.values():
            if vote.split and not vote.again and not vote.asked_again:
                vote.asked_again = True
                return True
        return False

    def next_check(self, now: float) -> float | None:
        """When the first window still to end that may decide ends (its copies agree)."""
        ends = [v.first + self.window for v in self._votes.values()
                if v.first is not None and len(set(v.slots.values())) == 1]
        return min((end for end in ends if end > now), default=None)

    def answered(self) -> None:
        """Every asker has a state: the copies still counted are moot."""
        self._votes.clear()

    def clear(self) -> None:
        self._asking.clear()
        self._votes.clear()
