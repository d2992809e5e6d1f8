"""systemd's notify protocol (crnet/node/observe/notify.py): what real crnetd processes tell it.

Each daemon under test gets ``NOTIFY_SOCKET`` pointing at a Unix datagram socket the test
binds (a path, or an abstract ``@name``), as systemd does for a ``Type=notify`` unit.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from crnet.client import Client
from crnet.coding.plan import Tree
from crnet.node.observe.notify import Notifier
from crnet.tools.launch import MASTER, LocalTree


class FakeSystemd:
    """The receiving end of ``$NOTIFY_SOCKET``: every datagram, in order."""

    def __init__(self, address: str):
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.messages: list[str] = []

    def collect(self, seconds: float) -> list[str]:
        """Everything that arrives within ``seconds``; returns all messages so far."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                break
        return self.messages

    def wait_for(self, field: str, seconds: float) -> list[str]:
        """Collect until a datagram carries ``field`` (a whole line, e.g. READY=1)."""
        deadline = time.monotonic() + seconds
        while not self.has(field):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {field} within {seconds} s; got {self.messages}")
            self.collect(min(left, 0.2))
        return self.messages

    def has(self, field: str) -> bool:
        return any(field in m.split("\n") for m in self.messages)

    def statuses(self) -> list[str]:
        return [line[len("STATUS="):] for m in self.messages for line in m.split("\n")
                if line.startswith("STATUS=")]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def systemd(tmp_path):
    made: list[FakeSystemd] = []

    def make(name: str, abstract: bool = False) -> FakeSystemd:
        address = (f"@crnet-test-{secrets.token_hex(6)}" if abstract
                   else str(tmp_path / f"notify-{name or 'master'}.sock"))
        made.append(FakeSystemd(address))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_ready_comes_only_once_the_node_holds_its_assignment(tmp_path, systemd):
    """Master with 2 workers: the first worker joins, but the tree cannot be planned
    while the second is missing, so it is not READY; the second joins and both are."""
    tree = Tree((2,), (1,))
    sockets = {MASTER: systemd(MASTER, abstract=True), "0": systemd("0"), "1": systemd("1")}
    extra = {"0": {"WATCHDOG_USEC": "200000"}}   # a ping every 0.1 s

    def spawn(name, argv, kwargs):
        env = dict(kwargs["env"], NOTIFY_SOCKET=sockets[name].address, **extra.get(name, {}))
        return subprocess.Popen(argv, **dict(kwargs, env=env))

    lt = LocalTree(tree, 600, workdir=tmp_path / "tree", spawn=spawn, strict=True, timeout=5)
    try:
        lt.start_node(MASTER)
        master = sockets[MASTER].wait_for("READY=1", 20)   # it listens: ready at once
        assert re.fullmatch(r"master: 0/2 workers joined \(listening on 127\.0\.0\.1:\d+\)",
                            sockets[MASTER].statuses()[0]), master

        lt.start_node("0")
        first = sockets["0"]
        first.wait_for("STATUS=joined as 0, waiting for the assignment", 20)
        first.collect(1.5)                                # worker 1 is still missing
        assert not first.has("READY=1"), first.messages
        assert first.has("WATCHDOG=1")                    # alive, but not ready

        lt.start_node("1")
        for name in ("0", "1"):
            sockets[name].wait_for("READY=1", 20)
        ready = next(m for m in first.messages if "READY=1" in m.split("\n"))
        assert "STATUS=node 0: assigned, running" in ready.split("\n")
        sockets[MASTER].wait_for("STATUS=master: all 2 workers joined, running", 5)

        # Steps: a STATUS line with the step and the stragglers (at most one a second).
        with Client(lt.socket_path("0"), timeout=30) as c:
            for step in range(3):
                c.allreduce(np.ones(8, dtype=np.float32), step=step)
        sockets[MASTER].collect(1.5)
        steps = [s for s in sockets[MASTER].statuses() if " step " in f" {s}"]
        assert steps and re.fullmatch(r"master: step 2, \d stragglers? last step, 3 done, "
                                      r"0 failed", steps[-1]), sockets[MASTER].statuses()

        # The watchdog: every WATCHDOG_USEC / 2, from the event loop.
        pings = sum(m == "WATCHDOG=1" for m in first.collect(0.6))
        assert pings >= 8, first.messages
        frozen = len(first.messages)
        lt.signal("0", signal.SIGSTOP)                     # a frozen daemon stops the pings
        first.collect(0.5)
        lt.signal("0", signal.SIGCONT)
        assert len(first.messages) - frozen <= 2          # those sent before it stopped

        lt.signal("0", signal.SIGTERM)
        assert lt.procs["0"].wait(10) == 0
        first.collect(0.2)
        assert "STOPPING=1" in first.messages[-1].split("\n"), first.messages
        assert not sockets["1"].has("STOPPING=1")         # only the daemon that stopped
    finally:
        lt.stop()
        problems = lt.problems()
    assert not problems, problems


def test_no_notify_socket_sends_nothing(monkeypatch):
    assert not Notifier({}).enabled
    assert not Notifier({"NOTIFY_SOCKET": "relative/path"}).enabled
    Notifier({}).send("READY=1")                            # a no-op, not an error


def test_watchdog_is_for_this_process_only(tmp_path):
    base = {"NOTIFY_SOCKET": str(tmp_path / "n.sock"), "WATCHDOG_USEC": "3000000"}
    assert Notifier(base).watchdog == 1.5
    assert Notifier(dict(base, WATCHDOG_PID=str(os.getpid()))).watchdog == 1.5
    assert Notifier(dict(base, WATCHDOG_PID="1")).watchdog is None     # another process's
    assert Notifier({"WATCHDOG_USEC": "3000000"}).watchdog is None      # nowhere to send
    assert Notifier(dict(base, WATCHDOG_USEC="0")).watchdog is None


def test_a_missing_socket_never_stops_the_daemon(tmp_path, caplog):
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    n.send("READY=1")
    n.send("STATUS=still here")
    assert [r.getMessage() for r in caplog.records if "cannot notify" in r.getMessage()] \
        and len(caplog.records) == 1   # said once
