"""What a peer link carries, as the ring's first senders cut their segments by it
(``Neighbours.link_rate``): TCP's bytes acknowledged over its busy time, and nothing for a
link that is down or has carried nothing. Over a real loopback socket pair."""

import socket
from types import SimpleNamespace

import pytest

from crnet.node import neighbours
from crnet.node.neighbours import Neighbours
from crnet.protocol.tcp_info import TcpInfo

pytestmark = pytest.mark.timeout(10)


class Link:
    """A peer link as ``tcp_info`` reads it: its transport's socket."""

    def __init__(self, sock: socket.socket):
        self.transport = SimpleNamespace(get_extra_info=lambda name: sock if name == "socket" else None)
        self.is_closing = False


@pytest.fixture
def pair():
    server = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(server.getsockname())
    receiver, _ = server.accept()
    yield sender, receiver
    for s in (sender, receiver, server):
        s.close()


def test_a_link_that_carried_bytes_has_a_rate_and_a_link_that_is_down_has_none(pair):
    sender, receiver = pair
    nb = Neighbours()
    assert nb.link_rate(1) is None                    # no link to peer 1
    nb.peer_up(1, Link(sender))  # type: ignore[arg-type]
    assert nb.link_rate(1) is None                    # up, but it carried nothing yet
    for _ in range(64):                               # 64 MB: long enough to count busy time
        sender.sendall(b"x" * (1 << 20))
        got = 0
        while got < 1 << 20:
            got += len(receiver.recv(1 << 20))
    rate = nb.link_rate(1)
    assert rate is not None and rate > 1e6            # loopback: far beyond 1 MB/s
    nb.peer_down(1)
    assert nb.link_rate(1) is None


def test_the_rate_is_what_the_link_carried_while_busy_not_its_newest_burst(pair, monkeypatch):
    """Behind a shaper's bucket a part goes at line rate: the kernel's newest delivery
    rate says so, the link's bytes over its busy time do not."""
    monkeypatch.setattr(neighbours, "tcp_info",
                        lambda conn: TcpInfo(1e-4, 1e-4, 125_000_000, 1.0, 3.1e9))
    nb = Neighbours()
    nb.peer_up(2, Link(pair[0]))  # type: ignore[arg-type]
    assert nb.link_rate(2) == 125e6
