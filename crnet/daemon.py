"""crnetd: one host of the CodedReduce tree.

A daemon owns three kinds of links: the ones to its children (it listens), the one
to its parent (it connects; the master has none) and the one to its local training
process (a Unix socket, vectors in shared memory). Join, then steps:

- Join. A node says HELLO to its parent, which gives it a child slot (or the slot
  its ``--name`` held before) and the tree; every node reports how many workers of
  its subtree have joined; once all N have, the master computes ``crnet.plan`` and
  ASSIGNs every subtree its allocation down the tree.
- Step. Chunks of the children's coded messages are received straight into
  per-child arrays; ``UpStep`` decodes each chunk the moment the local vector and
  n-s children have it, and the chunk goes up. The master's decode is the step's
  full gradient: it goes down as RESULT chunks, forwarded by every node to all its
  children (stragglers included) and to its training process.
- Failure. A child that disconnects or reports FAIL is a straggler. A step that
  does not reach its quorum within ``timeout`` of starting at a node fails there:
  a node reports FAIL up (its parent treats it as a straggler), the master
  broadcasts the failure, and every client gets the same StepFailed.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import time
from dataclasses import dataclass, field

import msgpack
import numpy as np

from . import __version__, kernels
from .plan import Tree, plan as make_plan
from .schemes.chunks import DTYPES, ChunkLayout
from .schemes.buffers import BufferPool
from .schemes.coded_reduce import ResultStep, UpStep
from .transport import Connection, loop_name
from .links import (MAX_CONTROL_PAYLOAD, RECONNECT_BACKOFF, RING_SLOT, ChildLink, ClientLink,
                    FatalJoinError, ParentLink, RetryJoin, RingLinks)
from .wire import VERSION, Limits, MsgType, ProtocolError, encode

log = logging.getLogger("crnet.daemon")

@dataclass
class Settings:
    role: str                                  # "master" or "node"
    scheme: str = "cr"                         # master only: cr, gc, tree (CR shapes) or rar
    listen: tuple[str, int] | None = None
    parent: tuple[str, int] | None = None
    name: str | None = None                    # node: the slot to ask the parent for
    tree: Tree | None = None                   # master only
    samples: int | None = None                 # master only
    code_kind: str = "auto"                    # master only
    chunk_bytes: int = 1 << 20                 # master only: the tree uses the master's
    client_socket: str | None = None
    timeout: float = 30.0
    keep_results: int = 4


@dataclass
class Stats:
    """Counters a client can read (``Client.stats()``) and the daemon logs."""

    steps_done: int = 0
    steps_failed: int = 0
    children_skipped: int = 0          # children a step was decoded without
    times_skipped: int = 0             # steps this node's parent finished without it
    decode_seconds: float = 0.0
    receive_seconds: float = 0.0       # first child byte of a step -> its quorum decoded
    bytes_up: int = 0                  # received from children
    bytes_down: int = 0                # received from the parent

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ChildSlot:
    link: Connection | None = None
    address: str | None = None         # where it listens (ring successor address, rar)
    workers: int = 0                   # joined workers in this child's subtree
    assigned: bool = False             # ASSIGN sent on this connection
    sent_results: set = field(default_factory=set)


class Daemon:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.stats = Stats()
        self.stopping = asyncio.Event()
        self.exit_code = 0
        is_master = settings.role == "master"
        self.name: str | None = "" if is_master else settings.name
        self.tree: Tree | None = settings.tree if is_master else None
        self.layer: int | None = 0 if is_master else None
        self.samples = settings.samples if is_master else None
        self.code_kind = settings.code_kind
        self.scheme = settings.scheme
        self.ring: RingLinks | None = None     # rar only: rank, successor, steps
        self.chunk_bytes = settings.chunk_bytes
        self.subtree: dict | None = None       # name -> [layer, local, responsibility]
        self.slots: list[ChildSlot] = []
        self.parent: Connection | None = None
        self.client: ClientLink | None = None
        self.listen_address: tuple[str, int] | None = None
        self.up: UpStep | None = None
        self.down: dict[int, ResultStep] = {}
        self.results: collections.OrderedDict[int, ResultStep] = collections.OrderedDict()
        self.failed: collections.OrderedDict[int, str] = collections.OrderedDict()
        self.resolved_through = -1
        self._child_buffers: tuple | None = None
        self.pool = BufferPool()               # outputs and results, reused once unreferenced
        self._timer: tuple[int, asyncio.TimerHandle] | None = None
        self._clock_step = -1                  # the newest step whose clock has started
        self._joined_reported = -1
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: list[asyncio.Task] = []
        if is_master:
            self._welcomed()

    # ------------------------------------------------------------------ lifecycle
    @property
    def is_master(self) -> bool:
        return self.settings.role == "master"

    @property
    def label(self) -> str:
        if self.name is None:
            return "node (joining)"
        return "master" if self.name == "" else f"node {self.name}"

    @property
    def is_leaf(self) -> bool:
        return self.tree is not None and self.layer == self.tree.layers

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        log.info("crnetd %s starting as %s; event loop %s; kernels %s", __version__,
                 self.settings.role, loop_name(),
                 "cython" if kernels.HAVE_CYTHON else "numpy reference (slow)")
        if self.settings.listen is not None:
            host, port = self.settings.listen
            server = await loop.create_server(
                lambda: Connection(ChildLink(self), self._tree_limits()), host, port)
            self._servers.append(server)
            self.listen_address = server.sockets[0].getsockname()[:2]
            log.info("listening for children on %s:%d", *self.listen_address)
        if self.settings.client_socket:
            path = self.settings.client_socket
            if os.path.exists(path):
                os.unlink(path)  # a stale socket from a previous run
            server = await loop.create_unix_server(
                lambda: Connection(ClientLink(self), Limits(max_payload=0), "client"), path)
            self._servers.append(server)
            log.info("training processes connect to %s", path)
        if self.is_master:
            log.info("master: tree fanout %s, stragglers %s: waiting for %d workers",
                     list(self.tree.fanout), list(self.tree.stragglers), self.tree.workers)
        else:
            self._tasks.append(asyncio.create_task(self._parent_loop(), name="parent"))

    async def serve(self) -> int:
        """Run until stopped (signal, fatal join error); then shut down in order."""
        await self.start()
        await self.stopping.wait()
        await self.shutdown()
        return self.exit_code

    def stop(self, code: int = 0) -> None:
        self.exit_code = self.exit_code or code
        self.stopping.set()

    async def shutdown(self) -> None:
        for server in self._servers:
            server.close()                      # stop accepting
        self._cancel_timer()
        for slot in self.slots:
            if slot.link is not None:
                slot.link.close()
        if self.parent is not None:
            self.parent.close()
        if self.client is not None:
            self.client.conn.close()
        if self.ring is not None:
            self.ring.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        if self.settings.client_socket and os.path.exists(self.settings.client_socket):
            os.unlink(self.settings.client_socket)
        log.info("%s stopped", self.label)

    def _tree_limits(self) -> Limits:
        return Limits(max_payload=max(self.chunk_bytes, MAX_CONTROL_PAYLOAD))

    # ------------------------------------------------------------------ join: parent side
    def _welcomed(self) -> None:
        """We know our place in the tree: size the child slots."""
        fanout = 0 if self.is_leaf else self.tree.fanout[self.layer]
        if len(self.slots) != fanout:
            self.slots = [ChildSlot() for _ in range(fanout)]
        if self.scheme == "rar" and not self.is_master and self.settings.listen is None:
            log.error("%s is in a ring (--scheme rar) and must accept its predecessor: "
                      "start it with --listen", self.label)
            self.stop(2)
        if fanout and self.settings.listen is None:
            log.error("%s is at layer %d of %d and must accept children: start it with --listen",
                      self.label, self.layer, self.tree.layers)
            self.stop(2)

    def child_hello(self, link: Connection, header: dict) -> int | None:
        """Admit a child: its slot, or None after sending REFUSE."""
        def refuse(reason, retry=False):
            log.warning("refusing %s: %s", link.label, reason)
            link.send(MsgType.REFUSE, {"reason": reason, "retry": retry})
            link.close()
            return None

        if header.get("version") != VERSION:
            return refuse(f"protocol version {header.get('version')!r}, {self.label} speaks {VERSION}")
        if header.get("role") == "ring":
            if self.ring is None:
                return refuse(f"{self.label} is not in a ring", retry=True)
            self.ring.predecessor = link
            link.send(MsgType.WELCOME, {"version": VERSION, "ring": True})
            return RING_SLOT
        if self.tree is None:
            return refuse(f"{self.label} has not joined the tree yet", retry=True)
        if self.is_leaf:
            return refuse(f"{self.label} is a leaf (layer {self.layer} of {self.tree.layers}): "
                          "it accepts no children")
        wanted = header.get("name")
        children = self.tree.children(self.name)
        if wanted is not None:
            if wanted not in children:
                return refuse(f"{wanted!r} is not a child of {self.label} "
                              f"(its children are {children[0]}..{children[-1]})")
            k = children.index(wanted)
            if self.slots[k].link is not None:
                return refuse(f"slot {wanted} of {self.label} is held by a live connection",
                              retry=True)
        else:
            free = [k for k, slot in enumerate(self.slots) if slot.link is None]
            if not free:
                return refuse(f"{self.label} has all {len(self.slots)} child slots taken")
            k = free[0]
        listen = header.get("listen")
        if isinstance(listen, str) and listen.startswith("0.0.0.0:"):
            # It listens everywhere: reach it at the address it connected from.
            listen = f"{link.label.rpartition(':')[0]}:{listen.rpartition(':')[2]}"
        self.slots[k] = ChildSlot(link=link, address=listen if isinstance(listen, str) else None)
        link.send(MsgType.WELCOME, {
            "version": VERSION, "name": children[k], "layer": self.layer + 1,
            "fanout": list(self.tree.fanout), "stragglers": list(self.tree.stragglers),
            "code": self.code_kind, "chunk_bytes": self.chunk_bytes, "scheme": self.scheme,
        })
        log.info("child %s joined from %s", children[k], link.label)
        return k

    def child_joined(self, k: int, workers: int) -> None:
        slot = self.slots[k]
        slot.workers = workers
        self._report_joined()
        if self.subtree is not None and not slot.assigned and workers:
            self._assign_child(k)

    def child_lost(self, k: int, link: Connection) -> None:
        slot = self.slots[k]
        if slot.link is not link:
            return
        self.slots[k] = ChildSlot(address=slot.address)
        log.warning("child %s disconnected", self.tree.children(self.name)[k])
        if self.up is not None and self.up.code is not None:
            self.up.silent.add(k)
        self._report_joined()

    def _report_joined(self) -> None:
        count = (0 if self.is_master else 1) + sum(s.workers for s in self.slots if s.link)
        if count == self._joined_reported:
            return
        self._joined_reported = count
        if not self.is_master:
            if self.parent is not None:
                self.parent.send(MsgType.JOINED, {"workers": count})
            return
        log.info("%d/%d workers joined", count, self.tree.workers)
        if count == self.tree.workers and self.subtree is None:
            p = make_plan(self.tree, self.samples, self.code_kind)
            self.subtree = {a.name: [a.layer, a.local, a.responsibility] for a in p.nodes.values()}
            log.info("all workers joined: plan for %d samples, d* = %.6g, max local %d",
                     self.samples, p.optimal_load, p.max_local_samples)
            self._assigned()

    def _assigned(self) -> None:
        for k, slot in enumerate(self.slots):
            if slot.link is not None and slot.workers and not slot.assigned:
                self._assign_child(k)
        if self.client is not None:
            self.client.welcome()

    def _assign_child(self, k: int) -> None:
        child = self.tree.children(self.name)[k]
        prefix = child + "."
        sub = {n: v for n, v in self.subtree.items() if n == child or n.startswith(prefix)}
        slot = self.slots[k]
        header = {"samples": self.samples}
        if self.scheme == "rar":
            successor = self.slots[(k + 1) % len(self.slots)].address
            header["ring"] = {"rank": k, "size": len(self.slots), "successor": successor}
        slot.assigned = slot.link.send(MsgType.ASSIGN, header, msgpack.packb(sub))

    @property
    def assignment(self) -> dict | None:
        if self.subtree is None:
            return None
        layer, local, responsibility = self.subtree[self.name]
        return {"name": self.name, "layer": layer, "samples": self.samples,
                "ranges": [list(r) for r in local], "workers": self.tree.workers,
                "responsibility": [list(r) for r in responsibility]}

    # ------------------------------------------------------------------ join: child side
    async def _parent_loop(self) -> None:
        host, port = self.settings.parent
        delay = RECONNECT_BACKOFF[0]
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            link = ParentLink(self)
            try:
                _, conn = await loop.create_connection(
                    lambda: Connection(link, self._tree_limits(), f"parent {host}:{port}"),
                    host, port)
                conn.send(MsgType.HELLO, {"version": VERSION, "role": "node", "name": self.name,
                                          "listen": _format_address(self.listen_address)})
                await link.welcome
            except OSError as e:
                log.info("parent %s:%d not reachable (%s); retrying in %.1fs", host, port,
                         e.strerror or e, delay)
            except FatalJoinError as e:
                log.error("parent %s:%d refused this node: %s", host, port, e)
                self.stop(2)
                return
            except RetryJoin as e:
                log.info("parent %s:%d asks to retry: %s", host, port, e)
            else:
                delay = RECONNECT_BACKOFF[0]
                self.parent = conn
                self._joined_reported = -1
                self._report_joined()
                await conn.closed
                self.parent = None
                self._parent_lost(f"lost the connection to its parent {host}:{port}")
                if self.stopping.is_set():
                    return
                log.warning("%s lost its parent; reconnecting", self.label)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_BACKOFF[1])

    def parent_welcome(self, header: dict) -> None:
        tree = Tree(header["fanout"], header["stragglers"])
        if self.tree is not None and tree != self.tree:
            raise FatalJoinError(f"the parent's tree {tree} differs from the one this node joined")
        self.tree, self.name, self.layer = tree, header["name"], header["layer"]
        self.code_kind, self.chunk_bytes = header["code"], header["chunk_bytes"]
        self.scheme = header.get("scheme", "cr")
        log.info("joined as %s (layer %d of %d)", self.name, self.layer, tree.layers)
        self._welcomed()

    def parent_assign(self, header: dict, payload: memoryview) -> None:
        self.samples = header["samples"]
        self.subtree = msgpack.unpackb(payload, max_array_len=1 << 24, max_map_len=1 << 24)
        if self.name not in self.subtree:
            raise ProtocolError(f"assignment for {self.label} is missing from the parent's ASSIGN")
        a = self.subtree[self.name]
        log.info("assignment: %d local samples of %d", sum(b - s for s, b, _ in a[1]), self.samples)
        ring = header.get("ring")
        if ring is not None and self.ring is None:
            self.ring = RingLinks(self, int(ring["rank"]), int(ring["size"]), ring["successor"])
            self._tasks.append(asyncio.create_task(self.ring.connect_loop(), name="ring"))
        self._assigned()

    def _parent_lost(self, reason: str) -> None:
        pending = set(self.down)
        if self.up is not None:
            pending.add(self.up.step)
        if self.client is not None and self.client.waiting is not None:
            pending.add(self.client.waiting[0])
        for step in sorted(pending):
            if step > self.resolved_through:
                self._fail(step, f"{self.label} {reason}")

    # ------------------------------------------------------------------ steps: upward
    def _up_for(self, step: int, layout: ChunkLayout) -> UpStep | None:
        """The UpStep for ``step``, started if new; None if the step is older."""
        if self.up is not None:
            if self.up.step == step:
                return self.up
            if self.up.step > step:
                return None
            self._abandon_up()
        code = None if self.is_leaf else self.tree.code_of(self.name, self.code_kind)
        self.up = UpStep(step, layout, code, has_local=not self.is_master,
                         child_buffers=self._buffers_for(layout, code), alloc=self.pool.get)
        self.up.silent.update(k for k, s in enumerate(self.slots) if s.link is None)
        self._step_begins(step)
        return self.up

    def _buffers_for(self, layout: ChunkLayout, code) -> list[np.ndarray] | None:
        """Per-child receive arrays, reused from step to step (nothing else holds them)."""
        if code is None:
            return None
        key = (layout.total, layout.dtype, code.n)
        if self._child_buffers is None or self._child_buffers[0] != key:
            self._child_buffers = (key, [np.empty(layout.total, layout.dtype) for _ in range(code.n)])
        return self._child_buffers[1]

    def _step_begins(self, step: int) -> None:
        """Start the step's clock at this node (once): the quorum must come within timeout."""
        if step <= self._clock_step:
            return
        self._clock_step = step
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self._timer = (step, loop.call_later(self.settings.timeout, self._timed_out, step))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer[1].cancel()
            self._timer = None

    def _timed_out(self, step: int) -> None:
        self._timer = None
        if step <= self.resolved_through:
            return
        if self.scheme == "rar" and self.is_master:
            self._fail(step, f"the ring did not finish step {step} within "
                             f"{self.settings.timeout:g} s (a ring waits for every worker)")
            return
        if self.ring is not None:
            ring = self.ring.steps.get(step)
            waiting = "its local vector" if ring is None else "the ring's segments"
            self._fail(step, f"ring allreduce at {self.label} did not get {waiting} within "
                             f"{self.settings.timeout:g} s (a ring waits for every worker)")
            if self.parent is not None:
                self.parent.send(MsgType.FAIL, {"step": step, "reason": "ring stalled"})
            return
        up = self.up if self.up is not None and self.up.step == step else None
        if up is not None and up.complete:
            return  # our part is done; the parent decides
        lacking = up.waiting_for() if up is not None else "any message for this step"
        reason = f"{self.label} did not get {lacking} within {self.settings.timeout:g} s"
        if self.is_master:
            self._fail(step, reason)
        else:
            log.warning("step %d: %s; telling the parent", step, reason)
            if self.parent is not None:
                self.parent.send(MsgType.FAIL, {"step": step, "reason": reason})

    def child_chunk_dest(self, k: int, link: Connection, header: dict, nbytes: int):
        step, chunk = header.get("step"), header.get("chunk")
        if not isinstance(step, int):
            raise ProtocolError("CHUNK without an integer step")
        if step <= self.resolved_through:
            self._catch_up(k, step)
            return None  # a straggler's late chunk: dropped unread into scratch
        total, dtype_name = header.get("total"), header.get("dtype")
        up = self.up
        if up is None or up.step != step:  # the step's first chunk here: its layout
            dtype = DTYPES.get(dtype_name)
            if dtype is None or not isinstance(total, int) or total < 1:
                raise ProtocolError(f"CHUNK with bad dtype {dtype_name!r} or total {total!r}")
            up = self._up_for(step, ChunkLayout.of(total, dtype, self.chunk_bytes))
        if up is None or k in up.silent:
            return None
        problem = up.layout.check(total, dtype_name, chunk, nbytes)
        if problem:
            log.warning("step %d: child %d: %s; ignoring it this step", step, k, problem)
            link.send(MsgType.FAIL, {"step": step, "reason": problem, "kind": "mismatch"})
            up.silent.add(k)
            return None
        if up.first_byte is None:
            up.first_byte = time.perf_counter()
        return up.child_buffer(k, chunk)

    def child_chunk(self, k: int, header: dict) -> None:
        up = self.up
        if up is None or up.step != header["step"]:
            return
        self.stats.bytes_up += up.layout.nbytes(header["chunk"])
        self._emit(up, up.child_arrived(k, header["chunk"]))

    def child_failed(self, k: int, header: dict) -> None:
        step = header.get("step")
        log.info("step %s: child %d reports: %s", step, k, header.get("reason"))
        if self.scheme == "rar" and isinstance(step, int):
            self._fail(step, f"ring allreduce failed at worker {k}: {header.get('reason')}")
            return
        if isinstance(step, int) and step > self.resolved_through:
            if self.up is not None and self.up.step == step:
                self.up.silent.add(k)
            self._step_begins(step)

    def local_submitted(self, step: int, vector: np.ndarray) -> str | None:
        """The training process's local gradient; returns a mismatch reason or None."""
        if self.is_master:
            self._step_begins(step)
            return None
        layout = ChunkLayout.of(vector.size, vector.dtype, self.chunk_bytes)
        if self.ring is not None:
            return self.ring.local_arrived(step, layout, vector)
        up = self._up_for(step, layout)
        if up is None:
            return None
        problem = up.layout.mismatch(layout, step)
        if problem is None:
            self._emit(up, up.local_arrived(vector))
        return problem

    def _emit(self, up: UpStep, chunks: list[int]) -> None:
        for c in chunks:
            t0 = time.perf_counter()
            message = up.decode(c)
            self.stats.decode_seconds += time.perf_counter() - t0
            if self.is_master:
                result = self.down.get(up.step)
                if result is None:
                    result = self.down[up.step] = ResultStep(up.step, up.layout, up.output)
                self._result_chunk(result, c)
            elif self.parent is not None:
                layout = up.layout
                self.parent.send(MsgType.CHUNK, {
                    "step": up.step, "chunk": c, "total": layout.total, "dtype": layout.dtype.name,
                }, message)
        if chunks and up.complete and up.code is not None:
            self.stats.children_skipped += up.code.n - len(up.used)
            if up.first_byte is not None:
                self.stats.receive_seconds += time.perf_counter() - up.first_byte

    def _abandon_up(self) -> None:
        up = self.up
        self.up = None
        if up is not None and not up.complete and not self.is_master:
            self.stats.times_skipped += 1
            log.info("step %d finished without this node (%s missing)", up.step, up.waiting_for())

    # ------------------------------------------------------------------ steps: downward
    def parent_result_dest(self, header: dict, nbytes: int):
        step, chunk = header.get("step"), header.get("chunk")
        if not isinstance(step, int):
            raise ProtocolError("RESULT without an integer step")
        if step <= self.resolved_through:
            return None
        result = self.down.get(step)
        if result is None:
            dtype = DTYPES.get(header.get("dtype"))
            total = header.get("total")
            if dtype is None or not isinstance(total, int) or total < 1:
                raise ProtocolError(f"RESULT with bad dtype or total: {header}")
            result = self.down[step] = ResultStep(step, ChunkLayout.of(total, dtype, self.chunk_bytes),
                                                  alloc=self.pool.get)
        problem = result.layout.check(header.get("total"), header.get("dtype"), chunk, nbytes)
        if problem:
            raise ProtocolError(f"RESULT for step {step}: {problem}")
        return result.dest(chunk)

    def parent_result(self, header: dict) -> None:
        result = self.down.get(header["step"])
        if result is not None:
            self.stats.bytes_down += result.layout.nbytes(header["chunk"])
            self._result_chunk(result, header["chunk"])

    def _result_chunk(self, result: ResultStep, c: int) -> None:
        """Chunk c of a step's full gradient is here: pass it on to every child."""
        result.arrived(c)
        frame = encode(MsgType.RESULT, {"step": result.step, "chunk": c,
                                        "total": result.layout.total,
                                        "dtype": result.layout.dtype.name}, result.chunk(c))
        cap = max(4 * result.vector.nbytes, 64 << 20)
        for slot in self.slots if self.scheme != "rar" else ():
            if slot.link is None:
                continue
            if slot.link.writing_paused and slot.link.write_buffer_size > cap:
                # Results keep coming whether or not it reads: don't hold them forever.
                slot.link.abort(f"child stopped reading ({slot.link.write_buffer_size} bytes queued)")
                continue
            slot.link.write(frame)
            if result.complete:
                slot.sent_results.add(result.step)
        if result.complete:
            self._resolved(result)

    def _resolved(self, result: ResultStep) -> None:
        step = result.step
        self.down.pop(step, None)
        self._keep(self.results, step, result)
        self._mark_resolved(step)
        self.stats.steps_done += 1
        log.debug("step %d done", step)
        if self.client is not None:
            self.client.result_ready(step)

    def _fail(self, step: int, reason: str) -> None:
        """The step can't complete: tell the subtree and the training process."""
        if step <= self.resolved_through and step not in self.down:
            return
        log.error("step %d failed: %s", step, reason)
        self.down.pop(step, None)
        self._keep(self.failed, step, reason)
        self._mark_resolved(step)
        self.stats.steps_failed += 1
        for slot in self.slots:
            if slot.link is not None:
                slot.link.send(MsgType.FAIL, {"step": step, "reason": reason})
                slot.sent_results.add(step)
        if self.client is not None:
            self.client.result_ready(step)

    def _keep(self, outcomes: collections.OrderedDict, step: int, outcome) -> None:
        """Remember a step's result (or failure) for the last ``keep_results`` steps."""
        outcomes[step] = outcome
        while len(outcomes) > self.settings.keep_results:
            outcomes.popitem(last=False)

    def _mark_resolved(self, step: int) -> None:
        self.resolved_through = max(self.resolved_through, step)
        for old in [s for s in self.down if s < step]:
            del self.down[old]  # superseded: its remaining chunks are never coming
        if self.up is not None and self.up.step <= step:
            self._abandon_up()
        if self.ring is not None:
            self.ring.resolved(step)
        if self._timer is not None and self._timer[0] <= step:
            self._cancel_timer()

    def _catch_up(self, k: int, step: int) -> None:
        """A child sent a chunk for a step we finished: if it never got the result
        (it reconnected since), send it once."""
        slot = self.slots[k]
        if step in slot.sent_results or slot.link is None:
            return
        slot.sent_results.add(step)
        if step in self.results:
            result = self.results[step]
            for c in range(result.layout.chunks):
                slot.link.send(MsgType.RESULT, {"step": step, "chunk": c, "total": result.layout.total,
                                                "dtype": result.layout.dtype.name}, result.chunk(c))
        else:
            reason = self.failed.get(step, f"the result of step {step} is no longer held "
                                            f"(this node fell more than {self.settings.keep_results} "
                                            "steps behind)")
            slot.link.send(MsgType.FAIL, {"step": step, "reason": reason})

    def parent_failed(self, header: dict) -> None:
        step = header.get("step")
        if isinstance(step, int):
            if header.get("kind") == "mismatch":
                log.error("step %d: the parent rejected this node's vector: %s", step, header.get("reason"))
                if self.client is not None:
                    self.client.mismatch(step, header.get("reason"))
                return
            self._fail(step, str(header.get("reason")))


def _format_address(address) -> str | None:
    return None if address is None else f"{address[0]}:{address[1]}"


def run_daemon(settings: Settings) -> int:
    """Run a daemon until SIGINT/SIGTERM; returns the process exit code."""
    from .transport import run

    async def main() -> int:
        daemon = Daemon(settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, daemon.stop)
        return await daemon.serve()

    return run(main())
