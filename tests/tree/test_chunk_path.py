"""docs/development.md's "Following a chunk" is the path a debugger steps through: a CHUNK from
a real leaf crnetd over real TCP completes a step at a master crnetd (in this process, so
that its calls can be recorded), from the accepted connection's read (the admission guard
included, as every accepted connection has it) to the result in the waiting training
process's shared memory. The documented files are exactly the crnet files the master
enters for it, in the order it first enters them; the number of moves between files is
the one the docs state."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from crnet.client import AsyncClient
from crnet.coding.plan import Tree
from crnet.node import Node, Settings
from crnet.protocol.transport import Connection
from crnet.tools.launch import MASTER, LocalTree

from ..helpers import REPO

pytestmark = pytest.mark.timeout(90)

ROOT = REPO
N = 6                              # float64: one chunk of 48 bytes


def documented_path() -> tuple[list[str], int]:
    """The files of docs/development.md's "Following a chunk", in order, and the moves it states."""
    text = (ROOT / "docs" / "development.md").read_text()
    section = text[text.index("**Following a chunk.**"):]
    section = section[:section.index("\n\n**", 1)]
    files = re.findall(r"^\s*\d+\. `(crnet/[\w/]+\.py)`", section, re.M)
    moves = re.search(r"(\d+) moves", section)
    return files, int(moves.group(1)) if moves else -1


def record_path(calls: list[tuple[str | None, str]]) -> tuple[list[str], int]:
    """The files in the order first entered, and the moves: the calls from one crnet file
    into another (as a debugger steps in; the returns are not counted)."""
    first = list(dict.fromkeys(file for _, file in calls))
    moves = sum(1 for caller, file in calls if caller is not None and caller != file)
    return first, moves


async def test_a_chunk_at_the_master_takes_the_documented_path(tmp_path, monkeypatch):
    tree = Tree((2,), (1,))                 # cr: s = 1, either leaf's chunk decodes the step
    lt = LocalTree(tree, samples=4, workdir=tmp_path, strict=True)
    node = Node(Settings.of("master", tree=tree, samples=4, scheme="cr",
                            listen=("127.0.0.1", lt.ports[MASTER]),
                            client_socket=lt.socket_path(MASTER), strict=True))
    calls: list[tuple[str | None, str]] = []   # (the calling crnet file, the one called)
    recording = False
    original = Connection.buffer_updated

    def profile(frame, event, arg):
        if event == "call":
            file = _relative(frame.f_code.co_filename)
            if file is not None:
                caller = frame.f_back
                while caller is not None and _relative(caller.f_code.co_filename) is None:
                    caller = caller.f_back     # (through the stdlib, numpy, the loop)
                calls.append((_relative(caller.f_code.co_filename) if caller else None, file))

    def traced(conn: Connection, nbytes: int) -> None:
        if not recording or conn not in accepted:
            return original(conn, nbytes)
        sys.setprofile(profile)
        try:
            return original(conn, nbytes)
        finally:
            sys.setprofile(None)

    accepted: set[Connection] = set()
    made = Connection.connection_made

    def remember(conn: Connection, transport) -> None:
        if transport.get_extra_info("sockname") == ("127.0.0.1", lt.ports[MASTER]):
            accepted.add(conn)       # a connection the master's listener accepted
        made(conn, transport)

    monkeypatch.setattr(Connection, "buffer_updated", traced)
    monkeypatch.setattr(Connection, "connection_made", remember)
    await node.start()
    clients = []
    try:
        leaves = [n for n in tree.names() if n != MASTER]
        for name in leaves:
            lt.start_node(name)
        await asyncio.to_thread(lt.wait_sockets, leaves, 30.0)
        for name in [MASTER, *leaves]:
            clients.append(await AsyncClient.connect(lt.socket_path(name), timeout=30))
        master, leaf = clients[0], clients[1]
        vector = np.arange(1.0, N + 1)
        waiting = asyncio.ensure_future(master.result(0, like=np.zeros(N)))
        await asyncio.sleep(0.2)            # the master's process waits on step 0
        recording = True
        got = await asyncio.wait_for(leaf.allreduce(vector, step=0), 30)
        result = await asyncio.wait_for(waiting, 30)
        recording = False
    finally:
        for c in clients:
            c.close()
        await node.shutdown()
        lt.stop()
    # The step's result is the decode from leaf 0 alone (s = 1): exact, and the same for
    # the leaf and for the master's process, in whose shared memory it landed.
    assert node.engine.scheme is not None and node.engine.scheme.code is not None
    weights = node.engine.scheme.code.decode((0,))
    np.testing.assert_array_equal(result, weights[0] * vector)
    np.testing.assert_array_equal(got, result)
    files, moves = record_path(calls)
    documented, stated = documented_path()
    print(f"\nthe chunk's path: {len(files)} files, {moves} moves", *files, sep="\n  ")
    assert files == documented, f"the real path ({len(files)} files):\n  " + "\n  ".join(files)
    assert moves == stated, f"the real path takes {moves} moves between files; the docs say {stated}"


def _relative(filename: str) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    return rel if rel.startswith("crnet/") else None
