"""Issue 11, "Trust boundary": one test per row of its table of faults, as an attack.

Each test is the row's attack against real crnetd processes on 127.0.0.1 (raw TCP or
Unix sockets speaking the wire protocol with ``crnet.protocol.messages``), or against a module
in-process where a live attack is impractical. It asserts the SAFE behaviour: a test
marked ``xfail(strict=True, raises=FaultStillThere)`` is a fault that is still there (it
turns into a failure the day the fault is fixed: remove the mark then; any other failure,
an AssertionError of the setup or a daemon's traceback say, fails it as well); an unmarked
one is a row fixed already.

The rows that need authentication itself (a stranger takes a slot, a ring predecessor
from anyone, a stranger's chunks in the decode) run the attack against a tree given a
cluster secret (``CRNET_SECRET_FILE``), which must refuse it. The other rows attack from a
peer that holds a slot of a tree without a secret (loopback needs none): a stand-in for a
buggy or compromised node, which field validation must stop anyway.

The client side runs on asyncio's loop only: the daemons are what is under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import mmap
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import weakref
from dataclasses import fields
from pathlib import Path

import msgpack
import numpy as np
import pytest

from benchmarks.hostile_peer import Peer
from crnet import AsyncClient, CrnetTimeout, StepFailed
from crnet.coding.plan import Tree
from crnet.protocol.allocation import NodeShare, pack_allocation
from crnet.protocol.messages import (
    Assign,
    Attach,
    Attached,
    Chunk,
    ClientError,
    ClientHello,
    ClientWelcome,
    Done,
    Fail,
    FailKind,
    Hello,
    Joined,
    Open,
    PeerHello,
    PeerWelcome,
    Refuse,
    StatsReply,
    StatsRequest,
    Submit,
    Welcome,
)
from crnet.protocol.shm import PROGRESS_BYTES
from crnet.protocol.transport import Connection
from crnet.protocol.wire import MAGIC, PREFIX, VERSION, MsgType
from crnet.schemes.ring_allreduce.messages import Phase, Segment
from crnet.tools.launch import MASTER, LocalTree
from crnet.tools.procs import stop_processes

from ..helpers.clients import close_all, connect, connect_all
from ..helpers.trees import KILL
from ..helpers.vectors import gradients, local_gradient, rel_error
from ..helpers.waits import wait_until
from .path_proxy import PathProxy

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_factories=["asyncio"])]

TIMEOUT = 2.0                   # the daemons' --timeout
BOUND = TIMEOUT + 0.5 + 1.0     # every request is answered within this (grace 0.5, +1 s trip)
STAR = Tree.regular(3, 1, 1)    # master -> 0, 1, 2; s = 1: any two children carry a step
PAIR = Tree((2,), (0,))         # master -> 0, 1 (leaves); s = 0: the master needs both
SAMPLES, DIM = 30, 8


class FaultStillThere(AssertionError):
    """The row's attack succeeded: the one failure its ``xfail`` expects."""


def xfail(short: str):
    return pytest.mark.xfail(reason=f"issue 11: {short}", strict=True, raises=FaultStillThere)


# ------------------------------------------------------------------ raw peers (the attacker)
# ``Peer`` is benchmarks/hostile_peer.py's: the authenticated fuzzer uses it too.

@pytest.fixture
def peers():
    """``await peers.tcp(port)``, ``await peers.unix(path)``: raw peers, all closed at teardown."""
    class Peers:
        def __init__(self):
            self.open: list[Peer] = []

        async def tcp(self, port: int) -> Peer:
            sock = socket.socket()
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
            return self._keep(Peer(sock))

        async def unix(self, path: str) -> Peer:
            sock = socket.socket(socket.AF_UNIX)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, path)
            return self._keep(Peer(sock))

        def _keep(self, peer: Peer) -> Peer:
            self.open.append(peer)
            return peer

    made = Peers()
    yield made
    for peer in made.open:
        peer.close()


# ------------------------------------------------------------------ real daemons

@contextlib.contextmanager
def running(workdir: Path, tree: Tree, samples: int, only=None, spawn=None, **options):
    """A LocalTree of strict daemons (``only``: start just these), stopped on the way out. When
    the body succeeded, a daemon that exited non-zero (other than those the test stopped)
    or logged a traceback fails the test here, in its call phase (an xfail covers that)."""
    options.setdefault("timeout", TIMEOUT)
    if spawn is not None:
        options["spawn"] = spawn
    lt = LocalTree(tree, samples, workdir=workdir, strict=True, **options)
    names = [n for n in tree.names() if only is None or n in only]
    try:
        for name in names:
            lt.start_node(name)
        lt.wait_sockets(names, 30)
        yield lt
    except BaseException:
        lt.stop()
        raise
    lt.stop()
    problems = lt.problems()
    assert not problems, "\n".join(problems)


async def step(clients: dict[str, AsyncClient], grads: np.ndarray, t: int, scale: float = 1.0):
    """Every client's outcome of step ``t`` (the result, or the exception)."""
    outcomes = await asyncio.gather(
        *(c.allreduce(scale * local_gradient(c.assignment, grads), step=t, timeout=30)
          for c in clients.values()), return_exceptions=True)
    return dict(zip(clients, outcomes))


def exact(outcomes: dict, want: np.ndarray) -> bool:
    return all(isinstance(o, np.ndarray) and rel_error(o, want) <= 1e-9 for o in outcomes.values())


async def take_slot(peers, lt: LocalTree, name: str | None = "2", workers: int = 1) -> Peer:
    """A raw peer that says HELLO for slot ``name`` of the master and, welcomed, JOINED."""
    peer = await peers.tcp(lt.ports[MASTER])
    peer.send(Hello(name=name))
    got = await peer.recv()
    assert got is not None and isinstance(got[0], Welcome), got
    peer.send(Joined(workers))
    return peer


async def processed(peer: Peer) -> None:
    """Return once the daemon has read all that ``peer`` sent: a second HELLO is out of
    place on a tree link, so the daemon closes the connection when it gets to it."""
    peer.send(Hello())
    assert await peer.closed_by_daemon(10), "the daemon kept a link that said HELLO twice"


def rss(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def settled(value, within: float = 10.0, quiet: float = 0.5):
    """``value()`` once it has not changed for ``quiet`` seconds (or after ``within``)."""
    deadline = time.monotonic() + within
    last, since = value(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet:
        await asyncio.sleep(0.05)
        now = value()
        if now != last:
            last, since = now, time.monotonic()
    return last


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time process ``pid`` has used."""
    stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def write_secret(workdir: Path) -> Path:
    path = workdir / "cluster.secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


@pytest.fixture
def with_secret(tmp_path, monkeypatch):
    """Every daemon started from here on is given a cluster secret (CRNET_SECRET_FILE)."""
    monkeypatch.setenv("CRNET_SECRET_FILE", str(write_secret(tmp_path)))


# ====================================================================== the rows, in order

async def test_high_no_authentication_a_stranger_takes_a_slot(tmp_path, with_secret, peers):
    """| high | no authentication: any TCP peer takes a free child slot (by name or the first
    open), gets the subtree's assignment and every step's full gradient; after a node is
    killed a stranger took its slot 0.05 s later and the real node was refused indefinitely
    ("held by a live connection") | daemon.py child_hello | yes |

    With a cluster secret configured, a peer that does not hold it asks for the slot of a
    node just killed: it must get no WELCOME, and the real node, restarted, gets its slot."""
    grads = gradients(1, SAMPLES, DIM)
    want = grads.sum(axis=0)
    with running(tmp_path / "tree", STAR, SAMPLES) as lt:
        clients = await connect_all(lt, ["0", "1", "2"], starting=True)
        master = await connect(lt.socket_path(MASTER), starting=True)
        try:
            assert exact(await step(clients, grads, 0), want)
            clients.pop("2").close()
            lt.signal("2", KILL)
            await wait_until(lambda: _child_down(master, 2), "the master to lose child 2")
            stranger = await peers.tcp(lt.ports[MASTER])
            stranger.send(Hello(name="2"))
            reply = await stranger.recv()
            assert reply is None or not isinstance(reply[0], Welcome), "a stranger got slot 2"
            lt.start_node("2")
            lt.wait_sockets(["2"], 30)
            clients["2"] = await connect(lt.socket_path("2"), 15, starting=True)
            clients["2"].mark_current()   # joined mid-job (stale): its vectors need no parameters
            assert exact(await step(clients, grads, 1), want)
        finally:
            close_all(clients)
            master.close()


class TamperingProxy(PathProxy):
    """An on-path attacker between node ``victim`` and its parent, on 127.0.0.1: it passes
    the handshake through untouched, then rewrites the payload of every CHUNK going up."""

    def __init__(self, victim: str):
        super().__init__(victim)
        self.tampered = 0

    async def _up(self, reader, writer):
        while True:
            prefix = await reader.readexactly(PREFIX.size)
            _, _, msg_type, hlen, plen = PREFIX.unpack(prefix)
            head = await reader.readexactly(hlen)
            payload = await reader.readexactly(plen) if plen else b""
            if msg_type == MsgType.CHUNK:
                payload = np.full(plen // 8, 1e6).tobytes()
                self.tampered += 1
            writer.write(prefix + head + payload)
            await writer.drain()


@pytest.mark.parametrize("attacker", [
    "stranger",
    # By design: the HMAC handshake authenticates a link, not each frame after it. On a
    # network where someone may sit on the path, run with --tls: then a changed byte cuts
    # the link (test_tls.py::test_a_byte_changed_on_the_path_never_reaches_a_sum).
    pytest.param("on_path", marks=xfail("without --tls, frames after the handshake carry no "
                                        "MAC")),
])
async def test_high_no_integrity_a_slot_holders_chunks_enter_the_decode(tmp_path, with_secret,
                                                                       peers, attacker):
    """| high | no integrity: a slot holder's chunks enter the decode; sending CHUNK(t+1)
    right after RESULT(t) made 21/21 client results wrong | schemes/coded_reduce.py | yes |

    A tree with a cluster secret. ``stranger``: a peer without it asks for the slot of a
    node just killed and, if it gets it, races a garbage CHUNK of every step in ahead of
    the real children (s = 1: the master decodes from the first two). ``on_path``: an
    attacker between a real child and the master lets the handshake through and rewrites
    the child's CHUNKs (s = 0: the master needs them). Every result must still be exact
    (or the step fail): garbage must not enter the decode."""
    grads = gradients(2, SAMPLES, DIM)
    want = grads.sum(axis=0)
    if attacker == "on_path":
        proxy = await TamperingProxy("1").start()
        try:
            with running(tmp_path / "tree", PAIR, SAMPLES, spawn=proxy.spawn) as lt:
                clients = await connect_all(lt, ["0", "1"], starting=True)
                try:
                    outcomes = [await step(clients, grads, t) for t in range(5)]
                finally:
                    close_all(clients)
        finally:
            await proxy.close()
        assert proxy.tampered > 0
        wrong = sum(any(isinstance(r, np.ndarray) and rel_error(r, want) > 1e-9
                        for r in o.values()) for o in outcomes)
        if wrong:
            raise FaultStillThere(f"{wrong} of {len(outcomes)} steps gave wrong results")
        return
    with running(tmp_path / "tree", STAR, SAMPLES) as lt:
        clients = await connect_all(lt, ["0", "1", "2"], starting=True)
        master = await connect(lt.socket_path(MASTER), starting=True)
        try:
            assert exact(await step(clients, grads, 0), want)
            clients.pop("2").close()
            lt.signal("2", KILL)
            await wait_until(lambda: _child_down(master, 2), "the master to lose child 2")
            stranger = await peers.tcp(lt.ports[MASTER])
            stranger.send(Hello(name="2"))
            reply = await stranger.recv()
            welcomed = reply is not None and isinstance(reply[0], Welcome)
            if welcomed:
                stranger.send(Joined(1))
            outcomes = []
            for t in range(1, 6):
                if welcomed:   # CHUNK(t) right after RESULT(t-1): first at the master
                    garbage = np.full(DIM, 1e6)
                    stranger.send(Chunk(t, 0, DIM, "float64"), garbage)
                    await wait_until(lambda t=t: _open_at(master, t), f"step {t} open at the master")
                outcomes.append(await step(clients, grads, t))
        finally:
            close_all(clients)
            master.close()
    wrong = sum(not exact(o, want) for o in outcomes)
    assert wrong == 0, f"{wrong} of {len(outcomes)} steps gave wrong results"


async def _open_at(client: AsyncClient, t: int) -> bool:
    return t in (await client.stats())["open_steps"]


async def links(client: AsyncClient) -> dict:
    """Which of its daemon's links are up (``stats()["links"]``)."""
    return (await client.stats())["links"]


async def _child_down(client: AsyncClient, k: int) -> bool:
    return not (await links(client))["children"][k]


async def _parent_down(client: AsyncClient) -> bool:
    return not (await links(client))["parent"]


async def planned(lt: LocalTree, name: str = "0") -> None:
    """Wait until the tree is planned: node ``name``'s training process gets its share."""
    (await connect(lt.socket_path(name), starting=True)).close()


@pytest.mark.parametrize("path", [
    "child_fail",
    "local_submit",
])
async def test_high_step_counter_poisoning(tmp_path, peers, path):
    """| high | step-counter poisoning: one FAIL (or CHUNK) with step 2^62 from a child starts
    that step's clock, cancels the current step's timer, the master fails and broadcasts
    step 2^62, every node's `resolved_through` jumps; every later call fails with StepLost
    until every daemon restarts | daemon.py (child FAIL/CHUNK, step timer); the local SUBMIT
    path is the same | yes |

    Before the tree's first step (no window yet), ``child_fail``: a child says FAIL for step
    2^62; ``local_submit``: the master's training process asks for step 2^62. The step must
    not open at the master, and steps must keep completing exactly past --timeout."""
    grads = gradients(3, SAMPLES, DIM)
    want = grads.sum(axis=0)
    poison = 1 << 62
    with running(tmp_path / "tree", STAR, SAMPLES, only=[MASTER, "0", "1"]) as lt:
        hostile = await take_slot(peers, lt, "2")
        clients = await connect_all(lt, ["0", "1"], starting=True)
        master = await connect(lt.socket_path(MASTER), starting=True)
        asked = None
        try:
            if path == "child_fail":
                hostile.send(Fail(poison, "poison", FailKind.STALL))
                await processed(hostile)
                opened = poison in (await master.stats())["open_steps"]
            else:
                asked = asyncio.ensure_future(master.allreduce(np.zeros(DIM), step=poison))
                await asyncio.sleep(0.5)   # answered at once if refused; else it waits
                opened = not asked.done()
            outcomes, t, until = [], 0, time.monotonic() + BOUND + 1
            while time.monotonic() < until:
                outcomes.append(await step(clients, grads, t))
                t += 1
            tree_step = clients["0"].tree_step
        finally:
            if asked is not None:
                asked.cancel()
                with contextlib.suppress(BaseException):
                    await asked
            close_all(clients)
            master.close()
    bad = [(t, o) for t, o in enumerate(outcomes) if not exact(o, want)]
    assert not bad, (f"{len(bad)} of {len(outcomes)} steps after the poison were not exact; "
                     f"step {bad[0][0]}: {str(bad[0][1])[:300]}")
    assert tree_step == t - 1
    assert not opened, "step 2^62 opened at the master"


async def test_high_empty_chunk_skips_validation(tmp_path, peers):
    """| high | a CHUNK with no payload skips `frame_header` validation, is counted as
    arrived, and `chunk=-1` indexes the last chunk: eight empty CHUNKs produced a wrong
    result (rel. err 0.985) | wire.py; daemon.py child_chunk | yes |

    A child sends eight CHUNKs without a payload, another one a CHUNK with chunk=-1: each
    connection is closed at its first one, and the steps stay exact."""
    grads = gradients(4, SAMPLES, DIM)
    want = grads.sum(axis=0)
    with running(tmp_path / "tree", STAR, SAMPLES, only=[MASTER, "0", "1"]) as lt:
        hostile = await take_slot(peers, lt, "2")
        clients = await connect_all(lt, ["0", "1"], starting=True)
        try:
            for _ in range(8):
                hostile.send(Chunk(0, 0, DIM, "float64"))          # no payload
            assert await hostile.closed_by_daemon(5)
            first = await step(clients, grads, 0)
            hostile = await take_slot(peers, lt, "2")
            hostile.send(Chunk(1, -1, DIM, "float64"), np.full(DIM, 1e6))
            assert await hostile.closed_by_daemon(5)
            second = await step(clients, grads, 1)
        finally:
            close_all(clients)
    assert exact(first, want) and exact(second, want)


async def test_high_rar_ring_predecessor_from_anyone(tmp_path, with_secret, peers):
    """| high (rar) | a ring predecessor is accepted from anyone saying `role=ring`; 4 empty
    frames gave wrong results | daemon.py, links.py | yes |

    With a cluster secret configured, a stranger says PEER_HELLO as rank 1's predecessor:
    it must get no PEER_WELCOME, and the ring's steps stay exact."""
    ring = Tree((4,), (0,))
    grads = gradients(5, 20, DIM)
    want = grads.sum(axis=0)
    with running(tmp_path / "tree", ring, 20, scheme="rar") as lt:
        clients = await connect_all(lt, ["0", "1", "2", "3"], starting=True)
        try:
            assert exact(await step(clients, grads, 0), want)
            stranger = await peers.tcp(lt.ports["1"])
            stranger.send(PeerHello(0))
            reply = await stranger.recv()
            accepted = reply is not None and isinstance(reply[0], PeerWelcome)
            if accepted:   # step 1's reduce-scatter as rank 0 would send it, made up
                for rnd in range(3):
                    stranger.send(Segment(1, Phase.REDUCE, rnd, -rnd % 4, DIM, "float64"),
                                  np.full(DIM // 4, 1e6))
            after = await step(clients, grads, 1)
        finally:
            close_all(clients)
    assert not accepted, "a stranger became rank 1's ring predecessor"
    assert exact(after, want)


@pytest.mark.parametrize("attack", [
    "dtype_first",
    "huge_total_mid_step",
    "huge_total_first",
])
async def test_medium_step_layout_set_by_the_first_child_chunk(tmp_path, peers, attack):
    """| medium | a step's layout (dtype, total length) is set by the first child chunk: a
    hostile child makes every client get MismatchError; a huge `total` abandons the step in
    progress | daemon.py | yes (dtype) |

    ``dtype_first``: at the tree's first step a child's float32 CHUNK reaches the master
    before the real (float64) ones. ``huge_total_mid_step``: a CHUNK with total 2^40 while a
    step is under way. ``huge_total_first``: the same CHUNK as the first piece of a step.
    The real processes' results must be exact each time, and the master must survive."""
    grads = gradients(6, SAMPLES, DIM)
    want = grads.sum(axis=0)
    with running(tmp_path / "tree", STAR, SAMPLES, only=[MASTER, "0", "1"]) as lt:
        hostile = await take_slot(peers, lt, "2")
        clients = await connect_all(lt, ["0", "1"], starting=True)
        master = await connect(lt.socket_path(MASTER), starting=True)
        huge = Chunk(1, 0, 1 << 40, "float64")
        try:
            if attack == "dtype_first":
                hostile.send(Chunk(0, 0, DIM, "float32"), np.ones(DIM, np.float32))
                await processed(hostile)
                outcome = await step(clients, grads, 0)
            else:
                assert exact(await step(clients, grads, 0), want)
                if attack == "huge_total_first":
                    hostile.send(huge, np.ones((1 << 20) // 8))
                    await processed(hostile)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        lt.procs[MASTER].wait(1)
                    assert lt.alive(MASTER), f"the master exited with {lt.procs[MASTER].poll()}"
                    outcome = await step(clients, grads, 1)
                else:
                    c0, c1 = clients["0"], clients["1"]
                    first = asyncio.ensure_future(
                        c0.allreduce(local_gradient(c0.assignment, grads), step=1, timeout=30))
                    await wait_until(lambda: _open_at(master, 1), "step 1 open at the master")
                    hostile.send(huge, np.ones((1 << 20) // 8))
                    await processed(hostile)
                    second = await c1.allreduce(local_gradient(c1.assignment, grads), step=1,
                                                timeout=30)
                    outcome = {"0": await first, "1": second}
        finally:
            close_all(clients)
            master.close()
        assert lt.alive(MASTER)
    assert exact(outcome, want), outcome


def _prefix(msg_type: MsgType, header_bytes: int, payload_bytes: int = 0) -> bytes:
    return PREFIX.pack(MAGIC, VERSION, msg_type, header_bytes, payload_bytes)


class _Quiet:
    """A transport.Handler that accepts nothing (for in-process Connections)."""

    def payload_dest(self, conn, msg, nbytes):
        return None

    def received(self, conn, msg, payload):
        pass

    def lost(self, conn, exc):
        pass


@pytest.mark.parametrize("aspect", ["scratch_before_hello", "cycle_after_close"])
async def test_medium_high_memory_from_header_prefixes(tmp_path, peers, aspect):
    """| medium-high | memory: an 18-byte prefix declaring a 1 MiB header makes the reader
    allocate 1 MiB scratch, and a Connection<->FrameReader reference cycle keeps it after
    close: 300 connections took RSS from 77 to 356 MB, 600 to 657 MB, not released |
    wire.py, transport.py | yes |

    ``scratch_before_hello`` (live): 100 connections each send only a prefix that declares
    a 1 MiB HELLO header; the master's RSS must grow by less than 16 MiB, while they are open
    and after they are closed. ``cycle_after_close`` (in-process): a closed Connection, once
    dropped, must be freed by reference counting alone (with the cyclic GC off), or its
    buffers wait for a full collection that may not come for a long time."""
    if aspect == "cycle_after_close":
        gc.disable()
        try:
            conn = Connection(_Quiet())
            freed = weakref.ref(conn)
            conn.connection_lost(None)
            del conn
            assert freed() is None, "a closed Connection outlives its last reference (a cycle)"
        finally:
            gc.enable()
        return
    with running(tmp_path / "tree", Tree((1,), (0,)), 4) as lt:
        pid = lt.procs[MASTER].pid
        await planned(lt)
        before, fds = rss(pid), open_fds(pid)
        conns = [await peers.tcp(lt.ports[MASTER]) for _ in range(100)]
        for conn in conns:
            conn.send_bytes(_prefix(MsgType.HELLO, 1 << 20))
        await settled(lambda: open_fds(pid))    # accepted (or refused): it says nothing
        await asyncio.sleep(0.5)                # to read their prefixes
        held = rss(pid) - before
        for conn in conns:
            conn.close()
        await wait_until(lambda: open_fds(pid) <= fds, "the master to close them", 10)
        await asyncio.sleep(0.5)
        after = rss(pid) - before
    mib = 1 << 20
    assert held < 16 * mib and after < 16 * mib, (
        f"RSS grew {held / mib:.0f} MiB with 100 prefixes pending, {after / mib:.0f} MiB after close")


async def test_medium_no_connection_cap_no_hello_or_idle_deadline(tmp_path, peers):
    """| medium | no connection cap, no HELLO or idle deadline: 500 idle connections held 30 s
    (fds 20 -> 518); 1-byte-per-second senders held; with the fd limit reached a restarted
    node could not rejoin | daemon.py | yes |

    500 connections that say nothing and two that send a HELLO one byte a second: within
    20 s the master must have closed all of them (a cap closes the excess at once, a HELLO
    deadline the rest), so its descriptors are back where they were."""
    with running(tmp_path / "tree", Tree((1,), (0,)), 4) as lt:
        pid = lt.procs[MASTER].pid
        await planned(lt)
        fds = lambda: open_fds(pid)  # noqa: E731
        baseline = fds()
        idle = [await peers.tcp(lt.ports[MASTER]) for _ in range(500)]
        slow = [await peers.tcp(lt.ports[MASTER]) for _ in range(2)]
        # A HELLO of some 250 bytes: a byte a second, it is never whole within the test.
        hello = b"".join(bytes(p) for p in Hello(name="0", listen="h" * 200 + ":1").frame())

        async def trickle(peer: Peer) -> bool:
            """Send ``hello`` a byte a second; True once the daemon closed the connection."""
            for i in range(len(hello)):
                try:
                    peer.sock.send(hello[i:i + 1])
                except OSError:
                    return True
                await asyncio.sleep(1.0)
            return False

        trickles = [asyncio.ensure_future(trickle(p)) for p in slow]
        try:
            await settled(fds)                  # all accepted (or the excess refused)
            try:
                await wait_until(lambda: fds() <= baseline + 4
                                 and all(t.done() and t.result() for t in trickles),
                                 "the master to close the idle and slow connections", 20)
                closed = True
            except AssertionError:
                closed = False
            held = fds() - baseline
        finally:
            for t in trickles:
                t.cancel()
            for p in idle + slow:
                p.close()
    assert closed, f"{held} connections that never said HELLO still held after 20 s"


async def test_medium_header_decoded_before_hello_check(tmp_path, peers):
    """| medium | a 1 MiB msgpack header is decoded before the HELLO/type check: 61 such
    frames in 4.8 s cost the master 17.7 s of CPU; steps went from 0.07 s to 2.9 s | wire.py |
    yes |

    Ten connections each send one frame before HELLO whose 1 MiB header is a million empty
    msgpack arrays (within every per-field limit). A frame no unauthenticated peer may send
    must be refused from its prefix: all ten together must cost the master under 1 s of CPU."""
    body = msgpack.packb({"step": [[[]] * 65530 for _ in range(16)]})
    assert len(body) <= 1 << 20
    frame = _prefix(MsgType.OPEN, len(body)) + body
    with running(tmp_path / "tree", Tree((1,), (0,)), 4) as lt:
        pid = lt.procs[MASTER].pid
        await planned(lt)
        before = cpu_seconds(pid)
        for _ in range(10):
            peer = await peers.tcp(lt.ports[MASTER])
            peer.send_bytes(frame)   # False: refused before the body was read, as it should be
            assert await peer.closed_by_daemon(10)
            peer.close()
        spent = cpu_seconds(pid) - before
    assert spent < 1.0, f"ten hostile headers cost the master {spent:.2f} s of CPU"


# How this crnet takes a process's shared memory: by descriptor (a sealed memfd over
# SCM_RIGHTS, ATTACH naming the process by the token of its CLIENT_WELCOME), or by path.
DESCRIPTORS = "token" in {f.name for f in fields(Attach)}


async def _client_hello(peer: Peer) -> ClientWelcome:
    """Say CLIENT_HELLO as a training process; this host's assignment (the welcome)."""
    peer.send(ClientHello(os.getpid()))
    got = await peer.expect(ClientWelcome)
    assert got is not None, "no CLIENT_WELCOME"
    return got[0]


@contextlib.contextmanager
def region_file(capacity: int, sealed: bool = True):
    """Memory sized like a process's region, the way this crnet takes it: a memfd (sealed
    against shrinking and growing unless not ``sealed``), or a file in /dev/shm. Yields
    (descriptor, path or None, a mapping of it)."""
    size = PROGRESS_BYTES + 2 * capacity
    path = None
    if DESCRIPTORS:
        fd = os.memfd_create("crnet-trust", os.MFD_ALLOW_SEALING)
    else:
        path = f"/dev/shm/crnet-trust-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        if DESCRIPTORS and sealed:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        yield fd, path, mmap.mmap(fd, size)
    finally:
        os.close(fd)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


async def attach(peer: Peer, socket_path: str, welcome: ClientWelcome, fd: int,
                 path: str | None, capacity: int):
    """ATTACH memory as a training process does (by descriptor or by path); the daemon's
    answer on the control connection (ATTACHED, ERROR), or None if it closed it."""
    if DESCRIPTORS:
        frame = b"".join(bytes(p) for p in Attach(welcome.token, capacity).frame())  # type: ignore[attr-defined]
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(socket_path)
            socket.send_fds(s, [frame], [fd])
    else:
        peer.send(Attach(path, capacity))
    return await peer.expect(Attached, ClientError)


async def test_medium_local_attach_maps_any_path(tmp_path, peers):
    """| medium (local) | ATTACH maps any path the daemon can open: a (root) daemon sent a
    file's first half to a client and overwrote its second half | links.py, shm.py | yes |

    A training process asks its daemon to ATTACH a file that is no shared-memory region of
    its own (any file of the right size the daemon may open; by descriptor, where crnet
    takes descriptors): it must be refused, and the file left as it was."""
    capacity = 4096
    victim = tmp_path / "victim.dat"
    content = bytes(range(256)) * ((PROGRESS_BYTES + 2 * capacity) // 256)
    victim.write_bytes(content)
    with running(tmp_path / "tree", PAIR, 4) as lt:
        peer = await peers.unix(lt.socket_path("0"))
        welcome = await _client_hello(peer)
        fd = os.open(victim, os.O_RDWR)
        try:
            got = await attach(peer, lt.socket_path("0"), welcome, fd, str(victim), capacity)
        finally:
            os.close(fd)
        peer.close()
    assert got is None or not isinstance(got[0], Attached), "the daemon mapped an arbitrary file"
    assert victim.read_bytes() == content, "the daemon wrote into an arbitrary file"


async def test_medium_local_truncated_mapping_kills_the_daemon(tmp_path, peers):
    """| medium (local) | a client truncating its mapped file kills the daemon with SIGBUS
    (exit 135) | links.py, shm.py | yes |

    A training process attaches memory it has not sealed, truncates it to nothing, and
    submits a step: the daemon must live on (refusing the memory, or surviving the
    truncation) and keep accepting training processes."""
    with running(tmp_path / "tree", PAIR, 4) as lt:
        path = lt.socket_path("0")
        peer = await peers.unix(path)
        welcome = await _client_hello(peer)
        with region_file(DIM * 8, sealed=False) as (fd, name, _):
            await attach(peer, path, welcome, fd, name, DIM * 8)
            with contextlib.suppress(OSError):   # sealed memory cannot shrink: refused
                os.ftruncate(fd, 0)
            peer.send(Submit(0, DIM, "float64"))
            with contextlib.suppress(subprocess.TimeoutExpired):
                lt.procs["0"].wait(1)
        code = lt.procs["0"].poll()
        assert code is None, f"the daemon died (exit {code})"
        peer.close()
        (await peers.unix(path)).close()   # still accepting


async def test_low_medium_region_swap_while_a_step_is_pending(tmp_path, peers):
    """| low-medium | a client swapping to a smaller region while a step is pending makes a
    ValueError escape into the parent link handler, which drops the parent link | links.py |
    yes |

    A training process submits step 0 from a region that fits it, then ATTACHes a region of
    8 bytes before the step's result comes (from the parent): its daemon must not hit an
    internal error (strict mode would stop it), and its parent link must stay up."""
    grads = gradients(12, 4, DIM)
    want = grads.sum(axis=0)
    with running(tmp_path / "tree", PAIR, 4) as lt:
        path = lt.socket_path("0")
        peer = await peers.unix(path)
        welcome = await _client_hello(peer)
        other = await connect(lt.socket_path("1"), starting=True)
        try:
            with region_file(DIM * 8) as (fd, name, mapping), region_file(8) as (fd2, name2, _):
                assert await attach(peer, path, welcome, fd, name, DIM * 8) is not None
                local = np.frombuffer(mapping, np.float64, DIM, offset=PROGRESS_BYTES)
                local[:] = grads[0:2].sum(axis=0)        # worker 0's share: samples 0..2
                peer.send(Submit(0, DIM, "float64"))
                assert await attach(peer, path, welcome, fd2, name2, 8) is not None
                del local
                result = await other.allreduce(local_gradient(other.assignment, grads), step=0,
                                               timeout=30)
                with contextlib.suppress(asyncio.TimeoutError):   # an answer, or none
                    await peer.expect(ClientError, Done, timeout=3)
                peer.send(StatsRequest())
                stats = await peer.expect(StatsReply, timeout=5)
        finally:
            other.close()
        log = lt.log_path("0").read_text()
        assert rel_error(result, want) <= 1e-9
        assert "internal error" not in log, log[log.find("internal error"):][:600]
        assert lt.alive("0") and stats is not None and stats[0].links["parent"], stats


async def test_medium_orphaned_node_fails_new_steps_in_time(tmp_path):
    """| medium | an orphaned node (parent lost) never fails steps submitted after the loss:
    its client got TimeoutError after 10 s instead of StepFailed (daemon timeout 3 s),
    contrary to the README | daemon.py | yes |

    Leaf 0.0's parent dies; its training process then submits a new step: it must get
    StepFailed (not tree-wide: cut off from the master) within --timeout plus the grace."""
    chain = Tree((1, 1), (0, 0))      # master -> 0 -> 0.0
    grads = gradients(13, 4, DIM)
    want = grads.sum(axis=0)
    with running(tmp_path / "tree", chain, 4) as lt:
        clients = await connect_all(lt, ["0", "0.0"], starting=True)
        try:
            assert exact(await step(clients, grads, 0), want)
            clients.pop("0").close()
            lt.signal("0", KILL)
            await wait_until(lambda: _parent_down(clients["0.0"]), "0.0 to lose its parent")
            orphan = clients["0.0"]
            started = time.monotonic()
            with pytest.raises(StepFailed) as failed:
                await orphan.allreduce(local_gradient(orphan.assignment, grads), step=1,
                                       timeout=30)
            took = time.monotonic() - started
        finally:
            close_all(clients)
    assert not failed.value.tree_wide
    assert took < BOUND, f"StepFailed after {took:.1f} s"


# ------------------------------------------------------------------ a hostile parent

class FakeParent:
    """A listening socket on 127.0.0.1 posing as a node's parent."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[Peer] = []

    async def accept(self, timeout: float = 15.0) -> Peer:
        conn, _ = await asyncio.wait_for(asyncio.get_running_loop().sock_accept(self.sock), timeout)
        peer = Peer(conn)
        self.accepted.append(peer)
        got = await peer.expect(Hello)
        assert got is not None, "the node sent no HELLO"
        return peer

    def close(self) -> None:
        for peer in self.accepted:
            peer.close()
        self.sock.close()


@contextlib.contextmanager
def lone_node(workdir: Path, parent_port: int, name: str = "0", listen: bool = False):
    """One crnetd (--role node, strict) whose parent is ``parent_port``; stopped after.
    Yields (process, client socket path, log path)."""
    from crnet.tools.launch import free_port

    workdir.mkdir(parents=True, exist_ok=True)
    sock, log = workdir / "node.sock", workdir / "node.log"
    cmd = [sys.executable, "-m", "crnet", "daemon", "--role", "node", "--name", name,
           "--parent", f"127.0.0.1:{parent_port}", "--client-socket", str(sock),
           "--timeout", str(TIMEOUT), "--strict"]
    if listen:
        cmd += ["--listen", f"127.0.0.1:{free_port()}", "--insecure"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc, str(sock), log
    finally:
        stop_processes([proc], 5.0)


def _welcome(fanout, stragglers, name="0", layer=1) -> Welcome:
    return Welcome(name, layer, tuple(fanout), tuple(stragglers), "auto", 1 << 20, "cr")


@pytest.mark.parametrize("aspect", [
    "bounded",
    "refuses",
    "impostor",
])
async def test_medium_welcome_is_not_validated(tmp_path, monkeypatch, aspect):
    """| medium | WELCOME is not validated: a parent's WELCOME with fanout 1e6 built 1M
    slots (397 MB, 3.7 s), then exit 2, which the systemd unit does not restart | daemon.py |
    yes |

    A hostile parent WELCOMEs a node into the largest place a WELCOME may describe (65,536
    children). ``bounded``: a node that listens takes it; its RSS must grow by less than
    64 MiB and it must report its subtree (JOINED) within 2 s. ``refuses``: a node that does
    not listen cannot take it: it builds nothing, tells the parent why (REFUSE) and exits 2,
    as a parent's REFUSE makes it do (issue 24: it used to redial forever, the master's log
    flapping with no reason). That gives a parent no new power: without a cluster secret
    any peer at the parent's address can already REFUSE a node, and with one only the
    authenticated parent gets to WELCOME it (``impostor``). ``impostor``: a node given a
    cluster secret dials a parent that WELCOMEs it without authenticating: it must not take
    that place, and must dial again rather than exit."""
    if aspect == "impostor":
        monkeypatch.setenv("CRNET_SECRET_FILE", str(write_secret(tmp_path)))
    parent = FakeParent()
    try:
        with lone_node(tmp_path / "node", parent.port, listen=aspect == "bounded") as (proc, _, _):
            link = await parent.accept()
            before = rss(proc.pid)
            started = time.monotonic()
            if aspect == "impostor":
                link.send(_welcome((2,), (0,)))   # a place a leaf can take
            else:
                link.send(_welcome((1, 65536), (0, 0)))
            if aspect == "bounded":   # it took its place: it reports its subtree (JOINED)
                assert await link.expect(Joined) is not None, "the node dropped the link"
                took, grew = time.monotonic() - started, rss(proc.pid) - before
                assert grew < 64 << 20 and took < 2, f"{grew >> 20} MiB, {took:.1f} s"
                return
            if aspect == "refuses":   # it cannot take it: it says why and stops, building nothing
                said = await link.expect(Refuse, Joined, timeout=5)
                assert said is not None and isinstance(said[0], Refuse), said
                assert "--listen" in said[0].reason, said[0].reason
                assert proc.wait(timeout=10) == 2
                return
            try:
                taken = await link.expect(Joined, timeout=5)
            except asyncio.TimeoutError:
                taken = None
            try:
                again = await parent.accept(timeout=5)
            except asyncio.TimeoutError:
                again = None
            code = proc.poll()
            assert taken is None, "the node took a place from a parent that did not authenticate"
            assert again is not None and code is None, f"the node exited with {code}"
    finally:
        parent.close()


async def test_low_medium_assign_commits_before_validating(tmp_path):
    """| low-medium | ASSIGN commits `subtree`/`samples` before validating; `samples="ten"`
    reached the client | daemon.py | yes |

    A hostile parent sends ASSIGN with samples="ten", then (on the next connection) one
    whose ranges lie outside the batch, then a valid one: the node must drop the bad ones
    and its training process see only the valid assignment."""
    tree = Tree((2,), (0,))
    good = {"0": NodeShare(1, ((0, 5, 1.0),), ((0, 5, 1.0),)),
            "1": NodeShare(1, ((5, 10, 1.0),), ((5, 10, 1.0),))}
    outside = {"0": NodeShare(1, ((0, 50, 1.0),), ((0, 50, 1.0),))}
    parent = FakeParent()
    try:
        with lone_node(tmp_path / "node", parent.port) as (_, sock, _):
            client = asyncio.ensure_future(connect(sock, starting=True))
            dropped = []
            for samples, shares in (("ten", good), (10, outside), (10, good)):
                link = await parent.accept()
                link.send(_welcome(tree.fanout, tree.stragglers))
                link.send(Assign(samples), pack_allocation(shares))   # type: ignore[arg-type]
                if samples == 10 and shares is good:
                    break
                dropped.append(await link.closed_by_daemon(5))
            c = await client
            try:
                assignment = c.assignment
            finally:
                c.close()
    finally:
        parent.close()
    assert dropped == [True, True]
    assert assignment.samples == 10 and assignment.ranges == ((0, 5, 1.0),)


async def test_low_medium_shutdown_on_asyncio_waits_for_idle_connections(tmp_path, peers,
                                                                        monkeypatch):
    """| low-medium | on asyncio's loop (no uvloop) shutdown waits for idle non-slot
    connections: still running 10 s after SIGTERM | daemon.py | yes |

    A tree of daemons on asyncio's loop (uvloop hidden from them); twenty connections that
    never said HELLO, one stopped mid-frame: the master, sent SIGTERM, must exit 0 within
    its shutdown grace (5 s) plus 2 s."""
    hide = tmp_path / "no-uvloop"
    hide.mkdir()
    (hide / "uvloop.py").write_text('raise ImportError("uvloop is hidden from this daemon")\n')
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hide),
                                                                    os.environ.get("PYTHONPATH")])))
    grads = gradients(16, 4, DIM)
    with running(tmp_path / "tree", Tree((1,), (0,)), 4) as lt:
        maps = Path(f"/proc/{lt.procs[MASTER].pid}/maps").read_text()
        assert "uvloop" not in maps, "the daemon runs uvloop after all"
        clients = await connect_all(lt, ["0"], starting=True)
        try:
            assert exact(await step(clients, grads, 0), grads.sum(axis=0))
            pid, fds = lt.procs[MASTER].pid, open_fds(lt.procs[MASTER].pid)
            idle = [await peers.tcp(lt.ports[MASTER]) for _ in range(20)]
            idle[0].send_bytes(_prefix(MsgType.HELLO, 100))   # and stops there
            held = await settled(lambda: open_fds(pid)) - fds   # accepted (or the excess refused)
            assert held > 0, "the master holds none of them: nothing to test"
            started = time.monotonic()
            lt.signal(MASTER, signal.SIGTERM)
            try:
                code = lt.procs[MASTER].wait(15)
            except subprocess.TimeoutExpired:
                code = None
            took = time.monotonic() - started
        finally:
            close_all(clients)
    assert code == 0 and took < 7, f"exit {code} after {took:.1f} s"


@pytest.mark.parametrize("aspect", [
    "injection",
    "flooding",
    "long_name",
])
async def test_low_log_injection_and_flooding(tmp_path, peers, aspect):
    """| low | log injection and flooding: reasons logged with `%s`, 60 KB names logged |
    daemon.py | yes |

    A child sends 300 FAILs whose reason holds a newline and a forged log line, then 4,000
    characters. ``injection``: no line of the master's log may be the forged one.
    ``flooding``: the master's log may grow by at most 64 KiB. ``long_name``: a HELLO with
    a 60 KB name is refused, and the master's log grows by at most 4 KiB."""
    grads = gradients(17, SAMPLES, DIM)
    if aspect == "long_name":
        with running(tmp_path / "tree", STAR, SAMPLES, only=[MASTER]) as lt:
            size = lt.log_path(MASTER).stat().st_size
            peer = await peers.tcp(lt.ports[MASTER])
            peer.send(Hello(name="n" * 60_000))
            assert await peer.closed_by_daemon(5)
            grown = lt.log_path(MASTER).read_text()[size:]
        assert len(grown) < 4 << 10, f"the log grew by {len(grown)} bytes"
        return
    forged = "2001-01-01 00:00:00,000 ERROR   crnet.node[1]: FORGED by a child"
    reason = "stalled\n" + forged + "\n" + "A" * 4000
    with running(tmp_path / "tree", STAR, SAMPLES, only=[MASTER, "0", "1"]) as lt:
        hostile = await take_slot(peers, lt, "2")
        clients = await connect_all(lt, ["0", "1"], starting=True)
        try:
            assert exact(await step(clients, grads, 0), grads.sum(axis=0))
            size = lt.log_path(MASTER).stat().st_size
            for _ in range(300):
                hostile.send(Fail(0, reason, FailKind.STALL))
            assert await hostile.finish()   # the master read all 300 and closed
            grown = lt.log_path(MASTER).read_text()[size:]
        finally:
            close_all(clients)
    if aspect == "injection":
        assert not re.search(r"^2001-01-01 00:00:00,000 ERROR", grown, re.M), "a forged log line"
    else:
        assert len(grown) < 64 << 10, f"the log grew by {len(grown) >> 10} KiB"


async def test_low_joined_worker_counts_unbounded(tmp_path, peers):
    """| low | JOINED worker counts are taken from the child unbounded: one connection
    produced "9/9 workers joined" | links.py | yes |

    A tree of 6 workers (fanout 2, 2 layers) whose master alone runs: one connection takes
    child slot 0 and says JOINED with 6 workers. A layer-1 subtree holds 3: the master must
    count at most 3, and must not plan the tree."""
    tree = Tree.regular(2, 2, 0)
    with running(tmp_path / "tree", tree, 12, only=[MASTER]) as lt:
        await processed(await take_slot(peers, lt, "0", workers=tree.workers))
        try:   # the master's own process is welcomed only once the tree is planned
            (await connect(lt.socket_path(MASTER), 3, starting=True)).close()
            planned = True
        except CrnetTimeout:
            planned = False
        log = lt.log_path(MASTER).read_text()
    counts = [int(n) for n in re.findall(r"(\d+)/6 workers joined", log)]
    assert not planned, f"one connection made the master plan the tree: {counts}"


async def test_low_sent_results_grow_per_step_per_child(tmp_path, peers):
    """| low | `sent_results` grows by one entry per step per child forever (300k steps:
    ~33 MiB) | daemon.py | in-process |

    What a parent remembers per child (``ChildSlot.told``, the successor of sent_results) is
    pruned as the tree moves on; a hostile child feeds it instead: OPEN for 2,000 distinct
    steps far ahead of the window, each refused (FAIL) and remembered. The master's count
    (``stats()["stats"]["told"]``) must stay bounded by the window."""
    grads = gradients(19, SAMPLES, DIM)
    with running(tmp_path / "tree", STAR, SAMPLES, only=[MASTER, "0", "1"]) as lt:
        hostile = await take_slot(peers, lt, "2")
        clients = await connect_all(lt, ["0", "1"], starting=True)
        master = await connect(lt.socket_path(MASTER), starting=True)
        try:
            assert exact(await step(clients, grads, 0), grads.sum(axis=0))
            for i in range(2000):
                hostile.send(Open(10**9 + i))
            refused = 0
            while refused < 2000:
                got = await hostile.expect(Fail, timeout=10)
                if got is None:
                    break
                refused += got[0].kind is FailKind.REFUSED
            told = (await master.stats())["stats"]["told"]
        finally:
            close_all(clients)
            master.close()
    assert told <= 64, f"the master remembers {told} verdicts for one child"


def _umask_022(name, argv, kwargs):
    return subprocess.Popen(argv, **dict(kwargs, preexec_fn=lambda: os.umask(0o022)))


_PEER_SCRIPT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
    s.sendall(bytes.fromhex(sys.argv[2]))
    data = s.recv(18)
except OSError as e:
    print("refused", e)
else:
    print("type", data[5] if len(data) == 18 else "none")
"""


@pytest.mark.parametrize("aspect", [
    "mode",
    "peer_uid",
    "takeover",
])
async def test_info_client_socket_mode_peer_and_stale_path(tmp_path, aspect):
    """| info | the client socket's mode comes from umask (0755 seen), no SO_PEERCRED check;
    a stale socket path is unlinked at start even if a live daemon uses it | daemon.py | seen |

    ``mode``: a daemon started with umask 022 must create its client socket 0600 (or 0660).
    ``peer_uid``: with the socket opened to everyone (chmod 666: a permissive group or
    umask), a process of another user (nobody) must still not be welcomed (SO_PEERCRED).
    ``takeover``: a second daemon given the same --client-socket must not take the path
    from the live one (it must exit non-zero, the path still the first daemon's)."""
    import shutil
    import tempfile

    from crnet.tools.launch import free_port

    if aspect == "peer_uid" and os.geteuid() != 0:
        pytest.skip("needs root to run a peer as another user")
    # A directory every user may enter (pytest's own is private to root).
    workdir = Path(tempfile.mkdtemp(prefix="crnet-trust-"))
    workdir.chmod(0o755)
    try:
        with running(workdir, Tree((1,), (0,)), 4, spawn=_umask_022) as lt:
            path = lt.socket_path(MASTER)
            if aspect == "mode":
                mode = os.stat(path).st_mode & 0o777
                assert not mode & 0o007, f"client socket mode {mode:o}: open to every user"
            elif aspect == "peer_uid":
                os.chmod(path, 0o666)
                hello = b"".join(bytes(p) for p in ClientHello(1).frame()).hex()
                out = subprocess.run(["/usr/bin/python3", "-c", _PEER_SCRIPT, path, hello],
                                     capture_output=True, text=True, timeout=20,
                                     preexec_fn=lambda: os.setuid(65534)).stdout.strip()
                assert out != f"type {int(MsgType.CLIENT_WELCOME)}", \
                    "another user's process was welcomed"
            else:
                inode = os.stat(path).st_ino
                cmd = [sys.executable, "-m", "crnet", "daemon", "--role", "master", "--listen",
                       f"127.0.0.1:{free_port()}", "--samples", "4", "--fanout", "1",
                       "--layers", "1", "--stragglers", "0", "--client-socket", path,
                       "--insecure"]
                second = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True)
                try:
                    await wait_until(lambda: second.poll() is not None or not os.path.exists(path)
                                     or os.stat(path).st_ino != inode,
                                     "the second daemon to exit or take the path", 15)
                    await asyncio.sleep(0.5)
                    code = second.poll()
                    same = os.path.exists(path) and os.stat(path).st_ino == inode
                finally:
                    stop_processes([second], 5.0)
                assert code not in (None, 0) and same, \
                    f"the second daemon (exit {code}) took the live daemon's client socket"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
