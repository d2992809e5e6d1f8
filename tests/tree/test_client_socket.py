"""The daemon's Unix socket: who may connect, shared memory by descriptor only, one daemon
per socket path."""

import ast
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from crnet import AsyncClient, DaemonNotRunning, RequestRejected
from crnet.coding.plan import Tree
from crnet.protocol.messages import Attach
from crnet.protocol.shm import PROGRESS_BYTES
from crnet.tools.launch import LocalTree

from ..helpers.waits import wait_for_log

pytestmark = pytest.mark.timeout(60)

TREE = Tree.regular(2, 1, 1)


async def test_the_socket_is_the_daemons_users_only(local_tree):
    lt = local_tree(TREE, 4)
    mode = stat.S_IMODE(os.stat(lt.socket_path("0")).st_mode)
    assert mode == 0o600


def hand_over(path, token, fd, capacity):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        socket.send_fds(s, [b"".join(bytes(p) for p in Attach(token, capacity).frame())], [fd])


async def test_only_sealed_memory_of_the_announced_size_is_mapped(local_tree, tmp_path):
    lt = local_tree(TREE, 4)
    c = await AsyncClient.connect(lt.socket_path("0"), timeout=30)
    try:
        # A file the process can name: the daemon never maps it (the old ATTACH took a path).
        victim = tmp_path / "victim"
        victim.write_bytes(b"secret" * 10_000)
        fd = os.open(victim, os.O_RDWR)
        hand_over(lt.socket_path("0"), c._token, fd, 64)
        os.close(fd)
        with pytest.raises(RequestRejected, match="not sealable shared memory"):
            await c._reply(type(None), 5, "attach")     # the answer comes on the control link
        # Unsealed memory could be shrunk under the daemon's mapping (SIGBUS): refused too.
        fd = os.memfd_create("loose", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, PROGRESS_BYTES + 128)
        hand_over(lt.socket_path("0"), c._token, fd, 64)
        os.close(fd)
        with pytest.raises(RequestRejected, match="not sealed against shrinking"):
            await c._reply(type(None), 5, "attach")
        # A token nobody holds: that connection is closed, nothing else happens.
        fd = os.memfd_create("x")
        hand_over(lt.socket_path("0"), "f" * 32, fd, 64)
        os.close(fd)
        await wait_for_log(lt, "0", "a token no attached training process holds")
        assert victim.read_bytes() == b"secret" * 10_000
        # The process itself goes on: its own memory is handed over the real way.
        got = await c.broadcast(np.ones(8), "k", root=True)
        np.testing.assert_array_equal(got, np.ones(8))
    finally:
        c.close()
    assert lt.alive("0")


async def test_a_second_daemon_does_not_take_a_live_daemons_socket(local_tree):
    lt = local_tree(TREE, 4)
    got = subprocess.run([sys.executable, "-m", "crnet", "daemon", "--role", "node",
                          "--parent", "127.0.0.1:1", "--client-socket", lt.socket_path("0")],
                         capture_output=True, text=True, timeout=30)
    assert got.returncode != 0 and "another crnetd is serving" in got.stderr
    c = await AsyncClient.connect(lt.socket_path("0"), timeout=30)   # the first one still serves
    c.close()


async def test_a_process_of_another_user_is_refused(local_tree):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another user")
    lt = local_tree(TREE, 4)
    # As if an operator had opened the socket up by mistake (and where anyone reaches it).
    os.chmod(lt.socket_path("0"), 0o666)
    path = f"/tmp/crnet-test-{os.getpid()}.sock"
    os.link(lt.socket_path("0"), path)

    def connect() -> bytes:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            return s.recv(10)

    got = await as_nobody(connect)()
    os.unlink(path)
    assert got == b""                     # closed on it at once
    await wait_for_log(lt, "0", "refusing a training process of uid 65534")


async def test_a_socket_path_too_long_names_the_limit_and_the_path(tmp_path):
    """Python's own error is '[Errno None] AF_UNIX path too long'."""
    from crnet.node.client_socket import ClientSocket

    path = str(tmp_path / ("d" * 100) / "0.sock")
    sock = ClientSocket(path, connect=lambda s: asyncio.sleep(0))
    with pytest.raises(OSError) as raised:
        await sock.start()
    message = str(raised.value)
    assert path in message and "108 bytes" in message and "None" not in message
    sock.close()


def test_a_client_socket_in_a_directory_every_user_can_write_is_refused(tmp_path):
    """Once the daemon stopped (its socket removed), any user could bind the path there."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o1777)                # as /tmp is: sticky does not help
    got = subprocess.run([sys.executable, "-m", "crnet", "daemon", "--role", "node",
                          "--parent", "127.0.0.1:1", "--client-socket",
                          str(open_dir / "crnetd.sock")],
                         capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert got.returncode != 0 and "writable by every user (mode 1777)" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr and not (open_dir / "crnetd.sock").exists()


def as_nobody(work: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    """Run ``work()`` now in a forked process as uid 65534 (root only); what it returns
    (a literal) is awaited by calling what this returns."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                          # the other user's process
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, repr(work()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)

    async def result() -> object:
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        got = os.read(read, 1 << 16).decode()
        os.close(read)
        assert os.waitstatus_to_exitcode(status) == 0
        return ast.literal_eval(got)
    return result


def squat(path: str) -> tuple[int, bytes]:
    """Listen at ``path`` for 10 s: how many connections came, and every byte they sent."""
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
        s.listen(8)
        s.settimeout(0.2)
        came, said = 0, b""
        until = time.monotonic() + 10
        while time.monotonic() < until:
            try:
                conn, _ = s.accept()
            except TimeoutError:
                continue
            came += 1
            with conn:
                conn.settimeout(1)
                with contextlib.suppress(OSError):
                    while chunk := conn.recv(4096):
                        said += chunk
        return came, said


async def test_a_process_reconnects_only_to_a_daemon_of_its_first_daemons_user():
    if os.geteuid() != 0:
        pytest.skip("needs root to listen as another user")
    # A tree whose socket directory the other user can reach (pytest's tmp_path is root's
    # alone): /tmp/<ours, 0711>/tree/.
    top = tempfile.mkdtemp(prefix="crnet-squat-")
    os.chmod(top, 0o711)
    lt = LocalTree(TREE, 4, workdir=Path(top) / "tree", strict=True).start()
    path = lt.socket_path("0")
    try:
        c = await AsyncClient.connect(path, timeout=30, reconnect=8)
        lt.signal("0", signal.SIGTERM)         # a clean stop: the socket is removed
        for _ in range(100):
            if not lt.alive("0") and not os.path.exists(path):
                break
            await asyncio.sleep(0.05)
        os.chmod(os.path.dirname(path), 0o1777)   # as if the socket had lived in /tmp
        squatted = as_nobody(lambda: squat(path))
        try:
            with pytest.raises(DaemonNotRunning, match="runs as uid 65534, not as the crnetd"):
                await c.broadcast(np.ones(8), "k", root=True)
        finally:
            c.close()
            came, said = await squatted()
        assert came >= 1 and said == b""       # it was asked, and told nothing
    finally:
        lt.stop()
        shutil.rmtree(top, ignore_errors=True)
