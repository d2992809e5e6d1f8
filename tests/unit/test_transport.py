"""Connection over real sockets: typed messages in, payloads straight into the handler's
memory, a bad frame closes one connection, a broken handler is reported to the loop."""

import asyncio
import contextlib
import errno
import logging
import socket

import numpy as np
import pytest

from crnet import defaults
from crnet.protocol import transport
from crnet.protocol.messages import Chunk, Fail, Hello, Joined, Result
from crnet.protocol.pacing import FOLLOW_MAX
from crnet.protocol.transport import LOWAT_MAX, PACED_SEGMENTS, Connection
from crnet.protocol.wire import PREFIX, VERSION, MsgType, encode
from crnet.schemes.ring_allreduce.messages import Phase, Segment

pytestmark = pytest.mark.timeout(30)


class Peer:
    """A test Handler: every message goes to ``inbox``; ``dest(msg, nbytes)`` says where a
    payload lands (None: drop it). It remembers the views it handed out."""

    def __init__(self, dest=None):
        self.dest = dest
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.views = []
        self.lost_with = []

    def payload_dest(self, conn, msg, nbytes):
        view = None if self.dest is None else self.dest(msg, nbytes)
        self.views.append(view)
        return view

    def received(self, conn, msg, payload):
        self.inbox.put_nowait((msg, payload))

    def lost(self, conn, exc):
        self.lost_with.append(exc)

    async def next(self):
        return await asyncio.wait_for(self.inbox.get(), 10)


async def connect(handler, sock, label, cls=Connection):
    _, conn = await asyncio.get_running_loop().connect_accepted_socket(
        lambda: cls(handler, label=label), sock)
    return conn


async def pair(a_handler, b_handler):
    """Two Connections joined by a socketpair."""
    sa, sb = socket.socketpair()
    return await connect(a_handler, sa, "a"), await connect(b_handler, sb, "b")


async def close(*conns):
    for conn in conns:
        conn.close()
    await asyncio.gather(*(conn.closed for conn in conns))


@contextlib.contextmanager
def loop_errors():
    """Collect what reaches the running loop's exception handler; restore it afterwards."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    contexts = []
    loop.set_exception_handler(lambda loop, context: contexts.append(context))
    try:
        yield contexts
    finally:
        loop.set_exception_handler(previous)


def into(array):
    """A dest for CHUNKs: the bytes of ``array``."""
    return lambda msg, nbytes: memoryview(array).cast("B")


async def test_messages_arrive_typed():
    a, b = await pair(Peer(), peer := Peer())
    try:
        assert a.send(Hello("0.1", "10.0.0.2:7000"))
        assert a.send(Joined(3))
        assert await peer.next() == (Hello("0.1", "10.0.0.2:7000"), None)
        assert await peer.next() == (Joined(3), None)
    finally:
        await close(a, b)


@pytest.mark.parametrize("count", [100, 1 << 19], ids=["within-scratch", "4-MiB"])
async def test_a_payload_lands_in_the_handlers_own_array(count):
    buffer = np.zeros(count + 20)
    window = buffer[10:10 + count]     # the handler's destination: a view inside its array
    a, b = await pair(Peer(), peer := Peer(into(window)))
    try:
        sent = np.arange(count, dtype=np.float64)
        a.send(Chunk(4, 0, count, "float64"), sent)
        msg, payload = await peer.next()
        assert msg == Chunk(4, 0, count, "float64")
        assert payload is peer.views[0]
        assert np.shares_memory(np.frombuffer(payload, np.float64), window)
        np.testing.assert_array_equal(window, sent)
        assert not buffer[:10].any() and not buffer[10 + count:].any()
    finally:
        await close(a, b)


async def test_consecutive_payloads_each_land_in_their_own_destination():
    rows = np.zeros((3, 1000), np.float32)
    a, b = await pair(Peer(), peer := Peer(lambda msg, n: memoryview(rows[msg.chunk]).cast("B")))
    try:
        for c in (2, 0, 1):
            a.send(Result(1, c, 3000, "float32"), np.full(1000, c + 1, np.float32))
        for _ in range(3):
            await peer.next()
        np.testing.assert_array_equal(rows[:, 0], [1, 2, 3])
        np.testing.assert_array_equal(rows.min(axis=1), rows.max(axis=1))
    finally:
        await close(a, b)


async def test_a_payload_the_handler_drops_is_never_received():
    a, b = await pair(Peer(), peer := Peer(dest=lambda msg, nbytes: None))
    try:
        a.send(Chunk(4, 0, 70_000, "float64"), np.ones(70_000))   # more than the scratch buffer
        a.send(Fail(4, "after the chunk"))
        assert await peer.next() == (Fail(4, "after the chunk"), None)
        assert peer.views == [None]    # it was asked, said None, and was not called back
        assert peer.inbox.empty()
    finally:
        await close(a, b)


def bad_magic():
    return [b"HTTP/1.1 200 OK\r\n\r\n"]


def bad_field():
    return encode(MsgType.JOINED, {"workers": "three"})


def out_of_range_step():
    return encode(MsgType.CHUNK, {"step": -1, "chunk": 0, "total": 1, "dtype": "float32"}, b"1234")


def bad_version():
    header = b"\x80"
    return [PREFIX.pack(b"CRNT", VERSION + 1, MsgType.HELLO, len(header), 0) + header]


@pytest.mark.parametrize("frame, problem", [
    (bad_magic, "bad magic b'HTTP'"),
    (bad_version, f"protocol version {VERSION + 1}"),
    (bad_field, "JOINED: field 'workers' must be an integer"),
    (out_of_range_step, "CHUNK: field 'step' must be an integer"),
], ids=["bad-magic", "bad-version", "bad-field", "negative-step"])
async def test_a_malformed_frame_closes_only_its_connection(caplog, frame, problem):
    sick, sick_peer = await pair(Peer(), sick_handler := Peer())
    well, well_peer = await pair(Peer(), well_handler := Peer())
    with loop_errors() as errors, caplog.at_level(logging.WARNING, logger="crnet.protocol.transport"):
        try:
            sick.write(frame())
            assert await asyncio.wait_for(sick_peer.closed, 10) is None
            assert await asyncio.wait_for(sick.closed, 10) is None   # the sender sees it close
            well.send(Joined(2))
            assert await well_handler.next() == (Joined(2), None)
            assert not well_peer.is_closing
        finally:
            await close(sick, well, well_peer)
    assert sick_handler.lost_with == [None] and sick_handler.inbox.empty()
    [closing] = [m for m in caplog.messages if "closing connection" in m]
    assert closing.startswith(f"b: closing connection: protocol error: {problem}")
    assert errors == []    # a peer's mistake is not a bug here


class Broken(Peer):
    """A handler with a bug in one of its callbacks."""

    def __init__(self, where, error):
        super().__init__(into(np.zeros(4, np.float32)))
        self.where, self.error = where, error

    def payload_dest(self, conn, msg, nbytes):
        if self.where == "payload_dest":
            raise self.error
        return super().payload_dest(conn, msg, nbytes)

    def received(self, conn, msg, payload):
        if self.where == "received":
            raise self.error
        super().received(conn, msg, payload)


@pytest.mark.parametrize("where", ["payload_dest", "received"])
async def test_a_handler_bug_aborts_the_connection_and_reaches_the_loop(caplog, where):
    error = KeyError("no such step")
    a, b = await pair(Peer(), Broken(where, error))
    with loop_errors() as errors, caplog.at_level(logging.WARNING, logger="crnet.protocol.transport"):
        try:
            a.send(Chunk(0, 0, 4, "float32"), np.ones(4, np.float32))
            assert await asyncio.wait_for(b.closed, 10) is None
        finally:
            await close(a, b)
    assert len(errors) == 1
    assert errors[0]["exception"] is error
    assert errors[0]["message"] == "b: error handling a frame"
    assert errors[0]["protocol"] is b
    assert "b: closing connection: internal error: KeyError: 'no such step'" in caplog.messages


async def test_a_bug_in_the_lost_handler_reaches_the_loop():
    class LostBadly(Peer):
        def lost(self, conn, exc):
            raise RuntimeError("cleanup failed")

    a, b = await pair(Peer(), LostBadly())
    with loop_errors() as errors:
        await close(a, b)
    [context] = errors
    assert context["message"] == "b: error in the connection-lost handler"
    assert str(context["exception"]) == "cleanup failed"


async def test_closing_resolves_closed_and_stops_sending():
    a, b = await pair(Peer(), peer := Peer())
    a.close()
    assert a.is_closing
    assert a.send(Joined(1)) is False
    assert a.write(Joined(1).frame()) is False
    assert await asyncio.wait_for(a.closed, 10) is None
    assert await asyncio.wait_for(b.closed, 10) is None    # the peer's side closes on EOF
    assert peer.lost_with == [None]
    assert b.send(Joined(1)) is False


async def test_a_connection_lost_mid_frame_is_logged(caplog):
    a, b = await pair(Peer(), Peer(into(np.zeros(1000))))
    with caplog.at_level(logging.WARNING, logger="crnet.protocol.transport"):
        frame = Chunk(0, 0, 1000, "float64").frame(np.ones(1000))
        a.write([frame[0], frame[1][:100]])    # the header and a piece of the payload
        a.close()
        await asyncio.wait_for(b.closed, 10)
    assert "b: connection closed mid-frame" in caplog.messages


class Flagged(Connection):
    """A Connection that also signals pause/resume, so the test can wait for them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.paused = asyncio.Event()

    def pause_writing(self):
        super().pause_writing()
        self.paused.set()


async def test_writing_paused_follows_the_transport_buffer():
    loop = asyncio.get_running_loop()
    near, far = socket.socketpair()
    far.setblocking(False)
    conn = await connect(Peer(), near, "writer", Flagged)
    try:
        conn.transport.set_write_buffer_limits(high=1 << 16)
        assert conn.writing_paused is False
        payload = np.zeros(1 << 15)    # 256 KiB a frame; nobody reads ``far`` yet
        for _ in range(256):
            conn.send(Segment(0, Phase.REDUCE, 0, 0, payload.size, "float64"), payload)
            if conn.writing_paused:
                break
        await asyncio.wait_for(conn.paused.wait(), 10)
        assert conn.writing_paused is True
        assert conn.write_buffer_size > 1 << 16
        while conn.writing_paused:     # read until the transport resumes us
            assert await asyncio.wait_for(loop.sock_recv(far, 1 << 20), 10)
        assert conn.write_buffer_size <= 1 << 16
    finally:
        far.close()
        await close(conn)


async def test_a_tcp_connection_is_labelled_by_its_peer_and_sends_at_once():
    loop = asyncio.get_running_loop()
    accepted = loop.create_future()
    server = await loop.create_server(
        lambda: _resolve(accepted, Connection(Peer())), "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        _, client = await loop.create_connection(lambda: Connection(Peer()), "127.0.0.1", port)
        conn = await asyncio.wait_for(accepted, 10)
        assert client.label == f"127.0.0.1:{port}"
        assert conn.label.startswith("127.0.0.1:")
        for c in (client, conn):
            sock = c.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            # A silent link is dropped within LINK_TIMEOUT, sending or idle (not after
            # TCP's own retries of up to minutes): a healed partition is used again soon.
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
            if hasattr(socket, "TCP_USER_TIMEOUT"):
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == \
                    int(defaults.LINK_TIMEOUT * 1000)
                idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
                probes = (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
                          * sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT))
                assert idle + probes <= defaults.LINK_TIMEOUT
        await close(client, conn)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connection_made_when_descriptors_run_out_still_carries_frames(monkeypatch, caplog):
    """(issue 39 row 6) The duplicate descriptor for the receive mark is a luxury: with none
    left (EMFILE) the link goes on without it, warned of, not an internal error."""
    def no_descriptor(fd):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(transport.os, "dup", no_descriptor)
    loop = asyncio.get_running_loop()
    accepted = loop.create_future()
    peer = Peer(into(np.zeros(1 << 16, np.float32)))
    server = await loop.create_server(lambda: _resolve(accepted, Connection(peer)),
                                      "127.0.0.1", 0)
    try:
        _, client = await loop.create_connection(lambda: Connection(Peer()), "127.0.0.1",
                                                 server.sockets[0].getsockname()[1])
        conn = await asyncio.wait_for(accepted, 10)
        sent = np.arange(1 << 16, dtype=np.float32)
        client.write(list(encode(MsgType.CHUNK, {"step": 0, "chunk": 0, "total": 1 << 16,
                                                 "dtype": "float32"}, sent)))
        msg, _ = await peer.next()
        assert isinstance(msg, Chunk) and conn.failure is None and not conn.is_closing
        assert conn.heard == conn.bytes_in > 0
        assert "no receive low-water mark (Too many open files)" in caplog.text
        await close(client, conn)
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("when", ["closing", "closed"])
async def test_pacing_a_link_that_is_closing_or_gone_does_nothing(when):
    """A peer link can go down between a send being queued in turn and its turn: pacing it
    then is a no-op (its socket's descriptor may already be -1), not a crash of the node."""
    loop = asyncio.get_running_loop()
    accepted = loop.create_future()
    server = await loop.create_server(
        lambda: _resolve(accepted, Connection(Peer())), "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        _, client = await loop.create_connection(lambda: Connection(Peer()), "127.0.0.1", port)
        conn = await asyncio.wait_for(accepted, 10)
        client.close()
        if when == "closed":
            await asyncio.wait_for(client.closed, 10)
        client.pace(1 << 15)
        assert client.write(Joined(1).frame()) is False
        await close(client, conn)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_paced_link_drains_and_its_send_buffer_follows_the_link():
    """A paced link (spread's peer links) starts at its floor (``unsent``, or four segments)
    and, each time it drains, follows the link as TCP measured it (``pacing.send_buffer``):
    never below the floor, never past FOLLOW_MAX, the kernel's SO_SNDBUF as set (Linux
    doubles what it is given). Every byte arrives, in order."""
    loop = asyncio.get_running_loop()
    accepted = loop.create_future()
    vector = np.zeros(1 << 20, np.float32)
    peer = Peer(into(vector))
    server = await loop.create_server(lambda: _resolve(accepted, Connection(peer)),
                                      "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        _, client = await loop.create_connection(lambda: Connection(Peer()), "127.0.0.1", port)
        conn = await asyncio.wait_for(accepted, 10)
        client.pace(1 << 15)
        sock = client.transport.get_extra_info("socket")
        mss = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
        floor = max(1 << 15, PACED_SEGMENTS * mss)
        assert client.send_buffer == floor
        drains = []
        client.on_drained = lambda: drains.append(client.send_buffer)
        sent = np.arange(1 << 20, dtype=np.float32)
        for step in range(8):
            sent[0] = step
            client.write(Chunk(step, 0, sent.size, "float32").frame(sent))
            msg, _ = await peer.next()
            assert msg.step == step and np.array_equal(vector, sent)
        assert drains, "a 4 MiB frame over a paced link never waited for the kernel"
        assert all(floor <= size <= FOLLOW_MAX for size in drains), drains
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * client.send_buffer
        await close(client, conn)
    finally:
        server.close()
        await server.wait_closed()


def _resolve(future, conn):
    future.set_result(conn)
    return conn


@pytest.mark.parametrize("count", [1 << 14, 1 << 18], ids=["64-KiB", "1-MiB"])
async def test_a_payload_trickling_in_wakes_the_reader_once_and_never_stalls_it(count):
    """While a payload is under way the socket's receive low-water mark is the rest of it
    (at most LOWAT_MAX): the bytes that trickle in do not wake the loop one by one, the
    last ones still do, and the frame after it (a small one) is not held back."""
    loop = asyncio.get_running_loop()
    accepted = loop.create_future()
    vector = np.zeros(count, np.float32)
    peer = Peer(into(vector))
    server = await loop.create_server(lambda: _resolve(accepted, Connection(peer)),
                                      "127.0.0.1", 0)
    sender = socket.create_connection(server.sockets[0].getsockname()[:2])
    try:
        conn = await asyncio.wait_for(accepted, 10)
        sock = conn.transport.get_extra_info("socket")
        sent = np.arange(count, dtype=np.float32)
        head, payload = encode(MsgType.CHUNK, {"step": 0, "chunk": 0, "total": count,
                                               "dtype": "float32"}, sent)
        data = bytes(head) + bytes(payload)
        marks = []
        cut = len(head) + 20000
        for i, piece in enumerate((data[:cut], data[cut:-1000], data[-1000:])):   # 3 parts
            sender.sendall(piece)
            await asyncio.sleep(0.05)
            marks.append(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
            if i == 1:   # every byte in is heard (what liveness counts), read or not
                assert conn.heard == len(data) - 1000
                if count == 1 << 14:   # held below the mark, unread (the kernel may cap a
                    assert conn.bytes_in < conn.heard   # larger mark at half its buffer)
        msg, _ = await peer.next()
        assert isinstance(msg, Chunk) and np.array_equal(vector, sent)
        expect_rest = len(payload) - 20000
        assert marks[0] == min(expect_rest, LOWAT_MAX)     # waiting for the rest at once
        assert marks[-1] == 1                               # between frames: any byte wakes it
        sender.sendall(b"".join(bytes(p) for p in Fail(0, "x").frame()))
        msg, _ = await peer.next()                          # a small frame is not held back
        assert isinstance(msg, Fail)
        conn.close()
    finally:
        sender.close()
        server.close()
        await server.wait_closed()
