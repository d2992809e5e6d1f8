"""spread: CodedReduce decoded at the chunks' owners, on real daemons (127.0.0.1).

Exact sums on trees of one and two layers, with float64 and float32 vectors, vectors of one
owner (small) and of every host (large), every host's result straight in its process's
output; stragglers left out per chunk as CodedReduce leaves them out; processes that give
up; the layout rules; TLS and a cluster secret on the peer links.
"""


import numpy as np
import pytest

from crnet import AsyncClient
from crnet.launch import MASTER
from crnet.plan import Tree

from .conftest import gather_or_cancel, rel_error

pytestmark = pytest.mark.asyncio(loop_factories=["asyncio"])   # the daemons run uvloop anyway

M = 40                                   # samples
COEF = np.random.default_rng(7).integers(1, 5, M).astype(np.float64)


def base(dim: int, dtype=np.float64) -> np.ndarray:
    return ((np.arange(dim) % 17) - 8).astype(dtype)


def share(client: AsyncClient) -> float:
    return float(sum(w * COEF[a:b].sum() for a, b, w in client.assignment.ranges))


def want(dim: int, step: int, dtype=np.float64) -> np.ndarray:
    return (step + 1) * float(COEF.sum()) * base(dim, np.float64)


async def connect(lt, names):
    return {n: await AsyncClient.connect(lt.socket_path(n), timeout=60) for n in names}


def close(clients):
    for c in clients.values():
        c.close()


async def step_all(clients, step, dim, dtype=np.float64, skip=()):
    async def one(name, c):
        if name in skip:
            return None
        vec = ((step + 1) * share(c) * base(dim, np.float64)).astype(dtype)
        return await c.allreduce(vec, step=step, timeout=30)
    names = list(clients)
    results = await gather_or_cancel(*(one(n, clients[n]) for n in names))
    return dict(zip(names, results))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tree, dim, chunk", [
    (Tree((4,), (1,)), 1000, 0),                     # one layer, one owner (the master)
    (Tree.regular(2, 2, 1), 1 << 16, 16 << 10),      # two layers, 7 hosts own 2 chunks... each
    (Tree((3, 2), (1, 0)), 1 << 15, 8 << 10),        # every host an owner
], ids=["star-small", "two-layers", "every-owner"])
async def test_every_host_gets_the_exact_sum(local_tree, tree, dim, chunk):
    lt = local_tree(tree, M, scheme="spread", chunk_bytes=chunk, timeout=5)
    clients = await connect(lt, list(tree.names()))
    try:
        for t in range(4):
            results = await step_all(clients, t, dim)
            first = results[MASTER]
            for name, r in results.items():
                assert rel_error(r, want(dim, t)) < 1e-9, (name, t)
                np.testing.assert_array_equal(r, first, err_msg=f"{name}, step {t}")
    finally:
        close(clients)
