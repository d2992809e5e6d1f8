"""Mutual authentication of the tree's TCP links: HMAC-SHA256 over a cluster secret.

Every host of a cluster holds the same secret (``--secret-file``). A link is
authenticated in one round trip on top of the hello the dialer sends anyway:

1. dialer -> acceptor: HELLO (or PEER_HELLO) with a fresh nonce ``a``;
2. acceptor -> dialer: CHALLENGE(nonce ``b``, MAC of the acceptor over the transcript);
3. dialer -> acceptor: PROOF(MAC of the dialer over the same transcript).

The transcript binds both fresh nonces, the dialer's role (a child, a ring
predecessor) and the name it claims (a child's host id and listening address
too: ``handshake.claim``), so a recorded handshake is useless on another
connection (the other side's nonce differs) and a proof for one name does not
admit another. The two MACs differ by a side label, so one side's answer cannot
be reflected back as the other's. Over TLS the transcript also binds the TLS
connection itself (``crnet.protocol.tls.channel_binding``): a relay that holds a stolen
certificate and passes the handshake between two TLS connections of its own makes
both MACs wrong. MACs are compared in constant time. Nothing else a dialer sends is
read until its proof checks out (``node/admission/guard.py``).

This module is pure: no sockets, no state.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets

import msgpack

from .private_files import check_private

PROTOCOL = "crnet-auth-1"
NONCE_BYTES = 32
MAC_BYTES = 32                    # SHA-256
MIN_SECRET_BYTES = 16

__all__ = ["MAC_BYTES", "NONCE_BYTES", "is_loopback", "load_secret", "mac", "new_nonce",
           "verify"]


def load_secret(path: str | os.PathLike, shared_gid: int | None = None,
                what: str = "the cluster secret") -> bytes:
    """The cluster secret in ``path`` (surrounding whitespace stripped). ValueError if it
    is shorter than 16 bytes, or if other users may read, change or replace it
    (``crnet.protocol.private_files``; ``shared_gid``: a group that must not read it)."""
    with open(path, "rb") as f:
        check_private(path, os.fstat(f.fileno()), what, shared_gid)
        secret = f.read().strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{os.fspath(path)} holds {len(secret)} bytes; a cluster secret needs "
                         f"at least {MIN_SECRET_BYTES} (e.g. `openssl rand -hex 32 > {path}`)")
    return secret


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` keeps the port to this machine (no secret needed)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False       # a name that may resolve anywhere


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def mac(secret: bytes, side: str, dialer_nonce: bytes, acceptor_nonce: bytes, role: str,
        name: str, binding: bytes = b"") -> bytes:
    """One side's MAC over the handshake's transcript (``side``: "dialer" or "acceptor").
    ``binding``: the TLS channel's (``crnet.protocol.tls.channel_binding``; empty on plain TCP,
    where the transcript is what it was before channel binding)."""
    fields = [PROTOCOL, side, role, name, dialer_nonce, acceptor_nonce]
    if binding:
        fields.append(binding)
    return hmac.new(secret, msgpack.packb(fields), hashlib.sha256).digest()


def verify(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)
