"""Optional mutual TLS on the tree's links (``--tls-cert``, ``--tls-key``, ``--tls-ca``).

The cluster secret (``crnet.auth``) proves who a peer is, once, at the start of a link;
it does not protect what follows. On a network where someone may sit on the path
between two hosts (and rewrite chunks), TLS does: every frame is encrypted and
authenticated. Both sides present a certificate signed by the cluster's own CA and
check the other's; host names are not checked (peers are addressed by IP, and any
host holding a certificate from that CA is a member), so keep the CA to the cluster.
TLS 1.3 only. The secret handshake still runs inside TLS: a stolen certificate alone
does not admit a host.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

from .private_files import check_private

__all__ = ["TlsFiles", "contexts"]


@dataclass(frozen=True)
class TlsFiles:
    cert: str        # this host's certificate chain (PEM)
    key: str         # its private key (PEM)
    ca: str          # the cluster CA that signed every host's certificate (PEM)


def contexts(files: TlsFiles, shared_gid: int | None = None) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(for accepting, for dialing): both require and verify the peer's certificate.
    Raises ``ssl.SSLError`` or ``OSError`` for files that cannot be loaded, and
    ``ValueError`` for a key other users may read, change or replace
    (``crnet.private_files``; ``shared_gid``: a group that must not read it)."""
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
