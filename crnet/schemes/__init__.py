"""Aggregation schemes: what a node does with a step's vectors, free of sockets.

One file per algorithm (``coded_reduce.py``, ``ring_allreduce.py``), each with its
pure step state and its driver, a ``Scheme`` (``base.py``) that the node's step
engine drives. Adding a scheme: one file, one entry below, one name in
``plan.SCHEMES`` with its tree shape in ``plan.scheme_tree``.
"""

from __future__ import annotations

from ..coding.plan import SCHEMES
from .base import Memory, Place, Ports, Scheme, Sends, Stall, Steps
from .coded_reduce.driver import CodedReduce
from .ring_allreduce.driver import RingAllreduce
from .spread.driver import Spread

__all__ = ["DRIVERS", "Memory", "Place", "Ports", "Scheme", "Sends", "Stall", "Steps", "driver"]

DRIVERS: dict[str, type[Scheme]] = {
    "cr": CodedReduce,
    "gc": CodedReduce,      # CodedReduce on a one-layer tree
    "tree": CodedReduce,    # CodedReduce with s = 0
    "rar": RingAllreduce,
    "spread": Spread,      # CodedReduce decoded at the chunks' owners
}
assert set(DRIVERS) == set(SCHEMES), "every scheme crnetd accepts needs a driver"


def driver(place: Place, ports: Ports) -> Scheme:
    """The scheme ``place.scheme`` at this node."""
    return DRIVERS[place.scheme](place, ports)
