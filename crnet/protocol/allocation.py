"""An allocation on the wire: ASSIGN's payload, node name -> ``NodeShare``.

A parent sends each child the allocation of the child's whole subtree (which batch
ranges each node computes, and which its subtree answers for) as the payload of an
ASSIGN (``crnet.protocol.messages``); ``parse_allocation`` checks every entry and range before
a node acts on it. ``check_ranges`` is the range check CLIENT_WELCOME's assignment
uses too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgpack

from ..errors import ProtocolError


@dataclass(frozen=True, slots=True)
class NodeShare:
    """One node's part of the allocation: its layer, the weighted ranges it computes
    (``local``) and the ones its subtree answers for (``responsibility``)."""

    layer: int
    local: tuple[tuple[int, int, float], ...]
    responsibility: tuple[tuple[int, int, float], ...]

    def to_wire(self) -> list:
        return [self.layer, [list(r) for r in self.local], [list(r) for r in self.responsibility]]


def pack_allocation(shares: dict[str, NodeShare]) -> bytes:
    """ASSIGN's payload."""
    return msgpack.packb({name: share.to_wire() for name, share in shares.items()})


def parse_allocation(payload, samples: int) -> dict[str, NodeShare]:
    """ASSIGN's payload, checked: node name -> NodeShare with ranges inside the batch."""
    try:
        doc = msgpack.unpackb(payload, max_array_len=1 << 24, max_map_len=1 << 24,
                              max_str_len=1 << 10, max_bin_len=0, max_ext_len=0)
    except Exception as e:  # noqa: BLE001 -- msgpack raises several types for bad input
        raise ProtocolError(f"ASSIGN: undecodable allocation: {e}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("ASSIGN: the allocation must be a map of node names")
    out = {}
    for name, share in doc.items():
        if (not isinstance(name, str) or not isinstance(share, list) or len(share) != 3
                or type(share[0]) is not int):
            raise ProtocolError(f"ASSIGN: allocation entry {name!r} must be [layer, local, responsibility]")
        out[name] = NodeShare(share[0], check_ranges("ASSIGN", name, share[1], samples),
                              check_ranges("ASSIGN", name, share[2], samples))
    return out


def check_ranges(what: str, name, value, samples: int) -> tuple[tuple[int, int, float], ...]:
    """``value`` as weighted ranges ``(start, stop, weight)`` inside a batch of ``samples``;
    a ProtocolError that names ``what`` and ``name`` if it is not."""
    if not isinstance(value, list):
        raise ProtocolError(f"{what}: ranges of {name!r} must be a list")
    out = []
    for r in value:
        if (not isinstance(r, list) or len(r) != 3 or type(r[0]) is not int
                or type(r[1]) is not int or type(r[2]) not in (int, float)
                or not math.isfinite(r[2]) or not 0 <= r[0] <= r[1] <= samples):
            raise ProtocolError(f"{what}: range {r!r} of {name!r} is not [start, stop, weight] "
                                f"within 0..{samples} with a finite weight")
        out.append((r[0], r[1], float(r[2])))
    return tuple(out)
