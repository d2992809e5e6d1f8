"""``Client``: the blocking twin of ``AsyncClient``, on a private event loop (uvloop's)."""

from __future__ import annotations

import asyncio
import os

import numpy as np

from .. import defaults
from ..protocol.transport import new_loop
from .aio import AsyncClient
from .assignment import Assignment
from .result_info import ResultInfo

__all__ = ["Client"]


class Client:
    """The blocking twin of ``AsyncClient`` for ordinary training loops.

    It drives an ``AsyncClient`` on a private event loop, so it must not be used
    from inside a running event loop (use ``AsyncClient`` there).
    """

    def __init__(self, socket_path: str | os.PathLike | None = None,
                 timeout: float | None = defaults.CLIENT_CONNECT_TIMEOUT, job: str | None = None,
                 reconnect: float = defaults.CLIENT_RECONNECT):
        """Connect and wait (up to ``timeout``) until the tree has assigned this host its
        data (``job``, ``reconnect``: see ``AsyncClient.connect``)."""
        self._loop = new_loop()
        try:
            self._c = self._run(AsyncClient.connect(socket_path, timeout, job, reconnect))
        except BaseException:
            self._loop.close()
            raise

    @property
    def assignment(self) -> Assignment:
        return self._c.assignment

    @property
    def tree_step(self) -> int:
        return self._c.tree_step

    @property
    def last_result_info(self) -> ResultInfo | None:
        return self._c.last_result_info

    @property
    def stale(self) -> bool:
        return self._c.stale

    @property
    def reconnects(self) -> int:
        return self._c.reconnects

    def mark_current(self) -> None:
        self._c.mark_current()

    def buffer(self, length: int, dtype=np.float32) -> np.ndarray:
        return self._run(self._c.buffer(length, dtype))

    def finished(self, step: int) -> bool:
        return self._c.finished(step)

    def wait_finished(self, step: int, timeout: float | None = None) -> None:
        self._run(self._c.wait_finished(step, timeout))

    def result_buffer(self, length: int, dtype=np.float32) -> np.ndarray:
        return self._run(self._c.result_buffer(length, dtype))

    def allreduce(self, vec, step: int, out=None, timeout: float | None = None) -> np.ndarray:
        return self._run(self._c.allreduce(vec, step, out, timeout))

    def result(self, step: int, like, out=None, timeout: float | None = None) -> np.ndarray:
        return self._run(self._c.result(step, like, out, timeout))

    def broadcast(self, vec, key: str, root: bool | int, out=None,
                  timeout: float | None = None, processes: int | None = None) -> np.ndarray:
        return self._run(self._c.broadcast(vec, key, root, out, timeout, processes))

    def numbered_key(self, prefix: str) -> str:
        return self._c.numbered_key(prefix)

    def barrier(self, key: str = "start", processes: int | None = None,
                timeout: float | None = None) -> None:
        self._run(self._c.barrier(key, processes, timeout))

    def request_state(self, like, out=None, timeout: float | None = None) -> tuple[np.ndarray, int]:
        return self._run(self._c.request_state(like, out, timeout))

    def state_wanted(self) -> bool:
        return self._c.state_wanted()

    def send_state(self, vec, step: int, timeout: float | None = None) -> None:
        self._run(self._c.send_state(vec, step, timeout))

    def stats(self) -> dict:
        return self._run(self._c.stats())

    def close(self) -> None:
        if not self._loop.is_closed():
            self._c.close()
            self._loop.run_until_complete(asyncio.sleep(0))  # let the transport close
            self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _run(self, coro):
        return self._loop.run_until_complete(coro)
