"""The peer links' messages (TCP): ``--scheme rar``'s, predecessor -> successor, and
``--scheme spread``'s, every host -> every other host."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ...dtypes import DTYPE_NAMES, DTYPES
from ..auth import NONCE_BYTES
from ..fields import MAX_STEP, Fields
from ..wire import MsgType
from .base import Message


class Phase(str, enum.Enum):
    """The two halves of ring allreduce."""

    REDUCE = "rs"    # reduce-scatter
    GATHER = "ag"    # all-gather


_PHASES = {p.value: p for p in Phase}   # Phase(x) costs two Python calls per frame


LINK_ID_BYTES = 16   # a peer link's id (PEER_HELLO's ``link_id``): fresh and random per dial


@dataclass(frozen=True, slots=True)
class PeerHello(Message):
    """A peer's first frame (ring predecessor -> successor; spread, host -> host): I am rank
    ``rank`` (``nonce``: as HELLO's). ``link_id``: this link's, which the acceptor may ask
    that rank about over its own link there (PEER_CHECK, ``node/peer_check.py``). ``to``:
    the rank the dialer means to reach (spread; an acceptor with --tls-names refuses a link
    meant for another rank: ``node/peer_identity.py``)."""

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
class Segment(Message):
    """ring predecessor -> successor: part ``part`` of segment ``segment`` of ``phase``,
    round ``round``."""

    TYPE = MsgType.SEGMENT
    PAYLOAD = True
    EMPTY_PAYLOAD = True     # a ring of more workers than the vector has elements
    step: int
    phase: Phase
    round: int
    segment: int
    total: int
    dtype: str
    part: int = 0            # which of the segment's pipelined parts (ring_parts)

    def header(self) -> dict[str, Any]:   # written out: the ring's hot path
        return {"step": self.step, "phase": self.phase.value, "round": self.round,
                "segment": self.segment, "total": self.total, "dtype": self.dtype, "part": self.part}

    @classmethod
    def from_header(cls, h: Fields) -> Segment:
        # The ring's hot path: checked inline, or field by field when anything is off.
        d = h.h
        step, phase, rnd, segment = d.get("step"), d.get("phase"), d.get("round"), d.get("segment")
        total, dtype, part = d.get("total"), d.get("dtype"), d.get("part", 0)
        if (type(step) is int and type(rnd) is int and type(segment) is int
                and type(total) is int and type(part) is int and 0 <= step <= MAX_STEP
                and 0 <= rnd <= 1 << 16 and 0 <= segment <= 1 << 16 and 1 <= total <= 1 << 40
                and 0 <= part <= 1 << 16 and type(dtype) is str and dtype in DTYPES
                and type(phase) is str and phase in _PHASES):
            return cls(step, _PHASES[phase], rnd, segment, total, dtype, part)
        return cls(h.integer("step"), Phase(h.text("phase", choices=("rs", "ag"))),
                   h.integer("round", 0, 1 << 16), h.integer("segment", 0, 1 << 16),
                   h.integer("total", 1, 1 << 40), h.text("dtype", choices=DTYPE_NAMES),
                   h.integer("part", 0, 1 << 16) if "part" in h.h else 0)


@dataclass(frozen=True, slots=True)
class Piece(Message):
    """spread, host -> host: chunk ``chunk`` of a step's vector. REDUCE: the sender's local
    vector, to the chunk's owner; GATHER: the decoded sum, from its owner."""

    TYPE = MsgType.PIECE
    PAYLOAD = True
    step: int
    phase: Phase
    chunk: int
    total: int
    dtype: str

    def header(self) -> dict[str, Any]:
        return {"step": self.step, "phase": self.phase.value, "chunk": self.chunk,
                "total": self.total, "dtype": self.dtype}

    @classmethod
    def from_header(cls, h: Fields) -> Piece:
        return cls(h.integer("step", 0, MAX_STEP), _PHASES[h.text("phase", choices=("rs", "ag"))],
                   h.integer("chunk", 0, 1 << 32), h.integer("total", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES))


@dataclass(frozen=True, slots=True)
class Owners(Message):
    """spread, master -> every host: from step ``start`` on, the hosts ``excluded`` own no
    chunks (``schemes/owners.py``). Each replaces the last for the steps from ``start``;
    the master sends its map first on every peer link, so a host that (re)connects has it.
    ``epoch`` counts the master's maps (for the logs)."""

    TYPE = MsgType.OWNERS
    epoch: int
    start: int
    excluded: tuple[int, ...] = ()

    @classmethod
    def from_header(cls, h: Fields) -> Owners:
        excluded = h.h.get("excluded", [])
        if (not isinstance(excluded, list) or len(excluded) > 1 << 16
                or any(type(r) is not int or not 1 <= r < 1 << 16 for r in excluded)):
            raise h.bad("excluded", "a list of worker ranks (1..65535)")
        return cls(h.integer("epoch", 0, MAX_STEP), h.integer("start", 0, MAX_STEP), tuple(excluded))


@dataclass(frozen=True, slots=True)
class Moot(Message):
    """spread, owner -> a host whose piece of chunk ``chunk`` it has not received: the chunk
    no longer needs it (the recursion is satisfied above it), so the host sends it only if it
    has not yet. The step's layout travels as in PIECE, so that the notice can open the step."""

    TYPE = MsgType.MOOT
    step: int
    chunk: int
    total: int
    dtype: str

    @classmethod
    def from_header(cls, h: Fields) -> Moot:
        return cls(h.integer("step", 0, MAX_STEP), h.integer("chunk", 0, 1 << 32),
                   h.integer("total", 1, 1 << 40), h.text("dtype", choices=DTYPE_NAMES))
