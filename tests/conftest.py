"""Shared fixtures: real crnetd trees on 127.0.0.1, always torn down."""

import asyncio
import logging
import signal
import weakref

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.tools.launch import MASTER, LocalTree

from .tiers import BOTH_LOOPS_FILES, is_quick


def pytest_asyncio_loop_factories(config, item):
    """Which event loops an async test runs on (the test side: clients, fake links).

    The client side's loop is the training process's choice, asyncio's or uvloop's, so
    the tests of the client side run on both: the files in ``tiers.BOTH_LOOPS_FILES``
    (AsyncClient, the transport, the README's loop) and any test marked ``both_loops``.
    Every other async test runs once, on uvloop: it tests a daemon's code (the step
    engine and links over fake links run on uvloop in crnetd) or a real tree of crnetd
    processes, which run uvloop whatever the test's loop, and its client calls are the
    ones the client files already run on both loops. A test that picks its loops
    (``pytest.mark.asyncio(loop_factories=[...])``) gets them. Without uvloop, asyncio's.
    """
    factories = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop
    except ImportError:
        return factories
    factories["uvloop"] = uvloop.new_event_loop
    chosen = item.get_closest_marker("asyncio")
    if (item.path.name in BOTH_LOOPS_FILES or item.get_closest_marker("both_loops") is not None
            or (chosen is not None and "loop_factories" in chosen.kwargs)):
        return factories
    return {"uvloop": uvloop.new_event_loop}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the quick tier (``tiers.py`` names it) before ``-m quick`` selects it."""
    for item in items:
        if is_quick(item.path.name, item.name):
            item.add_marker(pytest.mark.quick)


class _Kept(logging.Handler):
    """Keeps the records it is given."""

    def __init__(self, level: int):
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(autouse=True)
def client_bugs():
    """Every test fails, with the traceback, if a client in the test's own process hit a bug
    in its handling of crnetd's answers (crnet.client logs it as an error): even when the
    test caught the InternalError it raised as some CrnetError, or never asked again. A
    test that injects such a bug on purpose takes this list and clears it."""
    kept = _Kept(logging.ERROR)
    logger = logging.getLogger("crnet.client")
    logger.addHandler(kept)
    try:
        yield kept.records
    finally:
        logger.removeHandler(kept)
    if kept.records:
        pytest.fail("\n\n".join(logging.Formatter().format(r) for r in kept.records), pytrace=False)


@pytest.fixture
def local_tree(tmp_path):
    """``local_tree(Tree, samples, **options)`` starts a tree of strict daemons; every one
    is stopped at teardown, and the test fails if a daemon exited non-zero (other than
    the ones it killed) or logged a traceback: a bug inside a daemon never hides
    behind a straggler."""
    trees = []

    def start(tree: Tree, samples: int, **options) -> LocalTree:
        options.setdefault("strict", True)
        lt = LocalTree(tree, samples, workdir=tmp_path / f"tree{len(trees)}", **options)
        trees.append(lt)
        return lt.start()

    yield start
    problems = []
    for lt in trees:
        lt.stop()
        problems += lt.problems()
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture
def membership():
    """``membership(place=None, samples=None, dial_peer=None)``: a Membership over a fresh
    StepEngine and Neighbours (no sockets); the master passes its place and samples, a node
    neither; ``dial_peer`` dials its peers (``mesh.PeerDialer``)."""
    from crnet.measure.stats import Stats
    from crnet.node.join.membership import Membership
    from crnet.node.neighbours import Neighbours
    from crnet.node.steps import EngineSettings, StepEngine

    made = []

    def make(place=None, samples=None, dial_peer=None):
        neighbours = Neighbours()
        engine = StepEngine(EngineSettings(), Stats(), neighbours)
        m = Membership(engine, neighbours, stop=lambda code: None, place=place, samples=samples,
                       dial_peer=dial_peer)
        made.append(m)
        return m

    yield make
    for m in made:
        m.engine.close()
        m.close()


_ROOMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def rooms(m):
    """The broadcasts, barriers and status beside membership ``m`` (``node/rooms.py``),
    built once, as ``lifecycle.Node`` builds them."""
    from crnet.node.rooms import Rooms

    made = _ROOMS.get(m)
    if made is None:
        made = _ROOMS[m] = Rooms.beside(m)
    return made


def local_gradient(assignment, grads: np.ndarray) -> np.ndarray:
    """This process's weighted sum over its ranges of the per-sample vectors ``grads``."""
    out = np.zeros(grads.shape[1])
    for start, stop, weight in assignment.ranges:
        out += weight * grads[start:stop].sum(axis=0)
    return out


def workers(tree: Tree) -> list[str]:
    return [name for name in tree.names() if name != MASTER]


def rel_error(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / max(1.0, np.max(np.abs(want))))


async def wait_until(check, what: str, timeout: float = 30.0, every: float = 0.02):
    """Poll ``await check()`` (or ``check()``) until it is true: ordering by state, not by sleeps."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        ok = check()
        if asyncio.iscoroutine(ok):
            ok = await ok
        if ok:
            return ok
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(every)


async def wait_for_log(lt: LocalTree, name: str, text: str, timeout: float = 30.0) -> str:
    """Wait until daemon ``name``'s log contains ``text``; returns the log."""
    def check():
        log = lt.log_path(name).read_text(errors="replace")
        return log if text in log else None
    return await wait_until(check, f"{text!r} in the log of {lt.filename(name)}", timeout)


async def gather_or_cancel(*aws):
    """gather() that cancels the siblings when one fails, so no task outlives the test."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


KILL = signal.SIGKILL

def not_held(step, keep, tree_step):
    """The reason a daemon gives for a step whose outcome it no longer holds."""
    return (f"the outcome of step {step} is not held by this daemon (it keeps the last {keep}, "
            "and those its training processes have not taken within --result-memory); the "
            f"tree is at step {tree_step}: reload the parameters (e.g. the newest checkpoint) "
            "and go on after it")
