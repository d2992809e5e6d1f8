"""spread at one host: CodedReduce with each chunk decoded at its owner, not up the tree.

CodedReduce's tree makes every parent take n vectors and send n back down: where the
vector is large next to the links, its steps are several times a ring's. spread keeps
CodedReduce's tree, codes, allocation and straggler tolerance, and moves the decoding:
``owners.py`` gives each host (the master included) a share of the vector's chunks, and

1. every worker sends each owner its piece of its local vector (PIECE, REDUCE) over a
   direct peer link (``node/mesh.py``);
2. an owner decodes each of its chunks the moment the tree's recursion is satisfied on
   the pieces in (``spread_step.py``), and sends the chunk of the sum to every host
   (PIECE, GATHER);
3. a host's step resolves when it has every chunk of the sum.

Every host moves about 2N/(N+1) of the vector each way, as in a ring, in two hops. The
design, its traffic and its faults: docs/spread.md.

A step's layout is its first piece's or this host's vector's: this host's vector, once
in, is the step's (a new model's vectors change everywhere at once); pieces of another
layout are dropped (their senders count as missing here), and the sum's chunks of
another layout close the link they came on (an owner decodes only the step's layout).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..dtypes import dtype_name
from ..errors import ProtocolError
from ..messages import Phase, Piece
from ..peer_text import Throttle
from .base import Place, Ports, Scheme, Stall
from .owners import owners
from .spread_step import Recursion, SpreadStep

log = logging.getLogger("crnet.schemes")

REDUCE, GATHER = Phase.REDUCE, Phase.GATHER


class Spread(Scheme):
    """spread: one SpreadStep per step at every host."""

    def __init__(self, place: Place, ports: Ports):
        super().__init__(place, ports)
        self.recursion = Recursion.of(place.tree, place.code_kind)
        self.rank = place.tree.rank(place.name)
        self.hosts = self.recursion.hosts
        self.excluded: frozenset[int] = frozenset()
        self.steps: dict[int, SpreadStep] = {}
        self._lines = Throttle(log)

    # -- this host's vector
    def local(self, step: int, vector: np.ndarray) -> str | None:
        if self.place.is_master:   # the master adds nothing; its process only waits
            return None
        st = self._step(step, vector.size, dtype_name(vector.dtype), local=True)
        if st is None:
            return None
        if not _fits(st, vector.size, dtype_name(vector.dtype)):
            return st.layout.mismatch(self.place.layout(vector.size, vector.dtype), step)
        if st.mine is not None:
            return None   # (the engine lets one vector per host and step through)
        ready = st.local_arrived(vector)
        self._send_pieces(st)
        self._decode(st, ready)
        return None

    def _send_pieces(self, st: SpreadStep) -> None:
        """Each owner its piece, starting with the owner after this host, so that the hosts
        that are ready together do not all send to the same owner first."""
        assert st.mine is not None
        layout, ranks = st.layout, st.owners.ranks
        start = next((i for i, r in enumerate(ranks) if r > self.rank), 0)
        for owner in ranks[start:] + ranks[:start]:
            if owner == self.rank:
                continue
            for c in st.owners.chunks_of(owner):
                a, b = layout.bounds(c)
                self.ports.send.to_peer(owner, st.step, Piece(st.step, REDUCE, c, layout.total,
                                                              layout.dtype_name), st.mine[a:b])

    # -- pieces from peers
    def piece_dest(self, rank: int, msg: Piece, nbytes: int) -> memoryview | None:
        st = self._step(msg.step, msg.total, msg.dtype)
        if st is None:
            return None
        if not _fits(st, msg.total, msg.dtype):
            if msg.phase is GATHER:
                raise ProtocolError(f"PIECE: step {msg.step}'s sum is {msg.total} x {msg.dtype}, "
                                    f"but the step's vector is {st.layout.describe()} here")
            self._lines.warning((rank, "layout"), "step %d: rank %d's piece is %d x %s, but the "
                                "step's vector is %s here: dropped", msg.step, rank, msg.total,
                                msg.dtype, st.layout.describe())
            return None
        problem = st.layout.check(msg.total, msg.dtype, msg.chunk, nbytes)
        if problem is None:
            problem = self._misplaced(st, rank, msg)
        if problem is not None:
            raise ProtocolError(f"PIECE from rank {rank}, step {msg.step}: {problem}")
        if msg.phase is REDUCE:
            if st.decoded == len(st.owned):
                return None   # every owned chunk is decoded: a straggler's piece is moot
            self.ports.stats.bytes_up += nbytes
            return st.piece_dest(rank, msg.chunk)
        if msg.chunk in st.gathered:
            return None
        self.ports.stats.bytes_down += nbytes
        return st.sum_dest(msg.chunk)

    def _misplaced(self, st: SpreadStep, rank: int, msg: Piece) -> str | None:
        owner = st.owners.owner(msg.chunk)
        if msg.phase is REDUCE:
            if owner != self.rank:
                return f"chunk {msg.chunk} is rank {owner}'s to decode, not this host's"
            if rank == 0:
                return "the master adds nothing"
            return None
        if owner != rank:
            return f"chunk {msg.chunk} of the sum is rank {owner}'s, not rank {rank}'s"
        return None

    def piece(self, rank: int, msg: Piece) -> None:
        st = self.steps.get(msg.step)
        if st is None or not _fits(st, msg.total, msg.dtype):
            return
        if msg.phase is REDUCE:
            if st.piece_arrived(rank, msg.chunk):
                self._decode(st, [msg.chunk])
        else:
            st.sum_arrived(msg.chunk)
            self._check_complete(st)

    # -- decoding and the sum
    def _decode(self, st: SpreadStep, chunks: list[int]) -> None:
        stats = self.ports.stats
        layout = st.layout
        for c in chunks:
            t0, cpu0 = time.perf_counter(), time.thread_time()   # the kernels run in this thread
            out = st.decode(c)
            stats.decode_seconds += time.perf_counter() - t0
            stats.decode_cpu_seconds += time.thread_time() - cpu0
            msg = Piece(st.step, GATHER, c, layout.total, layout.dtype_name)
            for r in range(self.hosts):
                if r != self.rank:
                    self.ports.send.to_peer(r, st.step, msg, out)
        if chunks and st.decoded == len(st.owned):
            stats.children_skipped += self.hosts - 1 - len(st.used - {self.rank})
        self._check_complete(st)

    def _check_complete(self, st: SpreadStep) -> None:
        if not st.complete or self.steps.get(st.step) is not st:
            return
        del self.steps[st.step]
        assert st.result is not None
        self.ports.steps.resolved(st.step, st.layout, st.result)

    # -- the step's state
    def _step(self, step: int, total: int, dtype: str, local: bool = False) -> SpreadStep | None:
        """The step's SpreadStep, begun with a ``total`` x ``dtype`` layout if new. This
        host's vector (``local``) begins it again in its own layout if only pieces of
        another came so far (nothing decoded or gathered from them)."""
        if self.ports.steps.is_decided(step):
            return None
        st = self.steps.get(step)
        if st is not None and (_fits(st, total, dtype) or not local or st.mine is not None
                               or st.decoded or st.gathered):
            return st
        if st is not None:
            log.warning("step %d began here with pieces of %s, but this host's vector is %d x %s: "
                        "beginning it again", step, st.layout.describe(), total, dtype)
        cut = owners(total, dtype, self.place.chunk_bytes, self.hosts, self.excluded)
        st = self.steps[step] = SpreadStep(
            step, cut, self.recursion, self.rank, alloc=self.ports.memory.alloc,
            result_alloc=lambda total, dtype: self.ports.memory.alloc_result(step, total, dtype))
        return st

    def peer_silent(self, rank: int) -> None:
        """Peer ``rank``'s link is gone: the sum's chunks it owns will not come for the steps
        under way, which fail here now rather than at their deadline."""
        for st in list(self.steps.values()):
            missing = [c for c in st.owners.chunks_of(rank) if c not in st.gathered]
            if missing and rank != self.rank:
                self.ports.steps.stall(st.step, f"owner rank {rank} (chunks {missing[0]}.."
                                       f"{missing[-1]} of the sum) disconnected", here=True)

    def stalled(self, step: int) -> Stall | None:
        st = self.steps.get(step)
        if st is None:
            lacking = ("the pieces of the step" if self.place.is_master
                       else "this host's training process's vector and the sum")
            return Stall(lacking, here=True)
        return Stall(st.waiting_for(), here=True)

    def forget(self, step: int, resolved: bool) -> None:
        self.steps.pop(step, None)


def _fits(st: SpreadStep, total: int, dtype: str) -> bool:
    return st.layout.total == total and st.layout.dtype_name == dtype
