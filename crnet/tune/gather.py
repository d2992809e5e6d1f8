"""``crnet tune``'s gathering over the network: a running tree's measurements (``gather``),
or a probe of an idle one (``gather_probe``), through ``crnet status``'s connection and
authentication (``crnet.tools.status``). What is done with the answers is pure and apart
(``tuning.py``, ``probe.py``): the daemon ranks what its own status service gathered
(``crnetd --plan auto``), and imports nothing of the status client.
"""

from __future__ import annotations

from ..defaults import PROBE_DEADLINE, TUNE_WINDOW_MAX
from ..protocol.status_tree import DEADLINE
from ..protocol.tls import TlsFiles
from ..tools.status import StatusClient
from .probe import probe_size

__all__ = ["gather", "gather_probe"]


async def gather(host: str, port: int, secret: bytes | None = None, tls: TlsFiles | None = None,
                 window: int = TUNE_WINDOW_MAX, deadline: float = DEADLINE, probe: int = 0) -> dict:
    """The node's subtree with every node's measured section (windows of at most
    ``window`` steps), checked; with ``probe``, each node's links and compute probed first
    with that many bytes (``gather_probe``: a size from the tree's vector)."""
    client = await StatusClient.connect(host, port, secret=secret, tls=tls, timeout=deadline + 5)
    try:
        return await client.refresh(deadline, measured=window, probe=probe)
    finally:
        client.close()


async def gather_probe(host: str, port: int, secret: bytes | None = None,
                       tls: TlsFiles | None = None, probe_bytes: int | None = None,
                       deadline: float = PROBE_DEADLINE) -> dict:
    """The master's tree, every node probed with ``probe_bytes`` (default: ``probe_size``
    of the tree's vector, asked for first) and its measured section, checked."""
    client = await StatusClient.connect(host, port, secret=secret, tls=tls, timeout=deadline + 5)
    try:
        if probe_bytes is None:
            first = await client.refresh(DEADLINE, measured=1)
            config = (first.get("measured") or {}).get("config") or {}
            probe_bytes = probe_size(config.get("vector_bytes"))
        return await client.refresh(deadline, measured=TUNE_WINDOW_MAX, probe=probe_bytes)
    finally:
        client.close()
