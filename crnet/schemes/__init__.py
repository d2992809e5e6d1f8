"""Aggregation schemes: what a node does with a step's vectors, free of sockets.

One folder per algorithm (``coded_reduce/``, ``ring_allreduce/``, ``spread/``), each with
its pure step state, its messages and its driver, a ``Scheme`` (``base.py``) that the
node's step engine drives and whose ``TAKES`` says which messages it takes from which
kind of link. Adding a scheme: its folder, one entry in ``DRIVERS`` below, and its name
in ``plan.SCHEMES`` (with its tree shape in ``plan.scheme_tree``). A message of its own
also takes a wire number (``wire.MsgType``): the one table of frame types every peer
must agree on.
"""

from __future__ import annotations

from ..coding.plan import PEER_SCHEMES, SCHEMES
from ..protocol.messages import Message
from .base import Memory, Origin, PeerSends, Place, Ports, Scheme, Sends, Stall, Steps, Takes
from .coded_reduce.driver import CodedReduce
from .ring_allreduce.driver import RingAllreduce
from .spread.driver import Spread

__all__ = ["DRIVERS", "TAKEN", "WITH_PAYLOAD", "Memory", "Origin", "PeerSends", "Place", "Ports", "Scheme",
           "Sends", "Stall", "Steps", "Takes", "driver", "sums_over_peers"]

DRIVERS: dict[str, type[Scheme]] = {
    "cr": CodedReduce,
    "gc": CodedReduce,      # CodedReduce on a one-layer tree
    "tree": CodedReduce,    # CodedReduce with s = 0
    "rar": RingAllreduce,
    "spread": Spread,      # CodedReduce decoded at the chunks' owners
}
assert set(DRIVERS) == set(SCHEMES), "every scheme crnetd accepts needs a driver"
assert {n for n, d in DRIVERS.items() if d.SUMS_OVER_PEERS} == set(PEER_SCHEMES), \
    "the schemes whose sum comes over peer links are those the node gives peer links"

# What the links hand the step engine, per kind of link: every message some scheme takes
# from it; WITH_PAYLOAD those of them that carry bytes. The engine checks the running
# scheme's own.
TAKEN: dict[Origin, tuple[type[Message], ...]] = {
    origin: tuple(dict.fromkeys(t.message for d in DRIVERS.values() for t in d.TAKES if t.origin is origin))
    for origin in Origin}
WITH_PAYLOAD: dict[Origin, tuple[type[Message], ...]] = {
    origin: tuple(m for m in TAKEN[origin] if m.PAYLOAD) for origin in Origin}


def sums_over_peers(scheme: str) -> bool:
    """Whether scheme ``scheme``'s sum comes over peer links (``Scheme.SUMS_OVER_PEERS``)."""
    return DRIVERS[scheme].SUMS_OVER_PEERS


def driver(place: Place, ports: Ports) -> Scheme:
    """The scheme ``place.scheme`` at this node."""
    return DRIVERS[place.scheme](place, ports)
