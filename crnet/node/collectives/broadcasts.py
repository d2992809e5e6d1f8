"""Broadcasts: one process's vector to every process of the job, through the master.

A broadcast is named by a ``key`` (unique within a job). The sending process's daemon
copies the vector out of shared memory and sends it up, piece by piece; each node
relays the pieces of the first sender it hears from for that key (``origin``) and drops
any other's, so when several processes answer the same request (a newcomer asking for
the state, which every up-to-date replica holds), each link carries the vector once.
The master takes the first complete copy and sends it down to every node, which relays
each piece on as it arrives and keeps the last ``HELD`` broadcasts for the processes
that ask for them later.

The same machinery carries the answers to state requests (``state_requests.py``): a
process that joins a running job asks, and the processes that can answer send their
state as broadcast ``state/<nonce>``.

Nothing here waits: a broadcast that never completes (its sender died mid-way) leaves
its receivers to their timeout, and the newcomer asks again.

What a peer may make a node hold is bounded (a child may be broken or hostile): a claimed
vector larger than this host's memory (``max_vector_bytes``) closes its link before
anything is allocated; a vector is allocated piece by piece as its bytes arrive, in
order, never for what is only claimed; and one source has at most ``PER_SOURCE`` (a child
slot) or ``IN_FLIGHT`` (the parent) broadcasts half-received, whose claims add up to at
most that memory: more drops that source's own oldest, never another source's.

A broadcast belongs to its root: the host whose process sent it (``root``, its tree name,
which each parent checks is in the subtree the piece came from). A copy of the same key
from another host is another broadcast: a process that names the root it wants
(``Receive.root``, a rank) gets that root's copy, whoever sent theirs first; processes that
do not know the root's rank vote on its host first (``barriers.py``), then do the same.
State answers are the exception: any process's will do, but the master's own host's
first, while one there can answer; else the master assembles one copy per child slot (at
most one comes up through each) and takes the state that two slots agree on
(``state_answers.py`` says when one slot is enough).

A child speaks only for the processes of the job attached below it (``attached_below``,
the JOB counts of ``jobs.py``): from a child that has none, broadcast pieces and state
requests are dropped.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import defaults
from ...dtypes import DTYPES
from ...errors import ProtocolError
from ...peer_text import shown
from ...protocol.messages import Bcast, state_key
from ...schemes.base import Place
from ...schemes.chunks import chunk_bytes_for
from ..neighbours import Neighbours
from ..signal import Signal
from .state_answers import Answer, digest_of
from .state_requests import StateRequests

log = logging.getLogger("crnet.node")

HELD = 4              # complete broadcasts a node keeps for processes that ask later
IN_FLIGHT = 16        # incomplete ones from the parent it assembles at once (the oldest is dropped)
PER_SOURCE = 4        # ... and from each child slot
STATE = state_key(0).rpartition("/")[0] + "/"    # the keys of state answers


Id = tuple[str, str]    # a broadcast: its key and its root (``ANY_ROOT`` for state answers)
ANY_ROOT = "*"          # not a tree name (nor is ANY_ROOT + a child slot: one slot's copy)


def broadcast_id(key: str, root: str) -> Id:
    """The broadcast that is ``key`` from host ``root``: for a state answer, any host's."""
    return key, ANY_ROOT if key.startswith(STATE) else root


@dataclass
class Held:
    """A complete broadcast: what its sender said it belongs to, and the vector."""

    step: int
    vector: np.ndarray


@dataclass
class _Assembly:
    """A broadcast arriving piece by piece, in order, from one source (a child slot, the
    local process, or the parent): each piece in its own buffer, allocated as it comes
    (what its relayed copies reference), joined into one vector once all are here."""

    source: object
    root: str           # the host whose process sent it
    origin: int
    step: int
    total: int
    dtype: np.dtype
    pieces: list = field(default_factory=list)   # buffers, in offset order
    got: int = 0                                 # bytes received (the next piece's offset)
    digest: Any = None      # a state answer's copy at the master: its hash (digest_of) ...
    keep: bool = True       # ... and whether it keeps its bytes (else each piece goes, hashed)

    @property
    def nbytes(self) -> int:
        return self.total * self.dtype.itemsize

    def fits(self, msg: Bcast, nbytes: int) -> bool:
        return (msg.origin, msg.step, msg.total, DTYPES[msg.dtype]) == (
            self.origin, self.step, self.total, self.dtype) and msg.offset == self.got \
            and self.got + nbytes <= self.nbytes

    @property
    def complete(self) -> bool:
        return self.got == self.nbytes

    def vector(self) -> np.ndarray:
        if len(self.pieces) == 1:
            data = self.pieces[0]
        else:
            data = bytearray(self.nbytes)
            at = 0
            for piece in self.pieces:
                data[at:at + len(piece)] = piece
                at += len(piece)
            self.pieces = [data]
        return np.frombuffer(data, dtype=self.dtype, count=self.total)


Waiter = Callable[[Held], None]


def _nothing() -> None:
    """Stops waiting for a broadcast that was there at once."""


class Broadcasts:
    def __init__(self, neighbours: Neighbours, place: Callable[[], Place | None],
                 max_bytes: int = defaults.MAX_VECTOR_BYTES,
                 attached_below: Callable[[int], int] | None = None,
                 here: Callable[[], Collection[object]] | None = None,
                 window: float = defaults.TIMEOUT,
                 tree_step: Callable[[], int] | None = None):
        """``attached_below(k)``: the processes of the job attached below child slot ``k``
        (None: not counted); ``here()``: this host's (``JobCounts.here``); ``window``: the
        daemons' step timeout (``state_answers.py``); ``tree_step()``: the newest step the
        tree decided, as this node knows it (None: not checked)."""
        self.neighbours = neighbours
        self._place = place
        self._tree_step = tree_step
        self.max_bytes = max_bytes     # the largest vector a peer may claim (this host's memory)
        self.states = StateRequests(neighbours, place, self._give_state, attached_below, here,
                                    window)
        self.held: OrderedDict[Id, Held] = OrderedDict()
        self._up: OrderedDict[Id, _Assembly] = OrderedDict()      # toward the master
        self._down: OrderedDict[Id, _Assembly] = OrderedDict()    # from the master
        self._relayed: OrderedDict[Id, None] = OrderedDict()      # sent up in full
        # (key, root) -> who waits for it; root None: for the first copy of key, any root's
        # (only a state answer's: any process's will do, state_answers.py)
        self._waiters: dict[tuple[str, str | None], Signal[Held]] = {}
        # The step of every state answer that came down from the master: the tree decided
        # it (a process sends its state after a step), so a node that fell behind (its
        # step lost here, say) learns where the tree is, and its process's next step is
        # not refused as too far ahead.
        self.state_step: Signal[int] = Signal()

    # ------------------------------------------------------------ from this host's processes
    def publish(self, key: str, step: int, vector: np.ndarray) -> str | None:
        """This host's process sends ``vector`` as broadcast ``key``: copied at once (the
        process may reuse its memory when this returns). None, or why it cannot go."""
        place = self._place()
        if place is None:
            return "this node has not joined the tree yet"
        at = broadcast_id(key, place.name)
        if at in self.held or at in self._relayed or at in self._down or (
                at in self._up and not place.is_master):
            return None                       # another copy went first: nothing to do
        data = bytearray(vector.nbytes)
        np.frombuffer(data, dtype=vector.dtype)[:] = vector
        if place.is_master:   # (the children's copies of a state answer under way are moot)
            self._complete(at, place.name, step, np.frombuffer(data, dtype=vector.dtype))
            return None
        if self.neighbours.parent is None:
            return "this node is cut off from its parent: the broadcast cannot reach the master"
        a = _Assembly("local", place.name, secrets.randbits(62), step, vector.size, vector.dtype,
                      [data])
        a.got = len(data)
        self._relay_up(key, a, 0, memoryview(data),
                       chunk=chunk_bytes_for(len(data), place.chunk_bytes))
        self._remember_relayed(at)
        return None

    def receive(self, key: str, root: str | None, waiter: Waiter) -> Callable[[], None]:
        """``waiter(held)`` once broadcast ``key`` from host ``root`` (None: from any) is
        here (now, if it is). The function returned stops waiting (the process gave up, or
        left)."""
        held = self._held(key, root)
        if held is not None:
            waiter(held)
            return _nothing
        want = (key, None if root is None else broadcast_id(key, root)[1])
        waiters = self._waiters.setdefault(want, Signal())
        disconnect = waiters.connect(waiter)

        def cancel() -> None:
            disconnect()
            if not len(waiters) and self._waiters.get(want) is waiters:
                del self._waiters[want]
        return cancel

    def host_of(self, rank: int, per_host: int) -> str | None:
        """The tree name of the host of the process ranked ``rank`` (ranks go host by host,
        in ``Tree.names`` order, ``per_host`` each: ``Client.rank``); None if none is."""
        place = self._place()
        if place is None:
            return None
        names = list(place.tree.names())
        return names[rank // per_host] if 0 <= rank < len(names) * per_host else None

    def tree_processes(self, per_host: int) -> int:
        """The training processes of the whole tree, ``per_host`` on each host (0 before
        this node has joined it)."""
        place = self._place()
        return 0 if place is None else len(list(place.tree.names())) * per_host

    def _held(self, key: str, root: str | None) -> Held | None:
        if root is not None:
            return self.held.get(broadcast_id(key, root))
        return next((h for (k, _), h in self.held.items() if k == key), None)

    # ------------------------------------------------------------ pieces from the tree
    def child_dest(self, k: int, msg: Bcast, nbytes: int) -> memoryview | None:
        """Where a child's piece goes: the assembly relayed up, or nowhere (another
        sender's copy is already on its way, or done). A root outside the child's subtree
        is a ``ProtocolError``."""
        root = self._root_below(k, msg)
        at = broadcast_id(msg.key, root)
        if at in self.held or at in self._relayed:
            return None
        up = self._up_id(at, k)
        a = self._up.get(up)
        if a is not None and a.source == ("child", k) and msg.offset == 0 and a.got:
            # Begun again: its sender's link (or one below it) closed and came back, and the
            # honest relays in between start over. Not a fault of this child's.
            del self._up[up]
            a = None
        if a is None:
            if not self.states.speaks_for(k):
                return None              # no process of the job below it sent this
            if up != at and not self.states.answers.counts(msg.key, k):
                return None              # an answer to no request of the master's (or counted)
            a = self._start(self._up, ("child", k), msg, root)
            if up != at:
                a.digest = digest_of(a.step, a.dtype, a.total)
                a.keep = self.states.answers.keeps(msg.key, sum(
                    1 for (key, _), b in self._up.items() if key == msg.key and b.keep))
            self._up[up] = a
        elif a.source != ("child", k) or a.origin != msg.origin:
            return None
        return self._dest(a, msg, nbytes)

    def from_child(self, k: int, msg: Bcast, payload) -> None:
        at = broadcast_id(msg.key, self._root_below(k, msg))
        up = self._up_id(at, k)
        a = self._up.get(up)
        if payload is None or a is None or a.source != ("child", k):
            return
        if up != at:                     # a state answer's copy at the master: it votes
            a.digest.update(a.pieces[-1])
            if not a.keep:
                a.pieces.clear()
            if a.complete:
                del self._up[up]
                self.states.copy(msg.key, k, a.digest.digest(), Answer(
                    at, a.root, a.step, a.vector()) if a.keep else None)
            return
        place = self._place()
        if place is not None and place.is_master:
            if a.complete:
                del self._up[at]
                self._complete(at, a.root, a.step, a.vector())
            return
        self._relay_up(msg.key, a, msg.offset, memoryview(a.pieces[-1]), chunk=len(payload))
        if a.complete:
            del self._up[at]
            self._remember_relayed(at)

    def _up_id(self, at: Id, k: int) -> Id:
        """What child ``k``'s copy of ``at`` is assembled as: at the master, a state answer
        once per child slot (the slots vote: ``state_answers.py``); else ``at``."""
        place = self._place()
        if at[1] != ANY_ROOT or place is None or not place.is_master:
            return at
        return at[0], f"{ANY_ROOT}{k}"

    def _root_below(self, k: int, msg: Bcast) -> str:
        """The root ``msg`` names, if it is in child ``k``'s subtree (None: the child)."""
        place = self._place()
        if place is None:
            raise ProtocolError("BCAST before this node joined the tree")
        child = place.tree.children(place.name)[k]
        root = child if msg.root is None else msg.root
        if root != child and not root.startswith(child + "."):
            raise ProtocolError(f"BCAST {shown(msg.key)}: root {shown(root)} is not in the "
                                f"subtree of child {child}")
        return root

    def parent_dest(self, msg: Bcast, nbytes: int) -> memoryview | None:
        at = broadcast_id(msg.key, msg.root or "")
        if at in self.held:
            return None
        a = self._down.get(at)
        if a is None:
            a = self._down[at] = self._start(self._down, "parent", msg, msg.root or "")
        elif a.origin != msg.origin:
            raise ProtocolError(f"BCAST {msg.key!r}: two copies from the parent")
        return self._dest(a, msg, nbytes)

    def from_parent(self, msg: Bcast, payload) -> None:
        at = broadcast_id(msg.key, msg.root or "")
        a = self._down.get(at)
        if payload is None or a is None:
            return
        self._to_children(msg, memoryview(a.pieces[-1]))   # on down at once: a vector flows through
        if a.complete:
            del self._down[at]
            self._keep(at, a.step, a.vector())

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
        self.states.clear()

    # ------------------------------------------------------------ the rest
    def _start(self, assemblies: OrderedDict[Id, _Assembly], source: object,
               msg: Bcast, root: str) -> _Assembly:
        """A broadcast begun by ``source``: nothing is allocated for its claim. A claim no
        host could hold closes the link (ProtocolError); room is made among the source's
        own half-received broadcasts, never another's."""
        dtype = DTYPES[msg.dtype]
        a = _Assembly(source, root, msg.origin, msg.step, msg.total, dtype)
        if a.nbytes > self.max_bytes:
            raise ProtocolError(f"BCAST {msg.key!r} claims a vector of {msg.total} x {dtype} "
                                f"({a.nbytes} bytes): more than this host's memory "
                                f"({self.max_bytes} bytes)")
        most = IN_FLIGHT if source == "parent" else PER_SOURCE
        own = [k for k, b in assemblies.items() if b.source == source]
        claimed = sum(assemblies[k].nbytes for k in own)
        while own and (len(own) >= most or claimed + a.nbytes > self.max_bytes):
            old = own.pop(0)
            claimed -= assemblies.pop(old).nbytes
            log.warning("broadcast %s dropped half-received: its sender began too many at once",
                        shown(old[0]))
        return a

    def _dest(self, a: _Assembly, msg: Bcast, nbytes: int) -> memoryview:
        if not a.fits(msg, nbytes) or msg.offset % a.dtype.itemsize:
            raise ProtocolError(f"BCAST {msg.key!r}: a piece at byte {msg.offset} ({nbytes} "
                                f"bytes) does not fit the {a.total} x {a.dtype} vector begun "
                                f"(its next piece is at byte {a.got})")
        piece = bytearray(nbytes)       # allocated for bytes that are here, not for a claim
        a.pieces.append(piece)
        a.got += nbytes
        return memoryview(piece)

    def _relay_up(self, key: str, a: _Assembly, offset: int, piece: memoryview, chunk: int) -> None:
        for start in range(0, len(piece), chunk):
            self.neighbours.to_parent(Bcast(key, a.origin, a.step, offset + start, a.total,
                                            a.dtype.name, a.root), piece[start:start + chunk])

    def _give_state(self, answer: Answer) -> None:
        """The state answer the master decided on (``state_answers.py``): it goes down."""
        if answer.at not in self.held:
            self._complete(answer.at, answer.root, answer.step, answer.vector)

    def _complete(self, at: Id, root: str, step: int, vector: np.ndarray) -> None:
        """The master has broadcast ``at``, the first complete copy (a state answer: its own
        host's process's, or the one decided among the children's): it goes down."""
        key = at[0]
        place = self._place()
        if key.startswith(STATE) and self._tree_step is not None and step > self._tree_step():
            # A process sends its state after a step the tree decided, and the master decides
            # every step: an answer from further on is a lie, and every host below would
            # learn its step (refusing every honest step until the tree caught up).
            log.warning("a state answer (from %s) after step %d, but the tree has decided "
                        "only up to step %d: refused", root or "the master's host", step,
                        self._tree_step())
            return
        if key.startswith(STATE):        # the children's copies still under way are moot
            for up in [u for u in self._up if u[0] == key]:
                del self._up[up]
        chunk = chunk_bytes_for(vector.nbytes, defaults.CHUNK_BYTES if place is None
                                else place.chunk_bytes)
        origin = secrets.randbits(62)
        view = vector.data.cast("B")
        for start in range(0, view.nbytes, chunk):
            msg = Bcast(key, origin, step, start, vector.size, vector.dtype.name, root)
            self._to_children(msg, view[start:start + chunk])
        log.info("broadcast %r from %s: %d x %s from step %d, sent down", key,
                 "the master" if root == "" else f"node {root}", vector.size, vector.dtype, step)
        self._remember_relayed(at)
        self._keep(at, step, vector)

    def _to_children(self, msg: Bcast, piece: memoryview) -> None:
        for slot in self.neighbours.slots:
            if slot.link is not None:
                slot.link.send(msg, piece)

    def _keep(self, at: Id, step: int, vector: np.ndarray) -> None:
        held = self.held[at] = Held(step, vector)
        while len(self.held) > HELD:
            self.held.popitem(last=False)
        key, root = at
        wanted = [(key, root), (key, None)]
        if key.startswith(STATE):
            self.states.answers.answered()
            self.states.answered()
            place = self._place()
            if place is not None and not place.is_master:   # (the master vouched for it)
                self.state_step.emit(step)
            # Any peer's state is good for every process still waiting for one: requests
            # made at the same time are answered by the newest's answer (peers answer
            # only the newest request they see).
            wanted += [w for w in self._waiters if w[0].startswith(STATE) and w[0] != key]
        for w in wanted:
            waiters = self._waiters.pop(w, None)
            if waiters is not None:
                waiters.emit(held)

    def _remember_relayed(self, at: Id) -> None:
        self._relayed[at] = None
        while len(self._relayed) > 4 * IN_FLIGHT:
            self._relayed.popitem(last=False)
