"""Faults the authenticated fuzzer (``python -m benchmarks.fuzz --authenticated``) found, each
as a small attack on real crnetd processes with a cluster secret: the hostile peer holds
the secret, takes a slot after the real handshake (``benchmarks/hostile_peer.py``), and
sends the one frame the fuzzer's run narrowed the fault down to."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.hostile_peer import Peer, authenticate, dial
from crnet import StepRefused
from crnet.auth import load_secret
from crnet.launch import MASTER, LocalTree
from crnet.messages import Hello, Job, Joined, Welcome

from .test_trust import SAMPLES, STAR, close_all, connect, exact, grads_for, processed, running, step

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_factories=["asyncio"])]


async def insider(lt: LocalTree, name: str = "2") -> Peer:
    """Slot ``name`` of the master, taken by a peer that holds the secret; JOINED sent."""
    peer = await dial(lt.ports[MASTER])
    answer = await authenticate(peer, load_secret(lt.options["secret_file"]), Hello(name=name))
    assert isinstance(answer, Welcome), answer
    assert await peer.write(b"".join(bytes(p) for p in Joined(1).frame()))
    return peer


async def test_a_job_frame_does_not_end_a_running_job_of_processes_without_a_name(tmp_path):
    """Processes that name no job (README's loop, ``Client()``) run steps 0-19; a secret
    holder in slot 2 asks for job 'evil' with one process of it attached (one JOB frame).
    The running job has processes attached, so 'evil' may not start. Before the fix it
    did at once (an unnamed job's processes counted as none): the tree's step went back
    to -1 and every later step of the real processes (past the 16-step window) was refused,
    for good."""
    grads = grads_for(31)
    want = grads.sum(axis=0)
    with running(tmp_path / "tree", STAR, SAMPLES, only=[MASTER, "0", "1"], secret=True) as lt:
        hostile = await insider(lt)
        clients = await connect(lt, [MASTER, "0", "1"])
        try:
            for t in range(20):
                assert exact(await step(clients, grads, t), want), t
            assert await hostile.write(b"".join(bytes(p) for p in Job("evil", 1).frame()))
            await asyncio.sleep(0.5)
            outcomes = {t: await step(clients, grads, t) for t in range(20, 23)}
            refused = [t for t, o in outcomes.items() if any(isinstance(x, StepRefused) for x in o.values())]
            assert not refused, f"steps {refused} refused after one JOB frame: {outcomes}"
            assert all(exact(o, want) for o in outcomes.values()), outcomes
            await processed(hostile)
        finally:
            close_all(clients)
            hostile.close()
