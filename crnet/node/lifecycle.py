"""The lifecycle of one crnetd: listeners, signals, and an orderly, time-limited shutdown.

``Node`` builds the rooms (``Neighbours``, ``StepEngine``, ``Membership``, this
host's ``LocalProcesses``, and beside membership its broadcasts, barriers and status:
``rooms.py``) and wires them: the engine lends the local processes' outputs through
``Node._lend``, each link gets the rooms it hands messages to, metrics a read-only
``NodeView``. It opens the listeners whose connections get the right link
(``links/``), and on stop (a signal, or a fatal join error) shuts down in order,
as aiohttp's runner does: stop accepting, stop dialing, close every link, wait at
most ``SHUTDOWN_GRACE``.

Anything unexpected (a handler that raised, a task that died) reaches the event
loop's exception handler: it is logged with its traceback, and in strict mode
(``CRNET_STRICT=1``, set by the tests) the daemon stops with exit code 70.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import ssl
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import __version__, defaults
from ..coding import kernels
from ..coding.plan import Tree
from ..config.options import defaults_of, engine_values
from ..errors import NotThatHost, ProtocolError
from ..measure.stats import Stats
from ..measure.windows import Measured
from ..peer_text import Throttle
from ..protocol.fields import check_address, split_address
from ..protocol.handshake import Dialing
from ..protocol.tls import TlsFiles, contexts
from ..protocol.transport import Connection, Handler, loop_name, run
from ..protocol.wire import Limits
from ..schemes import Place
from ..schemes.chunks import largest_chunk
from ..units import format_bytes, plural
from .admission.doorway import Doorway
from .admission.guard import HANDSHAKE_LIMITS, Accepting
from .admission.tls_door import TlsDoor
from .client_socket import ClientSocket
from .join.dial import moot
from .join.membership import Membership
from .join.replan import AutoPlan
from .links import ChildLink, ClientLink, ParentLink, PeerLink
from .local import LocalProcesses, Seat
from .neighbours import Neighbours
from .observe import logs
from .observe.metrics import MetricsServer, NodeView, registry_for, server_context
from .observe.notify import Notifier, Readiness
from .peers.check import OutboundPeer
from .peers.identity import dialed_named
from .rooms import Rooms
from .steps import EngineSettings, StepEngine

log = logging.getLogger("crnet.node")

STRICT_ENV = "CRNET_STRICT"
EXIT_BUG = 70   # EX_SOFTWARE: strict mode caught an internal error


@dataclass(frozen=True)
class Settings:
    """What one daemon runs with: every option of ``crnet.config.options.DAEMON_OPTIONS``
    as a field of its name, in the table's order (``tests/unit/test_config.py`` fails when the
    two differ), then what ``crnet/config/effective.py`` made of several of them. Typed
    fields, not a bag: a misspelt ``settings.<name>`` is mypy's error, not a run-time one."""

    role: str
    listen: tuple[str, int] | None
    parent: tuple[str, int] | None
    resolve_timeout: float
    name: str | None
    scheme: str
    workers: int | None
    fanout: list[int]
    layers: int | None
    stragglers: list[int]
    samples: int | None
    code_kind: str
    beyond_s: str
    patience: float | None
    client_socket: str
    client_group: str | None
    chunk_bytes: int                           # 0: auto
    spread_sum: str                            # ring or direct
    timeout: float
    keep_results: int
    local_processes: int
    result_memory: int
    step_window: int
    plan: str
    tune_window: int
    max_send_queue: int | None
    link_timeout: float
    connect_timeout: float
    secret_file: str | None
    tls_cert: str | None
    tls_key: str | None
    tls_ca: str | None
    tls_names: bool
    trust_relays: bool
    insecure: bool
    metrics: tuple[str, int] | None
    metrics_token_file: str | None
    host_id: str | None
    strict: bool
    exit_with_stdin: bool
    log_level: str
    log_format: str
    # ---- derived (crnet/config/effective.py)
    tree: Tree | None = None                   # master only: from scheme, fanout, layers, ...
    client_gid: int | None = None              # --client-group's gid: its members may connect
    secret: bytes | None = None                # the cluster secret: every tree link authenticated
    tls: TlsFiles | None = None                # mutual TLS on every tree link (crnet/protocol/tls.py)
    metrics_token: bytes | None = None         # scrapers of --metrics send this bearer token
    reread_log_level: Callable[[], None] | None = None  # SIGHUP (crnet/config/effective.py)

    @classmethod
    def of(cls, role: str, tree: Tree | None = None, **values: Any) -> Settings:
        """Settings of the option defaults but ``values`` (by option name), e.g. for tests."""
        return cls(**defaults_of(role=role, **values), tree=tree)

    @property
    def is_master(self) -> bool:
        return self.role == "master"

    @property
    def engine(self) -> EngineSettings:
        """The step engine's settings: the options with an ``engine`` field, and with them
        every time derived from ``timeout`` (``EngineSettings``: one place for them)."""
        return EngineSettings(**engine_values(vars(self)),
                              guarded=self.secret_file is not None or self.tls_cert is not None,
                              check_relays=not self.trust_relays)


class Node:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.stats = Stats(measured=Measured(settings.tune_window))
        engine = settings.engine
        self.neighbours = Neighbours()
        self.engine = StepEngine(engine, self.stats, self.neighbours, lend=self._lend)
        place = None
        if settings.is_master:
            assert settings.tree is not None and settings.samples is not None
            place = Place("", 0, settings.tree, settings.scheme, settings.code_kind,
                          settings.chunk_bytes, beyond_s=settings.beyond_s,
                          patience=settings.patience, spread_sum=settings.spread_sum)
        self.membership = Membership(
            self.engine, self.neighbours, stop=self.stop, place=place, samples=settings.samples,
            name=settings.name, dial_parent=None if settings.is_master else self._dial_parent,
            dial_peer=self._dialer, resolve_timeout=settings.resolve_timeout,
            host_id=settings.host_id, parent_address=self._parent_address(),
            local_processes=settings.local_processes, names=settings.tls_names)
        self.local = LocalProcesses(settings.local_processes, self.engine)
        self.rooms = Rooms.beside(self.membership)   # broadcasts, barriers, crnet status
        self.auto_plan = (AutoPlan(self.membership, self.rooms.status, settings.tune_window)
                          if settings.is_master and settings.plan == "auto" else None)
        self.readiness = Readiness(Notifier(), self.membership, self.engine, self.stats)  # systemd
        self.stopping = asyncio.Event()
        self.exit_code = 0
        self._servers: list[asyncio.AbstractServer] = []
        self.doorway = Doorway()                 # accepted peers still in their handshake
        self.warnings = Throttle(log)            # what peers do: a line per peer now and then
        # connections closed on peers
        self.closings = Throttle(logging.getLogger("crnet.protocol.transport"))
        self.client_socket: ClientSocket | None = None
        self.metrics: MetricsServer | None = None
        self._tls_accept: ssl.SSLContext | None = None
        self._tls_dial: ssl.SSLContext | None = None
        if settings.tls is not None:
            self._tls_accept, self._tls_dial = contexts(settings.tls)
        # Every connection made or accepted (weak: a dial that failed leaves a protocol
        # object that never connected, and it must not pile up while a parent is away).
        self._conns: weakref.WeakSet[Connection] = weakref.WeakSet()

    async def serve(self) -> int:
        """Run until stopped; then shut down in order. Returns the exit code."""
        await self.start()
        await self.stopping.wait()
        await self.shutdown()
        return self.exit_code

    def stop(self, code: int = 0) -> None:
        self.exit_code = self.exit_code or code
        self.stopping.set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        s = self.settings
        log.info("crnetd %s starting as %s; event loop %s; kernels %s%s", __version__, s.role,
                 loop_name(), "cython" if kernels.HAVE_CYTHON else "numpy reference (slow)",
                 "; strict mode" if s.strict else "")
        log.info("keeping up to %s of results for training processes that fall behind "
                 "(--result-memory)", format_bytes(s.result_memory))
        if s.listen is not None:
            server = await loop.create_server(self._accepted, *s.listen)
            self._servers.append(server)
            host, port = server.sockets[0].getsockname()[:2]
            self.membership.listen_address = f"{host}:{port}"
            log.info("listening for children on %s:%d (%s%s)", host, port,
                     "authenticated" if s.secret else "no authentication: no --secret-file",
                     ", TLS" if s.tls else "")
        if s.metrics is not None:   # before the client socket: that one says "up"
            tls = None if s.tls is None else server_context(s.tls.cert, s.tls.key)
            self.metrics = MetricsServer(registry_for(self._scraped()), s.metrics,
                                         s.metrics_token, tls, self.closings)
            await self.metrics.start()
            assert self.metrics.bound is not None
            log.info("metrics on %s://%s:%d/metrics (%s)", "https" if tls else "http",
                     *self.metrics.bound, "bearer token" if s.metrics_token else "no token")
        if s.client_socket:
            self.client_socket = ClientSocket(s.client_socket, self._client, s.client_gid)
            await self.client_socket.start()
            log.info("training processes connect to %s", s.client_socket)
        self.readiness.start()
        if s.is_master:
            assert s.tree is not None
            log.info("master: tree fanout %s, stragglers %s: waiting for %s",
                     list(s.tree.fanout), list(s.tree.stragglers), plural(s.tree.workers, "worker"))
            if s.secret is not None and not s.tls_names and (s.scheme == "spread" or s.plan == "auto"):
                # The threat model's one gap without per-host identity (docs/operations.md).
                log.warning("%s without --tls-names: in a spread tree a host that holds the "
                            "cluster secret can answer for the hosts below it (give each host a "
                            "certificate that names its --host-id, and --tls-names)",
                            "--scheme spread" if s.scheme == "spread" else "--plan auto")
            self.readiness.listening(str(self.membership.listen_address))
        self.membership.start()

    async def shutdown(self) -> None:
        self.readiness.stopping()
        for server in self._servers:
            server.close()                      # stop accepting
        if self.metrics is not None:
            self.metrics.close()
        self.membership.close()                 # stop dialing
        self.engine.close()                     # stop the step clocks
        live = [c for c in self._conns if c.transport is not None]
        for conn in live:
            conn.close()
        try:
            await asyncio.wait_for(self._closed(live), defaults.SHUTDOWN_GRACE)
        except asyncio.TimeoutError:
            log.warning("shutdown took longer than %g s; stopping anyway", defaults.SHUTDOWN_GRACE)
        if self.client_socket is not None:
            self.client_socket.close()
        log.info("%s stopped", self.membership.label)

    async def _closed(self, conns: list[Connection]) -> None:
        await self.membership.wait_closed()
        await asyncio.gather(*(c.closed for c in conns), return_exceptions=True)

    def loop_error(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """Anything unexpected: log it with its traceback; in strict mode, stop with 70."""
        exc = context.get("exception")
        log.error("internal error: %s", context.get("message", "unexpected error"),
                  exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None)
        if self.settings.strict:
            self.stop(EXIT_BUG)

    # -- the rooms' wiring ------------------------------------------------------------
    def _lend(self, step: int, total: int, dtype: np.dtype) -> tuple[Seat, np.ndarray] | None:
        """The engine's ``Lend``: a local training process's output (built after it)."""
        return self.local.lend(step, total, dtype)

    def _scraped(self) -> NodeView:
        """What a metrics scrape reads of this node."""
        m, engine, s = self.membership, self.engine, self.settings
        return NodeView(
            role=s.role, host_id=s.host_id, parent=s.parent, stats=self.stats,
            neighbours=self.neighbours, place=lambda: m.place, join_state=lambda: m.state,
            tree_step=lambda: engine.tree_step,
            kept_bytes=lambda: engine.bookkeeping()["kept_bytes"],
            clients=lambda: [None if seat is None else seat.conn for seat in self.local.seats])

    def _child_link(self) -> ChildLink:
        r = self.rooms
        return ChildLink(self.membership, self.engine, r.broadcasts, r.barriers, r.status,
                         self.warnings)

    # -- connections -----------------------------------------------------------------
    def _limits(self) -> Limits:
        place = self.membership.place
        chunk = self.settings.chunk_bytes if place is None else place.chunk_bytes
        return Limits(max_payload=max(largest_chunk(chunk), defaults.MAX_CONTROL_PAYLOAD))

    def _connection(self, handler: Handler, limits: Limits | None = None,
                    label: str = "peer") -> Connection:
        """Every connection this node makes or accepts: tracked until it closes."""
        conn = Connection(handler, limits or self._limits(), label, self.settings.link_timeout)
        if label != "client":   # a local process the socket checked: its every line is logged
            conn.closings = self.closings
        self._conns.add(conn)
        return conn

    def _accepted(self) -> asyncio.BaseProtocol:
        """The protocol of a TCP connection accepted on --listen: a tree link behind the
        handshake (``node/admission/guard.py``), admitted by the doorway; with TLS, a ``TlsDoor`` admits
        it and runs the TLS handshake first."""
        def link() -> Connection:
            s = self.settings
            return self._connection(Accepting(self._child_link(), s.secret, self.doorway,
                                              self._limits, self.warnings), HANDSHAKE_LIMITS)
        if self._tls_accept is None:
            return link()
        return TlsDoor(link, self.doorway, self._tls_accept, self.closings)

    async def _client(self, sock) -> None:
        """A training process's control connection (node/client_socket.py checked who)."""
        link = ClientLink(self.local, self.membership, self.engine, self.stats,
                          self.rooms.broadcasts, self.rooms.barriers)
        assert self.client_socket is not None
        self.client_socket.links[link.token] = link
        await asyncio.get_running_loop().connect_accepted_socket(
            lambda: self._connection(link, Limits(max_payload=0), "client"), sock)

    async def _dial_parent(self, hello):
        # Where the configured parent is (--parent), or the tree moved this node (MOVE).
        address = self.membership.parent_address
        assert address is not None
        host, port = split_address(address)
        r = self.rooms
        link = ParentLink(self.membership, self.engine, r.broadcasts, r.barriers, r.status)
        guard = Dialing(link, self.settings.secret)
        try:
            # A partition swallows the SYN: try again soon rather than after TCP's
            # doubling retries (a minute or two), so a healed link is used at once.
            _, conn = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                lambda: self._connection(guard, label=f"parent {host}:{port}"), host, port,
                ssl=self._tls_dial), self.settings.connect_timeout)
        except socket.gaierror as e:   # say which name (dial.py gives up on it in time)
            raise socket.gaierror(e.errno, f"the host name {host!r} does not resolve "
                                           f"({e.strerror})") from None
        conn.send(guard.hello(hello))
        return conn, link.welcome

    def _parent_address(self) -> str | None:
        """host:port of the parent, as this node dials it."""
        if self.settings.parent is None:
            return None
        parent_host, parent_port = self.settings.parent
        return f"[{parent_host}]:{parent_port}" if ":" in parent_host else f"{parent_host}:{parent_port}"

    def _dialer(self, address: str | None, peer: OutboundPeer, named: str | None):
        """Dials a peer (a ring successor, a spread host) at ``address`` (None: the master,
        at the parent's); its link reports to ``peer``; ``named``: the host id its
        certificate must name (--tls-names: ``peer_identity.dialed_named``), before this
        node says a word on the link."""
        if address is None:   # (where this node dials its parent: the master's child)
            address = self.membership.parent_address
            assert address is not None
        # A peer said where (messages check every address they carry): one that is still no
        # host:port is a link that is no good, tried again (dial.py), never a dead task.
        bad = check_address(address)

        async def dial(hello):
            if bad:
                raise ProtocolError(f"cannot dial {bad}")
            link = PeerLink(peer, confirmed_by_welcome=self.settings.secret is None)
            guard = Dialing(link, self.settings.secret)
            _, conn = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                lambda: self._connection(guard, Limits(max_payload=0), f"peer {address}"),
                *split_address(address), ssl=self._tls_dial), self.settings.connect_timeout)
            if named is not None:
                try:
                    dialed_named(conn.transport, peer.rank, named)
                except NotThatHost:
                    link.welcome.add_done_callback(moot)   # nobody waits for it: the dial failed
                    conn.close()
                    raise
            conn.send(guard.hello(hello))
            return conn, link.welcome
        return dial


def _stop_when_stdin_closes(loop: asyncio.AbstractEventLoop, node: Node) -> None:
    """--exit-with-stdin: stop, as on SIGTERM, once standard input reaches end of file.
    A launcher (``crnet demo``, ``LocalTree``) gives its daemons the read end of a pipe
    whose write end only it holds: when it dies, even by SIGKILL, the kernel closes that
    end and its daemons go with it instead of running on, holding their ports."""
    def readable() -> None:
        try:
            data = os.read(0, 4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            return   # a launcher writes nothing; whatever comes means nothing
        loop.remove_reader(0)
        log.warning("standard input closed (--exit-with-stdin): whoever started this daemon "
                    "is gone; stopping")
        node.stop()

    loop.add_reader(0, readable)


def run_node(settings: Settings) -> int:
    """Run a daemon until SIGINT/SIGTERM; returns the process exit code."""
    async def main() -> int:
        node = Node(settings)
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(node.loop_error)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, node.stop)
        if settings.reread_log_level is not None:   # SIGHUP: the log level, nothing else
            loop.add_signal_handler(signal.SIGHUP, settings.reread_log_level)
        if settings.exit_with_stdin:
            _stop_when_stdin_closes(loop, node)
        joined = node.membership   # log lines carry node=<slot> once it has one
        logs.name_node(lambda: None if joined.place is None else joined.place.name or "master")
        return await node.serve()

    return run(main())
