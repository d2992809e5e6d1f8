"""What the links this node dials have in common: the peer must welcome it first."""

from __future__ import annotations

import asyncio
import enum

from ...errors import JoinRefused, ProtocolError
from ...protocol.messages import Refuse
from ...protocol.transport import Connection
from .machine import StateMachine


class DialedState(enum.Enum):
    WAITING = "waiting"      # HELLO sent: its WELCOME (or REFUSE) comes first
    WELCOMED = "welcomed"
    REFUSED = "refused"      # it refused, or welcomed this node to a place it cannot take


class DialedLink(StateMachine):
    """A link this node dialed (to its parent, or its ring successor): ``welcome``
    resolves when the peer welcomes this node, or fails with why not. ``node/join/dial.py``
    dials again after a ``ProtocolError`` or a ``JoinRefused`` with ``retry``; any
    other ``JoinRefused`` is the tree saying this node's configuration is wrong."""

    def __init__(self) -> None:
        self.state = DialedState.WAITING
        self.welcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def welcomed(self) -> None:
        self.state = DialedState.WELCOMED
        self.welcome.set_result(None)

    def refused(self, conn: Connection, msg: Refuse, payload) -> None:
        self.state = DialedState.REFUSED
        to = None if msg.to is None or msg.name is None else (msg.to, msg.name)
        self.welcome.set_exception(JoinRefused(msg.reason, msg.retry, to))

    def cannot_take(self, conn: Connection, e: JoinRefused) -> None:
        """The peer welcomed this node to a place its configuration cannot take: the peer
        hears why (REFUSE, so its log says it) and the node stops, as after a refusal for
        good, instead of joining and leaving every few seconds."""
        self.state = DialedState.REFUSED
        conn.send(Refuse(e.reason))
        if not self.welcome.done():
            self.welcome.set_exception(e)
        conn.close()

    def reject(self, conn: Connection, reason: str) -> None:
        """The peer did, before its welcome, what no parent or successor of this node does
        (a WELCOME to a place this node cannot take, no proof of the cluster secret): the
        link is no good. It closes; the dialer logs why and dials again after a pause."""
        self.state = DialedState.REFUSED
        if not self.welcome.done():
            self.welcome.set_exception(ProtocolError(reason))
        conn.close()

    def hung_up(self, why: str) -> None:
        if not self.welcome.done():
            self.welcome.set_exception(ConnectionResetError(why))
