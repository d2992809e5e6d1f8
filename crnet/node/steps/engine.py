"""The step engine: the gate every piece of a step passes at one node.

The links hand it each step's pieces as typed messages, through one entry point
(``piece_dest`` for where a payload lands, ``piece`` once it is whole), with the kind
of link it came on and who sent it; the local vector comes through ``request``. Which
messages are pieces is the scheme's word (``Scheme.TAKES``). The engine admits a piece
only if its step is in the window and not decided, opens the step (its deadline runs:
``deadlines.py``) before the scheme (``crnet.schemes``) sees its first piece, and
passes it on; the scheme combines pieces, sends them on and gives its verdict
through narrow ports (``Sends`` below, ``decisions.py``, ``lending.py``). The rooms:

- ``record.py``     a step at this node: one record, one state, the table of its moves;
- ``window.py``     which steps are decided, and which may take part (``tree_step``);
                    the records of the steps within it;
- ``deadlines.py``  a deadline for every step under way (the stall inspector);
- ``decisions.py``  a step resolves or fails; whoever waits is answered;
- ``outcomes.py``   what a step came to, and the outcomes kept (the result cache);
- ``lending.py``    memory, and results straight into a training process's output.

What the gate itself decides:

- **Who may take part.** Steps more than ``window`` ahead of ``tree_step`` are refused
  to whoever sent them (a process, or a child's CHUNK, OPEN or FAIL), and only to them.
  A child hears of its refusal once per step, but only its newest refusal is
  remembered (a hostile child naming steps far ahead adds nothing that lasts). Steps
  further behind than the window (or the kept results) are decided here: a late
  process gets their result if it is kept, else StepLost with ``tree_step``.
- **Catch-up.** A child busy with a decided step it may have missed (it joined while
  the step was under way) gets the outcome, once.
- **One vector per host and step.** A second SUBMIT of a step (a restarted process, a
  retry) waits for the result and adds nothing.
- **No vector larger than this host's memory** (``max_vector_bytes``): a peer whose
  piece (CHUNK, RESULT, SEGMENT, PIECE, ...) claims one has its connection closed before
  anything is allocated (no host could hold it: it is not a gradient, it is an attack or
  a bug).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ... import defaults
from ...dtypes import DTYPES, dtype_name
from ...errors import ProtocolError
from ...measure.stats import Stats
from ...peer_text import Throttle, shown
from ...protocol.messages import Chunk, Fail, FailKind, Message, Open, Result
from ...schemes import Origin, Place, Ports, Scheme, Stall, Takes, driver, sums_over_peers
from ..neighbours import Neighbours
from ..signal import Signal
from .deadlines import Deadlines
from .decisions import Answer, Decisions
from .lending import Lend, Lender, Lending
from .outcomes import Failed, Kept, Lost, Mismatched, Outcome, Refused, Resolved, fail_of
from .settings import EngineSettings
from .window import StepWindow

log = logging.getLogger("crnet.node")

__all__ = ["StepEngine"]

# Steps beyond the window a peer's chunk of the tree's sum began here (``_admit``), at most:
# a host that fell behind learns so where the tree is, and one such step is all it needs.
FAR_STEPS = 2


class StepEngine:
    """Steps at one node: the rooms, and the gate between the links and the scheme."""

    def __init__(self, settings: EngineSettings, stats: Stats, neighbours: Neighbours,
                 lend: Lend | None = None):
        self.settings = settings
        self.stats = stats
        self.neighbours = neighbours
        self.place: Place | None = None
        self.scheme: Scheme | None = None
        self.window = StepWindow(settings.window, settings.behind)
        self.deadlines = Deadlines(settings, self.window, neighbours, stalled=self._stalled,
                                   fail=self._fail, lose=self._lose)
        self.lending = Lending(neighbours, self.deadlines.is_open, lend)
        self.decisions = Decisions(
            settings, stats, self.window, self.deadlines,
            Kept(settings.keep_results, settings.result_memory),
            self.lending, neighbours, self._forget)
        self.sends = Sends(neighbours, settings.send_queue_bytes, self.deadlines.sent_up)
        self._takes: dict[tuple[Origin, type[Message]], Taking] = {}   # the scheme's TAKES, bound
        self._peer_lines = Throttle(log)        # lines about what children sent
        self._disowned: set[int] = set()        # peers this assignment will not reach (--tls-names)

    # -- what the rest of the node reads
    @property
    def label(self) -> str:
        return self.deadlines.label

    @property
    def is_master(self) -> bool:
        return self.deadlines.is_master

    @property
    def decided(self) -> Signal[int | None]:
        """Every decision (its step), and a tree_step learned from a peer (None)."""
        return self.decisions.decided

    @property
    def consumers(self) -> Signal[None]:
        """Polled for the oldest step each local training process may still ask for
        (``links.client_steps``): results they have not taken are kept."""
        return self.decisions.kept.consumers

    @property
    def open_steps(self) -> list[int]:
        return self.deadlines.steps

    def decided_steps(self) -> list[int]:
        """The steps decided here that the window still tracks."""
        return self.window.steps.decided_steps()

    def is_decided(self, step: int) -> bool:
        return self.window.is_decided(step)

    def failed_here(self, step: int) -> bool:
        """Whether ``step`` is decided here only as a failure of this node's alone (cut off
        from the master): asked for again, it is reopened (``Decisions.reopen``)."""
        return self.decisions.failed_here(step)

    def refusal(self, step: int) -> str | None:
        return self.window.refusal(step)

    @property
    def tree_step(self) -> int:
        """The newest step the master decided, as far as this node knows (-1: none yet)."""
        return self.window.tree_step

    @property
    def tree_vector(self) -> tuple[int, str] | None:
        """(length, dtype) of the tree's vectors, once known."""
        return self.window.tree_vector

    @property
    def newest_step(self) -> int:
        """The newest step seen here in any form (-1: none)."""
        return self.window.newest_step

    @property
    def newest_decided(self) -> int:
        """The newest step decided here in any way (-1: none)."""
        return self.window.newest_decided

    def outcome(self, step: int) -> Outcome:
        """The outcome of a decided step."""
        return self.decisions.outcome(step)

    def lends(self, owner: Lender) -> bool:
        return self.lending.lends(owner)

    def alloc(self, total: int, dtype) -> np.ndarray:
        return self.lending.alloc(total, dtype)

    def bookkeeping(self) -> dict[str, int]:
        """How many steps each table tracks: bounded by the window, whatever the run's length."""
        records = self.window.steps
        return {"open": len(records.open_steps()), "decided": len(records.decided_steps()),
                "kept": len(self.decisions.kept), "kept_bytes": self.decisions.kept.held,
                "waiting": sum(1 for r in records if r.waiters), "records": len(records),
                "told": sum(len(slot.told) for slot in self.neighbours.slots)}

    # -- the node's life
    def start(self, place: Place) -> None:
        """This node knows its place and its share: steps may begin."""
        if self.place == place and self.scheme is not None:
            return  # rejoined the same place (the parent restarted): nothing changes
        self.place = self.deadlines.place = place
        self._new_scheme(place)

    def _new_scheme(self, place: Place) -> None:
        self.scheme = scheme = driver(place, self._ports(place))
        self.decisions.keep_open_here = scheme.SUMS_OVER_PEERS
        self._takes = {(t.origin, t.message): Taking.of(t, scheme) for t in scheme.TAKES}
        for rank in self._disowned:
            self.scheme.peer_disowned(rank)

    def _ports(self, place: Place) -> Ports:
        peers = self.sends if sums_over_peers(place.scheme) else None
        return Ports(send=self.sends, steps=self.decisions, memory=self.lending, stats=self.stats,
                     peers=peers, guarded=self.settings.guarded,
                     check_relays=self.settings.guarded and self.settings.check_relays,
                     stall_after=self.settings.stall_after)

    def learn(self, tree_step: int, vector: tuple[int, str] | None = None) -> None:
        """What a peer knows of the tree (a parent's WELCOME, a child's JOINED): a node that
        restarted resumes where the tree is."""
        if self.window.learn(tree_step, vector):
            self.decisions.prune()
            self.decided.emit(None)

    def new_job(self, name: str) -> None:
        """The tree starts training job ``name``: the previous job's steps, results and
        vector are dropped (its processes still waiting are told), and steps count from 0."""
        # Steps whose result was going into a process's memory, never decided now: its
        # owner gets it back once the links sent what they queued from it.
        undecided = [s for s in self.lending.steps if not self.is_decided(s)]
        if undecided:
            loop = asyncio.get_running_loop()
            for step in undecided:
                loop.call_soon(self.lending.give_back, step, [],
                               loop.time() + self.settings.answer_within)
        self.close()
        waiting = self.decisions.reset()
        for slot in self.neighbours.slots:
            slot.told.clear()
            slot.missed_through = -1
        self.window.reset()
        if self.place is not None:
            self._new_scheme(self.place)
        log.info("the tree now runs job %r", name)
        for step, answers in sorted(waiting.items()):
            for answer in answers:
                answer(Failed(step, f"the tree now runs job {name!r}: this job's steps are over",
                              tree_wide=True))
        self.decided.emit(None)

    def close(self) -> None:
        self.deadlines.close_all()

    # -- what the rooms ask of the scheme
    def _stalled(self, step: int) -> Stall | None:
        return None if self.scheme is None else self.scheme.stalled(step)

    def _fail(self, step: int, reason: str, tree_wide: bool) -> None:
        self.decisions.fail(step, reason, tree_wide)

    def _lose(self, step: int, reason: str) -> None:
        self.decisions.lose(step, reason)

    def _forget(self, step: int, resolved: bool) -> None:
        if self.scheme is not None:
            self.scheme.forget(step, resolved)

    def _open(self, step: int, announce: bool, child: int | None = None,
              peer: int | None = None) -> bool:
        """Open ``step`` (its deadline runs: ``deadlines.py`` says when, if ``child`` or
        ``peer`` opens it) before the scheme sees a piece of it, and tell the scheme it
        began; False if that decided it (too many children were out of it)."""
        if self.deadlines.open(step, announce, child, peer) and self.scheme is not None:
            self.scheme.opened(step)
        return not self.is_decided(step)

    @property
    def _announces(self) -> bool:
        """A leaf's chunk goes up at once: that tells the parent the step began."""
        return self.place is not None and not self.place.is_leaf

    # -- the training process
    def request(self, step: int, vector: np.ndarray | None, answer: Answer) -> None:
        """A process asks for ``step``'s outcome, contributing ``vector`` (or not): ``answer``
        is called once, within ``answer_within``. A step this node failed alone (cut off
        from the master) asked for again is reopened: it takes part anew, or gets the
        tree's verdict."""
        if self.is_decided(step) and not self._asked_again(step, answer):
            answer(self.outcome(step))
            return
        refusal = self.refusal(step)
        if refusal is not None:
            answer(Refused(step, refusal))
            return
        record = self.window.steps.get(step)
        given = None if vector is None or record is None else record.contributed
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
            if self.scheme is None:
                answer(Mismatched(step, f"{self.label} has no share of the data yet"))
                return
            problem = self.scheme.local(step, vector) if self._open(step, self._announces) else None
            if problem is not None:
                answer(Mismatched(step, problem))
                return
            self.window.steps.make(step).contributed = (vector.size, vector.dtype)
        self._open(step, announce=True)
        if self.is_decided(step):   # at once: children out of it before it opened here
            answer(self.outcome(step))
            return
        self.decisions.waiting(step, answer)

    @property
    def _sums_over_peers(self) -> bool:
        return self.scheme is not None and self.scheme.SUMS_OVER_PEERS

    def _asked_again(self, step: int, answer: Answer) -> bool:
        """A process asks again for a step this node failed alone: True if it is open
        again. The sum of a scheme with peers reaches a host only while the step is under
        way there (the owners', the ring's sends): a host that failed such a step alone
        after the tree decided it cannot get it again, and says so (``Lost``: the
        process takes the others' state), once the tree is past it."""
        if not self.failed_here(step):
            return False
        if self._sums_over_peers and step <= self.tree_step:
            answer(Lost(step, f"the tree decided step {step} while {self.label} was cut off "
                              f"from it; its sum does not come here again (the tree is at "
                              f"step {self.tree_step}): take the others' state"))
            return True
        return self.decisions.reopen(step)

    def parent_back(self) -> None:
        """A new link to the parent: what went up on the old one is gone with it. Steps
        open here fail here now (provisionally): their processes ask again, and the
        steps take part anew over the new link, or get the tree's verdict. (rar and
        spread send their pieces to peers, not up: their steps go on.)"""
        if self.scheme is None or self._sums_over_peers:
            return
        for step in [r.step for r in self.window.steps.unsettled()]:
            self.decisions.fail(step, f"{self.label} reconnected to its parent while step "
                                      f"{step} was under way: ask again", tree_wide=False)

    # -- a step's pieces, from any link
    def piece_dest(self, origin: Origin, who: int, msg: Any, nbytes: int) -> memoryview | None:
        """Where the payload of ``msg`` (a piece the scheme takes from ``origin``'s kind of
        link, sent by ``who``) lands; None: it is read and dropped (its step is decided, or
        refused)."""
        taking = self._taking(origin, who, msg)
        if taking is None or not self._admit(taking, origin, who, msg):
            return None
        assert taking.dest is not None
        return taking.dest(who, msg, nbytes)

    def piece(self, origin: Origin, who: int, msg: Any, payload: memoryview | None) -> None:
        """``msg`` is whole (its payload landed where ``piece_dest`` said)."""
        taking = self._taking(origin, who, msg)
        if taking is None:
            return
        if taking.dest is None:                # no payload: admitted only now
            if not self._admit(taking, origin, who, msg):
                return
        elif payload is None:                  # an empty payload: no destination was asked
            if self.piece_dest(origin, who, msg, 0) is None:
                return
        elif self.is_decided(msg.step):        # decided while its bytes came
            return
        taking.take(who, msg)

    def _taking(self, origin: Origin, who: int, msg: Message) -> Taking | None:
        """The running scheme's method for ``msg`` from ``origin``; None before this node has
        its share; a ProtocolError (the connection closes) if the scheme takes no such piece."""
        if self.scheme is None:
            if not _stepped(msg):
                raise ProtocolError(f"{msg.TYPE.name} before this node has its share")
            self._check_size(msg)   # (a vector no host could hold closes the link, share or not)
            return None
        taking = self._takes.get((origin, type(msg)))
        if taking is None:
            # Of a step that is decided here (or out of the window), it is dropped as any
            # late piece is: a parent catching this node up, a child still on a step the
            # tree decided under another scheme. Of a step that may take part: an error.
            if _stepped(msg) and not self._may_take_part(origin, who, msg):
                return None
            raise ProtocolError(f"{self.label} ({self.place.scheme if self.place else '?'}) "
                                f"takes no {msg.TYPE.name} from {origin.value}")
        return taking

    def _may_take_part(self, origin: Origin, who: int, msg: Any) -> bool:
        """The window's word on ``msg``'s step, before anything opens it."""
        self._check_size(msg)
        if origin is Origin.CHILD:
            return self._admit_child(who, msg.step, reopen=False)
        if self.is_decided(msg.step):
            return False
        return origin is Origin.PARENT or self.refusal(msg.step) is None

    def _admit(self, taking: Taking, origin: Origin, who: int, msg: Any) -> bool:
        """May ``msg`` take part in its step here (the module's docstring)? The step opens."""
        if not taking.stepped:
            return True
        self._check_size(msg)
        step = msg.step
        if origin is Origin.CHILD:
            return self._admit_child(who, step) and self._open(step, announce=True, child=who)
        if origin is Origin.PARENT:
            self.decisions.reopen(step)   # the tree's verdict on a step failed here: taken
        if self.is_decided(step):
            return False
        if origin is Origin.PARENT:
            self.window.seen(step)   # results of a step this node took no part in
            return True
        # A peer's piece of the tree's decided sum is taken beyond the window, as a parent's
        # RESULT is: a host that fell behind (restarted while the others ran on) learns so
        # where the tree is, instead of failing its steps one deadline at a time. Not at the
        # master, which is where the tree is: there a sum's chunk far ahead is a peer's word,
        # and the step it opened would fail for the whole tree at its deadline. And only in
        # the tree's layout (the last result's): a host behind learns it with its WELCOME,
        # and a chunk in a layout of a peer's choosing is no chunk of the tree's sum.
        decided_sum = (taking.beyond is not None and taking.beyond(msg) and not self.is_master
                       and self.tree_vector == (msg.total, msg.dtype))
        if self.refusal(step) is not None:
            if not decided_sum:
                return False
            self._room_far_ahead(step)
        return self._open(step, self._announces, peer=who)

    def _room_far_ahead(self, step: int) -> None:
        """Room for ``step``, beyond the window, among the steps a peer's sum began here:
        at most ``FAR_STEPS``, the oldest forgotten first. Such a step has no clock until
        the tree gets there, and the window does not bound it: a peer that holds the
        secret sending one chunk per step far ahead kept a step of the tree's vector per
        chunk, for good (the authenticated fuzzer: 102 steps and 150 MiB at a leaf after
        400,000 frames)."""
        end = self.window.end
        far = sorted((r for r in self.window.steps if r.step > end and r.is_open
                      and r.step != step and not r.waiters), key=lambda r: r.began or 0.0)
        for record in far[:max(0, len(far) - FAR_STEPS + 1)]:
            record.cancel_clocks()
            self.window.steps.drop(record.step)
            self._forget(record.step, resolved=False)

    # -- children
    def child_opened(self, k: int, msg: Open) -> None:
        if self._admit_child(k, msg.step):
            self._open(msg.step, announce=True, child=k)

    def child_failed(self, k: int, msg: Fail) -> None:
        # A child's text, and a child may report a failure of every step of the window:
        # quoted, cut short, and a line now and then per child.
        self._peer_lines.log(logging.INFO, (k, "FAIL"), "step %d: child %d reports: %s",
                             msg.step, k, shown(msg.reason))
        if self._peers_decided(k, msg.step):
            return
        if self.scheme is not None and self._admit_child(k, msg.step):
            self.scheme.child_silent(k, msg.step, msg.reason)

    def _peers_decided(self, k: int, step: int) -> bool:
        """Under rar or spread a result never goes down the tree (the sum comes over the
        peer links), so a child that reports a step this node decided may never get it
        (it rejoined after the sum went round, or its chunks were lost): it is told the
        verdict, a result as lost there (its processes take the others' state)."""
        if (not self._sums_over_peers or not self.is_decided(step)
                or self.failed_here(step)):
            return False
        outcome = self.outcome(step)
        if isinstance(outcome, Resolved):
            self._tell_child(k, step, Fail(step, f"{self.label} has step {step}'s sum, and it did "
                                                 "not reach this host over the peer links",
                                           FailKind.LOST))
        else:
            self._tell_child(k, step, fail_of(outcome))
        return True

    def child_lost(self, k: int) -> None:
        if self.scheme is not None:
            self.scheme.child_silent(k, None, "disconnected")

    def _admit_child(self, k: int, step: int, reopen: bool = True) -> bool:
        """May child ``k`` take part in ``step``? If it is decided, the child gets the
        outcome if it may have missed it; if it is out of the window, it is refused. A
        step this node failed alone while cut off takes part anew once the parent is back
        (``reopen``): its subtree asks for it again."""
        if self.is_decided(step) and not (reopen and self.neighbours.parent is not None
                                          and self.decisions.reopen(step)):
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
                end = self.window.end
                slot.told = {s for s in slot.told if s <= end}
            self._tell_child(k, step, Fail(step, refusal, FailKind.REFUSED))
            return False
        return True

    def _check_size(self, msg: Any) -> None:
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
                slot.link.send(Result(step, c, layout.total, layout.dtype_name,
                                      outcome.approx if c == 0 else None),
                               outcome.vector[start:stop])
        else:
            self._tell_child(k, step, fail_of(outcome))

    def _tell_child(self, k: int, step: int, msg: Message) -> None:
        """Send a child a verdict about ``step`` once, however many of its chunks come."""
        slot = self.neighbours.slots[k]
        if slot.link is not None and step not in slot.told:
            slot.told.add(step)
            slot.link.send(msg)

    # -- the parent
    def parent_failed(self, msg: Fail) -> None:
        decisions = self.decisions
        if msg.kind is not FailKind.LOCAL:
            decisions.reopen(msg.step)   # the tree's verdict replaces a failure here
        if msg.kind is FailKind.MISMATCH:
            log.error("step %d: the parent refused this node's vector: %s", msg.step,
                      shown(msg.reason), extra={"step": msg.step})
            decisions.refuse_local(msg.step, msg.reason)
        elif msg.kind is FailKind.REFUSED:
            # Beyond the parent's window now, not for good: this node's failure alone, and a
            # process asking for the step later opens it again. (A chunk of the tree's sum
            # from a peer opens a far step here, which the parent refuses: as the step's
            # verdict, every later ask was refused until the tree passed it, though the
            # tree came to it; the authenticated fuzzer's spread runs stalled so.)
            decisions.decide(msg.step, Refused(msg.step, msg.reason), here=True)
        elif msg.kind is FailKind.LOST:
            decisions.decide(msg.step, Lost(msg.step, msg.reason))
        elif msg.kind is FailKind.STALL:
            log.warning("step %d: the parent sent a child's FAIL kind: %s", msg.step,
                        shown(msg.reason), extra={"step": msg.step})
        else:
            decisions.fail(msg.step, msg.reason, tree_wide=msg.kind is FailKind.TREE)

    def parent_lost(self, reason: str) -> None:
        """Steps under way here cannot be decided without the master: fail them here (for
        now: ``Decisions.reopen``)."""
        for step in [r.step for r in self.window.steps.unsettled()]:
            self.decisions.fail(step, f"{self.label} {reason}", tree_wide=False)

    # -- peers: the ring predecessor (rar), the other hosts (spread)
    def peer_unreachable(self, rank: int) -> None:
        if self.scheme is not None:
            self.scheme.peer_unreachable(rank)

    def peer_disowned(self, rank: int) -> None:
        """Peer ``rank`` will not be reached (``Scheme.peer_disowned``), for as long as this
        assignment holds: told to every scheme this node runs from now on."""
        self._disowned.add(rank)
        if self.scheme is not None:
            self.scheme.peer_disowned(rank)

    def peers_moved(self) -> None:
        """The hosts move (MOVE): ranks are given anew, none is disowned yet."""
        self._disowned.clear()

    def peer_lost(self, rank: int) -> None:
        if self.scheme is not None:
            self.scheme.peer_silent(rank)


def _stepped(msg: Message) -> bool:
    return hasattr(msg, "step")


class Taking(NamedTuple):
    """A scheme's ``Takes``, its methods bound: what ``piece_dest`` and ``piece`` call."""

    take: Callable[[int, Any], None]
    dest: Callable[[int, Any, int], memoryview | None] | None
    stepped: bool
    beyond: Callable[[Any], bool] | None

    @classmethod
    def of(cls, takes: Takes, scheme: Scheme) -> Taking:
        dest = None if takes.dest is None else getattr(scheme, takes.dest)
        return cls(getattr(scheme, takes.take), dest, takes.stepped, takes.beyond)


class Sends:
    """The scheme's sends (``schemes.Sends``, and ``schemes.PeerSends`` for a scheme with
    peers) over the node's links (``neighbours.py``): each message encoded once; a chunk
    sent up starts the step's clock here; a result's queue bound is the node's."""

    def __init__(self, neighbours: Neighbours, send_queue_bytes: int | None,
                 sent_up: Callable[[int], None]):
        self.neighbours = neighbours
        self.send_queue_bytes = send_queue_bytes   # None: max(SEND_QUEUE_BYTES, 4 vectors)
        self._sent_up = sent_up                     # the step's clock hears a chunk went up

    def to_parent(self, msg: Message, payload=None) -> bool:
        if isinstance(msg, Chunk):
            self._sent_up(msg.step)
        return self.neighbours.to_parent(msg, payload)

    def to_child(self, k: int, msg: Message, payload=None) -> bool:
        link = self.neighbours.child(k)
        return link is not None and link.send(msg, payload)

    def to_children(self, msg: Result, payload) -> None:
        limit = self.send_queue_bytes
        if limit is None:
            vector = msg.total * np.dtype(msg.dtype).itemsize
            limit = max(defaults.SEND_QUEUE_BYTES, defaults.SEND_QUEUE_VECTORS * vector)
        self.neighbours.to_children(msg.frame(payload), limit)

    def absent_children(self) -> dict[int, str]:
        return self.neighbours.absent_children()

    # -- peers (rar, spread)
    def to_peer(self, rank: int, step: int, msg: Message, payload, keep: bool = False) -> None:
        self.neighbours.to_peer(rank, step, msg.frame(payload), keep)

    def in_turn(self, ranks: Sequence[int], step: int, msg: Message, payload,
                keep: bool = False, tag: int | None = None) -> None:
        frame = msg.frame(payload)   # one encoding for every peer
        for rank in ranks:
            self.neighbours.in_turn(rank, step, frame, keep, tag)

    def withdraw(self, rank: int, step: int, tag: int) -> bool:
        return self.neighbours.withdraw(rank, step, tag)

    def reachable(self, rank: int) -> bool:
        return self.neighbours.reachable(rank)

    def link_rate(self, rank: int) -> float | None:
        return self.neighbours.link_rate(rank)

    def announce(self, msg: Message) -> None:
        self.neighbours.announce(msg.frame())
