"""``--scheme spread``'s messages, host -> host on the peer links: a chunk of a vector to its
owner or of the sum from it (PIECE), the master's map of owners (OWNERS), an owner's
word that a piece is not needed (MOOT), the master's that a step is decided (SETTLED), and an
owner's digest of a chunk of the sum that goes round the ring (SUM_DIGEST) and a host's request
for that chunk straight from its owner, when the relayed copy did not match (SUM_WANTED)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...dtypes import DTYPE_NAMES
from ...protocol.fields import MAX_STEP, Fields
from ...protocol.messages import Message
from ...protocol.wire import MsgType
from ..ring_allreduce.messages import PHASES, Phase

__all__ = ["DIGEST_BYTES", "Moot", "Owners", "Piece", "Settled", "SumDigest", "SumWanted"]

DIGEST_BYTES = 16   # of SHA-256's, of a chunk of the sum (``step.chunk_digest``)


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
        return cls(h.integer("step", 0, MAX_STEP), PHASES[h.text("phase", choices=("rs", "ag"))],
                   h.integer("chunk", 0, 1 << 32), h.integer("total", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES))


@dataclass(frozen=True, slots=True)
class Owners(Message):
    """spread, master -> every host: from step ``start`` on, the hosts ``excluded`` own no
    chunks (``owners.py``). Each replaces the last for the steps from ``start``;
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


@dataclass(frozen=True, slots=True)
class Settled(Message):
    """spread, master -> every host: the master has step ``step``'s whole sum, so the tree
    decided it; a host applies a step only once it has both the sum and this word (a host
    that has the sum while the master fails the step must not apply it). The layout
    travels as in PIECE, so that the word can open the step at a host it reaches first."""

    TYPE = MsgType.SETTLED
    step: int
    total: int
    dtype: str

    @classmethod
    def from_header(cls, h: Fields) -> Settled:
        return cls(h.integer("step", 0, MAX_STEP), h.integer("total", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES))


@dataclass(frozen=True, slots=True)
class SumDigest(Message):
    """spread, owner -> every other host, straight (never relayed): the digest of chunk
    ``chunk`` of the sum, which goes round the ring of ranks. A host takes a copy of the
    chunk that a host other than its owner relayed only if it has this digest (a relay that
    holds the cluster secret could send anything on: issue 39, row 3)."""

    TYPE = MsgType.SUM_DIGEST
    step: int
    chunk: int
    total: int
    dtype: str
    digest: bytes

    @classmethod
    def from_header(cls, h: Fields) -> SumDigest:
        return cls(h.integer("step", 0, MAX_STEP), h.integer("chunk", 0, 1 << 32),
                   h.integer("total", 1, 1 << 40), h.text("dtype", choices=DTYPE_NAMES),
                   h.blob("digest", DIGEST_BYTES))


@dataclass(frozen=True, slots=True)
class SumWanted(Message):
    """spread, a host -> the owner of chunk ``chunk`` of the sum: the copy relayed to it did
    not match the owner's digest (a relay made it up, or passed on one that was): send it
    straight (PIECE, GATHER), once."""

    TYPE = MsgType.SUM_WANTED
    step: int
    chunk: int
    total: int
    dtype: str

    @classmethod
    def from_header(cls, h: Fields) -> SumWanted:
        return cls(h.integer("step", 0, MAX_STEP), h.integer("chunk", 0, 1 << 32),
                   h.integer("total", 1, 1 << 40), h.text("dtype", choices=DTYPE_NAMES))
