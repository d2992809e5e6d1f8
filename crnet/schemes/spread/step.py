"""One step of ``spread`` at one host: its pieces for the owners, the owned chunks' decoding,
the sum's chunks as they come. Free of sockets (``driver.py`` drives it).

CodedReduce's decoding is linear and per coordinate, so the whole tree's decode of one
chunk can run at one host, the chunk's owner, from every host's piece of that chunk:

    msg_v = local_v + decode_{n-s available children c}(msg_c),  sum = decode at the master,

evaluated on arrivals. A leaf is *available* for a chunk once its piece is in; an inner
node once its own piece is in and n - s of its children are available (or, with a
fractional repetition code, one of every group: ``GradientCode.covers``); the master once
n_1 - s_1 of its children are. The moment the master is, the chunk is decoded: the
recursion's coefficients multiply down the tree (child c of v weighs
``coef(v) * a_F(v)[c]``), and the chunk is one weighted sum of the pieces it used
(``kernels.coded_sum``). The same codes and the same allocation as CodedReduce's tree
give the same exact sum and the same straggler tolerance: any s_l children of every
parent may be missing, a missing inner node's whole subtree counts as missing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ...coding.codes import GradientCode
from ...coding.kernels import coded_sum
from ...coding.plan import Tree
from ..buffers import fresh
from ..chunks import ChunkLayout, byte_view
from .messages import DIGEST_BYTES
from .owners import Owners

__all__ = ["OwnedSums", "Recursion", "SpreadStep", "chunk_digest"]


def chunk_digest(chunk: np.ndarray) -> bytes:
    """What an owner says of a chunk of the sum it decoded (SUM_DIGEST), and what a host that
    had it relayed checks: SHA-256 of its bytes, its first ``DIGEST_BYTES``. (1.7 GB/s on
    one core here, with the CPU's SHA instructions, the GIL released; BLAKE2b, 0.9 GB/s,
    doubled the cost: the cost of a relayed sum's check, per byte of the vector and host.)"""
    return hashlib.sha256(byte_view(chunk)).digest()[:DIGEST_BYTES]


@dataclass(frozen=True)
class Recursion:
    """The tree as the owners evaluate it, by rank (``Tree.names()`` order; rank 0 is the
    master): each node's parent, children, code and how many children it needs."""

    parent: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    codes: tuple[GradientCode | None, ...]
    need: tuple[int, ...]

    @classmethod
    def of(cls, tree: Tree, code_kind: str) -> Recursion:
        names = list(tree.names())
        rank = {name: r for r, name in enumerate(names)}
        parent = tuple(-1 if name == "" else rank[tree.parent(name) or ""] for name in names)
        children = tuple(tuple(rank[c] for c in tree.children(name)) for name in names)
        codes = tuple(tree.code_of(name, code_kind) for name in names)
        need = tuple(0 if code is None else code.n - code.s for code in codes)
        return cls(parent, children, codes, need)

    @property
    def hosts(self) -> int:
        return len(self.parent)

    def below(self, v: int) -> list[int]:
        """The nodes of ``v``'s subtree, ``v`` not included."""
        out, todo = [], list(self.children[v])
        while todo:
            u = todo.pop()
            out.append(u)
            todo.extend(self.children[u])
        return out


class _Chunk:
    """One owned chunk's recursion: whose pieces are in, who is available, who was told
    that its piece is moot."""

    __slots__ = ("avail", "count", "done", "fresh", "has", "told")

    def __init__(self, hosts: int):
        self.has = bytearray(hosts)
        self.avail = bytearray(hosts)
        self.told = bytearray(hosts)
        self.count = [0] * hosts
        self.fresh: list[int] = []   # nodes available since ``moot`` last looked
        self.done = False


class SpreadStep:
    """Step ``step`` at host ``rank``: ``owners`` cut its vector; ``recursion`` is the tree."""

    def __init__(self, step: int, owners: Owners, recursion: Recursion, rank: int,
                 alloc=fresh, result_alloc=fresh):
        self.step, self.owners, self.recursion, self.rank = step, owners, recursion, rank
        self.layout = owners.layout
        self.mine: np.ndarray | None = None          # this host's vector (a copy it sends from)
        self._alloc = alloc
        self._result_alloc = result_alloc
        self.result: np.ndarray | None = None        # the sum, as its chunks come
        self.owned = owners.chunks_of(rank)
        self.first, self.last = owners.elements_of(rank)
        self._pieces: np.ndarray | None = None       # (hosts, owned elements): pieces received
        self._sums: np.ndarray | None = None         # the owned chunks' sums, sent from here
        # Each owned chunk's state, made when its first piece comes: a peer's piece may claim
        # a vector of millions of chunks (issue 26 row 13), of which it sends one.
        self._chunks: dict[int, _Chunk] = {}
        self.gathered: set[int] = set()              # chunks of the sum this host has
        self.used: set[int] = set()                  # ranks some owned chunk was decoded from
        self.senders: set[int] = set()               # ranks whose pieces came
        # The sum goes round the ring (spread.py): chunk -> the host it went on to; None: not.
        self.relayed: dict[int, int] | None = None
        self.not_needed: set[int] = set()            # chunks whose owners need not this host's piece (MOOT)
        self.decoded = 0
        # Relayed chunks of the sum (a host other than the owner sent them) count only once
        # they match their owner's digest (SUM_DIGEST, straight from it): chunk -> the rank
        # that relayed it, until then; and chunk -> the owner's digest, as it came.
        self.unverified: dict[int, int] = {}
        self.digests: dict[int, bytes] = {}
        self.resent: set[tuple[int, int]] = set()   # (rank, chunk): owned chunks sent it straight
        self.digest_at: dict[int, float] = {}        # chunk -> when its owner's digest came
        self.wanted: set[int] = set()                # chunks asked of their owners (SUM_WANTED)

    # -- where pieces land
    def piece_dest(self, sender: int, chunk: int) -> memoryview:
        """Where ``sender``'s piece of owned ``chunk`` is received."""
        a, b = self.layout.bounds(chunk)
        return byte_view(self._block()[sender, a - self.first:b - self.first])

    def sum_dest(self, chunk: int) -> memoryview:
        """Where its owner's decoded ``chunk`` is received."""
        a, b = self.layout.bounds(chunk)
        return byte_view(self._result()[a:b])

    @property
    def complete(self) -> bool:
        return len(self.gathered) == self.layout.chunks and not self.unverified

    # -- arrivals
    def local_arrived(self, vector: np.ndarray, copied: bool = False) -> list[int]:
        """This host's vector (the master adds none); returns the owned chunks that decode
        now. It is copied: the training process may write its input again while pieces of
        it are still queued (it gave up waiting). ``copied``: ``vector`` is such a copy
        already (a step begun again keeps its host's)."""
        if copied:
            self.mine = vector
        else:
            self.mine = self._alloc(self.layout.total, self.layout.dtype)
            np.copyto(self.mine, vector)
        return [c for c in self.owned if self._arrived(self.rank, c)]

    def piece_arrived(self, sender: int, chunk: int) -> bool:
        """``sender``'s piece of owned ``chunk`` is in: True if the chunk decodes now."""
        self.senders.add(sender)
        return self._arrived(sender, chunk)

    def sum_arrived(self, chunk: int, relayed_by: int | None = None) -> None:
        """The sum's ``chunk`` is in; ``relayed_by``: the rank that sent it, if not its owner
        (then it counts once it matches its owner's digest: ``verify``)."""
        self.gathered.add(chunk)
        if relayed_by is not None:
            self.unverified[chunk] = relayed_by

    def digest_arrived(self, chunk: int, digest: bytes) -> None:
        """The owner's digest of ``chunk`` (the first it sent counts)."""
        self.digests.setdefault(chunk, digest)

    def verify(self, chunk: int) -> int | None:
        """A relayed ``chunk`` whose owner's digest is in: checked. Returns the rank that
        relayed it if it does not match (the chunk is then not in: it is received again),
        else None (it matches, or cannot be checked yet)."""
        relay = self.unverified.get(chunk)
        digest = self.digests.get(chunk)
        if relay is None or digest is None:
            return None
        del self.unverified[chunk]
        a, b = self.layout.bounds(chunk)
        if chunk_digest(self._result()[a:b]) == digest:
            return None
        self.gathered.discard(chunk)
        return relay

    def _state(self, chunk: int) -> _Chunk:
        state = self._chunks.get(chunk)
        if state is None:
            state = self._chunks[chunk] = _Chunk(self.recursion.hosts)
        return state

    def _arrived(self, rank: int, chunk: int) -> bool:
        state = self._state(chunk)
        if state.done or state.has[rank]:
            return False
        state.has[rank] = 1
        return self._propagate(state, rank)

    def _propagate(self, state: _Chunk, u: int) -> bool:
        """Node ``u`` may have become available: walk up while nodes do. True if the
        master did (the chunk decodes now)."""
        rec = self.recursion
        while not state.avail[u]:
            if (u and not state.has[u]) or (state.count[u] < rec.need[u]
                                            and not self._covered(state, u)):
                return False
            state.avail[u] = 1
            state.fresh.append(u)
            if u == 0:
                return True
            u = rec.parent[u]
            state.count[u] += 1
        return False

    def _covered(self, state: _Chunk, u: int) -> bool:
        """Fewer than n - s of ``u``'s children are available, but (FRC) one of every
        group is: ``u``'s decode is exact already (``GradientCode.covers``)."""
        code = self.recursion.codes[u]
        if code is None or code.kind == "crc" or not state.count[u]:
            return False
        return code.covers(i for i, c in enumerate(self.recursion.children[u]) if state.avail[c])

    def moot(self, chunk: int) -> list[int]:
        """The ranks whose pieces of owned ``chunk`` are not in and no longer needed (a node
        above them is available), each told once."""
        state = self._chunks.get(chunk)
        if state is None:    # no piece of it came: nothing is available there
            return []
        out = []
        for v in state.fresh:
            for u in self.recursion.below(v):
                if not state.has[u] and not state.told[u] and u != self.rank:
                    state.told[u] = 1
                    out.append(u)
        state.fresh.clear()
        return out

    # -- decoding
    def decode(self, chunk: int) -> np.ndarray:
        """The sum's ``chunk``, from the pieces available now; returns it (sent from there)."""
        state = self._chunks[chunk]
        assert state.avail[0] and not state.done
        state.done = True
        weights = self._weights(state)
        a, b = self.layout.bounds(chunk)
        lo, hi = a - self.first, b - self.first
        block = self._block()
        mine = self.mine
        xs = [mine[a:b] if r == self.rank and mine is not None else block[r, lo:hi] for r in weights]
        self.used.update(weights)
        out = self._sums_array()[lo:hi]
        coded_sum(out, np.fromiter(weights.values(), np.float64, len(weights)), xs)
        self._result()[a:b] = out
        self.gathered.add(chunk)
        self.decoded += 1
        return out

    def _weights(self, state: _Chunk) -> dict[int, float]:
        """Each used rank's coefficient in the chunk's sum (none is zero)."""
        rec = self.recursion
        weights: dict[int, float] = {}
        todo = [(0, 1.0)]
        while todo:
            v, coef = todo.pop()
            if v:
                weights[v] = coef
            code = rec.codes[v]
            if code is None:
                continue
            kids = rec.children[v]
            arrived = [i for i, c in enumerate(kids) if state.avail[c]]
            used = code.decode_set(arrived)
            for i, a in zip(used, code.decode(used)):
                if a != 0.0:
                    todo.append((kids[i], coef * float(a)))
        return weights

    def owned_sum(self, chunk: int) -> np.ndarray | None:
        """Owned ``chunk`` of the sum as decoded here (never written again), or None if it
        is not decoded (yet)."""
        state = self._chunks.get(chunk)
        if chunk not in self.owned or state is None or not state.done:
            return None
        a, b = self.layout.bounds(chunk)
        return self._sums_array()[a - self.first:b - self.first]

    def kept(self) -> OwnedSums:
        """What this owner keeps of the step once it is resolved here."""
        return OwnedSums(self.step, self.layout, {c: s for c in self.owned
                                                  if (s := self.owned_sum(c)) is not None},
                         self.resent)

    # -- what is missing
    def waiting_for(self, settled: bool = True) -> str:
        """What the step still lacks here; ``settled``: the master's word came (the node
        keeps it: ``Steps.is_settled``)."""
        # (Per owner and from either end, not per chunk: a step may claim millions.)
        missing_sum = sorted({r for r in self.owners.ranks if r != self.rank and any(
            c not in self.gathered for c in self.owners.chunks_of(r))})
        undecoded = [next((c for c in chunks if self._undecoded(c)), None)
                     for chunks in (self.owned, reversed(self.owned))]
        parts = []
        if self.mine is None and self.rank != 0:
            parts.append("this host's training process's vector")
        if undecoded[0] is not None:
            parts.append(f"enough pieces to decode chunks {undecoded[0]}..{undecoded[1]} "
                         f"(pieces from {len(self.senders)} of {self.recursion.hosts - 1} hosts)")
        if missing_sum:
            parts.append(f"the sum's chunks from owner rank(s) {', '.join(map(str, missing_sum))}")
        unchecked = sorted({self.owners.owner(c) for c in self.unverified})
        if unchecked:
            parts.append(f"the digests of relayed chunks from owner rank(s) "
                         f"{', '.join(map(str, unchecked))}")
        if not settled:
            parts.append("the master's word that it has the whole sum")
        return "; ".join(parts) or "nothing"

    def _undecoded(self, chunk: int) -> bool:
        state = self._chunks.get(chunk)
        return state is None or not state.done

    # -- memory
    def _block(self) -> np.ndarray:
        if self._pieces is None:
            width = self.last - self.first
            flat = self._alloc(self.recursion.hosts * width, self.layout.dtype)
            self._pieces = flat.reshape(self.recursion.hosts, width)
        return self._pieces

    def _sums_array(self) -> np.ndarray:
        if self._sums is None:
            self._sums = self._alloc(self.last - self.first, self.layout.dtype)
        return self._sums

    def _result(self) -> np.ndarray:
        if self.result is None:
            self.result = self._result_alloc(self.layout.total, self.layout.dtype)
        return self.result


@dataclass
class OwnedSums:
    """What an owner keeps of a step resolved here whose sum went round the ring: the
    chunks of it it decoded (views of its own array, never written again), to send one
    straight to a host whose relayed copy did not match (SUM_WANTED), once per host. Not
    the step's pieces, nor its result: that is a training process's memory again."""

    step: int
    layout: ChunkLayout
    sums: dict[int, np.ndarray]
    resent: set[tuple[int, int]]

    def owned_sum(self, chunk: int) -> np.ndarray | None:
        return self.sums.get(chunk)
