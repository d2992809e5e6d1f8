"""The daemon's links: to its parent, its children, its ring successor (rar), and
the local training process. Each is a ``Connection`` handler that checks what the
peer sent and hands it to the ``Daemon``; the daemon decides what it means.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import numpy as np

from .schemes.chunks import DTYPES, ChunkLayout
from .schemes.coded_reduce import ResultStep
from .schemes.ring_allreduce import RingStep
from .shm import SharedRegion
from .transport import Connection
from .wire import VERSION, Limits, MsgType, ProtocolError

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger("crnet.daemon")

# Control payloads (ASSIGN) are small next to gradients; cap what a peer can make us hold.
MAX_CONTROL_PAYLOAD = 64 << 20
RECONNECT_BACKOFF = (0.1, 2.0)


class FatalJoinError(Exception):
    """The parent refused this node for good (wrong tree, no free slot, a leaf)."""


RING_SLOT = -1  # a ChildLink that carries the ring predecessor's segments (rar)


class RingLinks:
    """A rar worker's ring: the link to its successor, the steps in flight."""

    def __init__(self, daemon: Daemon, rank: int, size: int, successor: str | None):
        self.d = daemon
        self.rank, self.size, self.successor = rank, size, successor
        self.out: Connection | None = None
        self.predecessor: Connection | None = None
        self.steps: dict[int, RingStep] = {}
        self._pending: list[tuple[dict, object]] = []  # sends waiting for the successor link

    async def connect_loop(self) -> None:
        """Keep a connection to the successor (it may start after us)."""
        if self.size == 1:
            return
        if self.successor is None:
            log.error("rar: the master did not know rank %d's successor", self.rank)
            return
        host, _, port = self.successor.rpartition(":")
        loop = asyncio.get_running_loop()
        delay = RECONNECT_BACKOFF[0]
        while not self.d.stopping.is_set():
            outbound, conn = _Outbound(), None
            try:
                _, conn = await loop.create_connection(
                    lambda: Connection(outbound, Limits(max_payload=0), f"ring {self.successor}"),
                    host, int(port))
                conn.send(MsgType.HELLO, {"version": VERSION, "role": "ring", "rank": self.rank})
                # Only an accepted link carries segments: one the successor refuses
                # (it has no ring yet) would swallow them.
                await asyncio.wait_for(outbound.accepted, 30)
            except (OSError, asyncio.TimeoutError, RetryJoin) as e:
                log.info("ring successor %s not ready (%s); retrying", self.successor, e)
                if conn is not None:
                    conn.close()
            else:
                self.out = conn
                for header, payload in self._pending:
                    if header["step"] > self.d.resolved_through:
                        conn.send(MsgType.CHUNK, header, payload)
                self._pending.clear()
                delay = RECONNECT_BACKOFF[0]
                await conn.closed
                self.out = None
                log.warning("lost the ring successor %s; reconnecting", self.successor)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_BACKOFF[1])

    def _step(self, step: int, layout: ChunkLayout) -> RingStep | None:
        if step <= self.d.resolved_through:
            return None
        ring = self.steps.get(step)
        if ring is None:
            ring = self.steps[step] = RingStep(step, layout, self.rank, self.size,
                                               alloc=self.d.pool.get)
            self.d._step_begins(step)
        return ring

    def local_arrived(self, step: int, layout: ChunkLayout, vector) -> str | None:
        ring = self._step(step, layout)
        if ring is None:
            return None
        problem = ring.layout.mismatch(layout, step)
        if problem is None:
            self._send(ring, ring.local_arrived(vector))
        return problem

    def dest(self, header: dict, nbytes: int):
        step, dtype, total = header.get("step"), DTYPES.get(header.get("dtype")), header.get("total")
        if not isinstance(step, int) or dtype is None or not isinstance(total, int) or total < 1:
            raise ProtocolError(f"bad ring CHUNK header {header}")
        ring = self._step(step, ChunkLayout.of(total, dtype, self.d.chunk_bytes))
        if ring is None:
            return None
        problem = ring.check(header.get("phase"), header.get("round"), header.get("segment"), nbytes)
        if problem or ring.layout.total != total or ring.layout.dtype != dtype:
            raise ProtocolError(f"ring step {step}: {problem or 'vector shape differs'}")
        self.d.stats.bytes_up += nbytes
        return ring.dest(header["phase"], header["segment"])

    def received(self, header: dict) -> None:
        ring = self.steps.get(header["step"])
        if ring is None:
            return
        self._send(ring, ring.received(header["phase"], header["round"], header["segment"]))

    def _send(self, ring: RingStep, sends) -> None:
        for send in sends:
            header = {"step": ring.step, "phase": send.phase, "round": send.round,
                      "segment": send.segment, "total": ring.layout.total,
                      "dtype": ring.layout.dtype.name}
            if self.out is None or not self.out.send(MsgType.CHUNK, header, send.payload):
                self._pending.append((header, send.payload))  # sent once the link is (back) up
        if ring.complete:
            del self.steps[ring.step]
            result = ResultStep(ring.step, ring.layout, ring.result)
            for c in range(ring.layout.chunks):
                result.arrived(c)
                if self.rank == 0 and self.d.parent is not None:  # the master's copy
                    self.d.parent.send(MsgType.RESULT, {
                        "step": ring.step, "chunk": c, "total": ring.layout.total,
                        "dtype": ring.layout.dtype.name}, result.chunk(c))
            self.d._resolved(result)

    def resolved(self, step: int) -> None:
        for old in [s for s in self.steps if s <= step]:
            del self.steps[old]
        self._pending = [(h, p) for h, p in self._pending if h["step"] > step]

    def close(self) -> None:
        for conn in (self.out, self.predecessor):
            if conn is not None:
                conn.close()


class _Outbound:
    """Handler of a connection we only send on (the ring successor)."""

    def __init__(self):
        self.accepted = asyncio.get_running_loop().create_future()

    def frame_header(self, conn, msg_type, header, nbytes):
        raise ProtocolError("unexpected payload from the ring successor")

    def frame_received(self, conn, msg_type, header, payload):
        if msg_type == MsgType.WELCOME and not self.accepted.done():
            self.accepted.set_result(None)
        elif msg_type == MsgType.REFUSE:
            if not self.accepted.done():
                self.accepted.set_exception(RetryJoin(str(header.get("reason"))))
            conn.close()

    def connection_lost(self, conn, exc):
        if not self.accepted.done():
            self.accepted.set_exception(ConnectionResetError("the ring successor hung up"))


class RetryJoin(Exception):
    """The parent can't take this node right now; try again shortly."""


class ParentLink:
    """The node's connection to its parent."""

    def __init__(self, daemon: Daemon):
        self.d = daemon
        self.welcome = asyncio.get_running_loop().create_future()

    def frame_header(self, conn, msg_type, header, nbytes):
        if msg_type == MsgType.RESULT:
            return self.d.parent_result_dest(header, nbytes)
        if msg_type == MsgType.ASSIGN and nbytes <= MAX_CONTROL_PAYLOAD:
            return memoryview(bytearray(nbytes))
        raise ProtocolError(f"unexpected payload on {msg_type.name} from the parent")

    def frame_received(self, conn, msg_type, header, payload):
        if msg_type == MsgType.RESULT:
            self.d.parent_result(header)
        elif msg_type == MsgType.FAIL:
            self.d.parent_failed(header)
        elif msg_type == MsgType.WELCOME and not self.welcome.done():
            try:
                self.d.parent_welcome(header)
                self.welcome.set_result(None)
            except FatalJoinError as e:
                self.welcome.set_exception(e)
        elif msg_type == MsgType.REFUSE and not self.welcome.done():
            reason = str(header.get("reason"))
            self.welcome.set_exception(RetryJoin(reason) if header.get("retry") else FatalJoinError(reason))
        elif msg_type == MsgType.ASSIGN:
            self.d.parent_assign(header, payload)
        else:
            raise ProtocolError(f"unexpected {msg_type.name} from the parent")

    def connection_lost(self, conn, exc):
        if not self.welcome.done():
            self.welcome.set_exception(ConnectionResetError("parent closed the connection"))


class ChildLink:
    """A child's connection to this daemon."""

    def __init__(self, daemon: Daemon):
        self.d = daemon
        self.slot: int | None = None

    def frame_header(self, conn, msg_type, header, nbytes):
        if self.slot is None:
            raise ProtocolError(f"{msg_type.name} before HELLO")
        if self.slot == RING_SLOT and msg_type == MsgType.CHUNK:
            return self.d.ring.dest(header, nbytes)
        if msg_type == MsgType.CHUNK:
            return self.d.child_chunk_dest(self.slot, conn, header, nbytes)
        if msg_type == MsgType.RESULT and self.d.scheme == "rar" and self.d.is_master:
            return self.d.parent_result_dest(header, nbytes)  # rank 0 reports the ring's result
        raise ProtocolError(f"unexpected payload on {msg_type.name}")

    def frame_received(self, conn, msg_type, header, payload):
        if self.slot is None:
            if msg_type != MsgType.HELLO:
                raise ProtocolError(f"{msg_type.name} before HELLO")
            self.slot = self.d.child_hello(conn, header)
        elif self.slot == RING_SLOT:
            if msg_type != MsgType.CHUNK:
                raise ProtocolError(f"unexpected {msg_type.name} on a ring link")
            self.d.ring.received(header)
        elif msg_type == MsgType.RESULT and self.d.scheme == "rar" and self.d.is_master:
            self.d.parent_result(header)
        elif msg_type == MsgType.CHUNK:
            self.d.child_chunk(self.slot, header)
        elif msg_type == MsgType.JOINED:
            self.d.child_joined(self.slot, int(header.get("workers", 0)))
        elif msg_type == MsgType.FAIL:
            self.d.child_failed(self.slot, header)
        else:
            raise ProtocolError(f"unexpected {msg_type.name} from a child")

    def connection_lost(self, conn, exc):
        if self.slot == RING_SLOT:
            log.warning("ring predecessor disconnected")
        elif self.slot is not None:
            self.d.child_lost(self.slot, conn)


class ClientLink:
    """The local training process: control frames on a Unix socket, vectors in shm."""

    def __init__(self, daemon: Daemon):
        self.d = daemon
        self.conn: Connection | None = None
        self.region: SharedRegion | None = None
        self.pid = None
        self.waiting: tuple[int, int, np.dtype] | None = None  # step, length, dtype

    def frame_header(self, conn, msg_type, header, nbytes):
        raise ProtocolError("the client link carries no payloads")

    def frame_received(self, conn, msg_type, header, payload):
        d = self.d
        if self.conn is None:
            if msg_type != MsgType.HELLO:
                raise ProtocolError(f"{msg_type.name} before HELLO")
            if d.client is not None:
                conn.send(MsgType.ERROR, {"reason": "another training process is attached to "
                                          f"this daemon (pid {d.client.pid})", "kind": "busy"})
                conn.close()
                return
            self.conn, self.pid = conn, header.get("pid")
            d.client = self
            log.info("training process %s attached", self.pid)
            self.welcome()
        elif msg_type == MsgType.ATTACH:
            try:
                self.region = SharedRegion.attach(str(header["path"]), int(header["capacity"]))
            except (OSError, ValueError, KeyError) as e:
                self.error(f"cannot map shared memory: {e}", "shm")
                return
            conn.send(MsgType.DONE, {"attached": True})
        elif msg_type == MsgType.SUBMIT:
            self.submit(header, contribute=True)
        elif msg_type == MsgType.FETCH:
            self.submit(header, contribute=False)
        elif msg_type == MsgType.STATS:
            conn.send(MsgType.STATS, {"stats": d.stats.as_dict(), "name": d.name,
                                      "resolved_through": d.resolved_through})
        else:
            raise ProtocolError(f"unexpected {msg_type.name} from the client")

    def welcome(self) -> None:
        if self.conn is not None and self.d.assignment is not None:
            self.conn.send(MsgType.WELCOME, {"assignment": self.d.assignment,
                                             "tree_step": self.d.resolved_through})

    def submit(self, header: dict, contribute: bool) -> None:
        step, length, dtype = header.get("step"), header.get("length"), DTYPES.get(header.get("dtype"))
        if not isinstance(step, int) or not isinstance(length, int) or length < 1 or dtype is None:
            self.error(f"bad request {header}", "request")
            return
        if self.region is None or length * dtype.itemsize > self.region.capacity:
            self.error("vector does not fit the attached shared memory", "request")
            return
        self.waiting = (step, length, dtype)
        if step <= self.d.resolved_through:
            self.result_ready(step)
            return
        if contribute:
            problem = self.d.local_submitted(step, self.region.input(dtype, length))
            if problem:
                self.mismatch(step, problem)

    def result_ready(self, step: int) -> None:
        if self.waiting is None or self.waiting[0] != step:
            return
        _, length, dtype = self.waiting
        d = self.d
        if step in d.results:
            result = d.results[step]
            problem = result.layout.mismatch(ChunkLayout.of(length, dtype, d.chunk_bytes), step)
            if problem:
                self.mismatch(step, problem)
                return
            np.copyto(self.region.output(dtype, length), result.vector)
            self.waiting = None
            self.conn.send(MsgType.DONE, {"step": step, "tree_step": d.resolved_through})
        elif step in d.failed:
            self.error(d.failed[step], "failed", step)
        else:
            self.error(f"the result of step {step} is no longer held by this daemon (it keeps the "
                       f"last {d.settings.keep_results}); the tree is at step {d.resolved_through}",
                       "lost", step)

    def mismatch(self, step: int, reason: str) -> None:
        if self.waiting is not None and self.waiting[0] == step:
            self.error(reason, "mismatch", step)

    def error(self, reason: str, kind: str, step: int | None = None) -> None:
        self.waiting = None
        self.conn.send(MsgType.ERROR, {"reason": reason, "kind": kind, "step": step})

    def connection_lost(self, conn, exc):
        if self.d.client is self:
            self.d.client = None
            log.info("training process %s detached", self.pid)
