"""Who is at the other end of a Unix socket, as the kernel says (``SO_PEERCRED``).

The daemon admits training processes by it (``node/client_socket.py``); a training process
checks by it that the daemon it reconnects to runs as the one it first connected to did
(``client/aio.py``): a socket path is only a name, and after a daemon stopped another
user may have bound it.
"""

from __future__ import annotations

import socket
import struct

__all__ = ["peer_credentials"]

_CREDS = struct.Struct("3i")         # struct ucred: pid, uid, gid


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, from the kernel."""
    return _CREDS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size))
