"""Shares: what the master's plan gives each node, and what reaches whom.

Pure functions over a tree, its plan and a node's place (``Membership`` holds the state
and sends): the allocation the master computes once every worker joined, the part of it
a child's subtree gets (its ASSIGN), the ring place a rar worker gets with it, a
parent's share as masses (for approximate decodes), and a training process's view of
its host's share (``Client.assignment``).
"""

from __future__ import annotations

import dataclasses
from math import prod

from ...coding.plan import Tree, cut, part_masses, weighted_mass
from ...coding.plan import plan as make_plan
from ...protocol.allocation import NodeShare
from ...protocol.messages import RingPlace
from ...schemes import Place


def plan_allocation(tree: Tree, samples: int, code_kind: str) -> tuple[dict[str, NodeShare], str]:
    """Every node's share of ``samples`` on ``tree`` (``crnet.coding.plan``), by node name, and
    the plan in words (for the log)."""
    p = make_plan(tree, samples, code_kind)
    said = (f"plan for {samples} samples, d* = {p.optimal_load:.6g}, max local "
            f"{p.max_local_samples}")
    return {a.name: NodeShare(a.layer, tuple(a.local), tuple(a.responsibility))
            for a in p.nodes.values()}, said


def subtree_allocation(allocation: dict[str, NodeShare], child: str) -> dict[str, NodeShare]:
    """The shares of ``child`` and of every node below it: what its ASSIGN carries."""
    prefix = child + "."
    return {n: v for n, v in allocation.items() if n == child or n.startswith(prefix)}


def child_ring(k: int, addresses: list[str | None]) -> RingPlace:
    """rar: child ``k``'s place in the ring, given every child's address. Ranks 0..N-1 are
    the workers, N the master: the last worker's successor and worker 0's predecessor are
    its parent (None), whose address it knows better than the master does."""
    n = len(addresses)
    return RingPlace(k, n + 1, addresses[k + 1] if k + 1 < n else None,
                     addresses[k - 1] if k else None)


def with_masses(place: Place, allocation: dict[str, NodeShare] | None) -> Place:
    """``place`` with its share as masses, for a parent's approximate decodes."""
    if place.is_leaf or allocation is None:
        return place
    share = allocation[place.name]
    return dataclasses.replace(place, local_mass=weighted_mass(share.local), part_mass=tuple(
        part_masses(share.responsibility, share.local, place.tree.fanout[place.layer])))


def process_assignment(place: Place, share: NodeShare, samples: int, process: int,
                       processes: int) -> dict:
    """A host's share as its training process ``process`` of ``processes`` sees it
    (``Client.assignment``): the host's share cut in ``processes`` parts."""
    ranges = cut(share.local, processes)[process]
    return {"name": place.name, "layer": share.layer, "samples": samples,
            "workers": place.tree.workers, "ranges": [list(r) for r in ranges],
            "process": process, "processes": processes,
            "rank": place.tree.rank(place.name) * processes + process}


def subtree_workers(tree: Tree, layer: int) -> int:
    """How many workers the subtree of a node at ``layer`` (>= 1) holds, itself included."""
    return sum(prod(tree.fanout[layer:deeper]) for deeper in range(layer, tree.layers + 1))
