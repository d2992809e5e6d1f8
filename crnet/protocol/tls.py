"""Optional mutual TLS on the tree's links (``--tls-cert``, ``--tls-key``, ``--tls-ca``).

The cluster secret (``crnet.protocol.auth``) proves who a peer is, once, at the start of a link;
it does not protect what follows. On a network where someone may sit on the path
between two hosts (and rewrite chunks), TLS does: every frame is encrypted and
authenticated. Both sides present a certificate signed by the cluster's own CA and
check the other's; host names are not checked by default (peers are addressed by IP,
and any host holding a certificate from that CA is a member), so keep the CA to the
cluster. TLS 1.3 only.

With ``--tls-names`` a host's certificate also says which host it is: a DNS
subjectAltName equal to its ``--host-id`` (compared exactly; the subject's CN is not
read). crnetd checks at startup that its own certificate names its host id
(``own_names``: the certificate as a peer sees it, after a handshake with itself). A
parent takes a child's host id (HELLO) only from a child whose certificate names it,
and spread's peer links check every rank's host id, as the master gives it (ASSIGN),
against the certificate at the other end: the dialer the acceptor's, the acceptor the
dialer's (``node/peers/identity.py``). So where a parent says its child listens is no
longer enough to answer for the child's rank: that takes the child's key.

The secret handshake still runs inside TLS, bound to the TLS connection it runs on
(``channel_binding``): a stolen certificate and key alone do not admit a host, and
they do not let their holder relay a real host's handshake into a connection of its
own either (what it would need on the path to read the gradients): the two sides of
a relay hold two different TLS connections, so each side's MAC is wrong for the other.
What a stolen key still allows: serving as one of the cluster's hosts to whoever
checks nothing but the certificate (a metrics scraper over HTTPS), and, with the
secret too, everything a host may. Since the binding is part of the MACs over TLS,
every host of a tree that uses TLS must bind (crnet since issue 26), and no
TLS-terminating proxy may stand between two hosts.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

from ..errors import ProtocolError
from .private_files import check_private

__all__ = ["TlsFiles", "channel_binding", "contexts", "names", "own_names"]


@dataclass(frozen=True)
class TlsFiles:
    cert: str        # this host's certificate chain (PEM)
    key: str         # its private key (PEM)
    ca: str          # the cluster CA that signed every host's certificate (PEM)


def contexts(files: TlsFiles, shared_gid: int | None = None) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(for accepting, for dialing): both require and verify the peer's certificate.
    Raises ``ssl.SSLError`` or ``OSError`` for files that cannot be loaded, and
    ``ValueError`` for a key other users may read, change or replace
    (``crnet.protocol.private_files``; ``shared_gid``: a group that must not read it)."""
    check_private(files.key, os.stat(files.key), "this host's TLS key", shared_gid)
    accept = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    dial = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for ctx in (accept, dial):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_cert_chain(files.cert, files.key)
        ctx.load_verify_locations(files.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    dial.check_hostname = False          # see the module docstring
    return accept, dial


def channel_binding(transport) -> bytes:
    """What binds a handshake to this TLS connection (empty on plain TCP): the client's
    Finished message of its TLS handshake, the same at both ends and different on every
    connection (a MAC over the whole handshake, both sides' key shares and certificates
    included, under a key only the two ends know; sent encrypted). Python's ``ssl``
    offers no keying-material exporter (RFC 9266's ``tls-exporter``);
    ``get_channel_binding("tls-unique")`` returns that Finished message under TLS 1.3
    too, where RFC 8446 leaves ``tls-unique`` undefined."""
    ssl_object = None if transport is None else transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return b""
    binding = ssl_object.get_channel_binding("tls-unique")
    if not binding:        # never after a completed handshake; fail closed if it were
        raise ProtocolError("this TLS connection offers no channel binding")
    return binding


def names(transport) -> tuple[str, ...]:
    """The host names (DNS subjectAltNames) of the certificate at the other end of a TLS
    connection; () on plain TCP, or for a certificate that names none."""
    ssl_object = None if transport is None else transport.get_extra_info("ssl_object")
    cert = None if ssl_object is None else ssl_object.getpeercert()
    return _dns_names(cert)


def _dns_names(cert: dict | None) -> tuple[str, ...]:
    if not cert:
        return ()
    return tuple(value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS")


def own_names(files: TlsFiles) -> tuple[str, ...]:
    """The host names this host's certificate gives, as a peer of it sees them: read from
    a TLS handshake between this host's own two contexts in memory (so the certificate
    also chains to ``files.ca``, or this raises ``ssl.SSLError``)."""
    accept, dial = contexts(files)
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server = accept.wrap_bio(server_in, server_out, server_side=True)
    client = dial.wrap_bio(client_in, client_out, server_side=False)
    done = {server: False, client: False}
    for _ in range(16):   # TLS 1.3 takes two flights each way; more means it is stuck
        for end, out, into in ((client, client_out, server_in), (server, server_out, client_in)):
            if not done[end]:
                try:
                    end.do_handshake()
                    done[end] = True
                except ssl.SSLWantReadError:
                    pass
            into.write(out.read())
        if all(done.values()):
            return _dns_names(client.getpeercert())
    raise ssl.SSLError("the TLS handshake with this host's own certificate did not finish")
