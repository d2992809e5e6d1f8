"""A state answer (``request_state``) from a host that holds the cluster secret and claims
a process of the job does not replace the answer of the master's own host.

Real crnetd processes on 127.0.0.1 with a secret; the attacker takes slot 2 of the master
after the real handshake (``test_trust_keys.insider``), says a process of the job is
attached below it, and answers the master's state request at once with a forged state.
The master is the root of trust: while a process on its own host can answer (one that is
not itself asking), it waits for that process's answer (``crnet/node/broadcasts.py``).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from crnet.launch import MASTER
from crnet.messages import Bcast, WantState, state_key

from .test_trust import close_all, connect, exact, grads_for, step
from .test_trust_keys import insider, job_frame, peers, tree

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_factories=["asyncio"])]

__all__ = ["peers"]    # the fixture

STATE = np.arange(6.0) * 0.25 + 1.0     # the job's state, as the honest processes hold it
FORGED = np.full(6, 666.0)


async def forge_state_answer(spy) -> int:
    """Read what the master sends the insider until its state request comes; answer it at
    once with ``FORGED`` (as the state after step 0). Returns the request's nonce."""
    while True:
        got = await spy.recv(timeout=20)
        assert got is not None, "the master closed the insider's link"
        if isinstance(got[0], WantState):
            nonce = got[0].nonce
            spy.send(Bcast(state_key(nonce), 7, 0, 0, FORGED.size, "float64", root="2"),
                     FORGED.tobytes())
            return nonce


async def answer_late(c, delay: float) -> None:
    """An honest process: at its step boundary, ``delay`` after it saw the request, its state."""
    while not c.state_wanted():
        await asyncio.sleep(0.01)
    await asyncio.sleep(delay)
    await c.send_state(STATE, 0)


async def test_a_forged_state_answer_sent_first_does_not_replace_the_masters_hosts(tmp_path, peers):
    """Processes on the master, 0 and 1 run step 0; process 0 asks for the state. The
    insider's forged answer reaches the master first (the honest processes answer 1 s
    after they see the request). Before the fix process 0 got [666 ...]; now it gets the
    state the master's process sent, exactly, and step 1 is exact for all three."""
    grads = grads_for(41)
    want = grads.sum(axis=0)
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)       # slot 2: the tree is whole once it joined
        clients = await connect(lt, [MASTER, "0", "1"])
        try:
            spy.send_bytes(job_frame("", 1))     # it speaks for a process of the job
            assert exact(await step(clients, grads, 0), want)
            forging = asyncio.ensure_future(forge_state_answer(spy))
            honest = [asyncio.ensure_future(answer_late(clients[n], 1.0)) for n in (MASTER, "1")]
            state, after = await clients["0"].request_state(np.zeros(6), timeout=20)
            await asyncio.wait_for(forging, 5)   # it did answer
            await asyncio.wait_for(asyncio.gather(*honest), 10)
            np.testing.assert_array_equal(state, STATE)
            assert after == 0
            assert exact(await step(clients, grads, after + 1), want)
            assert "kept aside: a process on the master's host answers" in \
                lt.log_path(MASTER).read_text()
        finally:
            close_all(clients)
