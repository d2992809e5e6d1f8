"""The training process's API: ``Client`` (blocking) and ``AsyncClient``.

::

    from crnet import Client
    with Client() as c:                      # $CRNET_CLIENT_SOCKET by default
        a = c.assignment                     # this process's share of every batch
        for step in range(steps):
            g = c.allreduce(local_gradient(a.ranges), step=step)   # full gradient sum

Vectors go through shared memory (``crnet.protocol.shm``); the socket carries only step
numbers. ``c.buffer(n, dtype)`` hands out the shared input itself, so a gradient
computed into it is never copied on this side.

The package: ``assignment.py`` (this process's share), ``replies.py`` (the daemon's
answers, in order), ``aio.py`` (``AsyncClient``), ``blocking.py`` (``Client``).
"""

from .aio import AsyncClient
from .assignment import Assignment
from .blocking import Client
from .result_info import ResultInfo

__all__ = ["Assignment", "AsyncClient", "Client", "ResultInfo"]
