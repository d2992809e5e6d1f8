"""What an aggregation scheme is to the node that runs it, and what the node offers it.

A scheme (a folder each: ``coded_reduce/``, ``ring_allreduce/``, ``spread/``) moves one
step's vectors at one node: it says where each incoming piece lands, combines
them, and sends pieces on through ``Ports`` (sends, its steps, memory, stats; a scheme
with peers also gets ``peers``). It never touches a socket. The step engine
(``crnet.node.steps``) drives it: it opens a step before handing the scheme its first
piece, hands it only pieces of steps not decided, and owns what every scheme shares:
per-step deadlines, the result cache, failures, and the training processes waiting for
results.

A scheme brings its own messages: ``TAKES`` lists each kind of piece it takes, from which
kind of link (``Origin``), and the methods that take it, as a link's table lists its
handlers. The links hand the engine every message some scheme takes from their kind of
link (``crnet.schemes.TAKEN``); the engine admits it (the window, the size, the step
opened) through one entry point and calls the scheme's method. A message the running
scheme does not list is a protocol error (the connection it came on is closed).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from ..coding.codes import GradientCode
from ..coding.plan import Tree
from ..measure.stats import Stats
from ..protocol.messages import Message, Result, RingPlace
from .chunks import ChunkLayout

__all__ = ["Memory", "Origin", "PeerSends", "Place", "Ports", "Scheme", "Sends", "Stall", "Steps", "Takes"]


@dataclass(frozen=True)
class Place:
    """Where a node sits and what the tree runs: all a scheme knows of its node."""

    name: str                   # "" for the master
    layer: int
    tree: Tree
    scheme: str
    code_kind: str
    chunk_bytes: int
    ring: RingPlace | None = None
    beyond_s: str = "fail"      # fail, or approximate: decode from fewer than n - s (approximate.py)
    patience: float | None = None   # seconds, per layer of parents below (None: from step times)
    spread_sum: str = "ring"    # spread: its sum round the ring of ranks, or direct from owners
    # This node's share as masses (approximate.py): its local share's, and each part's it
    # codes over its children; set once the allocation is known (() before, and for leaves).
    # (Derived from the allocation: not part of what a place is when places are compared.)
    local_mass: float = field(default=0.0, compare=False)
    part_mass: tuple[float, ...] = field(default=(), compare=False)

    @property
    def is_master(self) -> bool:
        return self.layer == 0

    @property
    def is_leaf(self) -> bool:
        return self.layer == self.tree.layers

    @property
    def fanout(self) -> int:
        return 0 if self.is_leaf else self.tree.fanout[self.layer]

    @property
    def label(self) -> str:
        return "master" if self.is_master else f"node {self.name}"

    def code(self) -> GradientCode | None:
        """The gradient code over this node's children (None for a leaf)."""
        return None if self.is_leaf else self.tree.code_of(self.name, self.code_kind)

    def layout(self, total: int, dtype) -> ChunkLayout:
        return ChunkLayout.of(total, dtype, self.chunk_bytes)


@dataclass(frozen=True)
class Stall:
    """Why a step cannot finish at this node yet: what it lacks, and whether the step
    fails here too (a ring cannot continue without a member) or only the parent is told.
    ``lost``: the master decided the step, and what this node lacks will not come (spread:
    the master settled it, and chunks relayed through a host that froze are gone): its
    processes are told so (StepLost) and take the others' state."""

    lacking: str
    here: bool = False
    lost: bool = False


class Sends(Protocol):
    """Where a scheme's pieces go; never blocks (a link queues, or cuts off a peer that
    stopped reading)."""

    def to_parent(self, msg: Message, payload=None) -> bool: ...

    def to_child(self, k: int, msg: Message, payload=None) -> bool: ...

    def to_children(self, msg: Result, payload) -> None:
        """One encoding to every connected child; one that stopped reading is cut off."""

    def absent_children(self) -> dict[int, str]:
        """Children without a live link, with why."""


class PeerSends(Protocol):
    """Where a scheme with peers (rar, spread: ``plan.PEER_SCHEMES``) sends beside the tree;
    never blocks."""

    def to_peer(self, rank: int, step: int, msg: Message, payload, keep: bool = False) -> None:
        """To peer ``rank`` (the ring successor, another spread host); queued while its link
        is (re)connecting, until ``step`` is decided (``keep``: a few steps longer, for a
        word the peer needs after this host decided it: spread's SETTLED)."""

    def in_turn(self, ranks: Sequence[int], step: int, msg: Message, payload,
                keep: bool = False, tag: int | None = None) -> None:
        """To each peer of ``ranks``, in that order, once this node's sends in turn before it
        have left: one peer link at a time takes the node's uplink (one encoding for them
        all). ``keep``: sent even once ``step`` is decided here. ``tag``: for ``withdraw``."""

    def withdraw(self, rank: int, step: int, tag: int) -> bool:
        """The send in turn to ``rank`` of ``step`` tagged ``tag`` is not to go, if it has not
        left yet; True if it had not."""

    def reachable(self, rank: int) -> bool:
        """Peer ``rank``'s link is up or coming up (not down, nor failed to dial)."""

    def link_rate(self, rank: int) -> float | None:
        """What the link to peer ``rank`` carried while it had something to send, in
        bytes/s, as TCP counts it; None while it is down, before it carried anything, or
        where TCP says nothing."""

    def announce(self, msg: Message) -> None:
        """To every peer now, and first to each peer whose link comes up later (the
        latest announcement only): spread's map of owners."""


class Steps(Protocol):
    """What a scheme sees of its node's steps, and the verdicts it gives. A step is open
    (its deadline runs) before the scheme sees its first piece: the scheme never opens one."""

    @property
    def tree_vector(self) -> tuple[int, str] | None:
        """The (length, dtype) every vector of the tree has, once a step has a result."""

    def is_decided(self, step: int) -> bool:
        """``step`` has a result, failed, or lies behind the window at this node."""

    def is_open(self, step: int) -> bool:
        """``step`` started at this node and is not decided yet (its deadline runs)."""

    def stall(self, step: int, reason: str, here: bool = False) -> None:
        """``step`` can no longer finish here (not enough children left): say so now
        instead of at its deadline."""

    def settle(self, step: int) -> None:
        """The master's word came that every host has ``step``'s sum (spread's SETTLED): the
        node keeps it with the step, whatever becomes of the scheme's own state of it."""

    def is_settled(self, step: int) -> bool:
        """Whether ``settle`` was said of ``step`` (while the step is held here)."""

    @property
    def timeout(self) -> float:
        """Seconds a step may take at this node before it fails here (--timeout)."""

    def resolved(self, step: int, layout: ChunkLayout, vector: np.ndarray,
                 approx: tuple[float, float] | None = None) -> None:
        """``vector`` is the step's full result at this node; it is never written again.
        ``approx``: it is approximate, (coverage, residual) (``crnet.coding.approximate``).
        The scheme has dropped its own state of the step (``Scheme.forget`` is not called
        for it)."""

    def refuse_local(self, step: int, reason: str) -> None:
        """The local process's vector for ``step`` does not fit: it gets MismatchError;
        the step goes on without it."""


class Memory(Protocol):
    """The arrays a scheme works in."""

    def alloc(self, total: int, dtype) -> np.ndarray:
        """A vector-sized array from the node's pool (see buffers.py)."""

    def alloc_result(self, step: int, total: int, dtype, sent: bool = False) -> np.ndarray:
        """The array ``step``'s result is received or assembled into: the shared output of
        the local training process waiting on it when there is one (nothing copies the
        result then), else one from the pool. ``sent``: parts of it are sent on from there
        (a ring member's all-gather parts); that process is then answered
        only once the node's links have sent all they queued, so it suits sends that
        leave at once, not a result forwarded to children that may straggle (their
        queues would hold it up). A leaf sends nothing from it."""


@dataclass(frozen=True)
class Ports:
    """What a scheme may do at its node, as Gloo gives an algorithm a narrow context:
    send, see its steps' state and decide them, take memory, count."""

    send: Sends
    steps: Steps
    memory: Memory
    stats: Stats
    peers: PeerSends | None = None   # only for a scheme with peers (``plan.PEER_SCHEMES``)
    # The hosts authenticate (``EngineSettings.guarded``): what one relays for another is
    # checked (``check_relays``: by this host; not with --trust-relays), so the owners say
    # what it must be.
    guarded: bool = False
    check_relays: bool = False
    # A peer from which nothing came this long is cut off as frozen (EngineSettings.stall_after):
    # the longest spread waits for a relayed chunk of the sum before it asks its owner.
    stall_after: float = 0.0


class Origin(enum.Enum):
    """The kind of link a step's piece came on; with it comes ``who``: the child's slot, the
    peer's rank, 0 for the parent."""

    CHILD = "children"
    PARENT = "its parent"
    PEER = "peers"


@dataclass(frozen=True)
class Takes:
    """One kind of piece a scheme takes: ``message`` from links of kind ``origin``. ``take``
    names the method told of it, once whole, as ``take(who, msg)``; ``dest``, for a message
    with a payload, the one that says where its bytes land, ``dest(who, msg, nbytes)``
    (None: drop them unread).

    The engine admits it first: its step in the window and not decided, a vector no larger
    than the host's memory, the step opened (a piece from the parent is of a step the tree
    decided: it is taken beyond the window and opens nothing). ``stepped=False``: a piece
    of no step (spread's map of owners): only the node's share is needed. ``beyond``: a
    peer's piece of the tree's decided sum (spread's sum chunks): taken beyond the window,
    as a parent's is, if it is in the tree's layout (the last result's), except at the
    master, which is where the tree is."""

    message: type[Message]
    origin: Origin
    take: str
    dest: str | None = None
    stepped: bool = True
    beyond: Callable[[Any], bool] | None = None


class Scheme:
    """One aggregation algorithm at one node, driven by the step engine."""

    TAKES: ClassVar[tuple[Takes, ...]] = ()   # the pieces it takes, from which links
    # Whether a step's sum reaches a host over its peer links (rar, spread), not down the
    # tree: then a host cut off from its parent keeps its steps open (their clocks stopped)
    # for the sum that may still come, a reconnected parent takes nothing up anew, and a
    # host that failed a step alone cannot get its sum once the tree is past it. The step
    # engine asks this, never the scheme's name.
    SUMS_OVER_PEERS: ClassVar[bool] = False

    def __init__(self, place: Place, ports: Ports):
        self.place = place
        self.ports = ports

    # -- the local training process's vector
    def local(self, step: int, vector: np.ndarray) -> str | None:
        """This node's local vector for ``step``; returns why it does not fit, or None."""
        raise NotImplementedError

    # -- what the engine tells the scheme
    def opened(self, step: int) -> None:
        """``step`` started at this node (its deadline runs from now), whatever began it:
        a piece of it, a training process's request, a child's OPEN."""

    def child_silent(self, k: int, step: int | None, why: str) -> None:
        """Child ``k`` won't answer ``step`` (it reported a failure: a step in the window,
        which this neither opens nor starts a clock for), or any open step (``step``
        None: its link is gone)."""

    def peer_silent(self, rank: int) -> None:
        """Peer ``rank``'s link to this node is gone: what it sent of steps under way stays,
        the rest will not come (until it reconnects)."""

    def peer_unreachable(self, rank: int) -> None:
        """This node's link to peer ``rank`` is down, or could not be dialed."""

    def peer_disowned(self, rank: int) -> None:
        """Peer ``rank`` will not be reached from here while the tree is assigned as it is
        (--tls-names: the master left it out, or another host answers at its address)."""

    def stalled(self, step: int) -> Stall | None:
        """``step``'s deadline passed at this node: what is missing, or None if this
        node's part is done (the parent decides)."""
        raise NotImplementedError

    def forget(self, step: int, resolved: bool) -> None:
        """``step`` is decided (``resolved``: with a result) other than by this scheme's
        ``Steps.resolved``: drop its state."""
