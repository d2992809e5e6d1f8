"""A state answer (``request_state``) from a host that holds the cluster secret and claims
a process of the job replaces no one's: not the answer of the master's own host, nor,
when no process there can answer, the state two child slots agree on.

Real crnetd processes on 127.0.0.1 with a secret; the attacker takes slot 2 of the master
after the real handshake (``test_trust_keys.insider``), says a process of the job is
attached below it, and answers the master's state request at once with a forged state.
The master is the root of trust: while a process on its own host can answer (one that is
not itself asking), it waits for that process's answer; else it takes the state that the
copies of two child slots agree on, or a lone one after the daemons' ``--timeout``
(``crnet/node/collectives/state_answers.py``).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from crnet import CrnetTimeout
from crnet.protocol.messages import Bcast, WantState, state_key
from crnet.tools.launch import MASTER

from ..helpers.clients import close_all, connect_all
from ..helpers.vectors import gradients
from .test_trust import DIM, SAMPLES, STAR, TIMEOUT, exact, running, step
from .test_trust_keys import insider, job_frame, peers, tree

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_factories=["asyncio"])]

__all__ = ["peers"]    # the fixture

STATE = np.arange(6.0) * 0.25 + 1.0     # the job's state, as the honest processes hold it
FORGED = np.full(6, 666.0)


async def forge_state_answer(spy, after: int = 0) -> int:
    """Read what the master sends the insider until its state request comes; answer it at
    once with ``FORGED`` (as the state after step ``after``). Returns the request's nonce."""
    while True:
        got = await spy.recv(timeout=20)
        assert got is not None, "the master closed the insider's link"
        if isinstance(got[0], WantState):
            nonce = got[0].nonce
            spy.send(Bcast(state_key(nonce), 7, after, 0, FORGED.size, "float64", root="2"),
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
    grads = gradients(41, SAMPLES, DIM)
    want = grads.sum(axis=0)
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)       # slot 2: the tree is whole once it joined
        clients = await connect_all(lt, [MASTER, "0", "1"], starting=True)
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


async def test_with_no_process_on_the_masters_host_that_can_answer_a_forged_answer_sent_first_loses(
        tmp_path, peers):
    """The master's one process asks (so none there can answer); the insider's forged
    answer reaches the master first, the honest processes on 0 and 1 answer 1 s after
    they see the request. Before the fix the asker got [666 ...] (the first answer from
    any host); now it gets the state that slots 0 and 1 agree on, exactly, at once."""
    grads = gradients(41, SAMPLES, DIM)
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)
        clients = await connect_all(lt, [MASTER, "0", "1"], starting=True)
        try:
            spy.send_bytes(job_frame("", 1))     # it speaks for a process of the job
            assert exact(await step(clients, grads, 0), grads.sum(axis=0))   # (answers name it)
            forging = asyncio.ensure_future(forge_state_answer(spy))
            honest = [asyncio.ensure_future(answer_late(clients[n], 1.0)) for n in ("0", "1")]
            state, after = await clients[MASTER].request_state(np.zeros(6), timeout=20)
            await asyncio.wait_for(forging, 5)   # it did answer
            await asyncio.wait_for(asyncio.gather(*honest), 10)
            np.testing.assert_array_equal(state, STATE)
            assert after == 0
            # The honest copy that came second disagreed with the forged one; the third decided.
            assert "disagree: child slots 2 / " in lt.log_path(MASTER).read_text()
        finally:
            close_all(clients)


async def test_a_lone_answer_is_taken_at_once_when_the_other_slot_only_asks(tmp_path):
    """No insider, no process on the master's host: the process on 1 asks, the one on 0
    is the only one that can answer. Slot 1's every process asks, so no second copy can
    come: the master takes the lone one as soon as it is in, not after the window (the
    daemons' ``--timeout``): waiting could not outvote it, and would hold up a job whose
    processes all missed a step but one subtree's."""
    grads = gradients(41, SAMPLES, DIM)
    with running(tmp_path / "tree", STAR, 30, secret=True) as lt:      # every daemon real
        clients = await connect_all(lt, ["0", "1"], starting=True)
        try:
            assert exact(await step(clients, grads, 0), grads.sum(axis=0))   # (the answer names it)
            honest = asyncio.ensure_future(answer_late(clients["0"], 0.0))
            began = asyncio.get_running_loop().time()
            state, after = await clients["1"].request_state(np.zeros(6), timeout=20)
            took = asyncio.get_running_loop().time() - began
            await asyncio.wait_for(honest, 5)
            np.testing.assert_array_equal(state, STATE)
            assert after == 0
            assert took < TIMEOUT * 0.9, f"taken after {took:.2f} s: it waited for the window"
        finally:
            close_all(clients)


async def test_a_forged_answer_that_no_slot_agrees_with_is_not_taken(tmp_path, peers):
    """The insider (slot 2) and the process on 0 answer with different states; the
    master's own process asks, and no other process is attached. No two slots agree:
    the asker times out rather than take either, and the master's log says why. Before
    the fix the asker got the forged state."""
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)
        clients = await connect_all(lt, [MASTER, "0"], starting=True)
        try:
            spy.send_bytes(job_frame("", 1))
            forging = asyncio.ensure_future(forge_state_answer(spy))
            honest = asyncio.ensure_future(answer_late(clients["0"], 0.5))
            with pytest.raises(CrnetTimeout):
                got = await clients[MASTER].request_state(np.zeros(6), timeout=3 * TIMEOUT)
                raise AssertionError(f"the asker was given {got}")
            await asyncio.wait_for(asyncio.gather(forging, honest), 5)
            log = lt.log_path(MASTER).read_text()
            assert "disagree: child slots 2 / 0 sent different states" in log, log
        finally:
            close_all(clients)


async def answer_each(c, steps: list[int]) -> None:
    """An honest process that answers each request it sees, after the next of ``steps``."""
    for after in steps:
        while not c.state_wanted():
            await asyncio.sleep(0.01)
        await c.send_state(STATE, after)


async def test_honest_answers_after_different_steps_are_asked_again_not_given_up(tmp_path):
    """No insider; the master's one process asks. The process on 1 straggled: it answers
    the first request with its state after step 1, the one on 0 after step 0. Their
    answers split, so the master asks once more, and their next answers (both after step
    0) decide. Without asking again, the asker timed out."""
    grads = gradients(41, SAMPLES, DIM)
    with running(tmp_path / "tree", STAR, 30, secret=True) as lt:      # every daemon real
        clients = await connect_all(lt, [MASTER, "0", "1"], starting=True)
        try:
            for t in (0, 1):    # the tree decided both steps the answers name
                assert exact(await step(clients, grads, t), grads.sum(axis=0))
            honest = [asyncio.ensure_future(answer_each(clients["0"], [0, 0])),
                      asyncio.ensure_future(answer_each(clients["1"], [1, 0]))]
            state, after = await clients[MASTER].request_state(np.zeros(6), timeout=3 * TIMEOUT)
            await asyncio.wait_for(asyncio.gather(*honest), 5)
            np.testing.assert_array_equal(state, STATE)
            assert after == 0
            assert "(asking once more)" in lt.log_path(MASTER).read_text()
        finally:
            close_all(clients)


async def test_a_state_answer_from_past_the_trees_step_is_refused_and_no_host_jumps_ahead(
        tmp_path, peers):
    """(issue 54 row 4) The insider answers the state request of the master's process alone,
    as the state after step 10**6. Before the fix the master took the lone answer after
    the window and every other host learned step 10**6 (tree_step 1000000, every later
    step refused). Now the master refuses it (no process can be past the tree's decided
    step): the asker times out, no host's tree_step moves, and the next step is exact."""
    grads = gradients(41, SAMPLES, DIM)
    want = grads.sum(axis=0)
    with tree(tmp_path) as lt:
        spy, _ = await insider(peers, lt)
        clients = await connect_all(lt, [MASTER, "0", "1"], starting=True)
        try:
            spy.send_bytes(job_frame("", 1))
            assert exact(await step(clients, grads, 0), want)
            forging = asyncio.ensure_future(forge_state_answer(spy, after=10**6))
            with pytest.raises(CrnetTimeout):
                got = await clients[MASTER].request_state(np.zeros(6), timeout=3 * TIMEOUT)
                raise AssertionError(f"the asker was given {got}")
            await asyncio.wait_for(forging, 5)
            for name in ("0", "1"):
                assert (await clients[name].stats())["tree_step"] == 0, name
            assert exact(await step(clients, grads, 1), want)
            assert "after step 1000000, but the tree has decided only up to step 0: refused" \
                in lt.log_path(MASTER).read_text()
        finally:
            close_all(clients)


async def test_a_process_that_names_no_job_answers_no_state_of_a_named_job_on_the_masters_host(
        tmp_path):
    """Issue 39 row 14: job 'real' runs, its processes on 0 and 1; a process that names no
    job attaches on the master's host (so it joins 'real') and answers the state request of
    process 0 at once, with its own state. The master's host is the root of trust, so that
    answer won: process 0 got [666 ...]. Now only a process that named the running job
    answers for it there; the one on 1 does (the only slot that can), and 0 gets its state."""
    grads = gradients(41, SAMPLES, DIM)
    with running(tmp_path / "tree", STAR, 30, secret=True) as lt:      # every daemon real
        clients = await connect_all(lt, ["0", "1"], starting=True, job="real")
        try:
            clients.update(await connect_all(lt, [MASTER]))            # no job: it joins 'real'
            assert exact(await step(clients, grads, 0), grads.sum(axis=0))
            stranger = clients[MASTER]

            async def forge() -> None:
                while not stranger.state_wanted():
                    await asyncio.sleep(0.01)
                await stranger.send_state(FORGED, 0)
            forging = asyncio.ensure_future(forge())
            honest = asyncio.ensure_future(answer_late(clients["1"], 1.0))
            state, after = await clients["0"].request_state(np.zeros(6), timeout=20)
            await asyncio.wait_for(asyncio.gather(forging, honest), 10)
            np.testing.assert_array_equal(state, STATE)
            assert after == 0
            assert "left out: it names no job" in lt.log_path(MASTER).read_text()
        finally:
            close_all(clients)
