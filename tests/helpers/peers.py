"""A TCP peer speaking frames by hand: what an attacker (or a test) sends to a daemon."""

from __future__ import annotations

import asyncio

from crnet.protocol.messages import Message, parse
from crnet.protocol.wire import FrameReader


class RawPeer:
    """A TCP peer speaking frames by hand: what an attacker (or a test) sends."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.got: list[Message] = []
        self._frames = FrameReader(lambda t, h, n: memoryview(bytearray(n)),
                                   lambda t, h, p: self.got.append(parse(t, h, 0 if p is None
                                                                         else len(p))))

    @classmethod
    async def to(cls, port):
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, msg: Message, payload=None):
        self.writer.write(b"".join(bytes(part) for part in msg.frame(payload)))

    async def next(self, timeout=10.0) -> Message | None:
        """The next message, or None once the daemon closed the connection."""
        while not self.got:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                return None
            buf = self._frames.get_buffer(len(data))
            buf[:len(data)] = data
            self._frames.buffer_updated(len(data))
        return self.got.pop(0)

    async def closed(self) -> bool:
        return await self.next() is None

    def close(self):
        self.writer.close()
