"""docs/development.md's "Following a chunk" is what happens: a CHUNK that completes a step at the
master, fed as bytes to a real ``Connection``, runs the six documented functions in
the documented order, and neither the scheme nor the decision calls back into a file
before it on the path (the ping-pong between engine and scheme the step core had)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from crnet.coding.plan import Tree
from crnet.node.links import ChildLink, ClientLink, ClientState
from crnet.node.local import LocalProcesses
from crnet.protocol.messages import Chunk, Done, Hello, Joined, Submit
from crnet.protocol.shm import SharedRegion
from crnet.protocol.transport import Connection
from crnet.schemes import Place

from ..helpers import REPO
from ..helpers.fake_links import FakeLink, rooms

pytestmark = pytest.mark.timeout(30)

N = 6                              # float64: one chunk of 48 bytes


def documented_path() -> list[tuple[str, str]]:
    """(file, Class.function) of each numbered step of docs/development.md's "Following a chunk"."""
    text = (REPO / "docs" / "development.md").read_text()
    section = text[text.index("**Following a chunk.**"):]
    section = section[:section.index("\n\n**")]
    return re.findall(r"^\d\. `(crnet/[\w/]+\.py)` — `([\w.]+)`", section, re.M)


def test_the_documented_path_has_at_most_six_files_each_once_and_they_exist():
    path = documented_path()
    files = [f for f, _ in path]
    assert 0 < len(path) <= 6 and len(set(files)) == len(files), path
    for file, function in path:
        cls, _, name = function.rpartition(".")
        source = (REPO / file).read_text()
        assert re.search(rf"^class {cls}\b", source, re.M), (file, cls)
        assert re.search(rf"^    def {name}\(", source, re.M), (file, function)


class FakeTransport:
    """What a Connection uses of an asyncio transport, for bytes fed by hand."""

    def get_extra_info(self, name, default=None):
        return default

    def is_closing(self):
        return False

    def writelines(self, data):
        pass

    def get_write_buffer_size(self):
        return 0


def frame_bytes(msg: Chunk, payload: np.ndarray) -> bytes:
    return b"".join(bytes(part) for part in msg.frame(memoryview(payload).cast("B")))


async def test_a_chunk_at_the_master_takes_the_documented_path(membership):
    m = membership(Place("", 0, Tree((2,), (1,)), "cr", "auto", 64), samples=10)
    r = rooms(m)
    child = ChildLink(m, m.engine, r.broadcasts, r.barriers, r.status)
    conn = Connection(child)
    conn.connection_made(FakeTransport())
    child.received(conn, Hello(), None)
    m.child_hello(FakeLink(), Hello())
    for k in range(2):
        m.child_joined(k, Joined(1))           # assigned: steps run
    local = LocalProcesses(1, m.engine)
    process = ClientLink(local, m, m.engine, m.engine.stats, r.broadcasts, r.barriers)
    region = SharedRegion.create(4096)
    region.close_fd()
    process.conn, process.region, process.index = FakeLink("process"), region, 0
    process.state = ClientState.ATTACHED
    local.seats[0] = process
    process.received(process.conn, Submit(0, N, "float64"), None)   # the master's process waits

    payload = np.arange(1.0, N + 1)
    data = frame_bytes(Chunk(0, 0, N, "float64"), payload)
    calls: list[tuple[str, str, tuple[str, ...]]] = []   # (file, function, files on the stack)

    def profile(frame, event, arg):
        if event != "call":
            return
        file = _relative(frame.f_code.co_filename)
        if file is None:
            return
        stack = []
        up = frame.f_back
        while up is not None:
            below = _relative(up.f_code.co_filename)
            if below is not None:
                stack.append(below)
            up = up.f_back
        calls.append((file, _qualname(frame), tuple(stack)))

    sys.setprofile(profile)
    try:
        at = 0
        while at < len(data):                  # as the event loop hands bytes over
            buf = conn.get_buffer(len(data) - at)
            n = min(len(buf), len(data) - at)
            buf[:n] = data[at:at + n]
            conn.buffer_updated(n)
            at += n
    finally:
        sys.setprofile(None)

    # The chunk decided the step: the process has the result, in its shared memory.
    [done] = process.conn.messages(Done)
    weights = m.engine.scheme.code.decode((0,))
    np.testing.assert_array_equal(region.output(np.float64, N), weights[0] * payload)
    assert done.step == 0 and conn.failure is None

    path = documented_path()
    firsts = []
    for file, function in path:
        found = [i for i, (f, q, _) in enumerate(calls)
                 if f == file and q in (function, function.rpartition(".")[2])]
        assert found, f"{file}:{function} was not called for the chunk"
        firsts.append(found[0])
    assert firsts == sorted(firsts), f"called out of the documented order: {path}"
    # No file on the path is entered from a file after it: the scheme never calls back
    # into the engine, nor the decision into the scheme. (The transport is where every
    # send goes out too: a RESULT to the children is not the read path entered again.)
    order = [f for f, _ in path]
    again = {f"{file}:{function} from {later[0]}" for file, function, stack in calls
             if file in order and file != "crnet/protocol/transport.py"
             for later in [[f for f in stack if f in order and order.index(f) > order.index(file)]]
             if later}
    assert not again, "entered again: " + "; ".join(sorted(again))


def _relative(filename: str) -> str | None:
    try:
        return Path(filename).resolve().relative_to(REPO).as_posix()
    except ValueError:
        return None


def _qualname(frame) -> str:
    code = frame.f_code
    return getattr(code, "co_qualname", code.co_name)   # 3.10: the bare name
