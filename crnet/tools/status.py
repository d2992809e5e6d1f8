"""``crnet status HOST:PORT``: ask a node (the master, or any node's --listen) for its subtree.

The connection is authenticated like every tree link (``crnet.protocol.auth``; the role
"status" is bound into the handshake): with the cluster's ``--secret-file`` and, if
the tree uses TLS, its certificate files. The node answers at once with its subtree
(``crnet/node/observe/status.py``); ``refresh`` asks again on the same connection (``--watch``).
This module gets and summarises the answer; the CLI only prints it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..errors import CrnetError, JoinRefused, ProtocolError
from ..protocol.handshake import Dialing
from ..protocol.messages import Refuse, StatusHello, StatusReply, StatusRequest
from ..protocol.status_tree import DEADLINE
from ..protocol.tls import TlsFiles, contexts
from ..protocol.transport import Connection

__all__ = ["Row", "StatusClient", "missing", "rows"]


class _Answers:
    """The status connection's handler: STATUS_REPLYs into a queue."""

    def __init__(self) -> None:
        self.replies: asyncio.Queue[StatusReply | Exception] = asyncio.Queue()

    def payload_dest(self, conn, msg, nbytes):
        raise ProtocolError(f"unexpected {msg.TYPE.name} with a payload")

    def received(self, conn, msg, payload):
        if isinstance(msg, StatusReply):
            self.replies.put_nowait(msg)
        elif isinstance(msg, Refuse):
            self.replies.put_nowait(JoinRefused(msg.reason))
        else:
            self.reject(conn, f"unexpected {msg.TYPE.name}")

    def reject(self, conn: Connection, reason: str) -> None:
        self.replies.put_nowait(CrnetError(reason))
        conn.close()

    def lost(self, conn, exc):
        if conn.aborted is not None:     # its answer was no good (a ProtocolError): why
            self.replies.put_nowait(CrnetError(conn.aborted))
        else:
            self.replies.put_nowait(ConnectionError(f"{conn.label} closed the connection"))


class StatusClient:
    """One authenticated connection to a node's --listen, for its subtree's state."""

    def __init__(self, conn: Connection, answers: _Answers, timeout: float):
        self._conn, self._answers, self._timeout = conn, answers, timeout
        self._ids = 0
        self.first: dict | None = None

    @classmethod
    async def connect(cls, host: str, port: int, secret: bytes | None = None,
                      tls: TlsFiles | None = None, timeout: float = DEADLINE + 5) -> StatusClient:
        """Connect and take the node's first answer (``first``)."""
        answers = _Answers()
        guard = Dialing(answers, secret)
        loop = asyncio.get_running_loop()
        ssl = None if tls is None else contexts(tls)[1]
        _, conn = await asyncio.wait_for(loop.create_connection(
            lambda: Connection(guard, label=f"{host}:{port}"), host, port, ssl=ssl), timeout)
        conn.send(guard.hello(StatusHello()))
        client = cls(conn, answers, timeout)
        client.first = await client._reply(0)
        return client

    async def refresh(self, deadline: float = DEADLINE, measured: int = 0, probe: int = 0) -> dict:
        """The subtree again (with every node's measured section, its windows cut to the
        newest ``measured`` steps, unless that is 0; each node's links and compute probed
        first with ``probe`` bytes, unless that is 0: ``crnet tune --probe``)."""
        self._ids += 1
        self._conn.send(StatusRequest(self._ids, deadline, measured, probe))
        return await self._reply(self._ids)

    async def _reply(self, wanted: int) -> dict:
        while True:
            got = await asyncio.wait_for(self._answers.replies.get(), self._timeout)
            if isinstance(got, JoinRefused):
                raise CrnetError(f"the node refused: {got.reason}")
            if isinstance(got, Exception):
                raise got
            if got.id == wanted:
                return got.node

    def close(self) -> None:
        self._conn.close()


@dataclass(frozen=True)
class Row:
    """One node of the tree, for a table."""

    name: str            # "master" for the root
    depth: int
    host: str | None
    address: str | None
    state: str
    tree_step: int
    last_step_seconds: float | None
    straggled: int | None      # of ``recent`` steps its parent decoded without it
    recent: int | None


def rows(entry: dict, depth: int = 0) -> list[Row]:
    """The tree, depth first, parents before their children."""
    out = [Row(entry["name"] or "master", depth, entry["host"], entry["address"], entry["state"],
               entry["tree_step"], entry["last_step_seconds"], entry["straggled"],
               entry["recent"])]
    for child in entry["children"]:
        out += rows(child, depth + 1)
    return out


def missing(entry: dict) -> list[Row]:
    """The nodes missing now (an empty slot: the host is down, or cut off from its parent)."""
    return [r for r in rows(entry) if r.state == "missing"]
