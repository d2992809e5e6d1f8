"""The master's choice among state answers (``request_state``): its own host's first.

Any process of the job may answer a state request, and the first answer to reach the
master used to be the one every asker got: a host that holds the cluster secret and
claims a process of the job could answer first, with any state. The master is the root
of trust, and so are the processes on its host: while one of them can answer (it is of
the job and is not itself waiting for a state), another host's answer is only kept aside
(the first one), and the master waits for its own host's. Once none of them can answer
(they all asked, or left, or none is attached), the answer kept aside is the one, and
the first from any host after it: that much is still the word of whoever answers first.

A process here counts as asking from its WANT_STATE until it is given a state (or
leaves); ``Broadcasts`` says when.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from ..peer_text import shown

log = logging.getLogger("crnet.node")


@dataclass(frozen=True)
class Answer:
    """A complete state answer from another host: broadcast ``at`` from host ``root``."""

    at: tuple[str, str]
    root: str
    step: int
    vector: np.ndarray


class StateAnswers:
    def __init__(self, here: Callable[[], Collection[object]] | None = None):
        """``here()``: this host's processes of the job (``JobCounts.here``)."""
        self._here = here
        self._asking: set[object] = set()    # of them: asked for a state, not given one yet
        self._aside: Answer | None = None

    def asked(self, process: object) -> None:
        self._asking.add(process)

    def served(self, process: object) -> None:
        self._asking.discard(process)

    def left(self, process: object) -> None:
        self._asking.discard(process)

    def can_answer_here(self) -> bool:
        """Whether a process of the job on this host can answer a state request."""
        return self._here is not None and any(p not in self._asking for p in self._here())

    def wait_for_here(self, answer: Answer) -> bool:
        """Whether ``answer`` (another host's) waits for this host's: kept aside if it
        is the first."""
        if not self.can_answer_here():
            return False
        if self._aside is None:
            self._aside = answer
            log.info("state answer %s from node %s kept aside: a process on the master's host "
                     "answers", shown(answer.at[0]), shown(answer.root))
        return True

    def released(self) -> Answer | None:
        """The answer kept aside, once no process here can answer: it is the one."""
        if self._aside is None or self.can_answer_here():
            return None
        answer, self._aside = self._aside, None
        return answer

    def answered(self) -> None:
        """Every asker has a state: the answer kept aside is moot."""
        self._aside = None

    def clear(self) -> None:
        self._asking.clear()
        self._aside = None
