"""The authentication handshake in front of a tree link (``crnet.protocol.auth`` has the math).

``Accepting`` stands before a ``ChildLink`` on every accepted TCP connection (admitted
and timed by the ``Doorway``, ``doorway.py``; with TLS, from before its TLS handshake:
``tls_door.py``), and ``Dialing`` (``crnet/protocol/handshake.py``, which the ``crnet
status`` client uses too) before a ``ParentLink`` or ``PeerLink`` on every dialed one.
Each lets nothing through to the link until the peer has proved that it holds the
cluster secret. ``Accepting`` is the connection's ``transport.Handler`` only until then:
it hands the connection over, the link is its handler from then on, and no later frame
(a chunk from a child) passes through it. (``Dialing`` stays in front of its link and
passes every frame on: handing a dialed connection over too let a spread host that
rejoined stop receiving its peers' pieces in tests/tree/test_spread_faults.py's
random faults, 1 run in 4; not understood yet.) An acceptor without a secret hands over at the hello, as
before; one with a secret refuses a hello that carries no nonce. A dialer with a
secret drops a peer that welcomes it without a challenge, or fails it (it could be
anyone): the link's ``reject``, after which the node dials again. Such a peer's REFUSE
is not taken at its word either (anyone can send one): only an authenticated peer's
refusal for good stops a node (exit 2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ...errors import ProtocolError
from ...peer_text import Throttle, shown
from ...protocol.auth import mac, new_nonce, verify
from ...protocol.handshake import claim
from ...protocol.messages import Challenge, Hello, Message, PeerHello, Proof, Refuse, StatusHello, before_auth
from ...protocol.tls import channel_binding
from ...protocol.transport import Connection, Handler
from ...protocol.wire import Limits
from .doorway import Doorway

log = logging.getLogger("crnet.node")


# What a peer may send before its hello has been acted on: a few small frame types,
# checked before their headers are decoded (wire.Limits).
HANDSHAKE_LIMITS = Limits(max_header=1024, max_payload=0, max_str=512, max_items=16,
                          types=before_auth())   # HELLO, PEER_HELLO, PROOF, STATUS_HELLO


class Accepting:
    """An accepted connection, until its peer has authenticated (with a secret). It
    starts with ``HANDSHAKE_LIMITS``; through, the connection gets ``limits()`` and the
    link as its handler."""

    def __init__(self, inner: Handler, secret: bytes | None, doorway: Doorway,
                 limits: Callable[[], Limits], warnings: Throttle | None = None):
        self.inner = inner
        self.secret = secret
        self._doorway = doorway
        self._limits = limits
        self._warnings = warnings or Throttle(log)   # the node's: one per peer address
        self._hello: Hello | PeerHello | StatusHello | None = None
        self._nonce = b""
        self._refused = False   # and logged

    def made(self, conn: Connection) -> None:
        if not self._doorway.enter(conn):
            conn.abort("too many connections in their handshake")

    def _pass(self, conn: Connection, hello: Hello | PeerHello | StatusHello) -> None:
        """Through the handshake: the link takes the connection over, with its own limits."""
        self._doorway.leave(conn)
        if conn.authenticated:   # a host of the tree: it gets the doorway's reserve from now on
            self._doorway.know(_address(conn))
        conn.set_limits(self._limits())
        conn.handler = self.inner
        self.inner.received(conn, hello, None)

    def payload_dest(self, conn: Connection, msg: Message, nbytes: int):
        if self._hello is None:
            raise ProtocolError(f"unexpected {msg.TYPE.name} from a peer before HELLO")
        raise ProtocolError(f"{msg.TYPE.name} with a payload before authentication")

    def received(self, conn: Connection, msg: Message, payload) -> None:
        if self._hello is None:
            self._hello_from(conn, msg)
        elif isinstance(msg, Proof):
            hello, theirs = self._hello, getattr(self._hello, "nonce", None)
            assert self.secret is not None and theirs is not None
            role, name = claim(hello)
            bound = channel_binding(conn.transport)
            if not verify(mac(self.secret, "dialer", theirs, self._nonce, role, name, bound), msg.mac):
                self._warnings.warning((_address(conn), "wrong secret"),
                                       "%s failed to authenticate as %s %s: wrong secret",
                                       conn.label, role, shown(name))
                self._refused = True
                _refuse(conn, "authentication failed: this node and the tree hold different "
                              "secrets (--secret-file)")
                return
            conn.authenticated = True
            self._pass(conn, hello)
        else:
            raise ProtocolError(f"{msg.TYPE.name} before the handshake's PROOF")

    def _hello_from(self, conn: Connection, msg: Message) -> None:
        if not isinstance(msg, (Hello, PeerHello, StatusHello)):
            raise ProtocolError(f"unexpected {msg.TYPE.name} from a peer before HELLO")
        if self.secret is None:
            self._pass(conn, msg)
            return
        if msg.nonce is None:
            self._warnings.warning((_address(conn), "no authentication"),
                                   "%s sent a hello without authentication; refused", conn.label)
            self._refused = True
            _refuse(conn, "this tree requires authentication: start the node with the "
                          "cluster's --secret-file")
            return
        self._hello = msg
        self._nonce = new_nonce()
        role, name = claim(msg)
        conn.send(Challenge(self._nonce, mac(self.secret, "acceptor", msg.nonce, self._nonce,
                                             role, name, channel_binding(conn.transport))))

    def lost(self, conn: Connection, exc: Exception | None) -> None:
        """Lost in the handshake (once through, the link hears of it instead)."""
        self._doorway.leave(conn)
        if self._hello is not None and not self._refused:
            # A node with another secret finds this daemon's challenge wrong and hangs up
            # before its PROOF: without this line, the refusal left nothing in this log.
            role, name = claim(self._hello)
            self._warnings.warning((_address(conn), "no proof"),
                                   "%s (as %s %s) hung up after the challenge without proving it "
                                   "holds the secret: refused; it holds another --secret-file, or "
                                   "is not a crnet daemon", conn.label, role, shown(name))


def _address(conn: Connection) -> str:
    return conn.label.rpartition(":")[0]


def _refuse(conn: Connection, reason: str) -> None:
    conn.send(Refuse(reason))
    conn.close()
