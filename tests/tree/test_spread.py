"""spread: CodedReduce decoded at the chunks' owners, on real daemons (127.0.0.1).

Exact sums on trees of one and two layers, with float64 and float32 vectors, vectors of one
owner (small) and of every host (large), every host's result straight in its process's
output; stragglers left out per chunk as CodedReduce leaves them out, and catching up on
the steps finished without them; several processes per host; jobs; broadcasts and
barriers; TLS and a cluster secret on the peer links; crnet status and metrics; bad
pieces on a peer link. Faults (owners killed, frozen, restarted): test_spread_faults.py.
"""

import asyncio

import numpy as np
import pytest
from click.testing import CliRunner

from crnet import AsyncClient
from crnet.cli import main
from crnet.coding.plan import Tree
from crnet.protocol.auth import mac, new_nonce
from crnet.protocol.messages import Challenge, PeerHello, PeerWelcome, Proof, Refuse
from crnet.schemes.ring_allreduce.messages import Phase
from crnet.schemes.spread.messages import Moot, Piece
from crnet.schemes.spread.owners import owners
from crnet.tools.launch import MASTER
from crnet.tools.status import rows

from ..helpers.clients import close_all, connect_all
from ..helpers.peers import RawPeer
from ..helpers.trees import KILL
from ..helpers.vectors import gradients, integers, local_gradient, rel_error
from ..helpers.waits import gather_or_cancel, wait_for_log
from .test_e2e import straggler_plan
from .test_metrics import scrape, value, with_metrics
from .test_status import ask

pytestmark = pytest.mark.asyncio(loop_factories=["asyncio"])   # the daemons run uvloop anyway

M = 40                                   # samples
COEF = np.random.default_rng(7).integers(1, 5, M).astype(np.float64)


def share(client: AsyncClient) -> float:
    return float(sum(w * COEF[a:b].sum() for a, b, w in client.assignment.ranges))


def want(dim: int, step: int, dtype=np.float64) -> np.ndarray:
    return (step + 1) * float(COEF.sum()) * integers(dim, np.float64, 17)


async def step_all(clients, step, dim, dtype=np.float64, skip=()):
    async def one(name, c):
        if name in skip:
            return None
        vec = ((step + 1) * share(c) * integers(dim, np.float64, 17)).astype(dtype)
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
    clients = await connect_all(lt, list(tree.names()), timeout=60)
    try:
        for t in range(4):
            results = await step_all(clients, t, dim)
            first = results[MASTER]
            for name, r in results.items():
                assert rel_error(r, want(dim, t)) < 1e-9, (name, t)
                np.testing.assert_array_equal(r, first, err_msg=f"{name}, step {t}")
    finally:
        close_all(clients)


SEVEN = Tree.regular(2, 2, 1)   # master; 0, 1; 0.0, 0.1, 1.0, 1.1: s = 1 of 2 at every parent
BIG = 1 << 15                   # float64: 256 KiB, 4 owners of the 7 hosts


async def exact_steps(clients, grads, steps, first=0):
    """Every client submits steps ``first`` .. ``first + steps - 1``: each result is the
    exact sum, the same vector at every host."""
    want = grads.sum(axis=0)
    for t in range(first, first + steps):
        results = await gather_or_cancel(*(c.allreduce((t + 1) * local_gradient(c.assignment, grads),
                                                       step=t, timeout=30) for c in clients.values()))
        for r in results:
            assert rel_error(r, (t + 1) * want) <= 1e-9, t
            np.testing.assert_array_equal(r, results[0])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-9), (np.float32, 1e-5)],
                         ids=["float64", "float32"])
async def test_stragglers_are_left_out_and_take_the_steps_finished_without_them(local_tree,
                                                                                dtype, tol):
    """Per step, one child of every parent does not submit (owners among them: a 512 KiB
    float64 vector has 8 owners of the 13 hosts): the others' steps resolve without them,
    the full sum. A late process finds its step finished (``c.finished``) and takes the
    result, or submits late and gets it at once."""
    tree, m, dim, steps = Tree.regular(3, 2, 1), 60, 1 << 16, 6
    lt = local_tree(tree, m, scheme="spread", chunk_bytes=32 << 10)
    grads = gradients(1, m, dim)
    want = grads.sum(axis=0)
    late = straggler_plan(tree, steps, seed=2)
    clients = await connect_all(lt, list(tree.names()), timeout=60)
    try:
        for t in range(steps):
            vec = {n: ((t + 1) * local_gradient(c.assignment, grads)).astype(dtype)
                   for n, c in clients.items()}
            on_time = [n for n in clients if n not in late[t]]
            got = dict(zip(on_time, await gather_or_cancel(
                *(clients[n].allreduce(vec[n], step=t, timeout=30) for n in on_time))))
            for n in late[t]:
                c = clients[n]
                await asyncio.wait_for(c.wait_finished(t), 10)   # its host has the sum
                assert c.finished(t)
                got[n] = await (c.result(t, like=vec[n]) if t % 2 else c.allreduce(vec[n], step=t))
            for n, r in got.items():
                assert r.dtype == dtype and rel_error(r, (t + 1) * want) <= tol, (n, t)
                np.testing.assert_array_equal(r, got[MASTER], err_msg=f"{n}, step {t}")
        skipped = sum([(await c.stats())["stats"]["children_skipped"] for c in clients.values()])
    finally:
        close_all(clients)
    assert skipped > 0   # owners decoded without the late hosts' pieces


@pytest.mark.timeout(120)
async def test_two_processes_per_host_each_get_the_exact_sum(local_tree):
    lt = local_tree(SEVEN, 28, scheme="spread", chunk_bytes=16 << 10, local_processes=2)
    grads = gradients(3, 28, BIG)
    clients = await connect_all(lt, lt.procs, per_host=2, timeout=60)
    try:
        assert {c.assignment.processes for c in clients.values()} == {2}
        await exact_steps(clients, grads, 3)
    finally:
        close_all(clients)


@pytest.mark.timeout(120)
async def test_a_second_job_starts_at_step_zero_with_another_vector(local_tree):
    lt = local_tree(SEVEN, 28, scheme="spread", chunk_bytes=16 << 10)
    for job, dim in (("job-a", BIG), ("job-b", 1000)):   # 4 owners, then 1 (the master)
        grads = gradients(len(job) + dim, 28, dim)
        clients = await connect_all(lt, lt.procs, timeout=60, job=job)
        try:
            assert all(c.tree_step == -1 for c in clients.values())
            await exact_steps(clients, grads, 3)
        finally:
            close_all(clients)


@pytest.mark.timeout(120)
async def test_a_broadcast_reaches_every_process(local_tree):
    lt = local_tree(SEVEN, 28, scheme="spread")
    clients = await connect_all(lt, lt.procs, timeout=60)
    params = np.random.default_rng(4).standard_normal(100_000)
    try:
        got = await gather_or_cancel(*(
            c.broadcast(params if n == "1.0" else np.zeros_like(params), "params/0", root=n == "1.0")
            for n, c in clients.items()))
        for r in got:
            np.testing.assert_array_equal(r, params)
        await exact_steps(clients, gradients(5, 28, BIG), 1)
    finally:
        close_all(clients)


@pytest.mark.timeout(120)
async def test_a_barrier_lets_every_process_go_once_all_are_there(local_tree):
    lt = local_tree(SEVEN, 28, scheme="spread")
    clients = await connect_all(lt, lt.procs, timeout=60)
    names = list(clients)
    try:
        early = [asyncio.ensure_future(clients[n].barrier("start", processes=7)) for n in names[:-1]]
        done, _ = await asyncio.wait(early, timeout=0.5)
        assert not done   # one is missing
        await asyncio.wait_for(asyncio.gather(clients[names[-1]].barrier("start", processes=7),
                                              *early), 30)
        await exact_steps(clients, gradients(6, 28, BIG), 1)
    finally:
        close_all(clients)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tls", [False, True], ids=["secret", "secret-tls"])
async def test_peer_links_authenticate_and_a_stranger_is_no_peer(local_tree, request, tls):
    lt = local_tree(SEVEN, 28, scheme="spread", chunk_bytes=16 << 10, secret=True,
                    tls=request.getfixturevalue("certs") if tls else None)
    grads = gradients(7, 28, BIG)
    clients = await connect_all(lt, lt.procs, timeout=60)
    try:
        await exact_steps(clients, grads, 2)
        port = lt.ports["1.0"]   # a leaf: only peers and the tree's status dial it
        if tls:   # plain TCP: the daemon wants a TLS handshake and hangs up
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"".join(bytes(part) for part in PeerHello(1).frame(None)))
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
        else:
            bare = await RawPeer.to(port)
            bare.send(PeerHello(1))   # no nonce: no authentication
            refused = await bare.next()
            assert isinstance(refused, Refuse) and "requires authentication" in refused.reason
            assert await bare.closed()
            wrong, ours = await RawPeer.to(port), new_nonce()
            wrong.send(PeerHello(1, ours))
            challenge = await wrong.next()
            assert isinstance(challenge, Challenge)
            wrong.send(Proof(mac(b"not the cluster's secret", "dialer", ours, challenge.nonce,
                                 "ring", "1")))
            refused = await wrong.next()
            assert isinstance(refused, Refuse) and "authentication failed" in refused.reason
        await exact_steps(clients, grads, 2, first=2)
    finally:
        close_all(clients)


@pytest.mark.timeout(120)
async def test_crnet_status_and_metrics_answer_for_a_spread_tree(local_tree):
    ports: dict[str, int] = {}
    lt = local_tree(SEVEN, 28, scheme="spread", chunk_bytes=16 << 10, spawn=with_metrics(ports))
    clients = await connect_all(lt, lt.procs, timeout=60)
    try:
        await exact_steps(clients, gradients(8, 28, BIG), 3)
    finally:
        close_all(clients)
    table = {r.name: r for r in rows(await ask(lt, secret=False))}
    assert set(table) == {"master", "0", "1", "0.0", "0.1", "1.0", "1.1"}
    for name, r in table.items():
        assert r.state == "joined" and r.tree_step == 2, (name, r)
    out = await asyncio.to_thread(CliRunner().invoke, main, ["status", f"127.0.0.1:{lt.ports[MASTER]}"])
    assert out.exit_code == 0 and out.output.rstrip().endswith("missing now: none"), out.output
    owning = {list(SEVEN.names())[r] for r in owners(BIG, "float64", 16 << 10, 7).ranks}
    assert len(owning) == 4
    for name in lt.procs:
        samples = scrape(ports[name])
        assert value(samples, "crnet_steps_done_total") == 3, name
        assert value(samples, "crnet_steps_failed_total", scope="tree") == 0
        assert value(samples, "crnet_steps_failed_total", scope="here") == 0
        assert value(samples, "crnet_tree_step") == 2
        assert value(samples, "crnet_join_state", state="assigned") == 1
        assert (value(samples, "crnet_decode_cpu_seconds_total") > 0) == (name in owning), name
        for other in SEVEN.names():   # a link to and from every other host
            if other != name:
                for link in ("peer_out", "peer_in"):
                    assert value(samples, "crnet_link_up", link=link, peer=other or "master") == 1


@pytest.mark.timeout(120)
async def test_bad_pieces_are_dropped_or_close_their_link_only(local_tree):
    """A peer link (loopback: no secret needed) says it is a dead worker's and sends rank 1
    a piece of a chunk it does not own (dropped, with a warning), a sum's chunk that goes
    round the ring past rank 4 before it reaches rank 1 (dropped), a MOOT for a chunk it does
    not own (ignored, with a warning), and a piece of the wrong
    length (that link is closed): the daemon goes on serving, and the tree's sums stay exact."""
    star, dim, chunk = Tree((4,), (1,)), 1 << 16, 16 << 10   # ranks 0 (master) .. 4; 5 owners
    lt = local_tree(star, 40, scheme="spread", chunk_bytes=chunk, timeout=5)
    grads = gradients(9, 40, dim)
    clients = await connect_all(lt, lt.procs, timeout=60)
    try:
        await exact_steps(clients, grads, 1)
        clients.pop("3").close()
        lt.signal("3", KILL)   # rank 4: s = 1, the others go on; it owns no chunks from now on
        await wait_for_log(lt, MASTER, "rank(s) 4 own no chunks")
        await exact_steps(clients, grads, 1, first=1)
        cut = owners(dim, "float64", chunk, 5, excluded={4})
        theirs, mine, masters = cut.chunks_of(2)[0], cut.chunks_of(1)[0], cut.chunks_of(0)[0]

        def piece(phase, c, short=0):
            return Piece(2, phase, c, dim, "float64"), np.full(cut.layout.nbytes(c) // 8 - short, 1e6)

        impostor = await RawPeer.to(lt.ports["0"])   # worker 0 is rank 1
        impostor.send(PeerHello(4))
        assert isinstance(await impostor.next(), PeerWelcome)
        impostor.send(*piece(Phase.REDUCE, theirs))
        await wait_for_log(lt, "0", f"step 2: rank 4's piece: chunk {theirs} is rank 2's to "
                                    "decode, not this host's")
        # The master's chunk reaches rank 1 first, rank 4 last. (Its warning is throttled.)
        impostor.send(*piece(Phase.GATHER, masters))
        impostor.send(Moot(2, theirs, dim, "float64"))   # rank 2's chunk: not rank 4's to say
        await wait_for_log(lt, "0", f"rank 4 says chunk {theirs} needs not this host's piece, "
                                    "but it does not own it")
        impostor.send(*piece(Phase.REDUCE, mine, short=1))
        assert await impostor.closed()
        await wait_for_log(lt, "0", f"PIECE from rank 4, step 2: chunk {mine} has "
                                    f"{cut.layout.nbytes(mine) - 8} bytes")
        await exact_steps(clients, grads, 2, first=2)   # step 2 took none of the impostor's bytes
        assert lt.alive("0")
    finally:
        close_all(clients)
