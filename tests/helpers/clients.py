"""Training processes' clients on the hosts of a real tree: connected in turn, closed together,
and one process's share of a step."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from crnet import AsyncClient
from crnet.errors import DaemonNotRunning
from crnet.tools.launch import LocalTree

from .vectors import local_gradient


async def connect(path: str, timeout: float = 30.0, job: str | None = None,
                  starting: bool = False) -> AsyncClient:
    """``AsyncClient.connect``; with ``starting``, retried while the daemon's socket does not
    accept yet (a daemon just started again), all within ``timeout``."""
    if not starting:
        return await AsyncClient.connect(path, timeout=timeout, job=job)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await AsyncClient.connect(path, timeout=max(1.0, deadline - time.monotonic()), job=job)
        except DaemonNotRunning:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def connect_all(lt: LocalTree, names, per_host: int | None = None, timeout: float = 30.0,
                      job: str | None = None, starting: bool = False) -> dict:
    """A client on each host of ``names``, keyed by name; with ``per_host``, that many on each,
    keyed ``(name, i)``. One at a time (each waits for its host's assignment); if one fails,
    those already connected are closed."""
    keys = list(names) if per_host is None else [(n, i) for n in names for i in range(per_host)]
    clients: dict = {}
    try:
        for key in keys:
            name = key if per_host is None else key[0]
            clients[key] = await connect(lt.socket_path(name), timeout, job, starting)
    except BaseException:
        close_all(clients)
        raise
    return clients


def close_all(clients) -> None:
    """Close every client of ``clients`` (a dict's values, or a list)."""
    for c in clients.values() if isinstance(clients, dict) else clients:
        c.close()


async def submit(client, grads, step, scale=1.0, dim=None):
    """``client``'s share of step ``step``: ``scale`` times its local gradient of ``grads``
    (resized to ``dim`` if given). The vectors depend on no parameters, so a process that
    joined late or lost a step has no stale replica (StaleReplica): it is marked current."""
    client.mark_current()
    vec = scale * local_gradient(client.assignment, grads)
    if dim is not None:
        vec = np.resize(vec, dim)
    return await client.allreduce(vec, step=step)
