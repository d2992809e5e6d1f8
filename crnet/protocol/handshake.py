"""The dialer's side of the authentication handshake (``crnet.protocol.auth`` has the math).

``Dialing`` stands before whatever dialed a TCP connection to a node: a daemon's
``ParentLink`` or ``PeerLink``, and the ``crnet status`` client. It lets nothing
through until the peer has proved that it holds the cluster secret; from then on it
passes every frame straight on. A dialer with a secret drops a peer that welcomes it
without a challenge, or fails it (it could be anyone): the handler's ``reject``. Such
a peer's REFUSE is not taken at its word either (anyone can send one). The
acceptor's side is the daemon's alone (``crnet/node/admission/guard.py``); ``claim`` is what
both sides bind into the MACs.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from ..errors import ProtocolError
from ..peer_text import shown
from .auth import mac, new_nonce, verify
from .messages import Challenge, Hello, Message, PeerHello, Proof, Refuse, StatusHello
from .tls import channel_binding
from .transport import Connection, Handler


def claim(hello: Hello | PeerHello | StatusHello) -> tuple[str, str]:
    """The role and name a hello claims: what its handshake binds. A child's host id
    too (it picks the slot), and where it listens (its ring predecessor and peers dial
    it there): NUL cannot occur in a host id or an address the parent takes, so the
    parts are unambiguous; without ``listen`` the claim is as before."""
    if isinstance(hello, PeerHello):
        return "ring", str(hello.rank)
    if isinstance(hello, StatusHello):
        return "status", ""
    name = hello.name or ""
    if hello.listen is not None:
        return "child", f"{name}\0{hello.host or ''}\0{hello.listen}"
    return "child", name if hello.host is None else f"{name}\0{hello.host}"


class Dialed(Handler, Protocol):
    """The handler behind a ``Dialing`` guard (a daemon's parent and ring links, the status client)."""

    def reject(self, conn: Connection, reason: str) -> None:
        """The peer is no good: close the connection; the node dials again later."""


class Dialing:
    """A connection this node dialed, until the peer has authenticated (with a secret).
    ``hello`` adds this side's nonce to the hello the dialer sends."""

    def __init__(self, inner: Dialed, secret: bytes | None):
        self.inner = inner
        self.secret = secret
        self.open = secret is None
        self._hello: Hello | PeerHello | StatusHello | None = None

    def hello(self, msg: Hello | PeerHello | StatusHello) -> Hello | PeerHello | StatusHello:
        if self.secret is None:
            return msg
        self._hello = dataclasses.replace(msg, nonce=new_nonce())
        return self._hello

    def payload_dest(self, conn: Connection, msg: Message, nbytes: int):
        if self.open:
            return self.inner.payload_dest(conn, msg, nbytes)
        raise ProtocolError(f"{msg.TYPE.name} with a payload before authentication")

    def received(self, conn: Connection, msg: Message, payload) -> None:
        if self.open:
            self.inner.received(conn, msg, payload)
        elif isinstance(msg, Refuse):
            # Before the peer proved itself: anyone may have said it (say why, then dial
            # again). After, a refusal goes to the link like any message.
            self.inner.reject(conn, f"{conn.label} refused this node before authenticating "
                                    f"itself: {shown(msg.reason)}")
        elif isinstance(msg, Challenge) and self._hello is not None:
            assert self.secret is not None and self._hello.nonce is not None
            role, name = claim(self._hello)
            ours = self._hello.nonce
            bound = channel_binding(conn.transport)
            if not verify(mac(self.secret, "acceptor", ours, msg.nonce, role, name, bound), msg.mac):
                self.inner.reject(conn, f"{conn.label} failed to authenticate: it holds another "
                                        "secret (--secret-file), or is not this node's peer")
                return
            conn.send(Proof(mac(self.secret, "dialer", ours, msg.nonce, role, name, bound)))
            self.open = True
            conn.authenticated = True
        else:
            self.inner.reject(conn, f"{conn.label} answered {msg.TYPE.name} without "
                                    "authenticating itself: it does not hold this cluster's "
                                    "secret")

    def lost(self, conn: Connection, exc: Exception | None) -> None:
        self.inner.lost(conn, exc)
