"""Frame encoding and the incremental reader: any split of the byte stream, limits, bad input."""

import struct

import msgpack
import numpy as np
import pytest

from crnet.errors import ProtocolError
from crnet.protocol import wire
from crnet.protocol.wire import PREFIX, VERSION, FrameReader, Limits, MsgType, PyFrameReader, encode


@pytest.fixture(params=["compiled", "reference"], autouse=True)
def reader_kind(request, monkeypatch):
    """Every test runs against the compiled reader (crnet/protocol/_frames.pyx) and the Python one."""
    if request.param == "reference":
        monkeypatch.setattr(wire, "FrameReader", PyFrameReader)
        monkeypatch.setitem(globals(), "FrameReader", PyFrameReader)
    else:
        assert wire._frames is not None, "the compiled frame reader is not built"
    return request.param


class Sink:
    """Collects frames; sends CHUNK payloads into a preallocated array, drops FAIL payloads."""

    def __init__(self, dest_bytes=0):
        self.frames = []
        self.dest = np.zeros(dest_bytes, dtype=np.uint8)

    def on_header(self, msg_type, header, nbytes):
        if msg_type == MsgType.CHUNK:
            return memoryview(self.dest)[header["offset"]:header["offset"] + nbytes]
        if msg_type == MsgType.FAIL:
            return None
        return memoryview(bytearray(nbytes))

    def on_frame(self, msg_type, header, payload):
        self.frames.append((msg_type, header, None if payload is None else bytes(payload)))


def feed(reader, data, step):
    """Push ``data`` through get_buffer/buffer_updated in pieces of at most ``step`` bytes."""
    pos = 0
    while pos < len(data):
        buf = reader.get_buffer(-1)
        assert len(buf) > 0, "get_buffer must never return an empty buffer"
        n = min(len(buf), step, len(data) - pos)
        buf[:n] = data[pos:pos + n]
        reader.buffer_updated(n)
        pos += n


def stream():
    payload = np.arange(1000, dtype=np.float32)
    frames = [
        encode(MsgType.HELLO, {"version": 1, "role": "node", "name": None}),
        encode(MsgType.CHUNK, {"step": 3, "offset": 0}, payload),
        encode(MsgType.FAIL, {"step": 3}, b"dropped bytes"),
        encode(MsgType.ASSIGN, {}, b"x" * 70000),  # payload larger than the scratch buffer
        encode(MsgType.CHUNK, {"step": 4, "offset": 4000}, payload[:10]),
    ]
    return b"".join(bytes(part) for frame in frames for part in frame), payload


@pytest.mark.parametrize("step", [1, 7, 18, 19, 4096, 1 << 20])
def test_reader_reassembles_any_split(step):
    data, payload = stream()
    sink = Sink(dest_bytes=payload.nbytes + 40)
    reader = FrameReader(sink.on_header, sink.on_frame)
    feed(reader, data, step)
    assert reader.idle
    types = [t for t, _, _ in sink.frames]
    assert types == [MsgType.HELLO, MsgType.CHUNK, MsgType.ASSIGN, MsgType.CHUNK]
    assert sink.frames[0][1] == {"version": 1, "role": "node", "name": None}
    assert sink.frames[2][2] == b"x" * 70000
    # The chunk payloads landed in the destination array itself.
    got = sink.dest.view(np.float32)
    np.testing.assert_array_equal(got[:1000], payload)
    np.testing.assert_array_equal(got[1000:], payload[:10])


def test_encode_does_not_copy_payload():
    arr = np.ones(10, dtype=np.float64)
    parts = encode(MsgType.RESULT, {"step": 1}, arr)
    assert isinstance(parts[1], memoryview) and parts[1].obj is arr
    magic, _, msg_type, _, plen = PREFIX.unpack_from(parts[0])
    assert (magic, msg_type, plen) == (b"CRNT", MsgType.RESULT, 80)


def raw(magic=b"CRNT", version=VERSION, msg_type=1, header=b"\x80", plen=0):
    return PREFIX.pack(magic, version, msg_type, len(header), plen) + header


@pytest.mark.parametrize(
    "data, match",
    [
        (raw(magic=b"HTTP"), "bad magic"),
        (raw(version=9), "protocol version 9"),
        (raw(msg_type=99), "unknown message type 99"),
        (PREFIX.pack(b"CRNT", VERSION, 1, 1 << 30, 0), "header of 1073741824 bytes exceeds"),
        (PREFIX.pack(b"CRNT", VERSION, 6, 2, 1 << 40), "payload of 1099511627776 bytes exceeds"),
        (raw(header=b"\xc1\xc1"), "undecodable HELLO header"),
        (raw(header=msgpack.packb([1, 2])), "not a map"),
        (raw(header=msgpack.packb({"s": "x" * 100})), "undecodable"),
    ],
)
def test_bad_frames_raise_protocol_error(data, match):
    sink = Sink()
    reader = FrameReader(sink.on_header, sink.on_frame, Limits(max_str=50))
    with pytest.raises(ProtocolError, match=match):
        feed(reader, data, 1 << 20)
    assert sink.frames == []


def test_truncated_frame_is_not_delivered():
    data, payload = stream()
    sink = Sink(dest_bytes=payload.nbytes + 40)
    reader = FrameReader(sink.on_header, sink.on_frame)
    feed(reader, data[: len(data) - 5], 1000)
    assert not reader.idle
    assert len(sink.frames) == 3  # the last chunk is incomplete


def test_oversized_header_within_limit_grows_scratch():
    header = {"blob": "y" * 100_000}
    data = b"".join(bytes(p) for p in encode(MsgType.WELCOME, header))
    sink = Sink()
    reader = FrameReader(sink.on_header, sink.on_frame, Limits(max_str=1 << 20))
    feed(reader, data, 3000)
    assert sink.frames == [(MsgType.WELCOME, header, None)]


def test_destination_of_wrong_size_is_a_protocol_error():
    sink = Sink(dest_bytes=8)
    reader = FrameReader(sink.on_header, sink.on_frame)
    data = b"".join(bytes(p) for p in encode(MsgType.CHUNK, {"offset": 4}, b"12345678"))
    with pytest.raises(ProtocolError, match="destination has 4 bytes, frame 8"):
        feed(reader, data, 100)


def test_prefix_layout_is_stable():
    # Network order, 18 bytes: other implementations will speak this.
    assert PREFIX.size == 18
    assert raw()[:10] == b"CRNT" + struct.pack("!BBI", VERSION, 1, 1)
