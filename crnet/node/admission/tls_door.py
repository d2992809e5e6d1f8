"""TLS on an accepted connection, begun only once the connection is through the door.

A listener made with ``ssl=`` runs the TLS handshake before any protocol of crnet's
sees the connection: no cap on how many, asyncio's 60 s to finish, nothing logged (200
idle connections from one address were held a minute). So the tree's listener and the
metrics port accept plain TCP, and with TLS a ``TlsDoor`` is the connection's protocol
until its handshake is done: it enters the ``Doorway`` at the TCP accept (its caps, and
its deadline, which covers the TLS handshake and the hello after it), runs the handshake
(``loop.start_tls``, no longer than that deadline) and then hands the connection, its
place in the doorway and what is left of its deadline to the protocol ``make`` builds
(``transport.Connection`` with ``guard.Accepting``; a metrics scrape), as if it had
been accepted over TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import ssl
from collections.abc import Callable
from typing import Any, cast

from ...peer_text import Throttle
from ...protocol.transport import address_group, closing
from .doorway import Doorway, Visitor

log = logging.getLogger("crnet.node")

# Application bytes that may come before the protocol takes over: asyncio's TLS layer
# hands the first records to the protocol given to start_tls as the handshake completes,
# before start_tls returns. A hello is a few hundred bytes; more closes the connection.
EARLY_BYTES = 64 << 10
# A connection handed over after its handshake and closed later is garbage in a reference
# cycle (its protocol, the TLS transport, the TLS layer), which only a full collection
# frees; by then it has lived through younger ones, and Python runs full ones rarely. Each
# holds the TLS layer's buffers (some 200 KiB): a flood of handshakes from strangers left a
# master at 259 MiB, idle a minute after it (51 before; issue 39 row 9). So every SWEEP_EVERY
# hand-overs, a full collection, once the doorway's deadline has closed the strangers, and
# the freed pages given back.
SWEEP_EVERY = 64


class TlsDoor(asyncio.BufferedProtocol):
    """An accepted TCP connection until its TLS handshake is done (the module docstring)."""

    def __init__(self, make: Callable[[], asyncio.BaseProtocol], doorway: Doorway,
                 context: ssl.SSLContext, closings: Throttle):
        self.label = "peer"
        self._make = make
        self._doorway = doorway
        self._context = context
        self._closings = closings           # the daemon's: lines about closed connections
        self._raw: asyncio.Transport | None = None
        self._host = ""
        self._app: asyncio.BaseProtocol | None = None
        self._task: asyncio.Task | None = None
        self._tls = False                   # start_tls has taken the connection over
        self._raw_early = bytearray()       # TLS bytes read before that: the TLS layer's
        self._early = bytearray()           # application bytes before the hand-over
        self._scratch = bytearray(16 << 10)
        self._eof = False
        self._gone = False
        self._aborted = False               # by us, and logged

    # -- as the TCP connection's protocol, until start_tls takes it -------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = raw = cast(asyncio.Transport, transport)   # uvloop's are not subclasses
        # Its first bytes are the TLS layer's. asyncio reads nothing until start_tls if
        # paused now; uvloop starts reading after this returns, whatever we say, so what it
        # reads before start_tls takes over is kept (buffer_updated) and handed on.
        raw.pause_reading()
        peer = raw.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self._host, self.label = str(peer[0]), f"{peer[0]}:{peer[1]}"
        if not self._doorway.enter(self, self._host):
            self.abort("too many connections in their handshake")
            return
        self._task = asyncio.get_running_loop().create_task(self._handshake(raw),
                                                            name=f"TLS {self.label}")

    def abort(self, reason: str) -> None:
        """Close it before the hand-over (the doorway's deadline, or room made)."""
        closing(self._closings, self.label, reason)
        self._aborted = True
        if self._raw is not None:
            self._raw.abort()

    async def _handshake(self, raw: asyncio.Transport) -> None:
        if self._gone:
            return
        loop = asyncio.get_running_loop()
        if self._raw_early:
            # Runs after start_tls's first part (which gives the connection to its TLS
            # protocol) and before that protocol's connection_made: bytes it is given
            # then wait in its buffer for the handshake to begin; the next read comes after.
            loop.call_soon(self._hand_on_raw, raw)
        self._tls = True
        try:
            tls = await loop.start_tls(raw, self, self._context, server_side=True,
                                       ssl_handshake_timeout=self._doorway.deadline)
        except (OSError, asyncio.TimeoutError) as e:
            if not self._aborted:       # else abort said why
                self._closings.warning((address_group(self._host), "tls"),
                                       "%s: TLS handshake failed: %s", self.label, e)
            self._doorway.leave(self)
            raw.abort()
            return
        if self._gone or tls is None:
            self._doorway.leave(self)
            return
        self._app = app = self._make()
        _SWEEPER.handed_over(self._doorway.deadline)
        self._doorway.hand_over(self, cast(Visitor, app))   # it has a label and abort too
        tls.set_protocol(app)
        app.connection_made(tls)
        if self._early:
            _deliver(app, bytes(self._early))
            self._early.clear()
        if self._eof and not _eof_received(app):
            tls.close()

    def _hand_on_raw(self, raw: asyncio.Transport) -> None:
        tls_layer = raw.get_protocol()
        if tls_layer is not self and not raw.is_closing():
            _deliver(tls_layer, bytes(self._raw_early))
        self._raw_early.clear()

    # -- as the TLS layer's application protocol, until the hand-over ------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(self._scratch[:nbytes])
        if not self._tls:              # read before start_tls (uvloop): the TLS layer's
            self._raw_early += data
            assert self._raw is not None
            self._raw.pause_reading()
            return
        if self._app is not None:      # a read the TLS layer had scheduled before
            _deliver(self._app, data)
            return
        self._early += data
        if len(self._early) > EARLY_BYTES:
            self.abort(f"more than {EARLY_BYTES} bytes sent before the TLS handshake was done")

    def eof_received(self) -> bool | None:
        if not self._tls:
            return None                 # gone before its handshake: closed
        if self._app is not None:
            return _eof_received(self._app)
        self._eof = True
        return True                     # kept open until the protocol takes over

    def connection_lost(self, exc: Exception | None) -> None:
        if self._app is not None:       # told after the hand-over, as scheduled before it
            self._app.connection_lost(exc)
            return
        self._gone = True
        self._doorway.leave(self)


class _Sweeper:
    """Full collections after TLS hand-overs (``SWEEP_EVERY``), one pending at a time."""

    def __init__(self) -> None:
        self.count = 0
        self.pending = False

    def handed_over(self, deadline: float) -> None:
        self.count += 1
        if self.count < SWEEP_EVERY or self.pending:
            return
        self.count, self.pending = 0, True
        asyncio.get_running_loop().call_later(deadline + 1.0, self._sweep)

    def _sweep(self) -> None:
        self.pending = False
        gc.collect()
        _malloc_trim()


def _malloc_trim() -> None:
    """Give the heap's free pages back to the system (glibc; elsewhere nothing): freed, the
    TLS layers' buffers stay in the heap otherwise (162 MiB resident against 53 after it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


_SWEEPER = _Sweeper()


def _deliver(protocol: Any, data: bytes) -> None:
    """``data`` to ``protocol`` as a transport would hand it over (a buffered protocol by
    what it has: uvloop's TLS layer is one without being an asyncio.BufferedProtocol)."""
    if hasattr(protocol, "buffer_updated"):
        view = memoryview(data)
        while view:
            buf = protocol.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            protocol.buffer_updated(n)
            view = view[n:]
    else:
        protocol.data_received(data)


def _eof_received(protocol: asyncio.BaseProtocol) -> bool | None:
    eof_received = getattr(protocol, "eof_received", None)
    return None if eof_received is None else eof_received()
