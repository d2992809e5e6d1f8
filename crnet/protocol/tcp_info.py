"""A TCP link's own account of itself (Linux ``TCP_INFO``): round-trip times and throughput.

Read when someone asks (``crnet status --json``, ``crnet tune``, a metrics scrape), never
per frame or per step: one ``getsockopt`` per link. The kernel counts, for the
connection's life, the bytes the peer acknowledged and the time the socket was busy
sending (data in flight or waiting to go: ``tcpi_busy_time``), so their ratio is the
throughput the link achieved while it had something to send, however idle it was in
between. Two things make that ratio low for short messages: the busy time is counted in
the kernel's ticks (4 ms at HZ=250: a message sent in 50 us counts a tick), and it runs
until the last byte is acknowledged (a delayed ACK, up to 40 ms, when nothing goes back).
So the kernel's own delivery-rate estimate (``tcpi_delivery_rate``, from the ACKs of the
newest flight, as BBR uses it) is kept too: what ``crnet tune`` takes for bandwidth.
Elsewhere (another OS, a Unix socket, an old kernel) there is nothing: None.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["TcpInfo", "read", "tcp_info"]


class Link(Protocol):
    """What ``tcp_info`` reads a link through (a ``transport.Connection``, which imports
    this module to follow its paced links: ``read``)."""

    transport: Any

    @property
    def is_closing(self) -> bool: ...

# Offsets in Linux's struct tcp_info (include/uapi/linux/tcp.h); busy_time came with 4.10.
_RTT, _MIN_RTT = 68, 148                       # u32, microseconds
_BYTES_ACKED, _DELIVERY_RATE, _BUSY_TIME = 120, 160, 168   # u64: bytes, bytes/s, microseconds
_SIZE = _BUSY_TIME + 8


@dataclass(frozen=True)
class TcpInfo:
    rtt: float               # seconds, smoothed
    min_rtt: float           # seconds, the least seen lately
    bytes_acked: int         # bytes sent that the peer acknowledged
    busy_seconds: float      # time with data in flight or queued to send
    delivery_rate: float     # bytes/s, the kernel's latest estimate

    @property
    def throughput(self) -> float | None:
        """Bytes per second while it was sending; None if it never was."""
        return self.bytes_acked / self.busy_seconds if self.busy_seconds > 0 else None


def tcp_info(conn: Link | None) -> TcpInfo | None:
    """``conn``'s TCP_INFO, or None where there is none to read."""
    option = getattr(socket, "TCP_INFO", None)
    if conn is None or conn.transport is None or conn.is_closing or option is None:
        return None
    return read(conn.transport.get_extra_info("socket"))


def read(sock) -> TcpInfo | None:
    """A TCP socket's TCP_INFO, or None where there is none to read."""
    option = getattr(socket, "TCP_INFO", None)
    if sock is None or option is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, option, _SIZE)
    except OSError:
        return None
    if len(raw) < _SIZE:
        return None
    rtt, = struct.unpack_from("I", raw, _RTT)
    min_rtt, = struct.unpack_from("I", raw, _MIN_RTT)
    acked, = struct.unpack_from("Q", raw, _BYTES_ACKED)
    rate, busy = struct.unpack_from("QQ", raw, _DELIVERY_RATE)
    return TcpInfo(rtt / 1e6, min_rtt / 1e6, acked, busy / 1e6, float(rate))
