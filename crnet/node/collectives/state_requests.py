"""State requests: a process that joins a running job asks the others for their state.

The process sends WANT_STATE(nonce) up; the master sends it down to every node, whose
processes see it in shared memory at their next step boundary and answer as broadcast
``state/<nonce>`` (``broadcasts.py`` carries the answers up and the one taken down).
When the answers to a request split (no two child slots agree), the master makes the
request once more itself.

The master sends a request down at most once every ``STATE_PAUSE`` seconds (one that
comes sooner waits for its turn, and the newest such request is the one that goes), so
that however many requests come, each process uploads its state at most that often; the
answer to any request serves every asker waiting when it comes. Which answer that is
(its own host's, or one its children's copies agree on) is ``state_answers.py``'s
choice; this module tells it what happens (a request sent down, a copy complete, a
process here that asks or leaves) and asks it again when a window it waits for ends.
A child that has no process of the job attached below it asks for nothing: its request
is held (the newest few) until the job's counts say it has some (a child that rejoined
says so just after it asks).

A request is never lost with a link: a node keeps the requests it passed up (the newest
``PASSED_UP``, for as long as their askers wait) and passes them up again when its
parent link comes back (the parent or the master restarted, a link was cut), until a
state answer comes down (any answer serves every asker: ``broadcasts.py``).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Collection

from ... import defaults
from ...protocol.messages import WantState, state_key
from ...schemes.base import Place
from ..neighbours import Neighbours
from ..signal import Signal
from .state_answers import Answer, StateAnswers

STATE_PAUSE = 1.0     # seconds between state requests the master sends down
PASSED_UP = 8         # requests a node passes up again when its parent link is back


class StateRequests:
    def __init__(self, neighbours: Neighbours, place: Callable[[], Place | None],
                 give: Callable[[Answer], None],
                 attached_below: Callable[[int], int] | None = None,
                 here: Callable[[], Collection[object]] | None = None,
                 window: float = defaults.TIMEOUT):
        """``give(answer)``: the master sends the state decided down (to every asker);
        ``here()``: this host's processes of the job (``JobCounts.here``); ``window``: the
        daemons' step timeout."""
        self.neighbours = neighbours
        self._place = place
        self._give = give
        # child slot -> the processes of the job attached below it (None: not counted)
        self._attached_below = attached_below
        self.answers = StateAnswers(here, window)     # the master's choice among answers
        self._sent = -STATE_PAUSE                # when the master last sent a request down
        self._turn: asyncio.TimerHandle | None = None
        self._next = 0                           # the request waiting for its turn
        self._again = False                      # ... made by the master (answers split)
        self._check: asyncio.TimerHandle | None = None    # when a window ends
        self.state_request = 0                   # the newest one this node heard (nonce)
        # The master: child slot -> the requests that came up through it since the last
        # answer. A slot whose every process below asks answers nothing: the only slot left
        # that can answer need not wait for another (``_attached``).
        self._asking_below: dict[int, set[int]] = {}
        # Requests from children not known to have processes of the job yet: nonce -> slot.
        self._held: OrderedDict[int, int] = OrderedDict()
        # Requests passed up and not answered yet: nonce -> until when (its asker waits).
        self._passed_up: OrderedDict[int, float] = OrderedDict()
        self._window = window
        self.on_state_request: Signal[int] = Signal()     # this host's processes

    def may_answer(self, process: object) -> bool:
        """Whether this host's ``process`` may answer a state request: any process of the
        job, except at the master, where an answer is taken at once and only one of those
        ``here()`` names may give it (``JobCounts.here``)."""
        place = self._place()
        return place is None or not place.is_master or self.answers.vouches(process)

    def speaks_for(self, k: int) -> bool:
        """Whether child ``k`` has processes of the job attached below it."""
        return self._attached_below is None or self._attached_below(k) > 0

    def want_state(self, nonce: int, child: int | None = None, asker: object = None) -> None:
        """A process here (``asker``) or below ``child`` wants a peer's state: the master
        asks everyone, at most once every ``STATE_PAUSE`` seconds."""
        if child is not None and not self.speaks_for(child):
            self._held[nonce] = child
            while len(self._held) > PASSED_UP:
                self._held.popitem(last=False)
            return
        place = self._place()
        if place is None or not place.is_master:
            self._pass_up(nonce)
            return
        if asker is not None:
            self.answers.asked(asker)   # it will not answer: this host may have none that can
            self.decide()
        if child is not None:
            asking = self._asking_below.setdefault(child, set())
            if len(asking) < PASSED_UP and nonce not in asking:
                asking.add(nonce)
                self.decide()        # (a lone copy may be the only one to come now)
        self._request(nonce, again=False)

    def _pass_up(self, nonce: int) -> None:
        # An asker waits about its daemon's answer bound (--timeout and a grace) for the
        # answer: twice the timeout covers it.
        self._passed_up[nonce] = time.monotonic() + 2 * self._window
        self._passed_up.move_to_end(nonce)
        while len(self._passed_up) > PASSED_UP:
            self._passed_up.popitem(last=False)
        self.neighbours.to_parent(WantState(nonce))

    def parent_up(self) -> None:
        """A new parent link: the requests passed up on the old one may be gone with it
        (or with a master that restarted): they go up again."""
        now = time.monotonic()
        for nonce, until in list(self._passed_up.items()):
            if until < now:
                del self._passed_up[nonce]
            else:
                self.neighbours.to_parent(WantState(nonce))

    def counts_changed(self) -> None:
        """The job's counts changed: held requests of children that now have processes of
        the job below them go on."""
        for nonce, child in list(self._held.items()):
            if self.speaks_for(child):
                del self._held[nonce]
                self.want_state(nonce, child)

    def answered(self) -> None:
        """A state answer came down: it serves every request this node passed up."""
        self._passed_up.clear()
        self._asking_below.clear()

    def _request(self, nonce: int, again: bool) -> None:
        self._next, self._again = nonce, again
        wait = self._sent + STATE_PAUSE - time.monotonic()
        if wait <= 0:
            self._ask()
        elif self._turn is None:
            self._turn = asyncio.get_running_loop().call_later(wait, self._ask)

    def _ask(self) -> None:
        self._turn = None
        if self._next:
            self._sent = time.monotonic()
            nonce, self._next = self._next, 0
            self.answers.opened(state_key(nonce), self._again)
            self.state_requested(nonce)

    def state_requested(self, nonce: int) -> None:
        """The master asks every process for its state: tell this subtree and this host."""
        self.state_request = nonce
        msg = WantState(nonce)
        for slot in self.neighbours.slots:
            if slot.link is not None:
                slot.link.send(msg)
        self.on_state_request.emit(nonce)

    def left(self, process: object) -> None:
        """This host's ``process`` left: it answers nothing."""
        self.answers.left(process)
        self.decide()

    def copy(self, key: str, slot: int, digest: bytes, answer: Answer | None) -> None:
        """The master has child ``slot``'s complete copy of state answer ``key``."""
        self.answers.copy(key, slot, digest, answer, time.monotonic())
        self.decide()

    def decide(self) -> None:
        """Give the state decided, if one is; else look again when a window ends."""
        if self._check is not None:
            self._check.cancel()
            self._check = None
        now = time.monotonic()
        answer = self.answers.decision(now, self._attached())
        if answer is not None:
            self._asking_below.clear()
            self._give(answer)
            return
        if self.answers.split() and not self._next:    # (a newer request goes anyway)
            self._request(secrets.randbits(62) + 1, again=True)
        at = self.answers.next_check(now)
        if at is not None:
            self._check = asyncio.get_running_loop().call_later(at - now, self.decide)

    def _attached(self) -> list[int] | None:
        """The child slots with processes of the job below them that may answer: not every
        one of them asks itself."""
        if self._attached_below is None:
            return None
        return [k for k in range(len(self.neighbours.slots))
                if self._attached_below(k) > len(self._asking_below.get(k, ()))]

    def clear(self) -> None:
        """A new job: the previous job's requests are moot."""
        for timer in (self._turn, self._check):
            if timer is not None:
                timer.cancel()
        self._turn = self._check = None
        self.state_request = 0
        self._next = 0
        self._passed_up.clear()
        self._asking_below.clear()
        self._held.clear()
        self.answers.clear()
