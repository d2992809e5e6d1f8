"""``crnet status``: a status client's hello, and the request and reply that also travel
down the tree links (the reply's tree is checked by ``crnet.status_tree``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..auth import NONCE_BYTES
from ..defaults import TUNE_WINDOW_MAX
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
    windows cut to the newest ``measured`` steps, if that is not 0 (``crnet tune``)."""

    TYPE = MsgType.STATUS
    id: int
    deadline: float
    measured: int = 0

    @classmethod
    def from_header(cls, h: Fields) -> StatusRequest:
        return cls(h.integer("id", 0, 1 << 62), h.number("deadline", 0.0, MAX_STATUS_DEADLINE),
                   h.opt_integer("measured", 0, TUNE_WINDOW_MAX) or 0)


@dataclass(frozen=True, slots=True)
class StatusReply(Message):
    """node -> whoever asked: ``node``, its subtree's state (``crnet.status_tree``)."""

    TYPE = MsgType.STATUS_REPLY
    id: int
    node: dict

    @classmethod
    def from_header(cls, h: Fields) -> StatusReply:
        return cls(h.integer("id", 0, 1 << 62), status_entry(h.mapping("node"), depth=0))
