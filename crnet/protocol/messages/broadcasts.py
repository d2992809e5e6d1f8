"""Broadcasts and barriers: up the tree to the master and down to every node, and the
training process's requests for them (the Unix socket)."""

from __future__ import annotations

from dataclasses import dataclass

from ...dtypes import DTYPE_NAMES
from ..fields import Fields
from ..wire import MsgType
from .base import Message

MAX_KEY = 256                   # characters of a broadcast's key
VOTE = "crnet.root/"            # a barrier that names a broadcast's root (``vote_key``)
MAX_ROOTS = 2                   # roots a vote's release names (two: the processes disagree)


def vote_key(key: str) -> str:
    """The barrier at which every process of a ``root=True``/``False`` broadcast ``key``
    arrives: its release names the host whose process sent the broadcast."""
    return VOTE + key


def state_key(nonce: int) -> str:
    """The key of the broadcast that answers state request ``nonce`` (WANT_STATE)."""
    return f"state/{nonce}"


@dataclass(frozen=True, slots=True)
class Bcast(Message):
    """A piece of broadcast ``key``: bytes ``offset``.. of a ``total`` x ``dtype`` vector.
    Up (child -> parent): from the process that sent it (``origin``, chosen by its daemon),
    toward the master; down (parent -> child): the master's copy, to every node. ``step``
    is what the sender says the vector belongs to (a state: the step it was taken after).
    ``root``: the tree name of the host whose process sent it (each parent checks that it
    is in the subtree it came from; None: an older peer, taken as the child's own)."""

    TYPE = MsgType.BCAST
    PAYLOAD = True
    key: str
    origin: int
    step: int
    offset: int
    total: int
    dtype: str
    root: str | None = None

    @classmethod
    def from_header(cls, h: Fields) -> Bcast:
        return cls(h.text("key", MAX_KEY), h.integer("origin"), h.integer("step", -1),
                   h.integer("offset", 0, 1 << 48), h.integer("total", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES), h.opt_text("root", 64))


@dataclass(frozen=True, slots=True)
class WantState(Message):
    """Up (and training process -> daemon): a process that joined a running job wants a
    peer's state, as broadcast ``state/<nonce>``. Down: the master asks every process."""

    TYPE = MsgType.WANT_STATE
    nonce: int

    @classmethod
    def from_header(cls, h: Fields) -> WantState:
        return cls(h.integer("nonce", 1))


@dataclass(frozen=True, slots=True)
class Publish(Message):
    """training process -> daemon: send the vector in my shared input to every process of
    the job as broadcast ``key`` (``step``: what it belongs to, -1 if nothing). ``vote``:
    the sender is ``root=True`` and the others will ask with ``root=False``: it arrives at
    their vote of that many processes (0: every process of the tree); None: no vote (a
    root named by rank, a state answer)."""

    TYPE = MsgType.PUBLISH
    key: str
    step: int
    length: int
    dtype: str
    vote: int | None = None

    @classmethod
    def from_header(cls, h: Fields) -> Publish:
        return cls(h.text("key", MAX_KEY), h.integer("step", -1), h.integer("length", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES), h.opt_integer("vote", 0, 1 << 20))


@dataclass(frozen=True, slots=True)
class Receive(Message):
    """training process -> daemon: broadcast ``key`` into my shared output once it is here;
    with ``root``, only the copy sent by the process of that rank (``Client.rank``);
    without, the copy of the process that sent it with ``root=True``, which the processes'
    vote names (``vote``: of that many processes; 0 or None: every process of the tree)."""

    TYPE = MsgType.RECEIVE
    key: str
    length: int
    dtype: str
    root: int | None = None
    vote: int | None = None

    @classmethod
    def from_header(cls, h: Fields) -> Receive:
        return cls(h.text("key", MAX_KEY), h.integer("length", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES), h.opt_integer("root", 0, 1 << 31),
                   h.opt_integer("vote", 0, 1 << 20))


@dataclass(frozen=True, slots=True)
class Delivered(Message):
    """daemon -> training process: broadcast ``key`` was taken (PUBLISH) or is in shared
    memory (RECEIVE); ``step`` is what its sender said it belongs to."""

    TYPE = MsgType.DELIVERED
    key: str
    step: int

    @classmethod
    def from_header(cls, h: Fields) -> Delivered:
        return cls(h.text("key", MAX_KEY), h.integer("step", -1))


@dataclass(frozen=True, slots=True)
class Barrier(Message):
    """Barrier ``key`` of ``processes`` training processes. Up (and training process ->
    daemon, with ``arrived`` 1): ``arrived`` of them are at it in this subtree. Down: all
    are (``arrived == processes``): go on. At a vote (``vote_key``), ``roots`` names the
    hosts whose process arrived as the broadcast's root: up, those in this subtree; down,
    the release's, whose copy every receiver takes (one; ``MAX_ROOTS`` when several
    said so)."""

    TYPE = MsgType.BARRIER
    key: str
    arrived: int
    processes: int
    roots: tuple[str, ...] | None = None

    @classmethod
    def from_header(cls, h: Fields) -> Barrier:
        processes = h.integer("processes", 1, 1 << 20)
        roots = h.h.get("roots")
        if roots is not None and (not isinstance(roots, list) or len(roots) > MAX_ROOTS or any(
                not isinstance(r, str) or len(r) > 64 for r in roots)):
            raise h.bad("roots", f"a list of at most {MAX_ROOTS} tree names")
        return cls(h.text("key", len(VOTE) + MAX_KEY), h.integer("arrived", 0, processes),
                   processes, None if roots is None else tuple(roots))
