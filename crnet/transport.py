"""One connection as a BufferedProtocol: frames in (zero-copy), frames out (writelines).

The protocol owns no policy: a ``handler`` (the daemon's ChildLink, ParentLink,
ClientLink, or the client library) says where each payload goes and what a frame
means. A malformed frame closes this connection only, and the reason is logged.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from .wire import FrameReader, Limits, MsgType, ProtocolError, encode

log = logging.getLogger("crnet.transport")

__all__ = ["Connection", "loop_name", "run"]


class Connection(asyncio.BufferedProtocol):
    """Frames over one stream transport (TCP or Unix).

    ``handler`` provides ``frame_header(conn, type, header, nbytes) -> memoryview|None``,
    ``frame_received(conn, type, header, payload)`` and ``connection_lost(conn, exc)``.
    """

    def __init__(self, handler, limits: Limits = Limits(), label: str = "peer"):
        self.handler = handler
        self.label = label
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self._reader = FrameReader(self._frame_header, self._frame_received, limits)
        # The transport's buffer is over its high-water mark. crnet never blocks a
        # sender on it (a step's buffers are bounded by design); the daemon uses it to
        # spot a peer that stopped reading (``Daemon._result_chunk``).
        self.writing_paused = False

    # -- asyncio.BufferedProtocol -------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Chunks are whole messages: don't let Nagle hold the last segment back.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        if peer and self.label == "peer":
            self.label = _format_peer(peer)

    def get_buffer(self, sizehint):
        return self._reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes):
        try:
            self._reader.buffer_updated(nbytes)
        except ProtocolError as e:
            self.abort(f"protocol error: {e}")
        except Exception:  # a handler bug must not take the event loop down with it
            log.exception("%s: error handling a frame; closing the connection", self.label)
            self.abort("internal error")

    def eof_received(self):
        return False  # close our side too

    def connection_lost(self, exc):
        if not self._reader.idle:
            log.warning("%s: connection closed mid-frame", self.label)
        if not self.closed.done():
            self.closed.set_result(exc)
        try:
            self.handler.connection_lost(self, exc)
        except Exception:
            log.exception("%s: error in connection_lost handler", self.label)

    def pause_writing(self):
        self.writing_paused = True

    def resume_writing(self):
        self.writing_paused = False

    # -- sending ----------------------------------------------------------------
    @property
    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def send(self, msg_type: MsgType, header: dict, payload=None) -> bool:
        """Queue one frame; the payload buffer is referenced, not copied.

        The caller must not modify the payload's memory until it is sent: crnet only
        sends buffers that are never written again (results, decoded messages).
        Returns False if the connection is already closing.
        """
        return self.write(encode(msg_type, header, payload))

    def write(self, frame: list) -> bool:
        """Queue a frame ``wire.encode`` made: one encoding can go to many peers."""
        if self.is_closing:
            return False
        self.transport.writelines(frame)
        return True

    @property
    def write_buffer_size(self) -> int:
        return 0 if self.transport is None else self.transport.get_write_buffer_size()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self, reason: str) -> None:
        log.warning("%s: closing connection: %s", self.label, reason)
        if self.transport is not None:
            self.transport.abort()

    # -- reader callbacks -------------------------------------------------------
    def _frame_header(self, msg_type, header, nbytes):
        return self.handler.frame_header(self, msg_type, header, nbytes)

    def _frame_received(self, msg_type, header, payload):
        self.handler.frame_received(self, msg_type, header, payload)


def _format_peer(peer) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) or "unix"


def loop_name() -> str:
    """Which event loop ``run`` uses, for the daemon's start-up log line."""
    try:
        import uvloop
    except ImportError:
        return "asyncio (uvloop is not installed)"
    return f"uvloop {uvloop.__version__}"


def run(main):
    """Run a coroutine on uvloop when it is installed, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
