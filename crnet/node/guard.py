"""The authentication handshake in front of a tree link (``crnet.auth`` has the math).

``Accepting`` stands before a ``ChildLink`` on every accepted TCP connection, and
``Dialing`` before a ``ParentLink`` or ``SuccessorLink`` on every dialed one. Each is a
``transport.Handler`` that lets nothing through to the link until the peer has proved
that it holds the cluster secret; from then on it passes every frame straight on. An
acceptor without a secret passes the hello on at once, as before; one with a secret
refuses a hello that carries no nonce. A dialer with a secret refuses a peer that
welcomes it without a challenge (it could be anyone).
"""

from __future__ import annotations

import dataclasses
import logging

from ..auth import mac, new_nonce, verify
from ..errors import ProtocolError
from ..messages import Challenge, Hello, Message, PeerHello, Proof, Refuse
from ..transport import Connection, Handler

log = logging.getLogger("crnet.node")


def _claim(hello: Hello | PeerHello) -> tuple[str, str]:
    """The role and name a hello claims: what its handshake binds."""
    if isinstance(hello, PeerHello):
        return "ring", str(hello.rank)
    return "child", hello.name or ""


class Accepting:
    """An accepted connection, until its peer has authenticated (with a secret)."""

    def __init__(self, inner: Handler, secret: bytes | None):
        self.inner = inner
        self.secret = secret
        self.open = False
        self._hello: Hello | PeerHello | None = None
        self._nonce = b""

    def payload_dest(self, conn: Connection, msg: Message, nbytes: int):
        if self.open:
            return self.inner.payload_dest(conn, msg, nbytes)
        if self._hello is None:
            raise ProtocolError(f"unexpected {msg.TYPE.name} from a peer before HELLO")
        raise ProtocolError(f"{msg.TYPE.name} with a payload before authentication")

    def received(self, conn: Connection, msg: Message, payload) -> None:
        if self.open:
            self.inner.received(conn, msg, payload)
        elif self._hello is None:
            self._hello_from(conn, msg)
        elif isinstance(msg, Proof):
            hello, theirs = self._hello, getattr(self._hello, "nonce", None)
            assert self.secret is not None and theirs is not None
            role, name = _claim(hello)
            if not verify(mac(self.secret, "dialer", theirs, self._nonce, role, name), msg.mac):
                log.warning("%s failed to authenticate as %s %r: wrong secret", conn.label,
                            role, name[:64])
                _refuse(conn, "authentication failed: this node and the tree hold different "
                              "secrets (--secret-file)")
                return
            self.open = True
            conn.authenticated = True
            self.inner.received(conn, hello, None)
        else:
            raise ProtocolError(f"{msg.TYPE.name} before the handshake's PROOF")

    def _hello_from(self, conn: Connection, msg: Message) -> None:
        if not isinstance(msg, (Hello, PeerHello)):
            raise ProtocolError(f"unexpected {msg.TYPE.name} from a peer before HELLO")
        if self.secret is None:
            self.open = True
            self.inner.received(conn, msg, None)
            return
        if msg.nonce is None:
            log.warning("%s sent a hello without authentication; refused", conn.label)
            _refuse(conn, "this tree requires authentication: start the node with the "
                          "cluster's --secret-file")
            return
        self._hello = msg
        self._nonce = new_nonce()
        role, name = _claim(msg)
        conn.send(Challenge(self._nonce, mac(self.secret, "acceptor", msg.nonce, self._nonce,
                                             role, name)))

    def lost(self, conn: Connection, exc: Exception | None) -> None:
        if self.open:
            self.inner.lost(conn, exc)


class Dialing:
    """A connection this node dialed, until the peer has authenticated (with a secret).
    ``hello`` adds this side's nonce to the hello the dialer sends."""

    def __init__(self, inner: Handler, secret: bytes | None):
        self.inner = inner
        self.secret = secret
        self.open = secret is None
        self._hello: Hello | PeerHello | None = None

    def hello(self, msg: Hello | PeerHello) -> Hello | PeerHello:
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
            self.inner.received(conn, msg, None)     # e.g. authentication failed: say why
        elif isinstance(msg, Challenge) and self._hello is not None:
            assert self.secret is not None and self._hello.nonce is not None
            role, name = _claim(self._hello)
            ours = self._hello.nonce
            if not verify(mac(self.secret, "acceptor", ours, msg.nonce, role, name), msg.mac):
                self._refused(conn, f"{conn.label} failed to authenticate: it holds another "
                                    "secret (--secret-file)")
                return
            conn.send(Proof(mac(self.secret, "dialer", ours, msg.nonce, role, name)))
            self.open = True
            conn.authenticated = True
        else:
            self._refused(conn, f"{conn.label} answered {msg.TYPE.name} without authenticating "
                                "itself: it does not hold this cluster's secret")

    def _refused(self, conn: Connection, reason: str) -> None:
        self.inner.received(conn, Refuse(reason), None)   # the link's usual refusal path
        conn.close()

    def lost(self, conn: Connection, exc: Exception | None) -> None:
        self.inner.lost(conn, exc)


def _refuse(conn: Connection, reason: str) -> None:
    conn.send(Refuse(reason))
    conn.close()
