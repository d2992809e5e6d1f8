"""Shared fixtures: real crnetd trees on 127.0.0.1, always torn down."""

import asyncio
import signal

import numpy as np
import pytest

from crnet.launch import MASTER, LocalTree
from crnet.plan import Tree


def pytest_asyncio_loop_factories(config, item):
    """Every async test (the client side) runs on asyncio's loop and on uvloop's, as
    training processes may use either; the daemons themselves always run uvloop."""
    factories = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop
    except ImportError:
        return factories
    factories["uvloop"] = uvloop.new_event_loop
    return factories


@pytest.fixture
def local_tree(tmp_path):
    """``local_tree(Tree, samples, **options)`` starts a tree; every one is stopped at teardown."""
    trees = []

    def start(tree: Tree, samples: int, **options) -> LocalTree:
        lt = LocalTree(tree, samples, workdir=tmp_path / f"tree{len(trees)}", **options)
        trees.append(lt)
        return lt.start()

    yield start
    for lt in trees:
        lt.stop()


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
