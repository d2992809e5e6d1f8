"""One connection as a BufferedProtocol: typed messages in (payloads zero-copy), frames out.

The protocol owns no policy. Bytes go through ``wire.FrameReader``; each frame's
header becomes a typed message (``crnet.protocol.messages.parse``); a ``Handler`` (the
daemon's links, or the client library) says where a payload goes and what a
message means. Sending is ``transport.writelines`` of the frame's parts, so a
gradient is never copied on its way out.

A message that is not valid closes this connection only (``ProtocolError``, logged
as a warning). Any other exception out of a handler is a bug in crnet: the
connection is aborted and the event loop's exception handler is told, which in
crnetd logs the traceback and, in strict mode (``CRNET_STRICT=1``, the tests), stops
the daemon with a non-zero exit code, so a broken handler cannot hide behind a
straggler.
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import logging
import os
import re
import socket
import struct
import termios
from collections.abc import Callable
from typing import Protocol

try:
    import uvloop
except ImportError:   # a core dependency, but crnet still runs on asyncio's own loop
    uvloop = None     # type: ignore[assignment]

from .. import defaults
from ..errors import ProtocolError
from ..peer_text import Throttle
from .messages import Message, parse
from .pacing import send_buffer
from .tcp_info import read as read_tcp_info
from .wire import FrameReader, Limits, MsgType

log = logging.getLogger("crnet.protocol.transport")

DEFAULT_LIMITS = Limits()

# A payload arrives in many small reads (one per packet or two on a shaped link: ~8,000
# a second at 100 Mbit/s), and each read wakes the event loop and runs Python for bytes
# that mean nothing until the whole payload is in. So while a payload of at least
# LOWAT_MIN bytes is under way, the socket's receive low-water mark (SO_RCVLOWAT) is the
# rest of it, up to LOWAT_MAX (the kernel grows the receive buffer to twice the mark):
# the loop wakes once per LOWAT_MAX bytes instead. Never more than the rest of the frame,
# or the last bytes would not wake it at all; back to 1 between payloads.
# Liveness counts the bytes that wait below the mark (``Connection.heard``), so the mark
# may be large: 1 MiB (256 KiB woke a 4-host ring on 127.0.0.1 1,500 times per 256 MB step
# and daemon; 1 MiB took its step from 431-454 ms to 395-425 ms there, and from 553-680 ms
# to 518-546 ms on unshaped veth at MTU 1500, within that run's noise: Gloo's own 519-630).
LOWAT_MIN = 16 << 10
LOWAT_MAX = 1 << 20
_INT = bytes(4)   # FIONREAD's answer

PACED_SEGMENTS = 4   # segments a paced link's send buffer holds at least (pacing.py)

__all__ = ["Connection", "Handler", "address_group", "closing", "loop_name", "new_loop", "run"]


class Handler(Protocol):
    """What a Connection asks of its owner."""

    def payload_dest(self, conn: Connection, msg: Message, nbytes: int) -> memoryview | None:
        """Where ``msg``'s payload of ``nbytes`` goes (exactly that many bytes), or None
        to read and drop it (then ``received`` is not called for it)."""

    def received(self, conn: Connection, msg: Message, payload: memoryview | None) -> None:
        """A whole message; ``payload`` is the view ``payload_dest`` returned."""

    def lost(self, conn: Connection, exc: Exception | None) -> None:
        """The connection is closed (by either side)."""


class Connection(asyncio.BufferedProtocol):
    """Frames over one stream transport (TCP or Unix)."""

    def __init__(self, handler: Handler, limits: Limits = DEFAULT_LIMITS, label: str = "peer",
                 link_timeout: float = defaults.LINK_TIMEOUT):
        self.handler = handler
        self.link_timeout = link_timeout   # a TCP link silent this long is dropped (crnetd --link-timeout)
        self.label = label
        self.authenticated = False   # the peer proved it holds the cluster secret (node/guard.py)
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self._reader = FrameReader(self._frame_header, self._frame_received, limits)
        self._msg: Message | None = None     # the message whose payload is being received
        # The transport's buffer is over its high-water mark. crnet never blocks a
        # sender on it (a step's buffers are bounded by design); the step engine uses
        # it to spot a child that stopped reading.
        self.writing_paused = False
        self.on_drained: Callable[[], None] | None = None   # paced: all it queued went to the kernel
        # Bytes this connection carried each way (the daemon's metrics read them).
        self.bytes_in = 0
        self.bytes_out = 0
        self._sock: socket.socket | None = None   # a plain TCP socket: its SO_RCVLOWAT is ours
        self._lowat = 1
        # Paced (``pace``): the send buffer's floor, and what it is now (pacing.py).
        self._paced_floor = 0
        self._sndbuf = 0
        # The bug (an exception other than ProtocolError, out of parsing or the handler)
        # that aborted this connection: the handler's ``lost`` can tell it from the peer
        # going away.
        self.failure: Exception | None = None
        self.aborted: str | None = None      # why this side cut it off (``abort``), if it did
        # Where the lines about closing it go through: a daemon's connections share one
        # Throttle (a flood of them is a line per address and kind of reason every 10 s);
        # None: every line is logged.
        self.closings: Throttle | None = None

    def set_limits(self, limits: Limits) -> None:
        """What the peer may send from now on (e.g. more, once it has authenticated)."""
        self._reader.limits = limits

    # -- asyncio.BufferedProtocol -------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Chunks are whole messages: don't let Nagle hold the last segment back.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            silence_limits(sock, self.link_timeout)
            # Under TLS the socket's bytes are records, some already read and buffered in
            # the TLS layer: a mark counted in payload bytes could wait for bytes that
            # never come. Only plain TCP gets one.
            # A socket object of our own on a duplicate descriptor: uvloop's stand-in
            # for the transport's socket builds a socket object for every setsockopt.
            if transport.get_extra_info("sslcontext") is None and hasattr(socket, "SO_RCVLOWAT"):
                try:
                    fd = os.dup(sock.fileno())
                except OSError as e:   # out of descriptors (EMFILE): a link without the mark
                    log.warning("%s: no receive low-water mark (%s): every read wakes the loop",
                                self.label, e.strerror or e)
                else:
                    self._sock = socket.socket(sock.family, sock.type, sock.proto, fileno=fd)
        peer = transport.get_extra_info("peername")
        if peer and self.label == "peer":
            self.label = _format_peer(peer)
        made = getattr(self.handler, "made", None)   # e.g. the handshake's deadline
        if made is not None:
            made(self)

    @property
    def heard(self) -> int:
        """Bytes that came from the peer: read, or in the kernel's receive queue, where the
        low-water mark holds them back from the loop until the rest of a payload is in
        (FIONREAD). What liveness judges a peer by: a payload crossing a slow link is
        progress long before it wakes the loop."""
        if self._sock is None:
            return self.bytes_in
        try:
            queued, = struct.unpack("i", fcntl.ioctl(self._sock, termios.FIONREAD, _INT))
        except OSError:
            return self.bytes_in
        return self.bytes_in + queued

    def get_buffer(self, sizehint):
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes):
        self.bytes_in += nbytes
        try:
            self._reader.buffer_updated(nbytes)
            if self._sock is not None:
                self._wake_for(self._reader.awaiting)
        except ProtocolError as e:
            self.abort(f"protocol error: {e}")
        except Exception as e:  # noqa: BLE001 -- a handler bug: reported below, loop survives
            self.failure = e
            self.abort(f"internal error: {type(e).__name__}: {e}")
            asyncio.get_running_loop().call_exception_handler({
                "message": f"{self.label}: error handling a frame", "exception": e,
                "protocol": self})

    def _wake_for(self, awaiting: int) -> None:
        """Set the receive low-water mark for ``awaiting`` more payload bytes (see LOWAT_MIN)."""
        lowat = min(awaiting, LOWAT_MAX) if awaiting >= LOWAT_MIN else 1
        if lowat == self._lowat:
            return
        assert self._sock is not None
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
        except OSError:          # the socket is gone (closing): nothing to tune
            self._sock.close()
            self._sock = None
            return
        self._lowat = lowat

    def eof_received(self):
        return False  # close our side too

    def connection_lost(self, exc):
        if self._sock is not None:
            self._sock.close()     # the duplicate descriptor only
            self._sock = None
        if not self._reader.idle:
            closing(self.closings, self.label, "", "%s: connection closed mid-frame")
        self._reader.release()
        if not self.closed.done():
            self.closed.set_result(exc)
        try:
            self.handler.lost(self, exc)
        except Exception as e:  # noqa: BLE001 -- a handler bug: reported, the loop survives
            asyncio.get_running_loop().call_exception_handler({
                "message": f"{self.label}: error in the connection-lost handler",
                "exception": e, "protocol": self})

    def pause_writing(self):
        self.writing_paused = True

    def resume_writing(self):
        self.writing_paused = False
        if self.on_drained is not None:
            if self._paced_floor:
                self._follow_link()
            self.on_drained()

    def pace(self, unsent: int) -> None:
        """Writes on this connection go out in turn with others': the kernel holds at most
        about ``unsent`` bytes of it (its send buffer, in flight included, SO_SNDBUF; of them
        not yet sent, TCP_NOTSENT_LOWAT), the rest waits in the transport, and ``on_drained``
        is called the moment all of it went to the kernel (its buffer limit is 0: every
        write above it pauses). A link already closing is left as it is: its socket may be
        gone (descriptor -1), and it takes no more writes anyway."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        sock = transport.get_extra_info("socket")
        option = getattr(socket, "TCP_NOTSENT_LOWAT", None)
        if sock is not None and option is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, option, unsent)
            # The send buffer holds the bytes in flight too: below a few segments, the
            # receiver's delayed ACK (it acknowledges every second segment, or after
            # 40 ms) stalls every write (on loopback, segments of 32-64 KiB: spread's 4 MB
            # step took 13x the ring's). From there it follows the link (pacing.py),
            # looked at each time the link drains. A frozen peer is found by what it no
            # longer sends (node/peers/liveness.py), not by this buffer filling.
            mss = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
            self._paced_floor = self._sndbuf = max(unsent, PACED_SEGMENTS * mss)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._sndbuf)
        transport.set_write_buffer_limits(high=0, low=0)

    @property
    def send_buffer(self) -> int:
        """A paced link's send buffer now (SO_SNDBUF as set; 0: not paced)."""
        return self._sndbuf

    def _follow_link(self) -> None:
        """The paced link drained: its send buffer follows the link as TCP measured it
        (``pacing.send_buffer``)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        sock = self._sock if self._sock is not None else transport.get_extra_info("socket")
        info = read_tcp_info(sock)
        if info is None:
            return
        size = send_buffer(self._paced_floor, self._sndbuf, info.delivery_rate, info.min_rtt)
        if size == self._sndbuf:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        except OSError:   # the socket is going: nothing to follow
            return
        self._sndbuf = size

    # -- sending ----------------------------------------------------------------
    @property
    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def send(self, msg: Message, payload=None) -> bool:
        """Queue one message; the payload buffer is referenced, not copied.

        The caller must not modify the payload's memory until it is sent: crnet only
        sends buffers that are never written again (results, decoded messages).
        Returns False if the connection is already closing.
        """
        return self.write(msg.frame(payload))

    def write(self, frame: list) -> bool:
        """Queue a frame ``Message.frame`` made: one encoding can go to many peers."""
        if self.transport is None or self.transport.is_closing():
            return False
        self.transport.writelines(frame)
        self.bytes_out += sum(map(len, frame))   # bytes, or memoryviews cast to "B"
        return True

    @property
    def write_buffer_size(self) -> int:
        return 0 if self.transport is None else self.transport.get_write_buffer_size()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self, reason: str) -> None:
        self.aborted = reason
        closing(self.closings, self.label, reason)
        if self.transport is not None:
            self.transport.abort()

    # -- reader callbacks -------------------------------------------------------
    def _frame_header(self, msg_type: MsgType, header: dict, nbytes: int):
        self._msg = msg = parse(msg_type, header, nbytes)
        return self.handler.payload_dest(self, msg, nbytes)

    def _frame_received(self, msg_type: MsgType, header: dict, payload):
        msg, self._msg = self._msg, None
        if payload is None:  # no payload: _frame_header was not called for this frame
            msg = parse(msg_type, header, 0)
        assert msg is not None
        self.handler.received(self, msg, payload)


def closing(throttle: Throttle | None, label: str, reason: str,
            msg: str = "%s: closing connection: %s") -> None:
    """Log that the connection ``label`` (``host:port``) is closed on its peer, for
    ``reason``: through ``throttle``, if given, keyed by the peer's ``address_group``
    and the reason's shape (its words, numbers aside), so that 2,000 strangers'
    connections closed in 9 s are a few lines, not 4,000, while an address's different
    faults (a bad HELLO, then a vector no host could hold) each get their line."""
    args = (label, reason) if reason else (label,)
    if throttle is None:
        log.warning(msg, *args)
    else:
        key = (address_group(label.rpartition(":")[0]), _DIGITS.sub("#", reason)[:80])
        throttle.warning(key, msg, *args)


_DIGITS = re.compile(r"\d+")


def address_group(host: str) -> str:
    """Where a connection from ``host`` comes from, as floods are counted: the address, or
    for IPv6 its /64 (one host may hold a whole /64); an IPv4-mapped IPv6 address is the
    IPv4 address. Anything else (a name, a Unix socket's label) is itself."""
    try:
        ip = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def silence_limits(sock: socket.socket, seconds: float) -> None:
    """Drop a TCP connection whose sent data stays unacknowledged for ``seconds``
    (TCP_USER_TIMEOUT), and probe an idle one so that a dead peer is noticed about as
    soon (keepalive). Where an option does not exist (not Linux), TCP's own, far longer
    limits stay."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, int(seconds / 2))
    count = 4
    interval = max(1, int((seconds - idle) / count))
    for name, value in (("TCP_USER_TIMEOUT", int(seconds * 1000)), ("TCP_KEEPIDLE", idle),
                        ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _format_peer(peer) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) or "unix"


def loop_name() -> str:
    """Which event loop ``run`` uses, for the daemon's start-up log line."""
    if uvloop is None:
        return "asyncio (uvloop is not installed)"
    return f"uvloop {uvloop.__version__}"


def run(main):
    """Run a coroutine on uvloop when it is installed, else on asyncio's loop."""
    return asyncio.run(main) if uvloop is None else uvloop.run(main)


def new_loop() -> asyncio.AbstractEventLoop:
    """A private event loop (the blocking client's): uvloop's when it is installed (its
    callbacks cost less than asyncio's: bench_step's ``allreduce us`` column)."""
    return asyncio.new_event_loop() if uvloop is None else uvloop.new_event_loop()
