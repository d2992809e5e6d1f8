"""A man in the middle for tests: a TCP proxy on 127.0.0.1 between one node and its
parent, which passes the parent's bytes down untouched and lets a subclass change what
goes up (``_up``). ``spawn`` (a LocalTree spawn function) points the victim's --parent
at the proxy."""

from __future__ import annotations

import asyncio
import ssl
import subprocess


class PathProxy:
    """``accept`` and ``dial``: TLS contexts for its two ends (a relay that holds a
    certificate of the cluster), None for plain TCP."""

    def __init__(self, victim: str, accept: ssl.SSLContext | None = None,
                 dial: ssl.SSLContext | None = None):
        self.victim = victim
        self.upstream: int | None = None
        self._accept, self._dial = accept, dial
        self._tasks: set[asyncio.Task] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self):
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", 0, ssl=self._accept)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def spawn(self, name, argv, kwargs):
        if name == self.victim:
            i = argv.index("--parent") + 1
            self.upstream = int(argv[i].rpartition(":")[2])
            argv = [*argv[:i], f"127.0.0.1:{self.port}", *argv[i + 1:]]
        return subprocess.Popen(argv, **kwargs)

    async def _pipe(self, reader, writer):
        task = asyncio.current_task()
        assert task is not None and self.upstream is not None
        self._tasks.add(task)
        mine = [writer]
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream,
                                                                 ssl=self._dial)
            mine.append(up_writer)
            self._writers += mine
            await asyncio.gather(self._up(reader, up_writer), self._down(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in mine:
                w.close()
            self._tasks.discard(task)

    async def _up(self, reader, writer):
        """The child's bytes on their way to the parent (here: unchanged)."""
        await self._down(reader, writer)

    async def _down(self, reader, writer):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()

    async def close(self) -> None:
        """Stop: its connections are closed, so each pipe ends at EOF (not cancelled)."""
        self.server.close()
        for w in self._writers:
            w.close()
        await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), 10)
