"""A step engine over fake links, and a step's pieces handed to it as the links hand them
(the engine's tests, tests/node/test_engine.py and test_step_states.py; the fixture
``engine_at`` in tests/conftest.py makes the engines and closes them)."""

import numpy as np

from crnet.coding.plan import Tree
from crnet.measure.stats import Stats
from crnet.node.neighbours import ChildSlot, Neighbours
from crnet.node.steps import EngineSettings, StepEngine
from crnet.protocol.messages import Chunk, Result
from crnet.schemes import Origin, Place
from crnet.schemes.chunks import ChunkLayout


def make_engine(place, children, parent=None, **settings) -> StepEngine:
    """A started StepEngine whose child slots hold ``children`` (FakeLinks, or None for an
    empty slot) and whose parent link is ``parent``."""
    neighbours = Neighbours()
    neighbours.parent = parent
    neighbours.slots = [ChildSlot(link=link) for link in children]
    engine = StepEngine(EngineSettings(**settings), Stats(), neighbours)
    engine.start(place)
    return engine


STAR = Tree((3,), (1,))            # the master decodes any 2 of its 3 children
PAIR = Tree((2,), (1,))            # the master decodes from either of its 2 children
TWO_LAYERS = Tree.regular(3, 2, 1)  # node "0" decodes any 2 of its 3 children


def master(tree=STAR, chunk_bytes=32):
    return Place("", 0, tree, "cr", "auto", chunk_bytes)


def node(name, tree=TWO_LAYERS, chunk_bytes=32):
    return Place(name, tree.layer(name), tree, "cr", "auto", chunk_bytes)


def recorder(loop=None):
    """An ``answer`` for ``engine.request`` that records each outcome; given the loop, also
    when it came (``times``) and a future resolved with the first."""
    got, times = [], []
    future = None if loop is None else loop.create_future()

    def answer(outcome):
        got.append(outcome)
        if future is not None:
            times.append(loop.time())
            if not future.done():
                future.set_result(outcome)
    answer.got, answer.times, answer.future = got, times, future
    return answer


def send_chunk(engine, k, step, chunk, vector, chunk_bytes=32):
    """Child ``k``'s chunk of ``vector`` through the engine, as ChildLink does; returns
    whether the engine took the payload."""
    layout = ChunkLayout.of(vector.size, vector.dtype, chunk_bytes)
    a, b = layout.bounds(chunk)
    msg = Chunk(step, chunk, vector.size, vector.dtype.name)
    dest = engine.piece_dest(Origin.CHILD, k, msg, layout.nbytes(chunk))
    if dest is None:
        return False
    np.frombuffer(dest, vector.dtype)[:] = vector[a:b]
    engine.piece(Origin.CHILD, k, msg, dest)
    return True


def send_vector(engine, k, step, vector, chunk_bytes=32):
    """Every chunk of child ``k``'s ``vector``: whether the engine took each."""
    layout = ChunkLayout.of(vector.size, vector.dtype, chunk_bytes)
    return [send_chunk(engine, k, step, c, vector, chunk_bytes) for c in range(layout.chunks)]


def send_result(engine, step, vector, chunk_bytes=32):
    """The parent's RESULT chunks of ``vector`` for ``step``, as ParentLink hands them over."""
    layout = ChunkLayout.of(vector.size, vector.dtype, chunk_bytes)
    for c in range(layout.chunks):
        a, b = layout.bounds(c)
        msg = Result(step, c, vector.size, vector.dtype.name)
        dest = engine.piece_dest(Origin.PARENT, 0, msg, layout.nbytes(c))
        assert dest is not None, f"the engine dropped RESULT chunk {c} of step {step}"
        np.frombuffer(dest, vector.dtype)[:] = vector[a:b]
        engine.piece(Origin.PARENT, 0, msg, dest)
