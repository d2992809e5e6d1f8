"""Mutual TLS on the tree's links (crnet/protocol/tls.py): exact steps through it, no entry without
a certificate from the cluster's CA, and a byte changed on the path never reaches a sum."""

import asyncio
import ssl

import pytest

from crnet import CrnetError
from crnet.coding.plan import Tree

from ..helpers.certs import have_openssl
from ..helpers.clients import close_all, connect_all
from ..helpers.vectors import gradients, local_gradient, rel_error
from .path_proxy import PathProxy

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not have_openssl(), reason="needs the openssl command")]

TREE = Tree.regular(2, 2, 1)


async def steps(lt, names, grads, count):
    clients = await connect_all(lt, names)
    outcomes = []
    try:
        for t in range(count):
            got = await asyncio.gather(*(c.allreduce(local_gradient(c.assignment, grads), step=t)
                                         for c in clients.values()), return_exceptions=True)
            outcomes.append(got)
    finally:
        close_all(clients)
    return outcomes


async def test_a_tree_with_tls_and_a_secret_runs_exact_steps(local_tree, certs):
    lt = local_tree(TREE, 14, secret=True, tls=certs)
    grads = gradients(0, 14, 6)
    for outcome in await steps(lt, lt.procs, grads, 3):
        for r in outcome:
            assert rel_error(r, grads.sum(axis=0)) <= 1e-9
    assert "TLS" in lt.log_path("").read_text()


async def test_a_peer_without_a_certificate_gets_no_further_than_tls(local_tree, certs):
    lt = local_tree(Tree.regular(2, 1, 1), 4, tls=certs)
    port = lt.ports[""]
    # Plain TCP: the daemon expects a TLS handshake and hangs up.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"CRNT" + b"\0" * 60)
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    # TLS without a client certificate: refused in the handshake.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        writer.write(b"x" * 100)
        await writer.drain()
        if await asyncio.wait_for(reader.read(), 10) == b"":
            raise ConnectionError("closed")


class BitFlipper(PathProxy):
    """Between node ``victim`` and its parent: passes everything, but changes one byte of
    each child -> parent write after the first ``after`` bytes."""

    def __init__(self, victim: str, after: int = 4000):
        super().__init__(victim)
        self.after = after
        self.flipped = 0

    async def _up(self, reader, writer):
        seen = 0
        while data := await reader.read(65536):
            if seen + len(data) > self.after:
                data = bytearray(data)
                data[-1] ^= 0x01
                self.flipped += 1
            seen += len(data)
            writer.write(bytes(data))
            await writer.drain()


async def test_a_byte_changed_on_the_path_never_reaches_a_sum(local_tree, certs):
    """s = 0 under the master: it needs node 1's chunks. Without TLS a changed byte would
    enter the decode; with it the master drops the link: steps fail or are exact."""
    flipper = await BitFlipper("1").start()
    try:
        lt = local_tree(Tree((2,), (0,)), 4, secret=True, tls=certs, spawn=flipper.spawn,
                        timeout=3)
        grads = gradients(1, 4, 2000)
        outcomes = await steps(lt, ["0", "1"], grads, 4)
    finally:
        await flipper.close()
    assert flipper.flipped > 0
    for outcome in outcomes:
        for r in outcome:
            assert isinstance(r, CrnetError) or rel_error(r, grads.sum(axis=0)) <= 1e-9
    assert any(isinstance(r, CrnetError) for o in outcomes for r in o)   # the link was cut
