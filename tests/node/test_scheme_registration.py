"""What adding a scheme takes (docs/development.md, "Following a chunk"): its own module(s)
and its driver in ``schemes.DRIVERS`` (with its name in ``plan.SCHEMES`` for crnetd's
options and the wire). Shown with the smallest scheme on the tree's links, written here:
the master adds up its children's vectors. Nothing of the node names it: the engine
admits its pieces through its ``TAKES`` and runs a step to the exact sum."""

from __future__ import annotations

import numpy as np
import pytest

from crnet import schemes
from crnet.coding.plan import Tree
from crnet.measure.stats import Stats
from crnet.node.neighbours import ChildSlot, Neighbours
from crnet.node.steps import EngineSettings, Resolved, StepEngine
from crnet.protocol.messages import Chunk
from crnet.schemes import Origin, Place, Scheme, Stall, Takes
from crnet.schemes.chunks import ChunkLayout, byte_view

from ..helpers.fake_links import FakeLink

pytestmark = pytest.mark.timeout(30)


class Sum(Scheme):
    """At the master of a one-layer tree: the step's result is the sum of every child's
    vector, once all have come (no coding, no stragglers: a demonstration)."""

    TAKES = (Takes(Chunk, Origin.CHILD, "chunk", dest="chunk_dest"),)

    def __init__(self, place: Place, ports):
        super().__init__(place, ports)
        self.steps: dict[int, tuple[ChunkLayout, np.ndarray, set[tuple[int, int]]]] = {}

    def local(self, step: int, vector: np.ndarray) -> str | None:
        return None                      # the master adds nothing of its own

    def _step(self, msg: Chunk):
        if msg.step not in self.steps:
            layout = self.place.layout(msg.total, msg.dtype)
            self.steps[msg.step] = (layout, np.zeros((self.place.fanout, msg.total), layout.dtype), set())
        return self.steps[msg.step]

    def chunk_dest(self, k: int, msg: Chunk, nbytes: int) -> memoryview:
        layout, parts, _ = self._step(msg)
        a, b = layout.bounds(msg.chunk)
        return byte_view(parts[k, a:b])

    def chunk(self, k: int, msg: Chunk) -> None:
        layout, parts, came = self._step(msg)
        came.add((k, msg.chunk))
        if len(came) == layout.chunks * self.place.fanout:
            result = self.ports.memory.alloc(layout.total, layout.dtype)
            np.sum(parts, axis=0, out=result)
            del self.steps[msg.step]
            self.ports.steps.resolved(msg.step, layout, result)

    def stalled(self, step: int) -> Stall | None:
        return Stall("every child's vector")

    def forget(self, step: int, resolved: bool) -> None:
        self.steps.pop(step, None)


async def test_a_scheme_is_its_module_and_its_entry_in_drivers(monkeypatch):
    monkeypatch.setitem(schemes.DRIVERS, "sum", Sum)      # the one entry the node reads
    tree = Tree((3,), (0,))
    neighbours = Neighbours()
    neighbours.slots = [ChildSlot(link=FakeLink()) for _ in range(3)]
    engine = StepEngine(EngineSettings(), Stats(), neighbours)
    engine.start(Place("", 0, tree, "sum", "auto", chunk_bytes=32))
    assert isinstance(engine.scheme, Sum)
    got = []
    engine.request(0, None, got.append)                   # the master's process waits
    vectors = np.arange(30.0).reshape(3, 10)
    layout = ChunkLayout.of(10, np.dtype(np.float64), 32)
    for k in range(3):
        for c in range(layout.chunks):
            msg = Chunk(0, c, 10, "float64")
            dest = engine.piece_dest(Origin.CHILD, k, msg, layout.nbytes(c))
            a, b = layout.bounds(c)
            np.frombuffer(dest, np.float64)[:] = vectors[k, a:b]
            engine.piece(Origin.CHILD, k, msg, dest)
    [outcome] = got
    assert isinstance(outcome, Resolved)
    np.testing.assert_array_equal(outcome.vector, vectors.sum(axis=0))
    engine.close()
