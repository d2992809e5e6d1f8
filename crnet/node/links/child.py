"""``ChildLink``: a connection accepted on ``--listen``.

It starts with HELLO (a child joining), PEER_HELLO (a peer: the ring predecessor, rar; another
host, spread) or STATUS_HELLO (``crnet status``), and what it may send from then on follows
from which. A peer's rank is confirmed before anything it sends counts as that rank's (spread
with a cluster secret: by that rank's host, ``node/peers/check.py``; else at once):

==============  ==============================================================
state           may send
==============  ==============================================================
NEW             HELLO, PEER_HELLO, STATUS_HELLO
CHILD           CHUNK, JOINED, FAIL, OPEN, JOB, BCAST, WANT_STATE, BARRIER,
                STATUS_REPLY, REFUSE (it cannot take the place it was welcomed to),
                PROBE_ECHO (crnet tune --probe)
UNCONFIRMED     PEER_CHECK (it asks about a link that claims this node's rank)
PEER            SEGMENT (rar), PIECE, OWNERS and MOOT (spread), PEER_CHECK, HEARTBEAT
STATUS          STATUS (it may ask again: ``crnet status --watch``)
REFUSED         anything: REFUSE was sent, what it sent before reading it is moot
==============  ==============================================================
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from typing import ClassVar

from ...errors import JoinRefused
from ...peer_text import Throttle, tamed
from ...protocol.messages import (
    Barrier,
    Bcast,
    Fail,
    Heartbeat,
    Hello,
    Job,
    Joined,
    Message,
    Open,
    PeerCheck,
    PeerHello,
    ProbeEcho,
    Refuse,
    StatusHello,
    StatusReply,
    StatusRequest,
    WantState,
)
from ...protocol.transport import Connection
from ...schemes import TAKEN, WITH_PAYLOAD, Origin
from ..collectives.barriers import Barriers
from ..collectives.broadcasts import Broadcasts
from ..join.membership import Membership
from ..observe.status import StatusService
from ..steps import StepEngine
from .machine import Payloads, Receives, StateMachine, drop, ignore

log = logging.getLogger("crnet.node")

RECENT_FAILS = 64   # the steps a child's FAILs are remembered for (each step is reported once)


class ChildState(enum.Enum):
    NEW = "a peer before HELLO"
    CHILD = "a child"
    UNCONFIRMED = "a peer not yet confirmed"
    PEER = "a peer"
    STATUS = "crnet status"
    REFUSED = "a refused peer"


class ChildLink(StateMachine):
    """A child, a peer or ``crnet status``: each said so first."""

    def __init__(self, membership: Membership, engine: StepEngine, broadcasts: Broadcasts,
                 barriers: Barriers, status: StatusService, warnings: Throttle | None = None):
        self.membership = membership
        self.engine = engine
        self.broadcasts = broadcasts
        self.barriers = barriers
        self.status = status
        self.warnings = warnings or Throttle(log)   # the node's: shared by every connection
        self.state = ChildState.NEW
        self.slot: int | None = None     # the child's slot, once it said HELLO
        self.rank: int | None = None     # a peer's rank, once it said PEER_HELLO
        self._failed: dict[tuple[str, int], None] = {}   # (job, step) of its latest FAILs

    def unexpected(self, msg: Message, payload: bool) -> str:
        return f"unexpected {msg.TYPE.name} from {self.state.value}"

    def lost(self, conn, exc):
        if self.state is ChildState.PEER:
            assert self.rank is not None
            if self.membership.mesh.lost(self.rank, conn):
                log.warning("peer %d disconnected", self.rank)
        elif self.state is ChildState.UNCONFIRMED:
            self.membership.mesh.dropped(conn)
        elif self.slot is not None:
            self.membership.child_lost(self.slot, conn)

    # ---------------------------------------------------------------- NEW
    def _hello(self, conn: Connection, msg: Hello, payload) -> None:
        try:
            self.slot = self.membership.child_hello(conn, msg)
        except JoinRefused as e:
            self._refuse(conn, e)
            return
        self.state = ChildState.CHILD

    def _peer_hello(self, conn: Connection, msg: PeerHello, payload) -> None:
        self.state, self.rank = ChildState.UNCONFIRMED, msg.rank
        try:
            self.membership.peer_hello(conn, msg, self._confirmed)
        except JoinRefused as e:
            self.rank = None
            self._refuse(conn, e)

    def _confirmed(self) -> None:
        self.state = ChildState.PEER

    def _status_hello(self, conn: Connection, msg: StatusHello, payload) -> None:
        self.state = ChildState.STATUS       # answered at once; it may ask again (--watch)
        self.status.watching(conn)
        self.status.asked(conn, 0)

    def _refuse(self, conn: Connection, e: JoinRefused) -> None:
        self.state = ChildState.REFUSED
        # One line per peer address every few seconds: a peer may try again and again.
        self.warnings.warning((conn.label.rpartition(":")[0], "refused"), "refusing %s: %s",
                              conn.label, e.reason)
        to, name = e.to or (None, None)
        conn.send(Refuse(e.reason, e.retry, to, name))
        conn.close()

    # ---------------------------------------------------------------- CHILD
    def _piece_dest(self, conn: Connection, msg: Message, nbytes: int):
        assert self.slot is not None
        return self.engine.piece_dest(Origin.CHILD, self.slot, msg, nbytes)

    def _bcast_dest(self, conn: Connection, msg: Bcast, nbytes: int):
        assert self.slot is not None
        return self.broadcasts.child_dest(self.slot, msg, nbytes)

    def _piece(self, conn: Connection, msg: Message, payload) -> None:
        assert self.slot is not None
        self.engine.piece(Origin.CHILD, self.slot, msg, payload)

    def _joined(self, conn: Connection, msg: Joined, payload) -> None:
        assert self.slot is not None
        self.membership.child_joined(self.slot, msg)

    def _fail(self, conn: Connection, msg: Fail, payload) -> None:
        """A child reports each step's failure once: a repeat would change nothing but
        the log (a flood of them, or one reason forged into many lines). Its reason goes
        on, printable, into the step's failure reason."""
        k = self.slot
        assert k is not None
        key = (self.membership.job, msg.step)
        if key in self._failed:
            self.warnings.warning((conn.label, "FAIL again"),
                                  "%s (child slot %d) reported step %d's failure again; ignored",
                                  conn.label, k, msg.step)
            return
        self._failed[key] = None
        if len(self._failed) > RECENT_FAILS:
            del self._failed[next(iter(self._failed))]
        self.engine.child_failed(k, dataclasses.replace(msg, reason=tamed(msg.reason)))

    def _open(self, conn: Connection, msg: Open, payload) -> None:
        assert self.slot is not None
        self.engine.child_opened(self.slot, msg)

    def _job(self, conn: Connection, msg: Job, payload) -> None:
        assert self.slot is not None
        self.membership.child_job(self.slot, msg)

    def _bcast(self, conn: Connection, msg: Bcast, payload) -> None:
        assert self.slot is not None
        self.broadcasts.from_child(self.slot, msg, payload)

    def _want_state(self, conn: Connection, msg: WantState, payload) -> None:
        self.broadcasts.states.want_state(msg.nonce, self.slot)

    def _barrier(self, conn: Connection, msg: Barrier, payload) -> None:
        assert self.slot is not None
        self.barriers.from_child(self.slot, msg)

    def _status_reply(self, conn: Connection, msg: StatusReply, payload) -> None:
        assert self.slot is not None
        self.status.child_reply(self.slot, msg)

    def _probe_echo(self, conn: Connection, msg: ProbeEcho, payload) -> None:
        assert self.slot is not None
        self.status.probe_echoed(self.slot, msg)

    def _leaving(self, conn: Connection, msg: Refuse, payload) -> None:
        """The child cannot take the place it was welcomed to (e.g. an inner node without
        --listen) and stops: the log says why, not only that it came and went."""
        place = self.membership.place
        assert self.slot is not None and place is not None
        name = place.tree.children(place.name)[self.slot]
        self.warnings.warning((conn.label.rpartition(":")[0], "cannot take"),
                              "child %s (from %s) cannot take its place and stops: %s",
                              name, conn.label, tamed(msg.reason))
        conn.close()

    # ---------------------------------------------------------------- PEER, STATUS
    def _peer_piece_dest(self, conn: Connection, msg: Message, nbytes: int):
        assert self.rank is not None
        return self.engine.piece_dest(Origin.PEER, self.rank, msg, nbytes)

    def _peer_piece(self, conn: Connection, msg: Message, payload) -> None:
        assert self.rank is not None
        self.engine.piece(Origin.PEER, self.rank, msg, payload)

    def _peer_check(self, conn: Connection, msg: PeerCheck, payload) -> None:
        assert self.rank is not None
        self.membership.mesh.answer(conn, self.rank, msg)

    def _status_request(self, conn: Connection, msg: StatusRequest, payload) -> None:
        self.status.asked(conn, msg.id, msg.deadline, msg.measured, msg.probe, client=True)

    RECEIVE: ClassVar[Receives] = {
        ChildState.NEW: {Hello: _hello, PeerHello: _peer_hello, StatusHello: _status_hello},
        ChildState.CHILD: {**dict.fromkeys(TAKEN[Origin.CHILD], _piece), Joined: _joined, Fail: _fail,
                           Open: _open, Job: _job,
                           Bcast: _bcast, WantState: _want_state, Barrier: _barrier,
                           StatusReply: _status_reply, Refuse: _leaving, ProbeEcho: _probe_echo},
        ChildState.UNCONFIRMED: {PeerCheck: _peer_check},
        ChildState.PEER: {**dict.fromkeys(TAKEN[Origin.PEER], _peer_piece), PeerCheck: _peer_check,
                          Heartbeat: ignore},   # (what arrives is what counts: liveness.py)
        ChildState.STATUS: {StatusRequest: _status_request},
        ChildState.REFUSED: {Message: ignore},
    }
    PAYLOAD: ClassVar[Payloads] = {
        ChildState.CHILD: {**dict.fromkeys(WITH_PAYLOAD[Origin.CHILD], _piece_dest),
                           Bcast: _bcast_dest},
        ChildState.PEER: dict.fromkeys(WITH_PAYLOAD[Origin.PEER], _peer_piece_dest),
        ChildState.REFUSED: {Message: drop},
    }
