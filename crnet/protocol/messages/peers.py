"""The peer links' own messages (TCP): a peer's hello, its welcome and the confirmation of
the rank it claims (``--scheme rar``: predecessor -> successor; ``--scheme spread``: every
host -> every other host). The pieces of a step that travel on them are the schemes'
(``crnet/schemes/ring_allreduce/messages.py``, ``crnet/schemes/spread/messages.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..auth import NONCE_BYTES
from ..fields import Fields
from ..wire import MsgType
from .base import Message

LINK_ID_BYTES = 16   # a peer link's id (PEER_HELLO's ``link_id``): fresh and random per dial


@dataclass(frozen=True, slots=True)
class PeerHello(Message):
    """A peer's first frame (ring predecessor -> successor; spread, host -> host): I am rank
    ``rank`` (``nonce``: as HELLO's). ``link_id``: this link's, which the acceptor may ask
    that rank about over its own link there (PEER_CHECK, ``node/peers/check.py``). ``to``:
    the rank the dialer means to reach (spread; an acceptor with --tls-names refuses a link
    meant for another rank: ``node/peers/identity.py``)."""

    TYPE = MsgType.PEER_HELLO
    BEFORE_AUTH = True
    rank: int
    nonce: bytes | None = None
    link_id: bytes | None = None
    to: int | None = None

    @classmethod
    def from_header(cls, h: Fields) -> PeerHello:
        return cls(h.integer("rank", 0, 1 << 16), h.opt_blob("nonce", NONCE_BYTES),
                   h.opt_blob("link_id", LINK_ID_BYTES), h.opt_integer("to", 0, 1 << 16))


@dataclass(frozen=True, slots=True)
class PeerWelcome(Message):
    """acceptor -> a peer: accepted. Without a cluster secret pieces may flow; with one, once
    PEER_CONFIRMED follows."""

    TYPE = MsgType.PEER_WELCOME

    @classmethod
    def from_header(cls, h: Fields) -> PeerWelcome:
        return cls()


@dataclass(frozen=True, slots=True)
class PeerConfirmed(Message):
    """acceptor -> a peer, with a cluster secret: the rank it said is confirmed (spread: by
    that rank, PEER_CHECKED; rar: at once): pieces may flow."""

    TYPE = MsgType.PEER_CONFIRMED

    @classmethod
    def from_header(cls, h: Fields) -> PeerConfirmed:
        return cls()


@dataclass(frozen=True, slots=True)
class PeerCheck(Message):
    """spread, host B -> host R, on B's own link to R: is ``link_id`` the id of your link
    to me? (A link that dialed B claims to be R's.)"""

    TYPE = MsgType.PEER_CHECK
    link_id: bytes

    @classmethod
    def from_header(cls, h: Fields) -> PeerCheck:
        return cls(h.blob("link_id", LINK_ID_BYTES))


@dataclass(frozen=True, slots=True)
class PeerChecked(Message):
    """spread, R -> B, on the link PEER_CHECK came on: ``ok`` if ``link_id`` is the id of
    R's newest link to B."""

    TYPE = MsgType.PEER_CHECKED
    link_id: bytes
    ok: bool

    @classmethod
    def from_header(cls, h: Fields) -> PeerChecked:
        return cls(h.blob("link_id", LINK_ID_BYTES), h.flag("ok"))


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    """Either way on a peer link that carried nothing else for a while: this host's daemon
    is alive. A peer is live by what arrives from it, never by what the kernel's buffers
    take (``node/peers/liveness.py``)."""

    TYPE = MsgType.HEARTBEAT

    @classmethod
    def from_header(cls, h: Fields) -> Heartbeat:
        return cls()

