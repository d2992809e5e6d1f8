"""One CodedReduce step at one node, as pure state: the upward decode (``UpStep``) and
the result on its way down (``ResultStep``). No sockets, no clocks: the driver
(``driver.py``) feeds them pieces and sends what they give back.
"""

from __future__ import annotations

import numpy as np

from ...coding.approximate import Approximation
from ...coding.codes import GradientCode
from ...coding.kernels import coded_sum
from ..buffers import fresh
from ..chunks import ChunkLayout, byte_view

__all__ = ["ResultStep", "UpStep"]


class UpStep:
    """One step's upward pass at one node.

    Message = local weighted gradient + decode(any n-s children), per chunk. Each
    chunk is decoded the moment the local vector and enough children's copies of that
    chunk are in (n-s, or with a fractional repetition code one of every group:
    ``GradientCode.covers``), so chunk c can leave while chunk c+1 is still arriving,
    and each chunk may be decoded from a different set of children. A leaf's message is
    its local vector itself; the master has no local vector.
    """

    def __init__(self, step: int, layout: ChunkLayout, code: GradientCode | None,
                 has_local: bool, child_buffers: list[np.ndarray | None] | None = None,
                 alloc=fresh, early: bool = True):
        self.step = step
        self.layout = layout
        self.code = code
        self.has_local = has_local
        self.early = early   # may decode from fewer than n - s children that cover (FRC)
        self.local: np.ndarray | None = None
        self.silent: dict[int, str] = {}       # children that won't answer this step, and why
        self.senders: set[int] = set()         # children some chunk was received from
        self.used: set[int] = set()            # children some chunk was decoded from
        self.first_byte: float | None = None   # when the first child chunk started (stats)
        self.arrived_at: dict[int, float] = {}  # child -> when its first chunk started (stats)
        # Beyond s (approximate.py): the decode every chunk not yet decoded takes once the
        # patience ran out short of n - s children, and what each child said its own
        # message is: child -> (effective mass, residual), for a child that approximated.
        self.approx: Approximation | None = None
        self.child_approx: dict[int, tuple[float, float]] = {}
        self.infos: dict[tuple, tuple[float, float]] = {}   # what a decode makes of this message
        self.approx_sent: tuple[float, float] | None = None   # ... as last said to the parent
        self._children = child_buffers
        self._alloc = alloc
        # Quorum -> (children, weights) with the zero coefficients dropped. Chunks of a
        # step mostly share a quorum; the code's own cache still validates per call.
        self._weights: dict[tuple[int, ...], tuple[list[int], list[float]]] = {}
        # Per chunk, only for the chunks that came: a layout is a sender's claim until the
        # step settles it, and a claimed vector of millions of small chunks costs no list
        # per chunk before any of them came.
        self._arrived: dict[int, list[int]] = {}      # chunk -> the children it came from
        self._done: set[int] = set()                  # chunks decoded
        self._remaining = layout.chunks
        self._out: np.ndarray | None = None
        if code is not None and (child_buffers is None or len(child_buffers) != code.n):
            raise ValueError("a node with children needs one receive buffer per child")

    @property
    def needed(self) -> int:
        """Children needed per chunk: n - s."""
        return 0 if self.code is None else self.code.n - self.code.s

    @property
    def complete(self) -> bool:
        return self._remaining == 0

    @property
    def decoded(self) -> bool:
        """Some chunk was decoded (it is on its way): the step's layout is this one's."""
        return self._remaining < self.layout.chunks

    @property
    def decodable(self) -> bool:
        """Enough children may still answer for every chunk to be decoded."""
        code = self.code
        return code is None or code.n - len(self.silent) >= self.needed or (
            self.early and code.covers(k for k in range(code.n) if k not in self.silent))

    def child_buffer(self, child: int, chunk: int) -> memoryview:
        """Where child ``child``'s copy of ``chunk`` is received (a byte view)."""
        start, stop = self.layout.bounds(chunk)
        return byte_view(self._child(child)[start:stop])

    def _child(self, child: int) -> np.ndarray:
        """Child ``child``'s receive buffer, allocated at its first chunk (a child that sends
        nothing, or a layout held apart, costs no vector)."""
        assert self._children is not None
        buffer = self._children[child]
        if buffer is None:
            buffer = self._children[child] = self._alloc(self.layout.total, self.layout.dtype)
        return buffer

    def child_arrived(self, child: int, chunk: int) -> list[int]:
        """Record a child's chunk; returns the chunks now ready to decode."""
        arrived = self._arrived.get(chunk)
        if arrived is None:     # its first copy (a decoded chunk had copies)
            arrived = self._arrived[chunk] = [child]
        elif child in arrived or chunk in self._done:
            return []
        else:
            arrived.append(child)
        if (self.has_local and self.local is None) or not self._enough(arrived):
            return []
        return [chunk]

    def _enough(self, arrived: list[int]) -> bool:
        if self.approx is not None:
            return all(k in arrived for k in self.approx.used)
        return len(arrived) >= self.needed or (
            self.early and self.code.covers(arrived))   # type: ignore[union-attr]

    def decoded_from(self, chunk: int) -> tuple[int, ...]:
        """The children ``chunk`` is (or was) decoded from, exactly: n - s of its arrivals
        (or, FRC, fewer that cover every group)."""
        assert self.code is not None
        return self.code.decode_set(self._arrived[chunk])

    def go_approximate(self, decode: Approximation) -> list[int]:
        """The patience ran out short of n - s children: every chunk not decoded yet is
        decoded with ``decode`` (from the children it uses) once they sent it; returns the
        chunks ready now."""
        self.approx = decode
        return self._ready(range(self.layout.chunks))

    def local_arrived(self, vector: np.ndarray) -> list[int]:
        """The training process's local weighted gradient; returns ready chunks."""
        self.local = vector
        return self._ready(range(self.layout.chunks))

    def waiting_for(self) -> str:
        """What this step still lacks, for the timeout message."""
        missing = []
        if self.has_local and self.local is None:
            missing.append("the local training process's gradient")
        if self.code is not None and not self.complete:
            worst = min(len(self._arrived.get(c, ())) for c in range(self.layout.chunks)
                        if c not in self._done)
            if worst < self.needed:
                also = "" if self.code.kind == "crc" else " or one of every group"
                missing.append(f"{self.needed} of {self.code.n} children{also} (got {worst})")
        return " and ".join(missing) or "nothing"

    def decode(self, chunk: int) -> np.ndarray:
        """Chunk ``chunk`` of this node's message (computed once)."""
        start, stop = self.layout.bounds(chunk)
        self._done.add(chunk)
        self._remaining -= 1
        assert self.local is not None or not self.has_local
        if self.code is None:
            assert self.local is not None  # a leaf's message is its local vector
            return self.local[start:stop]
        assert self._children is not None
        # Which n - s children: a function of the set that arrived, not of its order, and
        # summed in index order (GradientCode.decode_set), so that a float32 result varies
        # with arrival order only when the set itself does.
        assert self.code is not None
        if self.approx is not None:
            children = list(self.approx.used)
            weights = [float(self.approx.weights[k]) for k in children]
        else:
            children, weights = self._decoder(self.code.decode_set(self._arrived[chunk]))
        inputs = [self._child(k)[start:stop] for k in children]
        self.used.update(children)
        if self.local is not None:  # new lists: the cached ones serve the step's other chunks
            inputs, weights = [self.local[start:stop], *inputs], [1.0, *weights]
        if self._out is None:
            # Not last step's: the transport may still be sending it (see buffers.py).
            self._out = self._alloc(self.layout.total, self.layout.dtype)
        out = self._out[start:stop]
        coded_sum(out, weights, inputs)
        return out

    def _decoder(self, responders: tuple[int, ...]) -> tuple[list[int], list[float]]:
        found = self._weights.get(responders)
        if found is None:
            assert self.code is not None
            coeffs = self.code.decode(responders)
            found = ([k for k, a in zip(responders, coeffs) if a != 0.0],
                     [float(a) for a in coeffs if a != 0.0])
            self._weights[responders] = found
        return found

    @property
    def output(self) -> np.ndarray | None:
        """The whole decoded vector (the master's result), once allocated."""
        return self._out

    def _ready(self, chunks) -> list[int]:
        if self.has_local and self.local is None:
            return []
        arrived = self._arrived
        return [c for c in chunks if c not in self._done and self._enough(arrived.get(c, []))]


class ResultStep:
    """A step's full gradient, assembled chunk by chunk on its way down the tree."""

    def __init__(self, step: int, layout: ChunkLayout, buffer: np.ndarray | None = None,
                 alloc=fresh):
        self.step = step
        self.layout = layout
        self.vector = alloc(layout.total, layout.dtype) if buffer is None else buffer
        self._have: set[int] = set()       # chunks received (only those: a layout is a claim)
        self.approx: tuple[float, float] | None = None   # (coverage, residual) if approximate
        self.approx_sent = False    # ... said to the children (on one chunk: once per step)
        self._remaining = layout.chunks

    @property
    def complete(self) -> bool:
        return self._remaining == 0

    def dest(self, chunk: int) -> memoryview | None:
        """Where chunk ``chunk`` is received, or None if it already was."""
        if chunk in self._have:
            return None
        start, stop = self.layout.bounds(chunk)
        return byte_view(self.vector[start:stop])

    def chunk(self, chunk: int) -> np.ndarray:
        start, stop = self.layout.bounds(chunk)
        return self.vector[start:stop]

    def arrived(self, chunk: int) -> None:
        if chunk not in self._have:
            self._have.add(chunk)
            self._remaining -= 1
