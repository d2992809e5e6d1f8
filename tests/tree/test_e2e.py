"""End to end: real crnetd processes on 127.0.0.1, real sockets, real training clients."""

import asyncio
import random
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from crnet import AsyncClient, Client, DaemonBusy, DaemonNotRunning, MismatchError, StepFailed
from crnet.coding.plan import Tree
from crnet.protocol.messages import Chunk, Hello
from crnet.protocol.wire import PREFIX, VERSION, MsgType
from crnet.tools.launch import MASTER

from ..helpers.clients import close_all, connect_all
from ..helpers.trees import KILL, workers
from ..helpers.vectors import gradients, integers, local_gradient, rel_error
from ..helpers.waits import gather_or_cancel, wait_for_log

pytestmark = pytest.mark.timeout(180)

TREE = Tree.regular(3, 2, 1)  # 12 workers and the master


def straggler_plan(tree, steps, seed):
    """Per step, one child of every parent whose training process is late."""
    rng = random.Random(seed)
    return [{rng.choice(tree.children(p)) for p in tree.names() if tree.children(p)}
            for _ in range(steps)]


SCHEMES = [("cr", TREE), ("gc", Tree((6,), (2,))), ("rar", Tree((6,), (0,))),
           ("tree", Tree((3, 3), (0, 0)))]


@pytest.mark.parametrize("scheme, tree", SCHEMES, ids=[s for s, _ in SCHEMES])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-9), (np.float32, 1e-5)],
                         ids=["float64", "float32"])
async def test_every_client_gets_the_exact_sum_despite_stragglers(local_tree, scheme, tree,
                                                                  dtype, tol):
    m, dim = 60, 777
    steps = 20 if scheme == "cr" else 10
    # 1 KiB chunks: 777 elements are 7 (float64) or 4 (float32) chunks, the last one short.
    # A late worker may fall several steps behind: keep enough results for it to catch up.
    lt = local_tree(tree, m, chunk_bytes=1024, scheme=scheme, keep_results=steps)
    grads = gradients(1, m, dim)
    late = straggler_plan(tree, steps, seed=2)

    async def train(name):
        async with await AsyncClient.connect(lt.socket_path(name), timeout=30) as c:
            local = local_gradient(c.assignment, grads)
            out = []
            for t in range(steps):
                if name in late[t]:
                    await asyncio.sleep(0.05)
                out.append(await c.allreduce(((t + 1) * local).astype(dtype), step=t, timeout=30))
            return out, (await c.stats())["stats"]

    runs = await gather_or_cancel(*(train(n) for n in [MASTER] + workers(tree)))
    want = grads.sum(axis=0)
    for results, _ in runs:
        for t, r in enumerate(results):
            assert r.dtype == dtype and r.shape == (dim,)
            assert rel_error(r, (t + 1) * want) <= tol
    skipped = sum(stats["children_skipped"] for _, stats in runs)
    if scheme in ("cr", "gc"):
        assert skipped > 0  # parents decoded without their slowest children
    else:
        assert skipped == 0  # no redundancy: everyone is waited for


async def test_killing_one_child_of_every_parent_mid_run(local_tree):
    m, dim = 60, 100
    lt = local_tree(TREE, m, timeout=5)
    grads = gradients(3, m, dim)
    want = grads.sum(axis=0)
    victims = {"2", "0.1", "1.2"}  # one child of the master, of node 0 and of node 1
    cut_off = victims | {"2.0", "2.1", "2.2"}  # node 2's subtree lost its parent
    warmed_up = [asyncio.Event() for _ in TREE.names()]
    killed = asyncio.Event()

    async def train(i, name):
        async with await AsyncClient.connect(lt.socket_path(name), timeout=30) as c:
            local = local_gradient(c.assignment, grads)
            results = []
            for t in range(12):
                if t == 4:
                    warmed_up[i].set()
                    if name in cut_off:
                        return results
                    await killed.wait()
                results.append(await c.allreduce((t + 1) * local, step=t, timeout=30))
            return results

    names = list(TREE.names())
    tasks = [asyncio.ensure_future(train(i, n)) for i, n in enumerate(names)]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in warmed_up)), 60)
        for v in victims:
            lt.signal(v, KILL)
        killed.set()
        runs = await asyncio.wait_for(asyncio.gather(*tasks), 90)
    finally:
        for t in tasks:
            t.cancel()
    for name, results in zip(names, runs):
        expected_steps = 4 if name in cut_off else 12
        assert len(results) == expected_steps, name
        for t, r in enumerate(results):
            assert rel_error(r, (t + 1) * want) <= 1e-9, (name, t)
    assert all(lt.alive(n) for n in names if n not in victims)


async def test_losing_more_than_s_children_fails_the_step_within_timeout(local_tree):
    m, dim, timeout = 60, 50, 2.0
    lt = local_tree(TREE, m, timeout=timeout)
    grads = gradients(4, m, dim)
    survivors = [MASTER, "2", "2.0", "2.1", "2.2"]
    clients = await connect_all(lt, lt.procs)
    try:
        locals_ = {n: local_gradient(c.assignment, grads) for n, c in clients.items()}
        await gather_or_cancel(*(c.allreduce(locals_[n], step=0, timeout=30)
                                 for n, c in clients.items()))
        lt.signal("0", KILL)
        lt.signal("1", KILL)  # s + 1 = 2 of the master's 3 children
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(clients[n].allreduce(locals_[n], step=1, timeout=30) for n in survivors),
            return_exceptions=True)
        elapsed = time.monotonic() - started
    finally:
        close_all(clients)
    for name, outcome in zip(survivors, outcomes):
        assert isinstance(outcome, StepFailed), (name, outcome)
        assert outcome.step == 1
        assert "master did not get 2 of 3 children" in outcome.reason
    assert elapsed <= timeout + 2
    assert all(lt.alive(n) for n in lt.procs if n not in ("0", "1"))


async def test_restarted_node_reclaims_its_slot_and_assignment(local_tree):
    m, dim = 60, 40
    lt = local_tree(TREE, m, timeout=5)
    grads = gradients(5, m, dim)
    want = grads.sum(axis=0)
    clients = await connect_all(lt, workers(TREE))
    try:
        before = clients["0.1"].assignment
        await gather_or_cancel(*(c.allreduce(local_gradient(c.assignment, grads), step=0, timeout=30)
                                 for c in clients.values()))
        clients.pop("0.1").close()
        lt.signal("0.1", KILL)
        lt.start_node("0.1")
        lt.wait_sockets(["0.1"], 30)
        clients["0.1"] = await AsyncClient.connect(lt.socket_path("0.1"), timeout=30)
        assert clients["0.1"].assignment == before
        clients["0.1"].mark_current()   # maybe stale (step 0 was decided): no parameters here
        results = await gather_or_cancel(
            *(c.allreduce(local_gradient(c.assignment, grads), step=1, timeout=30)
              for c in clients.values()))
    finally:
        close_all(clients)
    for r in results:
        assert rel_error(r, want) <= 1e-9


@pytest.mark.parametrize("dim", [1, 16 * 1024 * 1024])
async def test_vector_sizes(local_tree, dim):
    tree = Tree.regular(3, 1, 1)  # a star keeps 16M float32 (64 MiB) per vector affordable
    m = 6
    lt = local_tree(tree, m, chunk_bytes=3 << 20)  # 64 MiB is not a multiple of 3 MiB
    # Sample i's gradient is c_i * base: the coded messages stay exact and cheap to build.
    base = integers(dim)
    c = gradients(6, m, 1)
    clients = list((await connect_all(lt, workers(tree))).values())
    try:
        vecs = [np.float32(local_gradient(cl.assignment, c)[0]) * base for cl in clients]
        got = await gather_or_cancel(*(cl.allreduce(v, step=0, timeout=60)
                                       for cl, v in zip(clients, vecs)))
    finally:
        close_all(clients)
    want = c.sum() * base.astype(np.float64)
    for r in got:
        assert r.shape == (dim,) and r.dtype == np.float32 and rel_error(r, want) <= 1e-5


BAD_FRAMES = {
    "bad magic": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(20),
    "bad version": PREFIX.pack(b"CRNT", 99, MsgType.HELLO, 1, 0) + b"\x80",
    "unknown type": PREFIX.pack(b"CRNT", VERSION, 77, 1, 0) + b"\x80",
    "oversized header": PREFIX.pack(b"CRNT", VERSION, MsgType.HELLO, 1 << 31, 0),
    "oversized payload": PREFIX.pack(b"CRNT", VERSION, MsgType.CHUNK, 1, 1 << 50) + b"\x80",
    "chunk before hello": b"".join(Chunk(0, 0, 1, "float64").frame(b"12345678")),
    "header not a map": PREFIX.pack(b"CRNT", VERSION, MsgType.HELLO, 4, 0) + b"\x93\x01\x02\x03",
    "bad field": b"".join(bytes(p) for p in Hello(name=None).frame()).replace(b"\xc0", b"\x07", 1),
}


async def test_malformed_frames_close_one_connection_and_the_daemon_keeps_serving(local_tree):
    tree = Tree.regular(2, 1, 1)
    lt = local_tree(tree, 10)
    port = lt.ports[MASTER]
    # Each from an address of its own: the daemon logs one closed connection per address
    # and kind of reason every 10 s (issue 26: a flood from one address is a few lines).
    for i, (what, data) in enumerate(BAD_FRAMES.items()):
        reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                       local_addr=(f"127.0.0.{10 + i}", 0))
        writer.write(data)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b"", what
        writer.close()
    # A truncated frame: half a HELLO, then we hang up.
    hello = b"".join(bytes(p) for p in Hello(name=None).frame())
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(hello[: len(hello) // 2])
    log = await wait_for_log(lt, MASTER, "closed mid-frame")
    for reason in ("bad magic", "protocol version 99", "unknown message type 77",
                   "header of 2147483648 bytes exceeds", "exceeds the limit",
                   "unexpected CHUNK from a peer before HELLO", "not a map",
                   "HELLO: field 'name' must be a string"):
        assert reason in log, reason
    assert lt.alive(MASTER)
    grads = np.arange(10 * 3, dtype=np.float64).reshape(10, 3)
    clients = list((await connect_all(lt, workers(tree))).values())
    try:
        got = await gather_or_cancel(*(c.allreduce(local_gradient(c.assignment, grads), step=0,
                                                   timeout=30) for c in clients))
    finally:
        close_all(clients)
    for r in got:
        np.testing.assert_array_equal(r, grads.sum(axis=0))


async def test_garbage_on_the_client_socket_closes_that_connection_only(local_tree):
    tree = Tree.regular(2, 1, 0)
    lt = local_tree(tree, 4)
    path = lt.socket_path("0")
    for data in (b"garbage that is not a frame" * 3,
                 b"".join(bytes(p) for p in Hello(name="0").frame())):  # a tree message
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(data)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    log = await wait_for_log(lt, "0", "HELLO before CLIENT_HELLO")
    assert "bad magic" in log
    clients = list((await connect_all(lt, workers(tree))).values())
    try:
        got = await gather_or_cancel(*(c.allreduce(np.full(3, 1.0 + i), step=0, timeout=30)
                                       for i, c in enumerate(clients)))
    finally:
        close_all(clients)
    for r in got:
        np.testing.assert_array_equal(r, np.full(3, 3.0))


async def test_a_late_mismatched_vector_raises_on_that_client_only(local_tree):
    tree = Tree.regular(2, 1, 1)
    lt = local_tree(tree, 10, timeout=5)
    a = await AsyncClient.connect(lt.socket_path("0"), timeout=30)
    b = await AsyncClient.connect(lt.socket_path("1"), timeout=30)
    try:
        result = await a.allreduce(np.ones(10), step=0, timeout=30)  # s = 1: a alone decodes
        with pytest.raises(MismatchError, match=r"12 x float64.*10 x float64"):
            await b.allreduce(np.ones(12), step=0, timeout=30)
        both = await gather_or_cancel(a.allreduce(np.ones(10), step=1, timeout=30),
                                      b.allreduce(np.ones(10), step=1, timeout=30))
    finally:
        a.close()
        b.close()
    assert result.shape == (10,)
    for r in both:
        assert r.shape == (10,) and 1.0 <= r[0] <= 2.0  # one or both, by which child decoded


async def test_a_mismatched_chunk_is_refused_by_the_parent_and_fails_the_step(local_tree):
    tree = Tree.regular(2, 1, 0)  # s = 0: the master needs both children
    lt = local_tree(tree, 10, timeout=30)
    a = await AsyncClient.connect(lt.socket_path("0"), timeout=30)
    b = await AsyncClient.connect(lt.socket_path("1"), timeout=30)
    observer = await AsyncClient.connect(lt.socket_path(MASTER), timeout=30)
    try:
        good = asyncio.ensure_future(a.allreduce(np.ones(10), step=0, timeout=30))
        await wait_until_open(observer, 0)  # a's chunk has reached the master
        started = time.monotonic()
        with pytest.raises(MismatchError, match=r"vector is 12 x float64 but the step's is 10"):
            await b.allreduce(np.ones(12), step=0, timeout=30)
        with pytest.raises(StepFailed, match="child 1: its vector does not fit"):
            await good
        elapsed = time.monotonic() - started
        both = await gather_or_cancel(a.allreduce(np.ones(10), step=1, timeout=30),
                                      b.allreduce(np.ones(10), step=1, timeout=30))
    finally:
        close_all((a, b, observer))
    assert elapsed < 5, "the step fails as soon as it cannot be decoded, not at --timeout"
    for r in both:
        np.testing.assert_array_equal(r, np.full(10, 2.0))


async def wait_until_open(client: AsyncClient, step: int, timeout: float = 30.0) -> None:
    """Until ``step`` has begun at the client's daemon."""
    from ..helpers.waits import wait_until

    async def is_open():
        return step in (await client.stats())["open_steps"]
    await wait_until(is_open, f"step {step} to open", timeout)


def test_blocking_client_errors(tmp_path, local_tree):
    with pytest.raises(DaemonNotRunning, match="no crnetd at"):
        Client(tmp_path / "nothing.sock")
    tree = Tree.regular(2, 1, 0)  # no stragglers: the result is both vectors' sum
    lt = local_tree(tree, 4)
    with Client(lt.socket_path("0"), timeout=30) as c:
        with pytest.raises(TypeError, match="float32 or float64"):
            c.allreduce(np.ones(3, dtype=np.int32), step=0)
        with pytest.raises(ValueError, match="empty"):
            c.allreduce(np.ones(0), step=0)
        buf = c.buffer(5, np.float64)  # zero-copy path: compute into the shared input
        buf[:] = 2.0
        with Client(lt.socket_path("1"), timeout=30) as d:
            d_buf = d.buffer(5, np.float64)
            d_buf[:] = 3.0
            th = threading.Thread(target=d.allreduce, args=(d_buf,), kwargs={"step": 0})
            th.start()
            got = c.allreduce(buf, step=0, timeout=30)
            th.join(30)
        np.testing.assert_array_equal(got, np.full(5, 5.0))
        with pytest.raises(DaemonBusy, match="another training process"):
            Client(lt.socket_path("0"), timeout=5)


def test_full_parent_refuses_a_node_clearly(local_tree):
    tree = Tree.regular(2, 1, 0)
    lt = local_tree(tree, 4)
    extra = subprocess.run(
        [sys.executable, "-m", "crnet", "daemon", "--role", "node",
         "--parent", f"127.0.0.1:{lt.ports[MASTER]}", "--client-socket", lt.socket_path("extra")],
        capture_output=True, text=True, timeout=30)
    assert extra.returncode == 2
    assert "has all 2 child slots taken" in extra.stderr
    assert lt.alive(MASTER)


def test_an_inner_node_without_listen_stops_and_the_master_says_why(tmp_path):
    """It joined and left every 1-2 s, forever, and the master logged no reason."""
    from crnet.tools.launch import free_port

    port = free_port()
    with open(tmp_path / "master.log", "w") as log:
        master = subprocess.Popen(
            [sys.executable, "-m", "crnet", "daemon", "--role", "master", "--listen",
             f"127.0.0.1:{port}", "--fanout", "1,1", "--samples", "4", "--insecure",
             "--client-socket", str(tmp_path / "master.sock")], stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "master.sock").exists():
            assert master.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        node = subprocess.run(
            [sys.executable, "-m", "crnet", "daemon", "--role", "node", "--parent",
             f"127.0.0.1:{port}", "--client-socket", str(tmp_path / "node.sock")],
            capture_output=True, text=True, timeout=30)
        assert node.returncode == 2, node.stderr
        assert "must accept children: start it with --listen" in node.stderr
    finally:
        master.terminate()
        master.wait(30)
    logged = (tmp_path / "master.log").read_text()
    assert "child 0 (from 127.0.0.1:" in logged
    assert "cannot take its place and stops: node 0 is at layer 1 of 2 and must accept children" in logged


@pytest.mark.parametrize("args, message", [
    ([], "Missing option '--role'"),
    (["--role", "master"], "--role master needs --listen and --samples"),
    (["--role", "node"], "--role node needs --parent"),
    (["--role", "node", "--parent", "nowhere"], "is not HOST:PORT"),
    (["--role", "master", "--listen", ":1", "--samples", "5", "--fanout", "3", "--stragglers", "3"],
     "stragglers must be in 0..2"),
])
def test_crnetd_usage_errors(args, message):
    proc = subprocess.run([sys.executable, "-m", "crnet", "daemon", *args],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
