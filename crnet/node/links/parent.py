"""``ParentLink``: this node's connection to its parent.

============  ===========================================================================
state         the parent may send
============  ===========================================================================
WAITING       WELCOME, REFUSE
WELCOMED      RESULT, FAIL, ASSIGN, JOB, BCAST, WANT_STATE, BARRIER, STATUS, WELCOME (the
              master re-planned between jobs: what the tree runs, then ASSIGN and JOB),
              PROBE (crnet tune --probe: its bytes are dropped, a round's last echoed),
              MOVE (the master re-planned to another shape: this node joins elsewhere)
REFUSED       nothing (the dialer closes the link)
============  ===========================================================================
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from ...errors import JoinRefused, ProtocolError
from ...peer_text import tamed
from ...protocol.messages import (
    Assign,
    Barrier,
    Bcast,
    Fail,
    Job,
    Message,
    Move,
    Probe,
    ProbeEcho,
    Refuse,
    StatusRequest,
    WantState,
    Welcome,
)
from ...protocol.transport import Connection
from ...schemes import TAKEN, WITH_PAYLOAD, Origin
from ..collectives.barriers import Barriers
from ..collectives.broadcasts import Broadcasts
from ..join.membership import Membership
from ..observe.probe import ProbeSink
from ..observe.status import StatusService
from ..steps import StepEngine
from .dialed import DialedLink, DialedState
from .machine import Payloads, Receives


class ParentLink(DialedLink):
    """The parent: this node's place and share, the steps' results, and what it relays
    down (jobs, broadcasts, barriers, status questions)."""

    def __init__(self, membership: Membership, engine: StepEngine, broadcasts: Broadcasts,
                 barriers: Barriers, status: StatusService):
        super().__init__()
        self.membership = membership
        self.engine = engine
        self.broadcasts = broadcasts
        self.barriers = barriers
        self.status = status
        self.probe_sink = ProbeSink()

    def unexpected(self, msg: Message, payload: bool) -> str:
        if self.state is DialedState.WAITING and not payload:
            return f"{msg.TYPE.name} from the parent before WELCOME"
        return f"unexpected {msg.TYPE.name} from the parent"

    def lost(self, conn, exc):
        self.hung_up("the parent closed the connection")

    # ---------------------------------------------------------------- WAITING
    def _welcome(self, conn: Connection, msg: Welcome, payload) -> None:
        try:
            self.membership.welcomed(msg)
        except ProtocolError as e:
            self.reject(conn, f"a WELCOME this node cannot take: {e}")
            return
        except JoinRefused as e:
            self.cannot_take(conn, e)
            return
        self.welcomed()

    # ---------------------------------------------------------------- WELCOMED
    def _welcome_again(self, conn: Connection, msg: Welcome, payload) -> None:
        try:
            self.membership.welcomed(msg)
        except ProtocolError as e:
            self.reject(conn, f"a WELCOME this node cannot take: {e}")
        except JoinRefused as e:
            self.cannot_take(conn, e)

    def _piece_dest(self, conn: Connection, msg: Message, nbytes: int):
        return self.engine.piece_dest(Origin.PARENT, 0, msg, nbytes)

    def _bcast_dest(self, conn: Connection, msg: Bcast, nbytes: int):
        return self.broadcasts.parent_dest(msg, nbytes)

    def _assign_dest(self, conn: Connection, msg: Assign, nbytes: int):
        return memoryview(bytearray(nbytes))  # Limits capped it at MAX_CONTROL_PAYLOAD

    def _piece(self, conn: Connection, msg: Message, payload) -> None:
        self.engine.piece(Origin.PARENT, 0, msg, payload)

    def _fail(self, conn: Connection, msg: Fail, payload) -> None:
        # Its reason goes on to this subtree's processes.
        self.engine.parent_failed(dataclasses.replace(msg, reason=tamed(msg.reason)))

    def _assign(self, conn: Connection, msg: Assign, payload) -> None:
        self.membership.assigned(msg, payload)

    def _job(self, conn: Connection, msg: Job, payload) -> None:
        self.membership.parent_job(msg)

    def _bcast(self, conn: Connection, msg: Bcast, payload) -> None:
        self.broadcasts.from_parent(msg, payload)

    def _move(self, conn: Connection, msg: Move, payload) -> None:
        self.membership.moved(msg)

    def _want_state(self, conn: Connection, msg: WantState, payload) -> None:
        self.broadcasts.states.state_requested(msg.nonce)

    def _barrier(self, conn: Connection, msg: Barrier, payload) -> None:
        self.barriers.released(msg)

    def _status_request(self, conn: Connection, msg: StatusRequest, payload) -> None:
        self.status.asked(conn, msg.id, msg.deadline, msg.measured, msg.probe)

    def _probe_dest(self, conn: Connection, msg: Probe, nbytes: int):
        return self.probe_sink.dest(nbytes)

    def _probe(self, conn: Connection, msg: Probe, payload) -> None:
        if msg.last:
            conn.send(ProbeEcho(msg.id, msg.round))

    RECEIVE: ClassVar[Receives] = {
        DialedState.WAITING: {Welcome: _welcome, Refuse: DialedLink.refused},
        DialedState.WELCOMED: {**dict.fromkeys(TAKEN[Origin.PARENT], _piece), Fail: _fail, Assign: _assign,
                               Job: _job,
                               Bcast: _bcast, WantState: _want_state, Barrier: _barrier,
                               StatusRequest: _status_request, Welcome: _welcome_again,
                               Probe: _probe, Move: _move},
        DialedState.REFUSED: {},
    }
    PAYLOAD: ClassVar[Payloads] = {
        DialedState.WELCOMED: {**dict.fromkeys(WITH_PAYLOAD[Origin.PARENT], _piece_dest),
                               Bcast: _bcast_dest, Assign: _assign_dest,
                               Probe: _probe_dest},
    }
