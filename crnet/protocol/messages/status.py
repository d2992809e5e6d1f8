"""``crnet status``: a status client's hello, and the request and reply that also travel
down the tree links (the reply's tree is checked by ``crnet.protocol.status_tree``); the frames
``crnet tune --probe`` times the tree links with (``crnet/node/observe/probe.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from ...defaults import PROBE_BYTES_MAX, PROBE_ROUNDS, TUNE_WINDOW_MAX
from ..auth import NONCE_BYTES
from ..fields import Fields
from ..status_tree import MAX_STATUS_DEADLINE, status_entry
from ..wire import MsgType
from .base import Message


@dataclass(frozen=True, slots=True)
class StatusHello(Message):
    """``crnet status`` -> a node's --listen, first frame (``nonce``: as HELLO's)."""

    TYPE = MsgType.STATUS_HELLO
    BEFORE_AUTH = True
    nonce: bytes | None = None

    @classmethod
    def from_header(cls, h: Fields) -> StatusHello:
        return cls(h.opt_blob("nonce", NONCE_BYTES))


@dataclass(frozen=True, slots=True)
class StatusRequest(Message):
    """``crnet status`` -> node, or parent -> child: your subtree's state within
    ``deadline`` seconds, as answer ``id``; with every node's ``measured`` section, its
    windows cut to the newest ``measured`` steps, if that is not 0 (``crnet tune``); after
    each node timed its links with ``probe`` bytes to each child and its compute, if that
    is not 0 (``crnet tune --probe``: the master starts it, for a status client only)."""

    TYPE = MsgType.STATUS
    id: int
    deadline: float
    measured: int = 0
    probe: int = 0

    @classmethod
    def from_header(cls, h: Fields) -> StatusRequest:
        return cls(h.integer("id", 0, 1 << 62), h.number("deadline", 0.0, MAX_STATUS_DEADLINE),
                   h.opt_integer("measured", 0, TUNE_WINDOW_MAX) or 0,
                   h.opt_integer("probe", 0, PROBE_BYTES_MAX) or 0)


@dataclass(frozen=True, slots=True)
class StatusReply(Message):
    """node -> whoever asked: ``node``, its subtree's state (``crnet.protocol.status_tree``)."""

    TYPE = MsgType.STATUS_REPLY
    id: int
    node: dict

    @classmethod
    def from_header(cls, h: Fields) -> StatusReply:
        return cls(h.integer("id", 0, 1 << 62), status_entry(h.mapping("node"), depth=0))


@dataclass(frozen=True, slots=True)
class Probe(Message):
    """parent -> child: ``crnet tune --probe``'s bytes (at most ``PROBE_FRAME`` a frame, the
    child reads and drops them), of probe ``id``'s round ``round``; after the ``last`` of
    a round the child echoes it."""

    TYPE = MsgType.PROBE
    PAYLOAD = True
    id: int
    round: int
    last: bool = False

    @classmethod
    def from_header(cls, h: Fields) -> Probe:
        return cls(h.integer("id", 0, 1 << 62), h.integer("round", 0, PROBE_ROUNDS), h.flag("last"))


@dataclass(frozen=True, slots=True)
class ProbeEcho(Message):
    """child -> parent: every byte of probe ``id``'s round ``round`` came."""

    TYPE = MsgType.PROBE_ECHO
    id: int
    round: int

    @classmethod
    def from_header(cls, h: Fields) -> ProbeEcho:
        return cls(h.integer("id", 0, 1 << 62), h.integer("round", 0, PROBE_ROUNDS))

