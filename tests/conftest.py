"""Shared fixtures: real crnetd trees on 127.0.0.1, always torn down; a node's membership over
no sockets; a step engine over fake links; the TLS tests' certificates. The helpers the
tests share are in ``tests/helpers/``."""

import asyncio
import logging

import pytest

from crnet.coding.plan import Tree
from crnet.tools.launch import LocalTree

from .helpers.certs import have_openssl, make_cluster_certs
from .helpers.engines import make_engine
from .tiers import BOTH_LOOPS_FILES, file_of, is_quick


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
    if (file_of(item.path) in BOTH_LOOPS_FILES or item.get_closest_marker("both_loops") is not None
            or (chosen is not None and "loop_factories" in chosen.kwargs)):
        return factories
    return {"uvloop": uvloop.new_event_loop}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the quick tier (``tiers.py`` names it) before ``-m quick`` selects it."""
    for item in items:
        if is_quick(file_of(item.path), item.name):
            item.add_marker(pytest.mark.quick)


class _Kept(logging.Handler):
    """Keeps the records it is given."""

    def __init__(self, level: int):
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def engine_at():
    """``engine_at(place, children, parent=None, **settings)``: a started StepEngine over fake
    links (``helpers.engines.make_engine``), closed after the test."""
    engines = []

    def make(place, children, parent=None, **settings):
        engines.append(make_engine(place, children, parent, **settings))
        return engines[-1]

    yield make
    for engine in engines:
        engine.close()


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


@pytest.fixture(params=["loopback", "veth"])
def links(request):
    """Where a test's hosts are: ``links(names)`` gives ``local_tree`` the options that put
    tree node ``names[i]`` on host i: all on 127.0.0.1 (``{}``), or each in a network
    namespace of its own behind an unshaped veth link at MTU 1500 (root; skipped
    without). The daemons stop before the namespaces go: a test takes ``links`` before
    ``local_tree``."""
    clusters = []

    def place(names) -> dict:
        if request.param == "loopback":
            return {}
        from benchmarks import netns
        reason = netns.requirements()
        if reason is not None:
            pytest.skip(f"emulated cluster: {reason}")
        clusters.append(netns.EmulatedCluster(len(names), rate=None, prefix="crtl").up())
        return netns.hosting(clusters[-1], list(names))

    yield place
    for cluster in clusters:
        cluster.down()


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


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A throwaway cluster CA and the one certificate every host of a local tree serves
    (``helpers/certs.py``); the test skips without the openssl command."""
    if not have_openssl():
        pytest.skip("needs the openssl command")
    return make_cluster_certs(tmp_path_factory.mktemp("certs"))
