"""Trees and data allocations for CodedReduce, Gradient Coding and uncoded schemes.

Pure math: no I/O. The master (layer 0, name ``""``) is responsible for all ``m``
samples of the global batch with weight 1. Every intermediate node computes a local
share of its responsibility itself and codes the rest over its children with its
layer's gradient code (``crnet.coding.codes``); leaves compute their whole responsibility.
Weights multiply down the tree, so decoding at every parent (local sum + decode of
any n-s children) yields exactly the parent's weighted sum, and the master's decode
is the plain sum over all samples (``../shared/codedreduce.md``, "Data allocation").

A weighted range ``(start, stop, weight)`` means "weight * sum of the per-sample
gradients of positions start..stop-1 of the global batch".
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from math import prod

from .codes import GradientCode, code_for

WeightedRange = tuple[int, int, float]

__all__ = [
    "PEER_SCHEMES",
    "SCHEMES",
    "SCHEME_SUMMARIES",
    "Assignment",
    "Plan",
    "Tree",
    "WeightedRange",
    "cut",
    "optimal_load",
    "part_masses",
    "plan",
    "plan_gc",
    "plan_uncoded",
    "scheme_tree",
    "weighted_mass",
]

# Aggregation schemes crnetd runs (``crnet.schemes`` has their drivers), each in a phrase:
# ``--scheme``'s help is made of these (``crnet.config.options.SCHEME``).
SCHEME_SUMMARIES = {
    "cr": "CodedReduce tree",
    "gc": "gradient coding (star)",
    "tree": "CodedReduce without redundancy (s = 0)",
    "rar": "ring allreduce",
    "spread": "CodedReduce with each chunk decoded at one host, for a ring's traffic",
}
SCHEMES = tuple(SCHEME_SUMMARIES)
# Schemes whose hosts send pieces to each other off the tree: every host listens for its peers.
PEER_SCHEMES = ("rar", "spread")


@functools.lru_cache(maxsize=64)
def _ranks(tree: Tree) -> dict[str, int]:
    return {name: r for r, name in enumerate(tree.names())}


@dataclass(frozen=True)
class Tree:
    """A tree of hosts: the master at layer 0, workers at layers 1..L.

    Every node of layer l-1 has ``fanout[l-1]`` children and tolerates
    ``stragglers[l-1]`` of them straggling. Node names are paths from the root:
    ``""`` is the master, ``"0"``..``"n-1"`` its children, ``"0.1"`` the second
    child of ``"0"``, and so on.
    """

    fanout: tuple[int, ...]
    stragglers: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "fanout", tuple(int(n) for n in self.fanout))
        object.__setattr__(self, "stragglers", tuple(int(s) for s in self.stragglers))
        if not self.fanout:
            raise ValueError("a tree needs at least one layer")
        if len(self.fanout) != len(self.stragglers):
            raise ValueError(
                f"fanout has {len(self.fanout)} layers but stragglers has "
                f"{len(self.stragglers)}: give one straggler count per layer"
            )
        for layer, (n, s) in enumerate(zip(self.fanout, self.stragglers), start=1):
            if n < 1:
                raise ValueError(f"layer {layer}: fanout must be >= 1, got {n}")
            if not 0 <= s < n:
                raise ValueError(
                    f"layer {layer}: stragglers must be in 0..{n - 1} for fanout {n}, got {s}"
                )

    @classmethod
    def regular(cls, n: int, layers: int, s: int = 0) -> Tree:
        """The paper's regular tree: fanout n and s stragglers at every layer."""
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        return cls((n,) * layers, (s,) * layers)

    @classmethod
    def from_options(
        cls, fanout: Sequence[int], stragglers: Sequence[int], layers: int | None = None
    ) -> Tree:
        """Build a tree from CLI-style options.

        A single fanout or straggler value is repeated over ``layers`` layers; a list
        gives one value per layer (and must agree with ``layers`` if that is given).
        """
        fanout, stragglers = list(fanout), list(stragglers)
        if layers is None:
            layers = max(len(fanout), len(stragglers))
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        for what, values in (("fanout", fanout), ("stragglers", stragglers)):
            if len(values) == 1:
                values *= layers
            elif len(values) != layers:
                raise ValueError(
                    f"--{what} lists {len(values)} values but the tree has {layers} layers"
                )
        return cls(tuple(fanout[:layers]), tuple(stragglers[:layers]))

    @property
    def layers(self) -> int:
        return len(self.fanout)

    @property
    def workers(self) -> int:
        """N = n_1 + n_1 n_2 + ... + n_1...n_L: every node but the master."""
        return sum(prod(self.fanout[:l]) for l in range(1, self.layers + 1))

    def layer(self, name: str) -> int:
        self._check(name)
        return 0 if name == "" else name.count(".") + 1

    def parent(self, name: str) -> str | None:
        self._check(name)
        if name == "":
            return None
        return name.rpartition(".")[0]

    def child_index(self, name: str) -> int:
        """Which row of its parent's code this node is."""
        self._check(name)
        if name == "":
            raise ValueError("the master has no parent")
        return int(name.rpartition(".")[2])

    def children(self, name: str) -> list[str]:
        layer = self.layer(name)
        if layer == self.layers:
            return []
        prefix = f"{name}." if name else ""
        return [f"{prefix}{k}" for k in range(self.fanout[layer])]

    def code_of(self, name: str, kind: str = "auto") -> GradientCode | None:
        """The gradient code node ``name`` decodes its children with (None for leaves)."""
        layer = self.layer(name)
        if layer == self.layers:
            return None
        return code_for(self.fanout[layer], self.stragglers[layer], kind)

    def rank(self, name: str) -> int:
        """A node's place in ``names()`` (the master is 0): its rank among the hosts."""
        return _ranks(self)[name]

    def names(self) -> Iterator[str]:
        """Every node, master first, layer by layer (breadth first)."""
        level = [""]
        while level:
            yield from level
            level = [child for name in level for child in self.children(name)]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name == "":
            return True
        parts = name.split(".")
        if len(parts) > self.layers:
            return False
        for n, part in zip(self.fanout, parts):
            if not part.isdigit() or int(part) >= n or str(int(part)) != part:
                return False
        return True

    def _check(self, name: str) -> None:
        if name not in self:
            raise ValueError(f"no node {name!r} in a tree with fanout {list(self.fanout)}")


def optimal_load(tree: Tree) -> float:
    """d* = 1 / sum_{l=1..L} prod_{k<=l} n_k/(s_k+1), as a fraction of the samples.

    The smallest equal per-worker load that lets every parent tolerate its layer's
    stragglers (the master computes nothing). s = 0 everywhere gives 1/N.
    """
    return 1.0 / sum(_layer_expansion(tree)[1:])


def _layer_expansion(tree: Tree) -> list[float]:
    """[1, e_1, ..., e_L] with e_l = prod_{k<=l} n_k/(s_k+1)."""
    out = [1.0]
    for n, s in zip(tree.fanout, tree.stragglers):
        out.append(out[-1] * n / (s + 1))
    return out


def _coverage(tree: Tree, d: float) -> list[float]:
    """C_l for l = 0..L: the sample fraction a subtree rooted at layer l provides.

    C_L = d, C_l = d + n_{l+1}/(s_{l+1}+1) C_{l+1}; the master computes nothing, so
    C_0 = n_1/(s_1+1) C_1 (= 1 at the optimal load).
    """
    c = [0.0] * (tree.layers + 1)
    c[tree.layers] = d
    for l in range(tree.layers - 1, -1, -1):
        n, s = tree.fanout[l], tree.stragglers[l]
        c[l] = (d if l > 0 else 0.0) + n / (s + 1) * c[l + 1]
    return c


@dataclass(frozen=True)
class Assignment:
    """What one node must deliver to its parent and what it computes itself."""

    name: str
    layer: int
    responsibility: tuple[WeightedRange, ...]
    local: tuple[WeightedRange, ...]

    @property
    def local_samples(self) -> int:
        return _count(self.local)

    @property
    def responsibility_samples(self) -> int:
        return _count(self.responsibility)


@dataclass(frozen=True)
class Plan:
    """Every node's assignment for a tree and a batch of ``samples`` positions."""

    tree: Tree
    samples: int
    code_kind: str
    nodes: dict[str, Assignment] = field(repr=False)

    @property
    def workers(self) -> int:
        return self.tree.workers

    @property
    def optimal_load(self) -> float:
        return optimal_load(self.tree)

    @property
    def max_local_samples(self) -> int:
        return max(a.local_samples for a in self.nodes.values())

    def code(self, parent: str) -> GradientCode | None:
        """The code ``parent`` decodes its children's messages with."""
        return self.tree.code_of(parent, self.code_kind)

    def to_json(self) -> dict:
        """The ``crnet plan --json`` document."""
        return {
            "workers": self.workers,
            "optimal_load": self.optimal_load,
            "max_local_samples": self.max_local_samples,
            "samples": self.samples,
            "nodes": [
                {
                    "name": a.name,
                    "layer": a.layer,
                    "local": [list(r) for r in a.local],
                    "responsibility": [list(r) for r in a.responsibility],
                }
                for a in self.nodes.values()
            ],
        }


def plan(tree: Tree, samples: int, code_kind: str = "auto") -> Plan:
    """Allocate ``samples`` batch positions over ``tree`` (CodedReduce).

    Exact for any samples >= 1: rounding moves samples between nodes, never loses
    or duplicates one. Intermediate nodes absorb the rounding of their own
    responsibility in their local share, so leaves stay within a few samples of
    d*·m and the error does not compound down the tree.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    d = optimal_load(tree)
    coverage = _coverage(tree, d)
    nodes: dict[str, Assignment] = {}
    level: list[tuple[str, list[WeightedRange]]] = [("", [(0, samples, 1.0)])]
    while level:
        next_level = []
        for name, responsibility in level:
            layer = tree.layer(name)
            if layer == tree.layers:
                nodes[name] = _assignment(name, layer, responsibility, responsibility)
                continue
            total = _count(responsibility)
            rest_target = round((coverage[layer] - (d if layer else 0.0)) * samples)
            local_count = 0 if layer == 0 else min(max(total - rest_target, 0), total)
            local, rest = _split_at(responsibility, local_count)
            nodes[name] = _assignment(name, layer, responsibility, local)
            code = tree.code_of(name, code_kind)
            assert code is not None  # not a leaf
            parts = cut(rest, code.n)
            for k, child in enumerate(tree.children(name)):
                share = [
                    (start, stop, weight * float(code.B[k, j]))
                    for j in code.supports[k]
                    for start, stop, weight in parts[j]
                ]
                next_level.append((child, _merge(share)))
        level = next_level
    return Plan(tree, samples, code_kind, nodes)


def plan_gc(workers: int, stragglers: int, samples: int, code_kind: str = "auto") -> Plan:
    """Master-worker Gradient Coding: a one-layer tree of N workers, s stragglers."""
    return plan(Tree((workers,), (stragglers,)), samples, code_kind)


def plan_uncoded(workers: int, samples: int) -> Plan:
    """Every worker 1/N of the batch, no redundancy (ring allreduce, plain tree)."""
    return plan(Tree((workers,), (0,)), samples)


def _assignment(name, layer, responsibility, local) -> Assignment:
    return Assignment(name, layer, tuple(responsibility), tuple(local))


def _count(ranges: Sequence[WeightedRange]) -> int:
    return sum(stop - start for start, stop, _ in ranges)


def _split_at(ranges: Sequence[WeightedRange], count: int):
    """(first ``count`` sample positions, the rest), in list order."""
    head: list[WeightedRange] = []
    tail: list[WeightedRange] = []
    for start, stop, weight in ranges:
        take = min(max(count, 0), stop - start)
        if take:
            head.append((start, start + take, weight))
        if start + take < stop:
            tail.append((start + take, stop, weight))
        count -= take
    return head, tail


def weighted_mass(ranges: Sequence[WeightedRange]) -> float:
    """The sum of the weights of every sample position in ``ranges``."""
    return float(sum((stop - start) * weight for start, stop, weight in ranges))


def part_masses(responsibility: Sequence[WeightedRange], local: Sequence[WeightedRange],
                n: int) -> list[float]:
    """The weighted mass of each of the n parts a parent codes over its children, cut
    from its ``responsibility`` after its ``local`` share as ``plan`` cuts them."""
    _, rest = _split_at(responsibility, _count(local))
    return [weighted_mass(part) for part in cut(rest, n)]


def cut(ranges: Sequence[WeightedRange], n: int) -> list[list[WeightedRange]]:
    """Cut into n consecutive parts whose sample counts differ by at most one (a parent's
    parts for its code, a host's share for its local training processes)."""
    base, extra = divmod(_count(ranges), n)
    parts = []
    rest = list(ranges)
    for j in range(n):
        part, rest = _split_at(rest, base + (1 if j < extra else 0))
        parts.append(part)
    return parts


def _merge(ranges: Sequence[WeightedRange]) -> list[WeightedRange]:
    """Join touching ranges of equal weight; drop zero-weight ones (they add nothing)."""
    out: list[WeightedRange] = []
    for start, stop, weight in ranges:
        if stop <= start or weight == 0.0:
            continue
        if out and out[-1][1] == start and out[-1][2] == weight:
            out[-1] = (out[-1][0], stop, weight)
        else:
            out.append((start, stop, weight))
    return out


def scheme_tree(scheme: str, *, tree: Tree | None = None, workers: int | None = None,
                stragglers: int = 0) -> Tree:
    """The tree a scheme joins and allocates on.

    ``cr`` and ``spread`` (CodedReduce decoded at the chunks' owners) run on ``tree``;
    ``tree`` is CodedReduce on the same shape with s = 0;
    ``gc`` is CodedReduce on a one-layer tree (the master decodes any N-s of N);
    ``rar`` joins as a star without stragglers (the master only coordinates, the
    data moves around the ring of workers).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
    if scheme in ("cr", "tree", "spread"):
        if tree is None:
            raise ValueError(f"scheme {scheme} needs a tree")
        return Tree(tree.fanout, (0,) * tree.layers) if scheme == "tree" else tree
    if workers is None:
        if tree is None:
            raise ValueError(f"scheme {scheme} needs workers (or a tree to take N from)")
        workers = tree.workers
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if scheme == "rar":
        return Tree((workers,), (0,))
    if not 0 <= stragglers < workers:
        raise ValueError(f"gc: stragglers must be in 0..{workers - 1} for {workers} workers, "
                         f"got {stragglers}")
    return Tree((workers,), (stragglers,))
