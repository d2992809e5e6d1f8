"""A paced link's send buffer follows the link (``crnet/protocol/pacing.py``): at its floor
where the link is the bottleneck (a shaped port: no window of segments queued at the
switch, so no incast), doubling each look where the buffer is (nothing queues: the
smoothed RTT near the least one), within its bounds."""

import pytest

from crnet.protocol.pacing import FOLLOW_GAIN, FOLLOW_MAX, send_buffer

FLOOR = 32 << 10


@pytest.mark.parametrize("rate_bits, min_rtt", [(100e6, 60e-6), (1e9, 60e-6), (10e9, 10e-6)])
def test_a_link_slower_than_the_buffer_keeps_the_floor(rate_bits, min_rtt):
    """The presets' shaped ports (100 Mbit/s, 1 Gbit/s) and a 10 Gbit/s link at 10 us: their
    bandwidth-delay product is below the floor, whatever the buffer was."""
    for current in (FLOOR, 4 * FLOOR, FOLLOW_MAX):
        assert send_buffer(FLOOR, current, rate_bits / 8, min_rtt) == FLOOR


def test_a_buffer_that_is_the_bottleneck_doubles_each_look_up_to_the_link():
    """A 100 Gbit/s link at 50 us (BDP 625 KB): the in-flight bytes are the buffer's, the
    RTT unloaded, so the delivery rate is buffer / RTT; each look doubles it until the link,
    not the buffer, sets the rate."""
    link, rtt = 100e9 / 8, 50e-6
    size, looks = FLOOR, 0
    while True:
        rate = min(link, 2 * size / rtt)   # Linux holds about twice SO_SNDBUF in flight
        after = send_buffer(FLOOR, size, rate, rtt)
        assert after <= 2 * size
        if after == size:
            break
        size, looks = after, looks + 1
    assert size == int(FOLLOW_GAIN * link * rtt) and looks == 6   # 32 KiB -> 1.25 MB


def test_the_bounds():
    assert send_buffer(FLOOR, FOLLOW_MAX, 50e9, 1e-3) == FOLLOW_MAX      # a long fat link
    assert send_buffer(FLOOR, FLOOR, 0.0, 0.0) == FLOOR                  # nothing measured yet
    assert send_buffer(FLOOR, 10 * FLOOR, -1.0, 1e-3) == FLOOR
