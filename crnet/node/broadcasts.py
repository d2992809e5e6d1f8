"""Broadcasts: one process's vector to every process of the job, through the master.

A broadcast is named by a ``key`` (unique within a job). The sending process's daemon
copies the vector out of shared memory and sends it up, piece by piece; each node
relays the pieces of the first sender it hears from for that key (``origin``) and drops
any other's, so when several processes answer the same request (a newcomer asking for
the state, which every up-to-date replica holds), each link carries the vector once.
The master takes the first complete copy and sends it down to every node, which relays
each piece on as it arrives and keeps the last ``HELD`` broadcasts for the processes
that ask for them later.

The same machinery carries state requests: a process that joins a running job sends
WANT_STATE(nonce) up; the master sends it down to every node, whose processes see it
in shared memory at their next step boundary and answer as broadcast ``state/<nonce>``.

Nothing here waits: a broadcast that never completes (its sender died mid-way) leaves
its receivers to their timeout, and the newcomer asks again.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .. import defaults
from ..dtypes import DTYPES
from ..errors import ProtocolError
from ..messages import Bcast, WantState, state_key
from ..schemes.base import Place
from ..schemes.chunks import chunk_bytes_for
from .neighbours import Neighbours
from .signal import Signal

log = logging.getLogger("crnet.node")

HELD = 4              # complete broadcasts a node keeps for processes that ask later
IN_FLIGHT = 16        # incomplete ones it assembles at once (the oldest is dropped)
STATE = state_key(0).rpartition("/")[0] + "/"    # the keys of state answers


@dataclass
class Held:
    """A complete broadcast: what its sender said it belongs to, and the vector."""

    step: int
    vector: np.ndarray


@dataclass
class _Assembly:
    """A broadcast arriving piece by piece from one source (a child slot, the local
    process, or the parent), into a buffer that its relayed pieces reference."""

    source: object
    origin: int
    step: int
    total: int
    dtype: np.dtype
    data: bytearray
    pieces: set[int] = field(default_factory=set)   # offsets received
    got: int = 0

    def fits(self, msg: Bcast, nbytes: int) -> bool:
        return (msg.origin, msg.step, msg.total, DTYPES[msg.dtype]) == (
            self.origin, self.step, self.total, self.dtype) and msg.offset + nbytes <= len(self.data)

    @property
    def complete(self) -> bool:
        return self.got == len(self.data)

    def vector(self) -> np.ndarray:
        return np.frombuffer(self.data, dtype=self.dtype, count=self.total)


Waiter = Callable[[Held], None]


def _nothing() -> None:
    """Stops waiting for a broadcast that was there at once."""


class Broadcasts:
    def __init__(self, neighbours: Neighbours, place: Callable[[], Place | None]):
        self.neighbours = neighbours
        self._place = place
        self.held: OrderedDict[str, Held] = OrderedDict()
        self._up: OrderedDict[str, _Assembly] = OrderedDict()     # toward the master
        self._down: OrderedDict[str, _Assembly] = OrderedDict()   # from the master
        self._relayed: OrderedDict[str, None] = OrderedDict()     # keys sent up in full
        self._waiters: dict[str, Signal[Held]] = {}                # key -> who waits for it
        self.state_request = 0                                    # the newest one (nonce)
        self.on_state_request: Signal[int] = Signal()             # this host's processes

    # ------------------------------------------------------------ from this host's processes
    def publish(self, key: str, step: int, vector: np.ndarray) -> str | None:
        """This host's process sends ``vector`` as broadcast ``key``: copied at once (the
        process may reuse its memory when this returns). None, or why it cannot go."""
        place = self._place()
        if place is None:
            return "this node has not joined the tree yet"
        if key in self.held or key in self._relayed or key in self._up or key in self._down:
            return None                       # someone else's copy went first: nothing to do
        data = bytearray(vector.nbytes)
        np.frombuffer(data, dtype=vector.dtype)[:] = vector
        if place.is_master:
            self._complete(key, step, np.frombuffer(data, dtype=vector.dtype))
            return None
        if self.neighbours.parent is None:
            return "this node is cut off from its parent: the broadcast cannot reach the master"
        a = _Assembly("local", secrets.randbits(62), step, vector.size, vector.dtype, data)
        a.got = len(data)
        self._relay_up(key, a, 0, len(data), chunk=chunk_bytes_for(len(data), place.chunk_bytes))
        self._remember_relayed(key)
        return None

    def receive(self, key: str, waiter: Waiter) -> Callable[[], None]:
        """``waiter(held)`` once broadcast ``key`` is here (now, if it is). The function
        returned stops waiting (the process gave up, or left)."""
        held = self.held.get(key)
        if held is not None:
            waiter(held)
            return _nothing
        waiters = self._waiters.setdefault(key, Signal())
        disconnect = waiters.connect(waiter)

        def cancel() -> None:
            disconnect()
            if not len(waiters) and self._waiters.get(key) is waiters:
                del self._waiters[key]
        return cancel

    def want_state(self, nonce: int) -> None:
        """A process here or below wants a peer's state: the master asks everyone."""
        place = self._place()
        if place is not None and place.is_master:
            self.state_requested(nonce)
        else:
            self.neighbours.to_parent(WantState(nonce))

    def state_requested(self, nonce: int) -> None:
        """The master asks every process for its state: tell this subtree and this host."""
        self.state_request = nonce
        msg = WantState(nonce)
        for slot in self.neighbours.slots:
            if slot.link is not None:
                slot.link.send(msg)
        self.on_state_request.emit(nonce)

    # ------------------------------------------------------------ pieces from the tree
    def child_dest(self, k: int, msg: Bcast, nbytes: int) -> memoryview | None:
        """Where a child's piece goes: the assembly relayed up, or nowhere (another
        sender's copy is already on its way, or done)."""
        if msg.key in self.held or msg.key in self._relayed:
            return None
        a = self._up.get(msg.key)
        if a is None:
            a = self._up[msg.key] = self._start(("child", k), msg)
            self._bound(self._up)
        elif a.source != ("child", k) or a.origin != msg.origin:
            return None
        return self._dest(a, msg, nbytes)

    def from_child(self, k: int, msg: Bcast, payload) -> None:
        a = self._up.get(msg.key)
        if payload is None or a is None or a.source != ("child", k):
            return
        place = self._place()
        if place is not None and place.is_master:
            if a.complete:
                del self._up[msg.key]
                self._complete(msg.key, a.step, a.vector())
            return
        self._relay_up(msg.key, a, msg.offset, len(payload), chunk=len(payload))
        if a.complete:
            del self._up[msg.key]
            self._remember_relayed(msg.key)

    def parent_dest(self, msg: Bcast, nbytes: int) -> memoryview | None:
        if msg.key in self.held:
            return None
        a = self._down.get(msg.key)
        if a is None:
            a = self._down[msg.key] = self._start("parent", msg)
            self._bound(self._down)
        elif a.origin != msg.origin:
            raise ProtocolError(f"BCAST {msg.key!r}: two copies from the parent")
        return self._dest(a, msg, nbytes)

    def from_parent(self, msg: Bcast, payload) -> None:
        a = self._down.get(msg.key)
        if payload is None or a is None:
            return
        piece = memoryview(a.data)[msg.offset:msg.offset + len(payload)]
        self._to_children(msg, piece)     # on down at once: a large vector flows through
        if a.complete:
            del self._down[msg.key]
            self._keep(msg.key, a.step, a.vector())

    # ------------------------------------------------------------ links and jobs
    def child_lost(self, k: int) -> None:
        """A child's half-sent copy will not complete: let another sender's through."""
        for key, a in list(self._up.items()):
            if a.source == ("child", k):
                del self._up[key]

    def parent_lost(self) -> None:
        self._down.clear()

    def new_job(self) -> None:
        """The previous job's broadcasts are moot (its processes were told it is over)."""
        self.held.clear()
        self._up.clear()
        self._down.clear()
        self._relayed.clear()
        self._waiters.clear()
        self.state_request = 0

    # ------------------------------------------------------------ the rest
    def _start(self, source: object, msg: Bcast) -> _Assembly:
        dtype = DTYPES[msg.dtype]
        return _Assembly(source, msg.origin, msg.step, msg.total, dtype,
                         bytearray(msg.total * dtype.itemsize))

    def _dest(self, a: _Assembly, msg: Bcast, nbytes: int) -> memoryview:
        if not a.fits(msg, nbytes) or msg.offset in a.pieces or msg.offset % a.dtype.itemsize:
            raise ProtocolError(f"BCAST {msg.key!r}: a piece at byte {msg.offset} ({nbytes} "
                                f"bytes) does not fit the {a.total} x {a.dtype} vector begun")
        a.pieces.add(msg.offset)
        a.got += nbytes
        return memoryview(a.data)[msg.offset:msg.offset + nbytes]

    def _relay_up(self, key: str, a: _Assembly, offset: int, nbytes: int, chunk: int) -> None:
        view = memoryview(a.data)
        for start in range(offset, offset + nbytes, chunk):
            stop = min(start + chunk, offset + nbytes)
            self.neighbours.to_parent(Bcast(key, a.origin, a.step, start, a.total, a.dtype.name),
                                      view[start:stop])

    def _complete(self, key: str, step: int, vector: np.ndarray) -> None:
        """The master has the first complete copy of ``key``: it is the broadcast."""
        place = self._place()
        chunk = chunk_bytes_for(vector.nbytes, defaults.CHUNK_BYTES if place is None
                                else place.chunk_bytes)
        origin = secrets.randbits(62)
        view = vector.data.cast("B")
        for start in range(0, view.nbytes, chunk):
            msg = Bcast(key, origin, step, start, vector.size, vector.dtype.name)
            self._to_children(msg, view[start:start + chunk])
        log.info("broadcast %r: %d x %s from step %d, sent down", key, vector.size,
                 vector.dtype, step)
        self._remember_relayed(key)
        self._keep(key, step, vector)

    def _to_children(self, msg: Bcast, piece: memoryview) -> None:
        for slot in self.neighbours.slots:
            if slot.link is not None:
                slot.link.send(msg, piece)

    def _keep(self, key: str, step: int, vector: np.ndarray) -> None:
        held = self.held[key] = Held(step, vector)
        while len(self.held) > HELD:
            self.held.popitem(last=False)
        keys = [key]
        if key.startswith(STATE):
            # Any peer's state is good for every process still waiting for one: requests
            # made at the same time are answered by the newest's answer (peers answer
            # only the newest request they see).
            keys += [k for k in self._waiters if k.startswith(STATE) and k != key]
        for k in keys:
            waiters = self._waiters.pop(k, None)
            if waiters is not None:
                waiters.emit(held)

    def _remember_relayed(self, key: str) -> None:
        self._relayed[key] = None
        while len(self._relayed) > 4 * IN_FLIGHT:
            self._relayed.popitem(last=False)

    @staticmethod
    def _bound(assemblies: OrderedDict) -> None:
        while len(assemblies) > IN_FLIGHT:
            key, _ = assemblies.popitem(last=False)
            log.warning("broadcast %r dropped half-received: too many under way", key)
