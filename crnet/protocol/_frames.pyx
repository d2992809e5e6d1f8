# cython: language_level=3
"""The frame reader of :mod:`crnet.protocol.wire`, compiled: the state machine of every connection.

Private module: use ``crnet.protocol.wire.FrameReader``, which is this class when it is built
and the pure-Python reference otherwise. Both behave the same to the byte (the tests
run each): the prefix is parsed and every limit checked here in C, the header is
decoded by msgpack, and the callbacks are the same. What is saved is the Python of a
handful of method calls per frame and per read, which on a ring of small parts was a
good share of a daemon's CPU (docs/lab/ring.md, "Cheaper frames").
"""
from cpython.bytearray cimport PyByteArray_AS_STRING
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy, memmove

import msgpack

from ..errors import ProtocolError

DEF PREFIX_SIZE = 18          # magic (4), version (1), type (1), header length (4), payload (8)
DEF SCRATCH = 1 << 16


cdef inline uint32_t _u32(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint64_t _u64(const uint8_t *p) noexcept nogil:
    return (<uint64_t>_u32(p) << 32) | _u32(p + 4)


def _closed(*args):
    raise ProtocolError("the connection is closed")


cdef class FrameReader:
    """Turns the bytes of one connection into frames (see ``crnet.protocol.wire.FrameReader``)."""

    cdef object _on_header, _on_frame, _limits, _unpack_kw
    cdef object _types           # type number -> MsgType
    cdef object _allowed         # frozenset of MsgType, or None
    cdef uint64_t _max_header, _max_payload
    cdef bytearray _scratch
    cdef object _view            # memoryview of _scratch
    cdef Py_ssize_t _start, _end, _need
    cdef object _dest            # memoryview the payload goes into, or None
    cdef Py_ssize_t _dest_pos, _dest_len
    cdef uint64_t _discard
    cdef object _msg_type, _header
    cdef uint64_t _plen
    cdef bint _in_frame
    cdef bytes _magic
    cdef int _version

    def __init__(self, on_header, on_frame, limits, types, magic, int version):
        self._on_header = on_header
        self._on_frame = on_frame
        self._types = types
        self._magic = magic
        self._version = version
        self.limits = limits
        self._scratch = bytearray(SCRATCH)
        self._view = memoryview(self._scratch)
        self._start = self._end = 0
        self._need = PREFIX_SIZE
        self._dest = None
        self._dest_pos = self._dest_len = 0
        self._discard = 0
        self._in_frame = False

    @property
    def limits(self):
        return self._limits

    @limits.setter
    def limits(self, limits):
        self._limits = limits
        self._max_header = limits.max_header
        self._max_payload = limits.max_payload
        self._allowed = limits.types
        self._unpack_kw = dict(max_str_len=limits.max_str, max_bin_len=limits.max_str,
                               max_array_len=limits.max_items, max_map_len=limits.max_items,
                               max_ext_len=0, strict_map_key=True)

    def get_buffer(self, Py_ssize_t sizehint):
        if self._dest is not None:
            return self._dest[self._dest_pos:]
        if self._discard:
            return self._view[:min(self._discard, <uint64_t>len(self._scratch))]
        if self._end == len(self._scratch):
            self._compact(0)
        return self._view[self._end:]

    def buffer_updated(self, Py_ssize_t nbytes):
        if self._dest is not None:
            self._dest_pos += nbytes
            if self._dest_pos == self._dest_len:
                self._deliver(self._dest)
            return
        if self._discard:
            self._discard -= nbytes
            if not self._discard:
                self._in_frame = False
            return
        self._end += nbytes
        self._parse()

    @property
    def awaiting(self):
        """Payload bytes of the current frame still to come (0 between payloads)."""
        if self._dest is not None:
            return self._dest_len - self._dest_pos
        return self._discard

    @property
    def idle(self):
        return self._dest is None and not self._discard and self._start == self._end

    cdef _parse(self):
        while self._end - self._start >= self._need:
            if not self._in_frame:
                self._read_header()
                if not self._in_frame:
                    continue   # waiting for the rest of the header: _need was raised
            self._start_payload()
            if self._dest is not None or self._discard:
                return
        if self._start == self._end:
            self._start = self._end = 0

    cdef _read_header(self):
        cdef const uint8_t *p = <const uint8_t *>PyByteArray_AS_STRING(self._scratch) + self._start
        cdef uint32_t hlen
        cdef uint64_t plen
        cdef Py_ssize_t total
        if p[0] != self._magic[0] or p[1] != self._magic[1] or p[2] != self._magic[2] \
                or p[3] != self._magic[3]:
            raise ProtocolError(f"bad magic {bytes(self._view[self._start:self._start + 4])!r}: "
                                "not a crnet peer")
        if p[4] != self._version:
            raise ProtocolError(f"protocol version {p[4]}, this side speaks {self._version}")
        msg_type = self._types.get(p[5])
        if msg_type is None:
            raise ProtocolError(f"unknown message type {p[5]}")
        if self._allowed is not None and msg_type not in self._allowed:
            raise ProtocolError(f"unexpected {msg_type.name} from a peer before HELLO")
        hlen = _u32(p + 6)
        plen = _u64(p + 10)
        if hlen > self._max_header:
            raise ProtocolError(f"header of {hlen} bytes exceeds the limit {self._max_header}")
        if plen > self._max_payload:
            raise ProtocolError(f"payload of {plen} bytes exceeds the limit {self._max_payload}")
        total = PREFIX_SIZE + hlen
        if self._end - self._start < total:
            self._need = total
            if self._start + total > len(self._scratch):
                self._compact(total)
            return
        try:
            header = msgpack.unpackb(self._view[self._start + PREFIX_SIZE:self._start + total],
                                     **self._unpack_kw)
        except Exception as e:  # msgpack raises several types for bad input
            raise ProtocolError(f"undecodable {msg_type.name} header: {e}") from None
        if not isinstance(header, dict):
            raise ProtocolError(f"{msg_type.name} header is a {type(header).__name__}, not a map")
        self._start += total
        self._need = PREFIX_SIZE
        self._msg_type, self._header, self._plen = msg_type, header, plen
        self._in_frame = True

    cdef _start_payload(self):
        cdef uint64_t plen = self._plen
        cdef Py_ssize_t have
        if plen == 0:
            self._in_frame = False
            self._on_frame(self._msg_type, self._header, None)
            return
        dest = self._on_header(self._msg_type, self._header, plen)
        have = min(<uint64_t>(self._end - self._start), plen)
        if dest is None:
            self._start += have
            self._discard = plen - have
            if not self._discard:
                self._in_frame = False
            else:
                self._start = self._end = 0
            return
        if <uint64_t>len(dest) != plen:
            raise ProtocolError(f"{self._msg_type.name}: destination has {len(dest)} bytes, "
                                f"frame {plen}")
        dest[:have] = self._view[self._start:self._start + have]
        self._start += have
        if <uint64_t>have == plen:
            self._deliver(dest)
        else:
            self._dest, self._dest_pos, self._dest_len = dest, have, plen
            self._start = self._end = 0

    cdef _deliver(self, payload):
        msg_type, header = self._msg_type, self._header
        self._in_frame = False
        self._dest = None
        self._msg_type = self._header = None
        self._on_frame(msg_type, header, payload)

    def release(self):
        """The connection is gone: drop the buffers and the callbacks."""
        self._scratch = bytearray()
        self._view = memoryview(self._scratch)
        self._start = self._end = 0
        self._dest = None
        self._on_header = self._on_frame = _closed

    cdef _compact(self, Py_ssize_t capacity):
        """Move unparsed bytes to the front; grow scratch for an oversized header, and
        shrink it back once such a header is through."""
        cdef Py_ssize_t size = len(self._scratch), pending = self._end - self._start
        cdef bytearray old
        if capacity > size or (not capacity and size > SCRATCH and pending <= SCRATCH):
            old = self._scratch
            self._scratch = bytearray(max(capacity, SCRATCH))
            self._view = memoryview(self._scratch)
            memcpy(PyByteArray_AS_STRING(self._scratch),
                   PyByteArray_AS_STRING(old) + self._start, pending)
        else:
            memmove(PyByteArray_AS_STRING(self._scratch),
                    PyByteArray_AS_STRING(self._scratch) + self._start, pending)
        self._start, self._end = 0, pending
