"""Issue 26, rows 3, 6 and 7: what a host holding the cluster secret may claim about jobs,
barriers, broadcasts, state requests and child slots.

Each test runs the row's attack against real crnetd processes on 127.0.0.1 given a
cluster secret: the attacker (``insider``) holds the secret, takes a free child slot of
the master after a real handshake, and then sends forged frames. The threat model
(docs/operations.md): such a host spoils only what it contributes; it cannot end a job,
release or block a barrier, replace a broadcast or a state answer for others, exhaust
another host's memory, or take a live child's slot.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import numpy as np
import pytest

from crnet import AsyncClient, DaemonBusy, MismatchError
from crnet.protocol.auth import load_secret, mac, new_nonce
from crnet.protocol.handshake import claim
from crnet.protocol.messages import (
    Barrier,
    Bcast,
    Challenge,
    Hello,
    Joined,
    Proof,
    Refuse,
    WantState,
    Welcome,
    vote_key,
)
from crnet.protocol.wire import MsgType, encode
from crnet.tools.launch import MASTER, LocalTree

from ..helpers.clients import close_all, connect_all
from ..helpers.vectors import gradients
from . import test_trust
from .test_trust import DIM, SAMPLES, STAR, Peer, exact, processed, rss, running, step

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_factories=["asyncio"])]

peers = test_trust.peers     # the fixture: raw peers, closed at teardown
MIB = 1 << 20
REAL = [MASTER, "0", "1"]       # STAR's daemons started; slot "2" is the insider's


async def insider(peers, lt: LocalTree, name: str | None = "2",
                  workers: int = 1) -> tuple[Peer, object]:
    """A peer that holds the cluster secret: HELLO for slot ``name`` of the master, the
    handshake's proof, then (welcomed) JOINED. Returns it and the master's first reply
    after the proof (WELCOME, REFUSE, or None if it closed the connection)."""
    secret = load_secret(lt.options["secret_file"])
    peer = await peers.tcp(lt.ports[MASTER])
    hello = Hello(name=name, nonce=new_nonce())
    peer.send(hello)
    got = await peer.recv()
    assert got is not None and isinstance(got[0], Challenge), got
    role, claimed = claim(hello)
    assert hello.nonce is not None
    peer.send(Proof(mac(secret, "dialer", hello.nonce, got[0].nonce, role, claimed)))
    got = await peer.expect(Welcome, Refuse)
    reply = None if got is None else got[0]
    if isinstance(reply, Welcome):
        peer.send(Joined(workers))
    return peer, reply


def job_frame(name: str, attached: int) -> bytes:
    """JOB up: ``attached`` processes of job ``name`` in the sender's subtree. Raw, so that
    the frame is the same whatever ``crnet.protocol.messages.Job`` holds."""
    return b"".join(bytes(p) for p in encode(MsgType.JOB, {"name": name, "attached": attached}))


def peak_rss(pid: int) -> int:
    """The highest resident set size process ``pid`` has had, in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def tree(tmp_path, **options):
    return running(tmp_path / "tree", STAR, 30, only=REAL, secret=True, **options)


# ------------------------------------------------------------------ row 3: broadcast memory

async def test_row3_bcast_claims_allocate_nothing_and_a_vector_no_host_holds_closes_one_link(
        tmp_path, peers):
    """| 3 | high | BCAST allocates ``total * itemsize`` for a claimed total up to 2**40:
    81-byte frames raised the master's RSS by 256 MiB each; a 2**40 claim logged
    ``internal error: MemoryError`` (--strict exits 70) |

    The insider says it has a process of the job below it (so that its broadcasts are
    taken at all: row 7). Four BCASTs of 8 bytes, each claiming a 256 MiB vector: the
    master's RSS stays within 32 MiB of where it was. A claim of 2**40 float64 closes
    that link, with a log line that says why; the master (strict) keeps serving: a step
    and a real broadcast after it are exact."""
    grads = gradients(3, SAMPLES, DIM)
    want = grads.sum(axis=0)
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)       # slot 2: the tree is whole once it joined
        clients = await connect_all(lt, ["0", "1"], starting=True)
        try:
            spy.send_bytes(job_frame("", 1))     # it speaks for a process of the job
            assert exact(await step(clients, grads, 0), want)
            pid = lt.procs[MASTER].pid
            before = rss(pid)
            for i in range(4):
                spy.send(Bcast(f"junk/{i}", 1, -1, 0, 1 << 25, "float64"), b"\0" * 8)
            await processed(spy)                 # read all of it (then closed: HELLO twice)
            grew = peak_rss(pid) - before        # (closing the link freed what it held)
            assert grew < 32 * MIB, f"4 claims of 256 MiB grew the master's RSS {grew / MIB:.0f} MiB"

            spy, _ = await insider(peers, lt)
            spy.send_bytes(job_frame("", 1))
            spy.send(Bcast("huge", 1, -1, 0, 1 << 40, "float64"), b"\0" * 8)
            assert await spy.closed_by_daemon(10), "a claim of 8 TiB did not close the link"
            assert lt.alive(MASTER), f"the master exited with {lt.procs[MASTER].poll()}"
            assert "claims a vector of 1099511627776 x float64" in lt.log_path(MASTER).read_text()

            assert exact(await step(clients, grads, 1), want)
            params = np.random.default_rng(4).standard_normal(300_000)   # several pieces
            got = await asyncio.gather(
                clients["0"].broadcast(params, "params", root=True, processes=2),
                clients["1"].broadcast(np.zeros_like(params), "params", root=False, processes=2))
            for r in got:
                np.testing.assert_array_equal(r, params)
        finally:
            close_all(clients)


# ------------------------------------------------------------------ row 6: jobs

async def test_row6_neither_a_job_frame_nor_a_newcomer_of_another_job_ends_a_running_job(
        tmp_path, peers):
    """| 6 | medium | one JOB frame, or a CLIENT_HELLO naming a new job, ends the running job
    for the whole tree: every process got JobEnded("the daemons now run job 'evil'") |

    Processes of job "real" run on 0 and 1. The insider's JOB("evil") changes nothing
    (the next step is exact for both); a process of job "evil" connecting to the master
    gets DaemonBusy naming job 'real'. Once the processes of "real" have gone, a new job
    starts (from step 0)."""
    grads = gradients(6, SAMPLES, DIM)
    want = grads.sum(axis=0)
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)
        clients = await connect_all(lt, ("0", "1"), job="real")
        try:
            assert exact(await step(clients, grads, 0), want)
            spy.send_bytes(job_frame("evil", 1))
            await asyncio.sleep(0.5)
            assert exact(await step(clients, grads, 1), want), "a JOB frame ended the job"
            with pytest.raises(DaemonBusy, match="run job 'real'"):
                await AsyncClient.connect(lt.socket_path(MASTER), timeout=5, job="evil")
            assert exact(await step(clients, grads, 2), want), "a newcomer ended the job"
        finally:
            close_all(clients)
        await asyncio.sleep(0.5)                 # their daemons tell the master they left
        after = await connect_all(lt, ("0", "1"), job="next")
        try:
            assert all(c.tree_step == -1 for c in after.values())
            assert exact(await step(after, grads, 0), want)
        finally:
            close_all(after)


# ------------------------------------------------------------------ row 7: shared keys

async def done_within(fut, seconds: float) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(fut), seconds)
    except asyncio.TimeoutError:
        return False
    return True


async def test_row7_a_barrier_is_neither_released_early_nor_squatted_nor_evicted(tmp_path, peers):
    """| 7 | medium | a barrier released early ("released with 1 process there"); a key
    squatted with processes=2**20; 64 junk keys evict real barriers whose waiters are
    never released |

    Two processes (on 0 and 1) and the insider, which has no process attached. Early:
    the insider counts one arrival at "early" of 2; process 0 alone must still wait.
    Squatted: the insider opens "start" with processes=2**20 first; both processes at
    "start" of 2 are released. Evicted: process 0 waits at "third", the insider opens 100
    junk barriers, then process 1 comes: both are released."""
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)       # slot 2: the tree is whole once it joined
        clients = await connect_all(lt, ["0", "1"], starting=True)
        try:
            spy.send(Barrier("early", 1, 2))
            await asyncio.sleep(0.3)
            first = asyncio.ensure_future(clients["0"].barrier("early", processes=2, timeout=30))
            assert not await done_within(first, 1.5), "released with 1 process there"
            await asyncio.wait_for(asyncio.gather(
                first, clients["1"].barrier("early", processes=2, timeout=30)), 10)

            spy.send(Barrier("start", 1, 1 << 20))
            await asyncio.sleep(0.3)
            await asyncio.wait_for(asyncio.gather(
                *(c.barrier("start", processes=2, timeout=30) for c in clients.values())), 10)

            first = asyncio.ensure_future(clients["0"].barrier("third", processes=2, timeout=30))
            await asyncio.sleep(0.5)
            for i in range(100):
                spy.send(Barrier(f"junk/{i}", 1, 3))
            await asyncio.sleep(0.5)
            await asyncio.wait_for(asyncio.gather(
                first, clients["1"].barrier("third", processes=2, timeout=30)), 10)
        finally:
            close_all(clients)


async def test_row7_a_host_counts_no_more_processes_than_it_seats(tmp_path, peers):
    """| 7 | medium | a barrier released early |, by a host that claims processes: the
    insider says 1000 processes of the job are attached below it (it could seat 1024 as
    long as any host could run that many) and that 2 of them are at "early" of 3. Every
    host of a tree seats as many processes as the master (--local-processes, here 1): the
    claim closes the insider's link, and process 0 alone still waits for process 1."""
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)       # slot 2: the tree is whole once it joined
        clients = await connect_all(lt, ["0", "1"], starting=True)
        try:
            spy.send_bytes(job_frame("", 1000))
            spy.send(Barrier("early", 2, 3))
            await asyncio.sleep(0.3)
            first = asyncio.ensure_future(clients["0"].barrier("early", processes=3, timeout=30))
            assert not await done_within(first, 1.5), "released with 1 process of 3 there"
            assert await spy.closed_by_daemon(5), "a claim of 1000 processes on one host kept its link"
            again, _ = await insider(peers, lt)
            again.send_bytes(job_frame("", 1))
            again.send(Barrier("early", 1, 3))
            await asyncio.wait_for(asyncio.gather(
                first, clients["1"].barrier("early", processes=3, timeout=30)), 10)
        finally:
            close_all(clients)


async def test_row7_every_host_of_a_tree_runs_as_many_processes_as_the_master(tmp_path):
    """What bounds a host's claims is the tree's own setting: a node started with another
    --local-processes than the master's is refused at its join and exits 2, saying why."""
    with tree(tmp_path) as lt:
        command = lt.command("2") + ["--local-processes", "2"]
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            assert await asyncio.to_thread(proc.wait, 30) == 2
        finally:
            if proc.poll() is None:
                proc.kill()
            out = proc.communicate()[0].decode()
        assert "runs --local-processes 2, but the tree runs 1 on every host" in out, out


async def test_row7_a_broadcast_and_state_requests_come_only_from_processes_of_the_job(
        tmp_path, peers):
    """| 7 | medium | the first broadcast copy wins (every process received [666 666 666
    666] for ``params``); a WANT_STATE makes every torch process upload its full state |

    The insider, with no process of the job attached, sends its copy of ``params`` first,
    and 20 state requests: process 1 receives process 0's ``params``, and no process is
    asked for its state."""
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)       # slot 2: the tree is whole once it joined
        clients = await connect_all(lt, ["0", "1"], starting=True)
        try:
            forged = np.full(4, 666.0)
            spy.send(Bcast("params", 5, -1, 0, 4, "float64"), forged.tobytes())
            for nonce in range(1, 21):
                spy.send(WantState(nonce))
            await asyncio.sleep(0.5)
            real = np.arange(4.0)
            got = await asyncio.gather(
                clients["0"].broadcast(real, "params", root=True, processes=2),
                clients["1"].broadcast(np.zeros(4), "params", root=False, processes=2))
            np.testing.assert_array_equal(got[1], real)
            await asyncio.sleep(1.5)
            assert not any(c.state_wanted() for c in clients.values()), \
                "a forged WANT_STATE asked every process for its state"
        finally:
            close_all(clients)


async def test_row7_a_broadcast_belongs_to_its_root(tmp_path, peers):
    """| 7 | medium | the first broadcast copy wins (every process received [666 666 666
    666] for ``params``) |, from a host that claims a process of the job: its copy of
    ``params`` reaches the master first. The processes name the root by its rank
    (``assignment.rank``): process 1 gets process 0's vector, not the insider's."""
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)       # slot 2: the tree is whole once it joined
        clients = await connect_all(lt, ["0", "1"], starting=True)
        try:
            spy.send_bytes(job_frame("", 1))     # it speaks for a process of the job
            spy.send(Bcast("params", 5, -1, 0, 4, "float64", root="2"), np.full(4, 666.0).tobytes())
            await asyncio.sleep(0.5)
            root = clients["0"].assignment.rank
            assert root == 1 and clients["1"].assignment.rank == 2   # master 0, then 0, 1, 2
            real = np.arange(4.0)
            got = await asyncio.gather(clients["0"].broadcast(real, "params", root=root),
                                       clients["1"].broadcast(np.zeros(4), "params", root=root))
            np.testing.assert_array_equal(got[1], real)
        finally:
            close_all(clients)


async def test_row7_root_true_receivers_take_the_voted_roots_copy_never_a_forged_first_one(
        tmp_path, peers):
    """| 7 | medium | the first broadcast copy wins |, with ``root=True``/``False``: the
    processes do not know the root's rank. The insider claims a process of the job (one of
    the tree's four seats) and sends its copies of ``a`` and ``b`` first. At ``a`` it
    arrives at the processes' vote as a receiver: every process gets process 0's vector. At
    ``b`` it says its own process is the root: each receiver is told that two hosts sent
    it (MismatchError naming both), and none gets the insider's vector."""
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)       # slot 2: the tree is whole once it joined
        clients = await connect_all(lt, REAL, starting=True)
        try:
            spy.send_bytes(job_frame("", 1))     # it speaks for a process of the job
            forged = np.full(4, 666.0)
            for key in ("a", "b"):
                spy.send(Bcast(key, 5, -1, 0, 4, "float64", root="2"), forged.tobytes())
            spy.send(Barrier(vote_key("a"), 1, 4))
            spy.send(Barrier(vote_key("b"), 1, 4, ("2",)))
            await asyncio.sleep(0.5)
            real = np.arange(4.0)

            def calls(key):
                return [clients[n].broadcast(real if n == "0" else np.zeros(4), key,
                                             root=n == "0") for n in REAL]
            for got in await asyncio.gather(*calls("a")):
                np.testing.assert_array_equal(got, real)
            got = await asyncio.gather(*calls("b"), return_exceptions=True)
            np.testing.assert_array_equal(got[REAL.index("0")], real)   # the root's own
            for n, r in zip(REAL, got):
                if n != "0":
                    assert isinstance(r, MismatchError), r
                    assert "hosts '2' and '0'" in str(r) or "hosts '0' and '2'" in str(r), r
        finally:
            close_all(clients)


async def test_row7_a_hello_for_a_live_childs_slot_does_not_take_it(tmp_path, peers):
    """| 7 | medium | an authenticated HELLO kicks a live child off its slot |

    The insider asks for slot "0", held by a live node: it is refused (try again), node 0
    keeps its slot (nothing in the master's log about closing it, and the next step is
    exact with its process). A node that really restarted takes its slot back: see
    test_auth.test_a_node_with_the_secret_reclaims_its_slot_from_a_dead_connection_at_once."""
    grads = gradients(7, SAMPLES, DIM)
    want = grads.sum(axis=0)
    with tree(tmp_path) as lt:
        await insider(peers, lt)                # slot 2: the tree is whole once it joined
        clients = await connect_all(lt, ["0", "1"], starting=True)
        try:
            assert exact(await step(clients, grads, 0), want)
            _, reply = await insider(peers, lt, name="0")
            assert isinstance(reply, Refuse), f"the insider took live slot 0: {reply}"
            assert reply.retry
            await asyncio.sleep(3.0)               # past the liveness check's deadline
            assert exact(await step(clients, grads, 1), want)
            log = lt.log_path(MASTER).read_text()
            assert "closing its old connection" not in log, "slot 0 changed hands"
            assert "child 0 disconnected" not in log, "slot 0 changed hands"
        finally:
            close_all(clients)
