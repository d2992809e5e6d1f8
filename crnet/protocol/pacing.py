"""How much of a paced link the kernel holds: a send buffer that follows the link.

A paced link (spread's peer links: ``Connection.pace``) lets the kernel hold at most
``unsent`` bytes not yet sent (TCP_NOTSENT_LOWAT), so that a host's sends go out one link
at a time. Its send buffer (SO_SNDBUF) bounds the bytes in flight as well: too small, and
it caps the link at about buffer / RTT (64 KiB over a 20 us RTT is 26 Gbit/s, below a
100 Gbit/s link), or waits on delayed ACKs; too large, and on a link slower than the host
(a shaped 1 Gbit/s port) every flow keeps a window of segments queued at the switch, and
a few hosts sending to one overflow its queue (TCP incast: drops, retransmission
timeouts; docs/spread.md). So it follows the link as TCP measures it, as BBR sizes its
window: ``FOLLOW_GAIN`` bandwidth-delay products, the newest delivery rate times the
least RTT seen. Where the link is the bottleneck, the rate is the link's and the least
RTT the unloaded one, and the buffer stays at its floor (a few segments); where nothing
queues (srtt near the least RTT: the buffer was the bottleneck), each look may double it.
Pure arithmetic: the connection reads TCP_INFO and sets the option (``transport.py``).
"""

from __future__ import annotations

__all__ = ["FOLLOW_GAIN", "FOLLOW_MAX", "send_buffer"]

FOLLOW_GAIN = 2          # bandwidth-delay products a paced link's send buffer holds
FOLLOW_MAX = 4 << 20     # ... at most (Linux's default tcp_wmem maximum)


def send_buffer(floor: int, current: int, delivery_rate: float, min_rtt: float) -> int:
    """A paced link's send buffer in bytes (what SO_SNDBUF is set to), looked at again
    now: ``FOLLOW_GAIN`` x ``delivery_rate`` (bytes/s) x ``min_rtt`` (s), never below
    ``floor`` (the pacing's: ``unsent``, and a few segments so that no write waits on a
    delayed ACK), never above ``FOLLOW_MAX``, and at most twice ``current`` (a burst a
    shaper let through at line rate does not make it leap; a buffer that is the
    bottleneck still doubles every look)."""
    target = int(FOLLOW_GAIN * max(delivery_rate, 0.0) * max(min_rtt, 0.0))
    return max(floor, min(target, 2 * current, FOLLOW_MAX))
