"""rar: a link that claims to be a ring member's predecessor counts only once the
predecessor confirms it (``crnet/node/peers/mesh.py``, ``crnet/node/peers/check.py``).

Real crnetd processes on 127.0.0.1 with a cluster secret. A secret holder dials ring
member 1 claiming rank 0, its predecessor: the handshake proves the secret, not the rank.
Member 1 does not dial its predecessor for the ring, so it dials the address the master
gave for rank 0 to ask whether the link's random id is rank 0's own; until rank 0 says
so, nothing on the link counts, and a link rank 0 disowns is closed.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.protocol.messages import PeerConfirmed
from crnet.schemes.ring_allreduce.messages import Phase, Segment
from crnet.tools.launch import MASTER

from ..helpers.clients import close_all, connect_all
from ..helpers.vectors import gradients
from .test_trust import exact, running, step
from .test_trust_fuzzed import as_peer

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_factories=["asyncio"])]

RING = Tree((3,), (0,))   # rar: the ring 0 -> 1 -> 2 -> master -> 0 (ranks 0..3)
DIM = 8                   # 4 segments of 2 (one part each)


async def frames_until_closed(peer, timeout: float) -> list | None:
    """The types of the messages the daemon sends ``peer`` until it closes the link (None:
    it did not within ``timeout``)."""
    kinds, deadline = [], time.monotonic() + timeout
    try:
        while (got := await peer.recv(max(0.01, deadline - time.monotonic()))) is not None:
            kinds.append(type(got[0]))
    except asyncio.TimeoutError:
        return None
    return kinds


async def test_a_link_that_claims_the_ring_predecessor_counts_only_once_it_confirms_it(tmp_path):
    """Ring member 1 takes a secret holder's link claiming rank 0. Before the fix it was
    confirmed at once (PEER_CONFIRMED) and its forged reduce-scatter segments (10^6) were
    taken as rank 0's: steps 1 and 2 failed for every process ("node 1 did not get the
    ring's segments"). Now the link sends them before it is confirmed: it is closed, and
    steps 1 and 2 are exact. A second such link that sends
    nothing is disowned by rank 0 (asked over member 1's own link to rank 0's address) and
    closed, with a line that says so; the ring goes on (step 3)."""
    grads = gradients(51, 12, DIM)
    want = grads.sum(axis=0)
    with running(tmp_path / "tree", RING, 12, scheme="rar", secret=True) as lt:
        clients = await connect_all(lt, [MASTER, "0", "1", "2"], starting=True)
        try:
            assert exact(await step(clients, grads, 0), want)
            forger = await as_peer(lt, "1", 0)
            for t in (1, 2):
                for rnd in range(3):    # what rank 0 sends in reduce-scatter round rnd
                    segment = Segment(t, Phase.REDUCE, rnd, -rnd % 4, DIM, "float64")
                    forger.send(segment, np.full(2, 1e6))
            forged = await frames_until_closed(forger, 10)
            outcomes = [await step(clients, grads, t) for t in (1, 2)]
            claim = await as_peer(lt, "1", 0)
            disowned = await frames_until_closed(claim, 10)
            last = await step(clients, grads, 3)
        finally:
            close_all(clients)
        log = lt.log_path("1").read_text()
    assert all(exact(o, want) for o in outcomes), outcomes
    assert forged is not None, "the forged predecessor's link was kept"
    assert PeerConfirmed not in forged, "a link that claims rank 0 was confirmed without rank 0"
    assert disowned is not None and PeerConfirmed not in disowned, disowned
    assert "says it is rank 0, which did not confirm it (it says that is not its link): closed" in log
    assert exact(last, want), last
