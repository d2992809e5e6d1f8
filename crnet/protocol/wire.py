"""Frame layout, limits and an incremental, zero-copy frame reader.

A frame is::

    prefix  (18 bytes)  magic b"CRNT", version u8, message type u8,
                        header length u32, payload length u64   (network order)
    header  (msgpack)   a map: step, offset, count, dtype, reason, ...
    payload (raw)       gradient bytes, never msgpack-encoded, never pickled

Every length is checked against ``Limits`` before anything is allocated, and the
reader asks its owner where each payload goes *after* reading the header, so a
gradient chunk lands straight in its destination array (uvloop's BufferedProtocol
reads into the memoryview we return). The same frames run over the TCP tree links
and the daemon's Unix socket for the local training process.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from ..errors import ProtocolError

MAGIC = b"CRNT"
VERSION = 3   # 3: the ring (rar) includes the master (messages.RingPlace)
PREFIX = struct.Struct("!4sBBIQ")

__all__ = ["PREFIX", "VERSION", "FrameReader", "Limits", "MsgType", "PyFrameReader", "encode"]


class MsgType(enum.IntEnum):
    """Frame types; ``crnet.protocol.messages`` has the typed message of each."""

    # Tree links (TCP), child <-> parent.
    HELLO = 1           # child -> parent: join (the slot it wants, where it listens)
    WELCOME = 2         # parent -> child: your name, layer, the tree and its settings
    REFUSE = 3          # parent -> child: why you can't join; then close
    JOINED = 4          # child -> parent: workers of my subtree that have joined
    ASSIGN = 5          # parent -> child: payload = the subtree's allocation
    CHUNK = 6           # child -> parent: a coded chunk of my message for a step
    RESULT = 7          # parent -> child: a chunk of the step's full gradient
    FAIL = 8            # either way: a step cannot complete (reason, kind)
    OPEN = 9            # child -> parent: a step has begun in my subtree
    JOB = 13            # up: a process of this job joined; down: the tree now runs this job
    BCAST = 14          # up: a piece of a vector one process sends to all; down: the same, to all
    WANT_STATE = 15     # up (and client -> daemon): a process wants a peer's state; down: asked
    MOVE = 45           # down, between jobs (--plan auto): the tree takes another shape; join there
    CHALLENGE = 16      # acceptor -> dialer, with a cluster secret: nonce, the acceptor's MAC
    PROOF = 17          # dialer -> acceptor: the dialer's MAC; only then is its hello acted on
    BARRIER = 18        # up (and client -> daemon): processes at a barrier; down: released
    # crnet status (TCP): a status client on --listen, or a parent asking down its tree link.
    STATUS_HELLO = 35   # status client -> node: first frame (its nonce, with a cluster secret)
    STATUS = 36         # asker -> node: this subtree's state, please (within a deadline)
    STATUS_REPLY = 37   # node -> asker: its subtree's state
    # crnet tune --probe (node/probe.py), on the tree links of an idle tree.
    PROBE = 43          # parent -> child: bytes to time the link with (the child drops them)
    PROBE_ECHO = 44     # child -> parent: the last frame of a round came
    # Ring links (TCP, --scheme rar), predecessor -> successor; the first two open spread's too.
    PEER_HELLO = 10     # I am your predecessor (rar) or host (spread), rank r
    PEER_WELCOME = 11   # successor -> predecessor: accepted (with a secret, PEER_CONFIRMED follows)
    SEGMENT = 12        # a ring segment of a step (phase, round, segment)
    # Peer links (TCP, --scheme spread), every host -> every other host.
    PIECE = 19          # a chunk of a host's vector to its owner, or of the sum from its owner
    OWNERS = 38         # master -> every host: which hosts own no chunks, from which step on
    MOOT = 39           # owner -> a host: its piece of a chunk is not needed (decoded without it)
    SETTLED = 46        # master -> every host: the step's whole sum is at the master: it is decided
    SUM_DIGEST = 48     # owner -> every host: the digest of a chunk of the sum that goes round the ring
    SUM_WANTED = 49     # host -> owner: that chunk again, straight (its relayed copy did not match)
    # Confirming a spread peer's rank (with a cluster secret; node/peer_check.py).
    PEER_CHECK = 40     # acceptor -> the claimed host, on its own link there: is this your link's id?
    PEER_CHECKED = 41   # that host -> the asker, on the same link: yes or no
    PEER_CONFIRMED = 42  # acceptor -> dialer: its rank is confirmed (rar: at once); pieces may flow
    HEARTBEAT = 47      # either way on a peer link, when nothing else went for a while: alive
    # The local training process (Unix socket).
    CLIENT_HELLO = 20   # client -> daemon: first frame (pid)
    CLIENT_WELCOME = 21  # daemon -> client: this host's assignment
    ATTACH = 22         # client -> daemon: map this shared-memory file
    ATTACHED = 23       # daemon -> client: mapped
    SUBMIT = 24         # client -> daemon: my local gradient for a step is in shared memory
    FETCH = 25          # client -> daemon: give me a finished step's result, I contribute nothing
    DONE = 26           # daemon -> client: the step's result is in shared memory
    ERROR = 27          # daemon -> client: a request failed (reason, kind)
    STATS = 28          # client -> daemon: counters please
    STATS_REPLY = 29    # daemon -> client: the counters
    WATCH = 30          # client -> daemon: tell me when this step is decided
    DECIDED = 31        # daemon -> client: that step is decided (its outcome is here)
    PUBLISH = 32        # client -> daemon: send the vector in shared memory to every process
    RECEIVE = 33        # client -> daemon: give me that broadcast once it is here
    DELIVERED = 34      # daemon -> client: published (taken), or received (in shared memory)


_TYPES = {t.value: t for t in MsgType}


@dataclass(frozen=True)
class Limits:
    """Upper bounds a reader enforces before it allocates or parses anything."""

    max_header: int = 1 << 20          # bytes of msgpack header
    max_payload: int = 1 << 31         # bytes of one frame's payload
    max_str: int = 1 << 16             # msgpack string length inside a header
    max_items: int = 1 << 16           # msgpack array/map length inside a header
    # The frame types accepted at all (None: every type); checked from the prefix, before
    # the header is decoded: a peer that has not authenticated may only say hello.
    types: frozenset[MsgType] | None = None


def encode(msg_type: MsgType, header: dict, payload=None) -> list:
    """A frame as a list for ``transport.writelines``: the payload is not copied."""
    head = msgpack.packb(header)
    if payload is None:
        return [PREFIX.pack(MAGIC, VERSION, msg_type, len(head), 0) + head]
    view = memoryview(payload).cast("B")
    return [PREFIX.pack(MAGIC, VERSION, msg_type, len(head), view.nbytes) + head, view]


# on_header(msg_type, header, payload_len) -> writable memoryview of payload_len bytes
# (where the payload goes) or None (read and drop it). May raise ProtocolError.
HeaderCallback = Callable[[MsgType, dict, int], "memoryview | None"]
# on_frame(msg_type, header, payload) with payload the memoryview on_header returned.
FrameCallback = Callable[[MsgType, dict, "memoryview | None"], None]


def _closed(*args):
    raise ProtocolError("the connection is closed")


class PyFrameReader:
    """Turns the bytes of one connection into frames; the state of a BufferedProtocol.

    The reference implementation: ``FrameReader`` is its compiled twin
    (``crnet/protocol/_frames.pyx``) when that is built, which behaves the same to the byte.

    Prefixes and headers (and the first bytes of a payload that arrive with them)
    land in a small scratch buffer; once a header says where the payload goes,
    ``get_buffer`` hands out the destination itself, so bulk payload bytes are
    written by the kernel straight into the gradient array.
    """

    SCRATCH = 1 << 16

    def __init__(self, on_header: HeaderCallback, on_frame: FrameCallback, limits: Limits = Limits()):
        self._on_header = on_header
        self._on_frame = on_frame
        self.limits = limits
        self._scratch = bytearray(self.SCRATCH)
        self._view = memoryview(self._scratch)
        self._start = 0          # first unparsed byte in scratch
        self._end = 0            # end of received bytes in scratch
        self._need = PREFIX.size  # scratch bytes the parser waits for
        self._dest: memoryview | None = None
        self._dest_pos = 0
        self._discard = 0        # payload bytes still to drop
        self._frame: tuple | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._dest is not None:
            return self._dest[self._dest_pos:]
        if self._discard:
            return self._view[: min(self._discard, len(self._view))]
        if self._end == len(self._scratch):
            self._compact()
        return self._view[self._end:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._dest is not None:
            self._dest_pos += nbytes
            if self._dest_pos == len(self._dest):
                self._deliver(self._dest)
            return
        if self._discard:
            self._discard -= nbytes
            if not self._discard:
                self._frame = None
            return
        self._end += nbytes
        self._parse()

    @property
    def awaiting(self) -> int:
        """Payload bytes of the current frame still to come (0 between payloads)."""
        if self._dest is not None:
            return len(self._dest) - self._dest_pos
        return self._discard

    @property
    def idle(self) -> bool:
        """True between frames: no partial frame is buffered."""
        return self._dest is None and not self._discard and self._start == self._end

    def _parse(self) -> None:
        while self._end - self._start >= self._need:
            if self._frame is None:
                self._read_header()
                if self._frame is None:
                    continue  # waiting for the rest of the header: _need was raised
            self._start_payload()
            if self._dest is not None or self._discard:
                return
        if self._start == self._end:
            self._start = self._end = 0

    def _read_header(self) -> None:
        start = self._start
        magic, version, msg_type, hlen, plen = PREFIX.unpack_from(self._scratch, start)
        if magic != MAGIC:
            raise ProtocolError(f"bad magic {bytes(magic)!r}: not a crnet peer")
        if version != VERSION:
            raise ProtocolError(f"protocol version {version}, this side speaks {VERSION}")
        known = _TYPES.get(msg_type)   # MsgType(x) costs two Python calls per frame
        if known is None:
            raise ProtocolError(f"unknown message type {msg_type}")
        msg_type = known
        if self.limits.types is not None and msg_type not in self.limits.types:
            raise ProtocolError(f"unexpected {msg_type.name} from a peer before HELLO")
        if hlen > self.limits.max_header:
            raise ProtocolError(f"header of {hlen} bytes exceeds the limit {self.limits.max_header}")
        if plen > self.limits.max_payload:
            raise ProtocolError(f"payload of {plen} bytes exceeds the limit {self.limits.max_payload}")
        total = PREFIX.size + hlen
        if self._end - start < total:
            self._need = total
            if start + total > len(self._scratch):
                self._compact(total)
            return
        try:
            header = msgpack.unpackb(
                self._view[start + PREFIX.size:start + total],
                max_str_len=self.limits.max_str,
                max_bin_len=self.limits.max_str,
                max_array_len=self.limits.max_items,
                max_map_len=self.limits.max_items,
                max_ext_len=0,
                strict_map_key=True,
            )
        except Exception as e:  # noqa: BLE001 -- msgpack raises several types for bad input
            raise ProtocolError(f"undecodable {msg_type.name} header: {e}") from None
        if not isinstance(header, dict):
            raise ProtocolError(f"{msg_type.name} header is a {type(header).__name__}, not a map")
        self._start += total
        self._need = PREFIX.size
        self._frame = (msg_type, header, plen)

    def _start_payload(self) -> None:
        assert self._frame is not None
        msg_type, header, plen = self._frame
        if plen == 0:
            self._frame = None
            self._on_frame(msg_type, header, None)
            return
        dest = self._on_header(msg_type, header, plen)
        have = min(self._end - self._start, plen)
        if dest is None:
            self._start += have
            self._discard = plen - have
            if not self._discard:
                self._frame = None
            else:
                self._start = self._end = 0
            return
        if len(dest) != plen:
            raise ProtocolError(f"{msg_type.name}: destination has {len(dest)} bytes, frame {plen}")
        dest[:have] = self._view[self._start:self._start + have]
        self._start += have
        if have == plen:
            self._deliver(dest)
        else:
            self._dest, self._dest_pos = dest, have
            self._start = self._end = 0

    def _deliver(self, payload: memoryview) -> None:
        assert self._frame is not None
        msg_type, header, _ = self._frame
        self._frame = None
        self._dest = None
        self._on_frame(msg_type, header, payload)

    def release(self) -> None:
        """The connection is gone: drop the buffers and the callbacks (which point back
        at the connection), so nothing waits for the garbage collector."""
        self._scratch = bytearray()
        self._view = memoryview(self._scratch)
        self._dest = None
        self._on_header = self._on_frame = _closed

    def _compact(self, capacity: int = 0) -> None:
        """Move unparsed bytes to the front; grow scratch for an oversized header, and
        shrink it back once such a header is through."""
        pending = self._view[self._start:self._end].tobytes()
        if capacity > len(self._scratch) or (not capacity and len(self._scratch) > self.SCRATCH
                                             and len(pending) <= self.SCRATCH):
            self._scratch = bytearray(max(capacity, self.SCRATCH))
            self._view = memoryview(self._scratch)
        self._view[: len(pending)] = pending
        self._start, self._end = 0, len(pending)


try:
    from . import _frames
except ImportError:   # not built (a source checkout without build_ext): the reference
    _frames = None    # type: ignore[assignment]

if _frames is not None:
    class FrameReader(_frames.FrameReader):
        """``PyFrameReader``, compiled (the prefix parsed and the limits checked in C)."""

        SCRATCH = PyFrameReader.SCRATCH   # _frames.pyx's too

        def __init__(self, on_header: HeaderCallback, on_frame: FrameCallback,
                     limits: Limits = Limits()):
            super().__init__(on_header, on_frame, limits, _TYPES, MAGIC, VERSION)
else:
    FrameReader = PyFrameReader   # type: ignore[misc]
