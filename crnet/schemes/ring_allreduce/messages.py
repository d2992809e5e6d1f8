"""``--scheme rar``'s message: a segment of a step's vector, ring predecessor -> successor,
on the peer links (``crnet/protocol/messages/peers.py`` has their hello and welcome).
``Phase`` names the ring's two halves; spread's pieces take the same two."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ...dtypes import DTYPE_NAMES, DTYPES
from ...protocol.fields import MAX_STEP, Fields
from ...protocol.messages import Message
from ...protocol.wire import MsgType

__all__ = ["Phase", "Segment"]


class Phase(str, enum.Enum):
    """The two halves of ring allreduce."""

    REDUCE = "rs"    # reduce-scatter
    GATHER = "ag"    # all-gather


PHASES = {p.value: p for p in Phase}   # Phase(x) costs two Python calls per frame



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
    # How many parts the segment is cut into: its first sender's choice (ring_parts, which
    # follows that sender's link), kept by every rank it passes; 0: the rule's own count.
    parts: int = 0

    def header(self) -> dict[str, Any]:   # written out: the ring's hot path
        return {"step": self.step, "phase": self.phase.value, "round": self.round,
                "segment": self.segment, "total": self.total, "dtype": self.dtype, "part": self.part,
                "parts": self.parts}

    @classmethod
    def from_header(cls, h: Fields) -> Segment:
        # The ring's hot path: checked inline, or field by field when anything is off.
        d = h.h
        step, phase, rnd, segment = d.get("step"), d.get("phase"), d.get("round"), d.get("segment")
        total, dtype, part = d.get("total"), d.get("dtype"), d.get("part", 0)
        parts = d.get("parts", 0)
        if (type(step) is int and type(rnd) is int and type(segment) is int
                and type(total) is int and type(part) is int and type(parts) is int
                and 0 <= step <= MAX_STEP and 0 <= rnd <= 1 << 16 and 0 <= segment <= 1 << 16
                and 1 <= total <= 1 << 40 and 0 <= part <= 1 << 16 and 0 <= parts <= 1 << 16
                and type(dtype) is str and dtype in DTYPES
                and type(phase) is str and phase in PHASES):
            return cls(step, PHASES[phase], rnd, segment, total, dtype, part, parts)
        return cls(h.integer("step"), Phase(h.text("phase", choices=("rs", "ag"))),
                   h.integer("round", 0, 1 << 16), h.integer("segment", 0, 1 << 16),
                   h.integer("total", 1, 1 << 40), h.text("dtype", choices=DTYPE_NAMES),
                   h.integer("part", 0, 1 << 16) if "part" in h.h else 0,
                   h.integer("parts", 0, 1 << 16) if "parts" in h.h else 0)
