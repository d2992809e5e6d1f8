"""``crnetd --metrics HOST:PORT``: what this node is doing, as Prometheus text.

Served from the daemon's own event loop, not with prometheus_client's
``start_http_server``: that runs a thread which would read the node's state (dicts
and counters the loop changes between any two of its lines) with no lock, and the
daemon is single-threaded by design. Here a scrape runs between two loop callbacks,
so what it reads is consistent, and it costs the steps nothing until someone asks.

Nothing on the hot path knows about Prometheus: ``NodeCollector`` reads the counters
the node keeps anyway (``crnet.measure.stats``: ``Stats``, and ``StepTimes`` observed once per
step), the engine's and membership's state and each connection's byte counts, at
the moment of the scrape, into a private registry (never the global one: a process
running two nodes, as the tests do, must not mix them).

Trust (as every endpoint that reveals tree state): on a loopback address it is
served without credentials (only this host's users reach it); on any other it needs
a bearer token (``--metrics-token-file``; Prometheus' ``authorization:
{credentials_file: ...}``) unless ``--insecure``, and uses TLS when the daemon has
``--tls-cert/--tls-key`` (server-side only: Prometheus need not hold a certificate of
the cluster CA). A request without the right token gets 401 and nothing else. The
server reads at most ``MAX_REQUEST`` bytes of a request and serves only ``GET
/metrics``. Until its request is in, a scraper is in a ``Doorway`` as the tree's
handshakes are (``node/admission/doorway.py``; under TLS from before its handshake,
``node/admission/tls_door.py``):
at most ``MAX_CONNECTIONS`` at once, ``MAX_PER_ADDRESS`` from one address, dropped after
``REQUEST_DEADLINE`` seconds, and a newcomer closes an idle one rather than being kept
out by them. At most ``MAX_CONNECTIONS`` more are taking their answers, each for at
most ``REQUEST_DEADLINE`` seconds. The metrics are listed in docs/operations.md, "Metrics".
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ... import __version__
from ...measure.stats import Histogram, Stats
from ...peer_text import Throttle
from ...protocol.transport import Connection, closing
from ...schemes.base import Place
from ..admission.doorway import Doorway
from ..admission.tls_door import TlsDoor
from ..join.membership import JoinState
from ..neighbours import Neighbours
from .measure import measured_metrics

log = logging.getLogger("crnet.node")

MAX_REQUEST = 4096          # bytes of request line and headers
MAX_CONNECTIONS = 16        # scrapers waiting for their request at once, and as many being answered
MAX_PER_ADDRESS = 4         # of them from one address (an IPv6 /64)
REQUEST_DEADLINE = 3.0      # seconds from connecting to the request (TLS included), and to take the answer


@dataclass(frozen=True)
class NodeView:
    """What a scrape reads of the node (``lifecycle.Node`` builds it): read-only."""

    role: str
    host_id: str | None
    parent: tuple[str, int] | None              # the address it dials (None: the master)
    stats: Stats
    neighbours: Neighbours
    place: Callable[[], Place | None]
    join_state: Callable[[], JoinState]
    tree_step: Callable[[], int]
    kept_bytes: Callable[[], int]               # results held for those catching up
    clients: Callable[[], list[Connection | None]]   # this host's training processes, by seat


class NodeCollector:
    """Every ``crnet_*`` metric, read from the node when Prometheus asks."""

    def __init__(self, node: NodeView):
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node = self.node
        stats = node.stats
        place = node.place()
        name = "" if place is None else place.name
        info = GaugeMetricFamily("crnet_node", "This daemon: its slot (master: empty), role, "
                                 "host id and version", labels=["name", "role", "host", "version"])
        info.add_metric([name, node.role, node.host_id or "", __version__], 1)
        yield info
        state = GaugeMetricFamily("crnet_join_state", "1 for the node's join state: joining "
                                  "(no place yet), welcomed (placed, no share yet), assigned",
                                  labels=["state"])
        joined = node.join_state()
        for s in JoinState:
            state.add_metric([s.value], 1 if joined is s else 0)
        yield state
        yield GaugeMetricFamily("crnet_tree_step", "The newest step the master decided, as "
                                "this node knows it", value=node.tree_step())
        yield CounterMetricFamily("crnet_steps_done", "Steps resolved here (a full result)",
                                  value=stats.steps_done)
        yield CounterMetricFamily("crnet_steps_approximate", "Of crnet_steps_done: results "
                                  "decoded from fewer than n - s children of some parent "
                                  "(--beyond-s approximate)", value=stats.steps_approximate)
        yield CounterMetricFamily("crnet_approximate_coverage", "The sum of those results' "
                                  "coverage of the global batch (mean: divide by "
                                  "crnet_steps_approximate)", value=stats.approximate_coverage)
        failed = CounterMetricFamily("crnet_steps_failed", "Steps failed here: scope tree (the "
                                     "master failed it for everyone) or here (this subtree gave "
                                     "up, cut off from the master)", labels=["scope"])
        failed.add_metric(["tree"], stats.steps_failed - stats.steps_failed_here)
        failed.add_metric(["here"], stats.steps_failed_here)
        yield failed
        yield CounterMetricFamily("crnet_times_skipped", "Steps the tree finished without this "
                                  "node's part", value=stats.times_skipped)
        yield CounterMetricFamily("crnet_pieces_withdrawn", "spread: pieces of this host's "
                                  "vector not sent, their owners decoded without them (MOOT)",
                                  value=stats.pieces_withdrawn)
        yield CounterMetricFamily("crnet_sums_refused", "spread: relayed chunks of the sum not "
                                  "taken, unlike their owner's digest", value=stats.sums_refused)
        yield CounterMetricFamily("crnet_results_direct", "Results received straight into a "
                                  "training process's shared output, delivered without a copy",
                                  value=stats.results_direct)
        yield _histogram("crnet_step_seconds", "Seconds from a step's beginning here (its first "
                         "piece, or a process asking) to its decision, once per step",
                         [], [([], stats.times.step_seconds)])
        yield CounterMetricFamily("crnet_decode_cpu_seconds", "CPU time of the decodes (this "
                                  "thread's time around the kernel calls)",
                                  value=stats.decode_cpu_seconds)
        yield CounterMetricFamily("crnet_decode_seconds", "Wall-clock time of the same decodes",
                                  value=stats.decode_seconds)
        yield GaugeMetricFamily("crnet_result_memory_bytes", "Bytes of results held for "
                                "children and training processes catching up",
                                value=node.kept_bytes())
        children = [] if place is None else place.tree.children(place.name)
        records = [(children[k], r) for k, r in sorted(stats.times.children.items())
                   if k < len(children)]
        yield _histogram("crnet_child_arrival_lag_seconds", "Seconds from a step's first child "
                         "chunk here to each child's first chunk, once per step and child (of "
                         "the children whose part came before the step was decided here; a "
                         "later one counts in crnet_child_skipped_steps)",
                         ["child"], [([c], r.lag) for c, r in records])
        skipped = CounterMetricFamily("crnet_child_skipped_steps", "Steps decoded here without "
                                      "this child (it straggled, failed or was gone)",
                                      labels=["child"])
        for child, record in records:
            skipped.add_metric([child], record.skipped)
        yield skipped
        up = GaugeMetricFamily("crnet_link_up", "1 if the link is connected", labels=["link", "peer"])
        received = CounterMetricFamily("crnet_link_received_bytes", "Bytes received on the link's "
                                       "current connection", labels=["link", "peer"])
        sent = CounterMetricFamily("crnet_link_sent_bytes", "Bytes sent on the link's current "
                                   "connection", labels=["link", "peer"])
        for labels, conn in self._links(place, children):
            up.add_metric(labels, 0 if conn is None or conn.is_closing else 1)
            if conn is not None:
                received.add_metric(labels, conn.bytes_in)
                sent.add_metric(labels, conn.bytes_out)
        yield from (up, received, sent)
        yield from measured_metrics(stats, place, node.neighbours)

    def _links(self, place: Place | None, children: list[str]):
        """([link kind, peer], connection or None) for every link this node has or should have."""
        nb = self.node.neighbours
        parent = self.node.parent
        if parent is not None:
            yield ["parent", f"{parent[0]}:{parent[1]}"], nb.parent
        for k, slot in enumerate(nb.slots):
            yield ["child", children[k] if k < len(children) else str(k)], slot.link
        if place is not None and place.ring is not None:
            yield ["successor", ""], nb.successor
            yield ["predecessor", ""], nb.predecessor
        if place is not None and place.scheme == "spread":   # every other host, both ways
            names = list(place.tree.names())
            for rank, name in enumerate(names):
                if name != place.name:
                    yield ["peer_out", name or "master"], nb.peers.get(rank)
                    yield ["peer_in", name or "master"], nb.peers_in.get(rank)
        for i, conn in enumerate(self.node.clients()):
            yield ["client", str(i)], conn


def _histogram(name: str, documentation: str, labels: list[str],
               series: list[tuple[list[str], Histogram]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for values, h in series:
        buckets = [("+Inf" if bound == float("inf") else repr(bound), n)
                   for bound, n in h.cumulative()]
        family.add_metric(values, buckets, h.sum)
    return family


def registry_for(node: NodeView) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node))
    return registry


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """TLS for scrapes: this host's certificate; the scraper shows none (it has a token)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


class MetricsServer:
    """``GET /metrics`` on ``address``, with a bearer ``token`` if given (TLS with ``tls``)."""

    def __init__(self, registry: CollectorRegistry, address: tuple[str, int],
                 token: bytes | None = None, tls: ssl.SSLContext | None = None,
                 closings: Throttle | None = None):
        self.registry = registry
        self.address = address
        self.token = token
        self.tls = tls
        self.bound: tuple[str, int] | None = None
        self.closings = closings or Throttle(logging.getLogger("crnet.protocol.transport"))
        # Scrapers until their request is in (under TLS, from before the handshake): a
        # Prometheus sends it at once, so an idle one gets little time, and a newcomer
        # closes the oldest idle one of the address holding the most (doorway.py): idle
        # connections, however many, do not keep a scrape out.
        self.doorway = Doorway(MAX_CONNECTIONS, MAX_PER_ADDRESS, REQUEST_DEADLINE, reserve=0,
                               awaited="request")
        self._server: asyncio.AbstractServer | None = None
        self.scrapes: set[Scrape] = set()            # every connection, to close at the end
        self._answering: dict[Scrape, None] = {}      # answered, not yet taken: oldest first

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accepted, *self.address)
        self.bound = self._server.sockets[0].getsockname()[:2]

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for scrape in list(self.scrapes):
            scrape.drop()

    def _accepted(self) -> asyncio.BaseProtocol:
        if self.tls is None:
            return Scrape(self)
        return TlsDoor(lambda: Scrape(self), self.doorway, self.tls, self.closings)

    def answering(self, scrape: Scrape) -> None:
        """``scrape`` has its answer to take: at most MAX_CONNECTIONS do at once (the
        oldest is cut off), each for at most REQUEST_DEADLINE seconds."""
        self._answering[scrape] = None
        while len(self._answering) > MAX_CONNECTIONS:
            oldest = next(iter(self._answering))
            self._answering.pop(oldest)
            oldest.drop()

    def gone(self, scrape: Scrape) -> None:
        self.doorway.leave(scrape)
        self.scrapes.discard(scrape)
        self._answering.pop(scrape, None)

    def answer(self, head: bytes) -> tuple[bytes, bytes, str]:
        """(status, body, content type) for one request's line and headers."""
        text = "text/plain; charset=utf-8"
        lines = head.decode("latin-1").split("\r\n")
        if self.token is not None and not self._authorized(lines[1:]):
            return b"401 Unauthorized", b"", text
        method, _, rest = lines[0].partition(" ")
        path = rest.partition(" ")[0].partition("?")[0]
        if method != "GET":
            return b"405 Method Not Allowed", b"only GET /metrics\n", text
        if path != "/metrics":
            return b"404 Not Found", b"only GET /metrics\n", text
        return b"200 OK", generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _authorized(self, headers: list[str]) -> bool:
        assert self.token is not None
        for line in headers:
            key, _, value = line.partition(":")
            if key.strip().lower() == "authorization":
                scheme, _, credentials = value.strip().partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(
                    credentials.strip().encode("latin-1"), self.token)
        return False


class Scrape(asyncio.Protocol):
    """One scraper's connection: its request (at most MAX_REQUEST bytes, within
    REQUEST_DEADLINE of connecting), one answer, closed."""

    def __init__(self, server: MetricsServer):
        self.server = server
        self.label = "scraper"
        self.transport: asyncio.Transport | None = None
        self._head = bytearray()
        self._answered = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)   # uvloop's are not subclasses
        self.server.scrapes.add(self)
        peer = transport.get_extra_info("peername")
        host = ""
        if isinstance(peer, tuple) and len(peer) >= 2:
            host, self.label = str(peer[0]), f"scraper {peer[0]}:{peer[1]}"
        if not self.server.doorway.enter(self, host):
            self.abort("too many scrapers waiting")

    def data_received(self, data: bytes) -> None:
        if self._answered or self.transport is None:
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0 or end + 4 > MAX_REQUEST:
            if len(self._head) >= MAX_REQUEST:     # too long: dropped without an answer
                self._answered = True
                self.server.doorway.leave(self)
                self.transport.close()
            return
        self._answered = True
        self.server.doorway.leave(self)
        status, body, kind = self.server.answer(bytes(self._head[:end + 4]))
        self.transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind.encode()
                             + b"\r\nContent-Length: " + str(len(body)).encode()
                             + b"\r\nConnection: close\r\n\r\n" + body)
        self.transport.close()                     # once it is written
        self._timer = asyncio.get_running_loop().call_later(REQUEST_DEADLINE, self.drop)
        self.server.answering(self)

    def abort(self, reason: str) -> None:
        """Closed before its request was in (the doorway's deadline, or room made)."""
        closing(self.server.closings, self.label, reason)
        self.drop()

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.gone(self)
        if self._timer is not None:
            self._timer.cancel()
