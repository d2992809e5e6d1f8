"""The step engine: every step at one node, from its first piece to its outcome.

The links hand it each step's pieces (the local vector, children's chunks, the
parent's result chunks, ring segments) as typed messages; it passes those of open
steps to the scheme (``crnet.schemes``), which combines them and sends pieces on
through the engine's ``Ports``. The engine owns what every scheme shares:

- **Decisions, one step at a time.** A step resolves (its full gradient) or fails;
  deciding one step never decides another. The master decides for the whole tree; a
  node decides alone only when it is cut off from the master (then its processes learn
  that the failure is local). ``tree_step`` is the newest step the master decided
  (a result or a tree-wide failure): after an error a training process goes on at
  ``tree_step + 1``, so processes that drifted apart meet again on the same step.
- **A window.** Steps more than ``window`` ahead of ``tree_step`` (of step 0 before the
  tree decided any) are refused to whoever sent them (a process, or a child's CHUNK,
  OPEN or FAIL), and only to them: no step number from a peer moves the tree far
  ahead. A child hears of its refusal once per step, but only its newest refusal is
  remembered (a hostile child naming steps far ahead adds nothing that lasts). Steps
  further behind than the window (or the kept results) are decided here: a late
  process gets their result if it is kept, else StepLost with ``tree_step``.
- **A deadline for every wait.** A step that begins here (its first piece, or a
  process asking for it) must be decided within ``timeout``: the master fails it
  then; a node tells its parent it stalled, and gives up for its own subtree only if
  no decision came ``grace`` seconds later (its parent is gone or frozen). So every
  request a training process makes is answered within ``answer_within``. A node
  tells its parent when a step begins below it (OPEN), so the master's clock starts
  when the step begins anywhere. A child's FAIL starts no clock and opens no step: it
  marks the child out of a step (the scheme remembers it until the step opens).
- **Who waits**: a process's request is answered the moment its step is decided
  (``request``); children that missed a decision get it once (``catch up``).
- **The tree's vector**: its length and dtype are those of the last result (learned
  from the parent when joining). A vector that does not fit is refused to whoever
  sent it, wherever it enters the tree, even when it arrived first (the scheme begins
  the step again); when every vector of a step has a new layout, it becomes the
  tree's (a new model). How the scheme settles a step's layout when the tree's is not
  known yet (the first step), or a new one comes: ``crnet.schemes.coded_reduce``.
- **Results straight into a training process's memory** (``alloc_result``): where a
  step's result is received into an array that nothing reads after the step but its
  own sends (a leaf, a ring member), it is the shared output of the
  local training process waiting on the step (``links.LocalProcesses.lend``), so no
  copy puts it there. That memory is the process's again once it is answered (it may
  change it in place at once), so: the host's other processes waiting on the step copy
  it first; its owner is answered last, once no link of this node holds a send that
  reads it (``_give_back``: within the step's bound, after which a link still holding
  one is cut off); until then its requests that would write there wait; and this
  daemon keeps no result of that step (asked again, it says Lost).
- **No vector larger than this host's memory** (``max_vector_bytes``): a peer whose
  CHUNK, RESULT or segment claims one has its connection closed before anything is
  allocated (no host could hold it: it is not a gradient, it is an attack or a bug).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .. import defaults
from ..dtypes import DTYPES, dtype_name
from ..errors import ProtocolError
from ..messages import Chunk, Fail, FailKind, Message, Open, Result, Segment
from ..peer_text import Throttle, shown
from ..schemes import Place, Scheme, driver
from ..schemes.buffers import BufferPool
from ..schemes.chunks import ChunkLayout
from ..stats import Stats
from .neighbours import Neighbours
from .signal import Signal

log = logging.getLogger("crnet.node")

GIVE_BACK_POLL = 0.001   # seconds between looks at the links' send queues (_give_back)


@dataclass(frozen=True)
class Resolved:
    step: int
    layout: ChunkLayout
    vector: np.ndarray


@dataclass(frozen=True)
class Failed:
    step: int
    reason: str
    tree_wide: bool = True      # decided by the master: every process gets the same


@dataclass(frozen=True)
class Refused:
    """The step is outside the window (here or at an ancestor)."""

    step: int
    reason: str


@dataclass(frozen=True)
class Lost:
    """The step is decided, but its outcome is not held here."""

    step: int
    reason: str


@dataclass(frozen=True)
class Mismatched:
    """This process's vector does not fit the tree's; the step goes on without it."""

    step: int
    reason: str


Outcome = Resolved | Failed | Refused | Lost | Mismatched


class Lender(Protocol):
    """A local training process whose shared output a step's result is received into
    (``links.ClientLink``)."""

    def answer(self, outcome: Outcome) -> None:
        """The outcome of the step it waits on (or of another, which it ignores)."""

    def given_back(self) -> None:
        """Its output receives that result no more: the requests it made meanwhile go on."""


# Finds the shared output of a local training process waiting on (step, length, dtype)
# for a step's result, or None (links.LocalProcesses.lend).
Lend = Callable[[int, int, np.dtype], tuple[Lender, np.ndarray] | None]


def physical_memory() -> int:
    """This host's memory in bytes: no vector larger than that is anyone's gradient here."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):   # not POSIX, or not told
        return defaults.MAX_VECTOR_BYTES


@dataclass(frozen=True)
class EngineSettings:
    timeout: float = defaults.TIMEOUT
    keep_results: int = defaults.KEEP_RESULTS
    window: int = defaults.STEP_WINDOW
    send_queue_bytes: int | None = None     # None: max(SEND_QUEUE_BYTES, 4 vectors)
    result_memory: int = defaults.RESULT_MEMORY
    # The largest vector a peer may claim (a CHUNK's total x dtype): a larger one closes
    # its connection before anything is allocated.
    max_vector_bytes: int = field(default_factory=physical_memory)

    @property
    def grace(self) -> float:
        """How much longer than ``timeout`` a node waits for the master's decision."""
        return min(defaults.GRACE_MAX, max(defaults.GRACE_MIN, self.timeout * defaults.GRACE_SHARE))

    @property
    def answer_within(self) -> float:
        """Every request of a training process is answered within this many seconds."""
        return self.timeout + self.grace

    @property
    def behind(self) -> int:
        """Steps this many or more behind ``tree_step`` count as decided."""
        return max(self.keep_results, self.window)


class StepEngine:
    """Steps at one node; it is the ``Ports`` its scheme sends through."""

    def __init__(self, settings: EngineSettings, stats: Stats, neighbours: Neighbours,
                 lend: Lend | None = None):
        self.settings = settings
        self._behind = settings.behind
        self.stats = stats
        self.neighbours = neighbours
        self.place: Place | None = None
        self.is_master = False
        self.scheme: Scheme | None = None
        self.tree_step = -1                     # the newest step the master decided
        self.tree_vector: tuple[int, str] | None = None   # (length, dtype) of the tree's vectors
        self.newest_step = -1                   # the newest step seen here in any form
        self.newest_decided = -1                # the newest step decided here in any way
        # Told of every decision, and of a tree_step learned from a peer (step None):
        # the training processes' shared progress (links.ClientLink).
        self.decided: Signal[int | None] = Signal()
        self.pool = BufferPool(keep=16)         # outputs, receive buffers, results
        self._outcomes: collections.OrderedDict[int, Resolved | Failed | Refused | Lost] = \
            collections.OrderedDict()           # decisions kept (see _trim), oldest first
        self._held = 0                          # bytes of the results kept
        # Polled (emit(None)) for the oldest step each local training process may still
        # ask for (links.ClientLink).
        self.consumers: Signal[None] = Signal()
        self._decided: set[int] = set()         # decided steps within the window behind
        self._open: dict[int, list[asyncio.TimerHandle]] = {}   # step -> its deadlines
        self._began: dict[int, float] = {}      # step -> when it began here (loop time)
        self._reported: set[int] = set()        # steps this node told its parent it stalled
        self._sent_up: set[int] = set()         # steps this node sent a chunk of up
        # Undecided steps this host's vector went into: its length and dtype.
        self._contributed: dict[int, tuple[int, np.dtype]] = {}
        self._last_stall = ""                   # why, as last logged
        self._peer_lines = Throttle(log)        # lines about what children sent
        self._waiters: dict[int, list[Callable[[Outcome], None]]] = {}
        self.lend = lend                        # the local processes' (links.LocalProcesses)
        # step -> the process whose shared output its result goes into, until given back, and
        # whether sends read that memory too (alloc_result's ``sent``)
        self._lent: dict[int, tuple[Lender, bool]] = {}

    @property
    def label(self) -> str:
        return "node (joining)" if self.place is None else self.place.label

    def start(self, place: Place) -> None:
        """This node knows its place and its share: steps may begin."""
        if self.place == place and self.scheme is not None:
            return  # rejoined the same place (the parent restarted): nothing changes
        self.place = place
        self.is_master = place.is_master
        self.scheme = driver(place, self)

    def learn(self, tree_step: int, vector: tuple[int, str] | None = None) -> None:
        """What a peer knows of the tree (a parent's WELCOME, a child's JOINED): a node that
        restarted resumes where the tree is."""
        if tree_step > self.tree_step or self.tree_vector is None:
            self.tree_vector = vector or self.tree_vector
        if tree_step > self.tree_step:
            self.tree_step = tree_step
            self.newest_step = max(self.newest_step, tree_step)
            self._prune()
            self.decided.emit(None)

    def new_job(self, name: str) -> None:
        """The tree starts training job ``name``: the previous job's steps, results and
        vector are dropped (its processes still waiting are told), and steps count from 0."""
        waiting = self._waiters
        # Steps whose result was going into a process's memory, never decided now: its
        # owner gets it back once the links sent what they queued from it.
        undecided = [s for s in self._lent if not self.is_decided(s)]
        if undecided:
            loop = asyncio.get_running_loop()
            for step in undecided:
                loop.call_soon(self._give_back, step, [],
                               loop.time() + self.settings.answer_within)
        self.close()
        self._waiters = {}
        self._outcomes.clear()
        self._held = 0
        self._decided.clear()
        self._reported.clear()
        self._sent_up.clear()
        self._contributed.clear()
        for slot in self.neighbours.slots:
            slot.told.clear()
            slot.missed_through = -1
        self.tree_step = self.newest_step = self.newest_decided = -1
        self.tree_vector = None
        if self.place is not None:
            self.scheme = driver(self.place, self)
        log.info("the tree now runs job %r", name)
        for step, answers in sorted(waiting.items()):
            for answer in answers:
                answer(Failed(step, f"the tree now runs job {name!r}: this job's steps are over",
                              tree_wide=True))
        self.decided.emit(None)

    def close(self) -> None:
        for handles in self._open.values():
            for handle in handles:
                handle.cancel()
        self._open.clear()

    @property
    def open_steps(self) -> list[int]:
        return sorted(self._open)

    def bookkeeping(self) -> dict[str, int]:
        """How many steps each table tracks: bounded by the window, whatever the run's length."""
        return {"open": len(self._open), "decided": len(self._decided),
                "kept": len(self._outcomes), "kept_bytes": self._held,
                "waiting": len(self._waiters),
                "told": sum(len(slot.told) for slot in self.neighbours.slots)}

    # ---------------------------------------------------------------- the training process
    def request(self, step: int, vector: np.ndarray | None,
                answer: Callable[[Outcome], None]) -> None:
        """A process asks for ``step``'s outcome, contributing ``vector`` (or not): ``answer``
        is called once, within ``answer_within``."""
        if self.is_decided(step):
            answer(self.outcome(step))
            return
        refusal = self.refusal(step)
        if refusal is not None:
            answer(Refused(step, refusal))
            return
        given = None if vector is None else self._contributed.get(step)
        if given is not None:
            # A host adds one vector to a step: a second (a process re-submitting after
            # a restart, or a client retrying) waits for the result and adds nothing,
            # where a scheme would add it again (a ring sends its parts twice).
            assert vector is not None
            if (vector.size, vector.dtype) != given:
                answer(Mismatched(step, f"this process's vector is {vector.size} x "
                                        f"{dtype_name(vector.dtype)} but the tree's for step "
                                        f"{step} is {given[0]} x {dtype_name(given[1])}"))
                return
            log.info("step %d: this host's vector is in already; a second one is not added",
                     step, extra={"step": step})
            vector = None
        if vector is not None:
            problem = (f"{self.label} has no share of the data yet" if self.scheme is None
                       else self.scheme.local(step, vector))
            if problem is not None:
                answer(Mismatched(step, problem))
                return
            self._contributed[step] = (vector.size, vector.dtype)
            if self.is_decided(step):   # decided at once (too many children gone at the master)
                answer(self.outcome(step))
                return
        self._open_step(step, announce=True)
        if self.is_decided(step):   # at once: children out of it before it opened here
            answer(self.outcome(step))
            return
        self._waiters.setdefault(step, []).append(answer)

    def decided_steps(self) -> list[int]:
        """The steps decided here that the window still tracks."""
        return sorted(self._decided)

    def is_decided(self, step: int) -> bool:
        return step in self._decided or step <= self.tree_step - self._behind

    def outcome(self, step: int) -> Outcome:
        """The outcome of a decided step."""
        found = self._outcomes.get(step)
        if found is not None:
            return found
        return Lost(step, f"the outcome of step {step} is not held by this daemon (it keeps the "
                          f"last {self.settings.keep_results}, and those its training processes "
                          f"have not taken within --result-memory); the tree is at step "
                          f"{self.tree_step}: reload the parameters (e.g. the newest "
                          "checkpoint) and go on after it")

    def refusal(self, step: int) -> str | None:
        """Why ``step`` is too far ahead to take part in here, or None. The window runs from
        step 0 before the tree decided any: a step number from a peer is never trusted."""
        ahead = self.settings.window
        if step <= self._window_end:
            return None
        where = (f"which is at step {self.tree_step}" if self.tree_step >= 0 else
                 "which has not decided a step yet (steps count from 0)")
        return f"step {step} is more than {ahead} steps ahead of the tree, {where}"

    @property
    def _window_end(self) -> int:
        """The newest step that may take part here."""
        return max(self.tree_step, 0) + self.settings.window

    # ---------------------------------------------------------------- children
    def child_chunk_dest(self, k: int, msg: Chunk, nbytes: int) -> memoryview | None:
        self._check_size(msg)
        if not self._admit_child(k, msg.step) or self.scheme is None:
            return None  # decided (a straggler's late chunk: dropped unread), or refused
        return self.scheme.child_chunk_dest(k, msg, nbytes)

    def child_chunk(self, k: int, msg: Chunk) -> None:
        if self.scheme is not None and not self.is_decided(msg.step):
            self.scheme.child_chunk(k, msg)

    def child_opened(self, k: int, msg: Open) -> None:
        if self._admit_child(k, msg.step):
            self._open_step(msg.step, announce=True)

    def child_failed(self, k: int, msg: Fail) -> None:
        # A child's text, and a child may report a failure of every step of the window:
        # quoted, cut short, and a line now and then per child.
        self._peer_lines.log(logging.INFO, (k, "FAIL"), "step %d: child %d reports: %s",
                             msg.step, k, shown(msg.reason))
        if self.scheme is not None and self._admit_child(k, msg.step):
            self.scheme.child_silent(k, msg.step, msg.reason)

    def child_lost(self, k: int) -> None:
        if self.scheme is not None:
            self.scheme.child_silent(k, None, "disconnected")

    def _admit_child(self, k: int, step: int) -> bool:
        """May child ``k`` take part in ``step``? If it is decided, the child gets the
        outcome if it may have missed it; if it is out of the window, it is refused."""
        if self.is_decided(step):
            self._catch_up(k, step)
            return False
        refusal = self.refusal(step)
        if refusal is not None:
            slot = self.neighbours.slots[k]
            if step not in slot.told:
                # Told once per step however many pieces of it come, but only the newest
                # refusal is remembered: one entry per far step would grow without bound.
                self._peer_lines.log(logging.INFO, (k, "refused"), "refusing child %d: %s",
                                     k, refusal)
                end = self._window_end
                slot.told = {s for s in slot.told if s <= end}
            self._tell_child(k, step, Fail(step, refusal, FailKind.REFUSED))
            return False
        return True

    def _check_size(self, msg: Chunk | Result | Segment) -> None:
        """A piece claiming a vector no host could hold closes its connection (ProtocolError)
        before anything is allocated for it."""
        nbytes = msg.total * DTYPES[msg.dtype].itemsize   # (a dtype the message checked)
        if nbytes > self.settings.max_vector_bytes:
            raise ProtocolError(
                f"{msg.TYPE.name} for step {msg.step} claims a vector of {msg.total} x "
                f"{msg.dtype} ({nbytes} bytes): more than this host's memory "
                f"({self.settings.max_vector_bytes} bytes)")

    def _catch_up(self, k: int, step: int) -> None:
        """A child is busy with a decided step: if it joined while the step was under way
        it may never have got the outcome: send it, once."""
        slot = self.neighbours.slots[k]
        if step > slot.missed_through:
            return  # decided after the child joined: the decision went to it
        outcome = self.outcome(step)
        if isinstance(outcome, Resolved):
            if step in slot.told or slot.link is None:
                return
            slot.told.add(step)
            layout = outcome.layout
            for c in range(layout.chunks):
                start, stop = layout.bounds(c)
                slot.link.send(Result(step, c, layout.total, layout.dtype_name),
                               outcome.vector[start:stop])
        else:
            self._tell_child(k, step, _fail_of(outcome))

    def _tell_child(self, k: int, step: int, msg: Message) -> None:
        """Send a child a verdict about ``step`` once, however many of its chunks come."""
        slot = self.neighbours.slots[k]
        if slot.link is not None and step not in slot.told:
            slot.told.add(step)
            slot.link.send(msg)

    # ---------------------------------------------------------------- the parent
    def parent_result_dest(self, msg: Result, nbytes: int) -> memoryview | None:
        self._check_size(msg)
        if self.is_decided(msg.step) or self.scheme is None:
            return None
        if msg.step > self.newest_step:   # results of a step this node took no part in
            self.newest_step = msg.step
        return self.scheme.result_dest(msg, nbytes)

    def parent_result(self, msg: Result) -> None:
        if self.scheme is not None and not self.is_decided(msg.step):
            self.scheme.result(msg)

    def parent_failed(self, msg: Fail) -> None:
        if msg.kind is FailKind.MISMATCH:
            log.error("step %d: the parent refused this node's vector: %s", msg.step,
                      shown(msg.reason), extra={"step": msg.step})
            for answer in self._waiters.pop(msg.step, []):
                answer(Mismatched(msg.step, msg.reason))
        elif msg.kind is FailKind.REFUSED:
            self._decide(msg.step, Refused(msg.step, msg.reason))
        elif msg.kind is FailKind.LOST:
            self._decide(msg.step, Lost(msg.step, msg.reason))
        elif msg.kind is FailKind.STALL:
            log.warning("step %d: the parent sent a child's FAIL kind: %s", msg.step,
                        shown(msg.reason), extra={"step": msg.step})
        else:
            self.fail(msg.step, msg.reason, tree_wide=msg.kind is FailKind.TREE)

    def parent_lost(self, reason: str) -> None:
        """Steps under way here cannot be decided without the master: fail them here."""
        for step in sorted(set(self._open) | set(self._waiters)):
            self.fail(step, f"{self.label} {reason}", tree_wide=False)

    # ---------------------------------------------------------------- the ring predecessor
    def segment_dest(self, msg: Segment, nbytes: int) -> memoryview | None:
        self._check_size(msg)
        if self.is_decided(msg.step) or self.refusal(msg.step) or self.scheme is None:
            return None
        return self.scheme.segment_dest(msg, nbytes)

    def segment(self, msg: Segment) -> None:
        if self.scheme is not None and not self.is_decided(msg.step):
            self.scheme.segment(msg)

    # ---------------------------------------------------------------- Ports: what the scheme calls
    def open(self, step: int) -> None:
        # A leaf's chunk goes up at once: it tells the parent the step began.
        self._open_step(step, announce=self.place is not None and not self.place.is_leaf)

    def is_open(self, step: int) -> bool:
        return step in self._open

    def _open_step(self, step: int, announce: bool) -> None:
        if self.is_decided(step) or step in self._open:
            return
        self.newest_step = max(self.newest_step, step)
        loop = asyncio.get_running_loop()
        handles = [loop.call_later(self.settings.timeout, self._deadline, step)]
        if announce and not self.is_master:
            # Unless this node's first chunk of the step goes up soon (the usual case,
            # and the parent then knows), tell the parent the step began here.
            handles.append(loop.call_later(defaults.OPEN_DELAY, self._announce, step))
        self._open[step] = handles
        self._began[step] = loop.time()
        if self.scheme is not None:
            self.scheme.opened(step)

    def _announce(self, step: int) -> None:
        if not self.is_decided(step) and step not in self._sent_up:
            self.neighbours.to_parent(Open(step))

    def _deadline(self, step: int) -> None:
        if self.is_decided(step):
            return
        if not self.is_master:   # the last chance for the master's decision to come
            handles = self._open.setdefault(step, [])
            handles.append(asyncio.get_running_loop().call_later(
                self.settings.grace, self._give_up, step))
        if not self.is_master and self.neighbours.parent is None:
            self.fail(step, f"{self.label} has no parent (it is reconnecting) and could not "
                            f"get step {step} decided within {self.settings.timeout:g} s",
                      tree_wide=False)
            return
        stall = None if self.scheme is None else self.scheme.stalled(step)
        if stall is not None:
            self.stall(step, f"{self.label} did not get {stall.lacking} within "
                             f"{self.settings.timeout:g} s", stall.here)

    def _give_up(self, step: int) -> None:
        """No decision reached this node from the master in time: its parent is gone or
        frozen. Its subtree's processes must not wait longer."""
        if not self.is_decided(step):
            self.fail(step, f"{self.label} got no decision about step {step} from the master "
                            f"within {self.settings.answer_within:g} s (its parent is cut off "
                            "or frozen)", tree_wide=False)

    def stall(self, step: int, reason: str, here: bool = False) -> None:
        if self.is_decided(step):
            return
        if self.is_master:
            self.fail(step, reason)
            return
        if step not in self._reported:
            self._reported.add(step)
            # Said loudly when it changes; a node that stays degraded says it once.
            why = reason.partition(":")[2] or reason
            level = logging.DEBUG if why == self._last_stall else logging.WARNING
            self._last_stall = why
            log.log(level, "step %d: %s; telling the parent (this subtree straggles)", step, reason,
                    extra={"step": step})
            self.neighbours.to_parent(Fail(step, reason, FailKind.STALL))
        if here or self.neighbours.parent is None:
            self.fail(step, reason, tree_wide=False)

    def resolved(self, step: int, layout: ChunkLayout, vector: np.ndarray) -> None:
        if self._decide(step, Resolved(step, layout, vector)):
            self.stats.steps_done += 1
            log.debug("step %d done", step, extra={"step": step})

    def fail(self, step: int, reason: str, tree_wide: bool = True) -> None:
        """``step`` failed: for the whole tree (the master decided), or for this subtree."""
        outcome = Failed(step, reason, tree_wide)
        if not self._decide(step, outcome):
            return
        log.error("step %d failed%s: %s", step, "" if tree_wide else " here", reason,
                  extra={"step": step})
        self.stats.steps_failed += 1
        if not tree_wide:
            self.stats.steps_failed_here += 1

    def refuse_local(self, step: int, reason: str) -> None:
        for answer in self._waiters.pop(step, []):
            answer(Mismatched(step, reason))

    def to_parent(self, msg: Message, payload=None) -> bool:
        if isinstance(msg, Chunk):
            self._sent_up.add(msg.step)
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

    def alloc_result(self, step: int, total: int, dtype, sent: bool = False) -> np.ndarray:
        # Only for an open step: its deadline runs, so it is decided, and the memory given back.
        found = (None if self.lend is None or step in self._lent or step not in self._open
                 else self.lend(step, total, np.dtype(dtype)))
        if found is None:
            return self.alloc(total, dtype)
        owner, vector = found
        self._lent[step] = (owner, sent)
        return vector

    def lends(self, owner: Lender) -> bool:
        """Does a step's result go into ``owner``'s shared output (until it is given back)?"""
        return any(lender is owner for lender, _ in self._lent.values())

    # ---------------------------------------------------------------- decisions
    def _decide(self, step: int, outcome: Resolved | Failed | Refused | Lost) -> bool:
        """``step`` is decided here: stop its clocks, tell the subtree, drop the scheme's
        state, answer whoever waits. False if it already was."""
        if step in self._decided or (self.is_decided(step) and step not in self._open
                                     and step not in self._waiters):
            return False
        self._decided.add(step)
        self.newest_step = max(self.newest_step, step)
        self.newest_decided = max(self.newest_decided, step)
        for handle in self._open.pop(step, ()):
            handle.cancel()
        began = self._began.pop(step, None)
        if began is not None and isinstance(outcome, (Resolved, Failed)):   # once per step
            self.stats.times.step_seconds.observe(asyncio.get_running_loop().time() - began)
        self._reported.discard(step)
        self._sent_up.discard(step)
        self._contributed.pop(step, None)
        if isinstance(outcome, Resolved):
            if step >= self.tree_step:   # the newest result's layout is the tree's
                self.tree_vector = (outcome.layout.total, outcome.layout.dtype_name)
        else:  # a result went down chunk by chunk already; anything else goes now
            for slot in self.neighbours.slots:
                if slot.link is not None:
                    slot.link.send(_fail_of(outcome))
        owner = self._lent[step][0] if step in self._lent else None
        if not isinstance(outcome, Lost):
            kept: Resolved | Failed | Refused | Lost = outcome
            if owner is not None and isinstance(outcome, Resolved):
                # Its vector is the owner's memory, which it changes once answered.
                kept = Lost(step, f"the result of step {step} was received straight into a "
                                  "training process's shared memory, where it was delivered; "
                                  "this daemon does not keep it")
            self._outcomes[step] = kept
            if isinstance(kept, Resolved):
                self._held += kept.vector.nbytes
            self._trim()
        if self.scheme is not None:
            self.scheme.forget(step, resolved=isinstance(outcome, Resolved))
        self.neighbours.forget(step)
        decided_by_master = isinstance(outcome, Resolved) or (isinstance(outcome, Failed)
                                                               and outcome.tree_wide)
        if decided_by_master and step > self.tree_step:
            self.tree_step = step   # before the answers: they say where the tree is
            self._prune()
        self.decided.emit(step)
        answers = self._waiters.pop(step, [])
        # The host's other processes copy a result from the owner's memory now, while the
        # owner waits; the owner is answered last (_give_back).
        owners = [] if owner is None else [a for a in answers if a == owner.answer]
        for answer in answers:
            if answer not in owners:
                answer(outcome)
        if owner is not None:
            loop = asyncio.get_running_loop()
            until = (loop.time() if began is None else began) + self.settings.answer_within
            then: list[Callable[[], None]] = [functools.partial(a, outcome) for a in owners]
            loop.call_soon(self._give_back, step, then, until)
        return True

    def _give_back(self, step: int, answers: list[Callable[[], None]], until: float) -> None:
        """``step``'s result went into a training process's shared output, which is its own
        again once it is answered (``answers``): first every link of this node must have
        sent what it queued, which may read that memory (a ring member's parts). Checked
        every ``GIVE_BACK_POLL`` s until the step's bound (``until``); a link that still
        holds data then is cut off (its queue dropped) rather than read memory the
        process may be changing."""
        loop = asyncio.get_running_loop()
        owner, sent = self._lent[step]
        busy = ([link for link in self.neighbours.sending() if link.write_buffer_size]
                if sent else [])   # else no send reads it: a leaf's
        if busy and loop.time() < until:
            loop.call_later(GIVE_BACK_POLL, self._give_back, step, answers, until)
            return
        for link in busy:
            link.abort(f"it did not send step {step}'s result within the step's bound, and the "
                       "training process whose memory holds it is due its answer")
        del self._lent[step]
        for answer in answers:
            answer()
        owner.given_back()

    def _trim(self) -> None:
        """Keep the last ``keep_results`` outcomes, and every result a local training process
        has not taken yet (it will catch up on them) while they fit ``result_memory``."""
        floor = min(self.consumers.emit(None), default=None)
        while len(self._outcomes) > self.settings.keep_results:
            step, oldest = next(iter(self._outcomes.items()))
            if floor is not None and step >= floor and self._held <= self.settings.result_memory:
                return
            self._outcomes.popitem(last=False)
            if isinstance(oldest, Resolved):
                self._held -= oldest.vector.nbytes

    def _prune(self) -> None:
        """The window moved: forget what lies behind it; steps still open there were
        passed over by the tree."""
        low = self.tree_step - self.settings.behind
        for step in sorted(s for s in set(self._open) | set(self._waiters) if s <= low):
            self._decide(step, Lost(step, f"step {step} was passed over: the tree went on to "
                                          f"step {self.tree_step} before it was decided here"))
        self._decided = {s for s in self._decided if s > low}
        self._contributed = {s: v for s, v in self._contributed.items() if s > low}
        for slot in self.neighbours.slots:
            slot.told = {s for s in slot.told if s > low}


def _fail_of(outcome: Failed | Refused | Lost | Mismatched) -> Fail:
    """The FAIL a child gets for a decided step that has no result to send."""
    if isinstance(outcome, Failed):
        return Fail(outcome.step, outcome.reason,
                    FailKind.TREE if outcome.tree_wide else FailKind.LOCAL)
    if isinstance(outcome, Refused):
        return Fail(outcome.step, outcome.reason, FailKind.REFUSED)
    return Fail(outcome.step, outcome.reason, FailKind.LOST)
