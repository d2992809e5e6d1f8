"""The Unix socket this host's training processes connect to.

Who may connect: the socket file is created 0600 (0660 with ``--client-group``), and
every connection's peer is checked again with SO_PEERCRED (the kernel's word, not the
client's): the daemon's own user, root, or a member of the client group.

What comes in: a training process's control connection (CLIENT_HELLO first; it gets a
``ClientLink``), or a one-frame connection that hands over shared memory: ATTACH with
the memory's descriptor attached (SCM_RIGHTS), which asyncio's transports cannot
carry, so those connections are read here with ``recvmsg``. The first frame's type,
peeked before anything is consumed, says which.

A socket path held by a live daemon is never taken over: starting a second daemon on
it fails; only a stale file (nobody accepts on it) is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import weakref
from collections.abc import Awaitable, Callable

from .. import defaults
from ..errors import ProtocolError
from ..peer_text import Throttle
from ..protocol.local_peer import peer_credentials
from ..protocol.messages import Attach, Message, parse
from ..protocol.shm import SharedRegion
from ..protocol.wire import MAGIC, PREFIX, VERSION, FrameReader, Limits, MsgType

log = logging.getLogger("crnet.node")

ATTACH_LIMITS = Limits(max_header=256, max_payload=0, max_str=128, max_items=8,
                       types=frozenset({MsgType.ATTACH}))
# accept() failing with these is this process or host short of something, not the peer
# gone: the listener waits this long and tries again (asyncio's ACCEPT_RETRY_DELAY).
RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_RETRY_DELAY = 1.0
SUN_PATH_BYTES = 108                 # sizeof(sockaddr_un.sun_path) on Linux, its NUL included


__all__ = ["ClientSocket"]


class ClientSocket:
    """Accepts training processes; ``connect(sock)`` makes their control connection, and
    ``links[token]`` is the link whose process hands over shared memory with that token."""

    def __init__(self, path: str, connect: Callable[[socket.socket], Awaitable[object]],
                 group: int | None = None):
        self.path = path
        self._connect = connect
        self._group = group
        self.links: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._sock: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()
        self._warnings = Throttle(log)

    async def start(self) -> None:
        self._make_directory()
        self._take_path()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Made under another name and moved into place once it listens: a process that
        # sees the path can connect (no window where it is refused), and at no moment is
        # the socket open to others (no window at the umask's 0755).
        staging = f"{self.path}.{os.getpid()}"
        self._check_length(staging)
        old = os.umask(0o117 if self._group is not None else 0o177)
        try:
            sock.bind(staging)
        except OSError as e:
            sock.close()
            raise OSError(e.errno, f"cannot create the client socket {self.path}: "
                                   f"{e.strerror}") from None
        finally:
            os.umask(old)
        try:
            if self._group is not None:
                os.chown(staging, -1, self._group)
            sock.listen(128)
            os.rename(staging, self.path)
        except BaseException:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staging)
            raise
        sock.setblocking(False)
        self._sock = sock
        accepting = asyncio.create_task(self._accept(), name="client socket")
        accepting.add_done_callback(_died)
        self._tasks.add(accepting)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def _check_length(self, staging: str) -> None:
        """Python says only ``[Errno None] AF_UNIX path too long``: say the limit and the path."""
        extra = len(os.fsencode(staging)) - len(os.fsencode(self.path))
        most = SUN_PATH_BYTES - 1 - extra
        size = len(os.fsencode(self.path))
        if size > most:
            raise OSError(errno.ENAMETOOLONG,
                          f"cannot create the client socket {self.path}: the path is {size} bytes, "
                          f"but a Unix socket's path must fit in {SUN_PATH_BYTES} bytes (AF_UNIX "
                          f"sun_path, with its NUL and the {extra}-byte suffix it is made under), "
                          f"so at most {most} bytes here: choose a shorter --client-socket "
                          "(or --workdir)")

    def _make_directory(self) -> None:
        """The socket's directory (the default, /run/crnet, exists under systemd's
        RuntimeDirectory= only): made if its own parent exists, mode 0755, this user's;
        never a whole chain of them (a mistyped path would leave one behind)."""
        directory = os.path.dirname(os.path.abspath(self.path))
        if os.path.isdir(directory):
            mode = os.stat(directory).st_mode
            if mode & stat.S_IWOTH:
                # Sticky or not (/tmp), any user may create an entry there: once this daemon
                # stops and removes its socket, another user's could take the path, and the
                # training processes reconnecting would hand it their memory.
                raise OSError(errno.EPERM,
                              f"cannot create the client socket {self.path}: its directory "
                              f"{directory} is writable by every user (mode "
                              f"{stat.S_IMODE(mode):o}), so another user could put a socket of "
                              "their own at that path while this daemon is stopped: choose a "
                              "directory only this user (or --client-group) can write, e.g. "
                              "/run/crnet (the default)")
            return
        try:
            os.mkdir(directory, 0o755)
        except OSError as e:
            raise OSError(e.errno, f"cannot create the client socket {self.path}: its directory "
                                   f"{directory} is missing and could not be created "
                                   f"({e.strerror})") from None
        log.info("created %s for the client socket", directory)

    def _take_path(self) -> None:
        if not os.path.exists(self.path):
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.path)
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(self.path)          # stale: left by a daemon that is gone
            return
        except OSError as e:
            raise OSError(f"{self.path} exists and is not a socket crnetd can check: {e}") from None
        finally:
            probe.close()
        raise OSError(f"another crnetd is serving training processes on {self.path}")

    def _allowed(self, uid: int, gid: int) -> bool:
        if uid in (os.geteuid(), 0):
            return True
        if self._group is None:
            return False
        import pwd

        try:
            return gid == self._group or self._group in os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
        except KeyError:
            return False

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as e:
                if e.errno not in RESOURCE_ERRORS:
                    continue      # that connection is gone already (ECONNABORTED, ...)
                # Out of descriptors (or memory): as asyncio's TCP listener does, say so and
                # try again in a moment; the connections wait in the backlog meanwhile.
                # Before, this task died silently and no training process got in again.
                self._warnings.log(logging.ERROR, "accept", "cannot accept training processes "
                                   "on %s: %s; trying again in %g s", self.path, e.strerror,
                                   ACCEPT_RETRY_DELAY)
                await asyncio.sleep(ACCEPT_RETRY_DELAY)
                continue
            task = asyncio.create_task(self._admit(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _admit(self, conn: socket.socket) -> None:
        try:
            pid, uid, gid = peer_credentials(conn)
            if not self._allowed(uid, gid):
                log.warning("refusing a training process of uid %d (pid %d): not this daemon's "
                            "user%s", uid, pid, " or --client-group" if self._group is not None
                            else "")
                conn.close()
                return
            first = await asyncio.wait_for(_peek_type(conn), defaults.HANDSHAKE_DEADLINE)
            if first == MsgType.ATTACH:
                await asyncio.wait_for(self._attach(conn), defaults.HANDSHAKE_DEADLINE)
                conn.close()
            else:
                await self._connect(conn)    # the control connection: its link takes it
        except (OSError, ProtocolError, asyncio.TimeoutError) as e:
            log.warning("training process connection closed: %r", str(e)[:200])
            conn.close()

    async def _attach(self, conn: socket.socket) -> None:
        data, fds = await _recv_with_fds(conn)
        try:
            msg = _one_frame(data)
            link = self.links.get(msg.token)
            if link is None:
                raise ProtocolError("ATTACH with a token no attached training process holds")
            if len(fds) != 1:
                link.attach_failed(f"ATTACH carried {len(fds)} descriptors, not 1")
                return
            try:
                region = SharedRegion.attach(fds.pop(), msg.capacity)
            except (OSError, ValueError) as e:
                link.attach_failed(f"cannot map shared memory: {e}")
                return
            link.attach(region)
        finally:
            for fd in fds:
                os.close(fd)


def _died(task: asyncio.Task) -> None:
    """The accepting task ended other than by ``close``: a bug, which must not pass in
    silence (no training process could connect again)."""
    if not task.cancelled() and task.exception() is not None:
        asyncio.get_running_loop().call_exception_handler({
            "message": "the client socket stopped accepting", "exception": task.exception(),
            "task": task})


async def _readable(conn: socket.socket) -> None:
    """Until ``conn`` has something to read (or hung up)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():          # the loop may call it again before it is removed
            ready.set_result(None)
    loop.add_reader(conn.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(conn.fileno())


async def _peek_type(conn: socket.socket) -> MsgType | None:
    """ATTACH if the first frame is one (None otherwise), read without consuming it."""
    while True:
        try:
            head = conn.recv(PREFIX.size, socket.MSG_PEEK)
        except BlockingIOError:
            head = None
        if head == b"":
            return None        # it hung up: the control connection's reader sees that
        if head is not None and len(head) >= PREFIX.size:
            # Anything but a well-formed ATTACH prefix goes the control connection's way,
            # whose reader says what is wrong with it.
            magic, version, msg_type, _, _ = PREFIX.unpack(head)
            is_attach = (magic, version, msg_type) == (MAGIC, VERSION, MsgType.ATTACH)
            return MsgType.ATTACH if is_attach else None
        await _readable(conn)


async def _recv_with_fds(conn: socket.socket) -> tuple[bytes, list[int]]:
    """One ATTACH frame and the descriptors sent with it."""
    while True:
        try:
            data, fds, flags, _ = socket.recv_fds(conn, 1024, 4)
        except BlockingIOError:
            await _readable(conn)
            continue
        if flags & socket.MSG_CTRUNC:
            for fd in fds:
                os.close(fd)
            raise ProtocolError("ATTACH came with more descriptors than one")
        return data, list(fds)


def _one_frame(data: bytes) -> Attach:
    got: list[Message] = []

    def frame(msg_type, header, payload):
        got.append(parse(msg_type, header, 0))

    reader = FrameReader(lambda *a: None, frame, ATTACH_LIMITS)
    buf = reader.get_buffer(len(data))
    if len(data) > len(buf):
        raise ProtocolError("ATTACH frame too long")
    buf[:len(data)] = data
    reader.buffer_updated(len(data))
    if len(got) != 1 or not isinstance(got[0], Attach) or not reader.idle:
        raise ProtocolError("an ATTACH connection carries exactly one ATTACH frame")
    return got[0]


