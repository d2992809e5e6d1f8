"""``PeerLink``: a link this node dialed to a peer: the ring successor (rar), another host
(spread). Pieces go out on it; in come the welcome, the confirmation of this node's rank
and, in spread, the answers to this node's checks of links that claim the peer's rank
(``node/peers/check.py``). With a cluster secret the link is up (``welcome`` resolves,
and pieces go out on it) only once the peer confirmed this node's rank; without one, once
it welcomed this node.

============  ===================================================================
state         the peer may send
============  ===================================================================
WAITING       PEER_WELCOME, REFUSE
WELCOMED      with a secret: PEER_CONFIRMED (once: the link is up), PEER_CHECKED;
              HEARTBEAT
REFUSED       nothing
============  ===================================================================
"""

from __future__ import annotations

from typing import ClassVar

from ...protocol.messages import Heartbeat, Message, PeerChecked, PeerConfirmed, PeerWelcome, Refuse
from ...protocol.transport import Connection
from ..peers.check import OutboundPeer
from .dialed import DialedLink, DialedState
from .machine import Receives, ignore


class PeerLink(DialedLink):
    def __init__(self, peer: OutboundPeer, confirmed_by_welcome: bool = False) -> None:
        """``peer``: where this link reports; ``confirmed_by_welcome``: the welcome confirms this
        node's rank (no cluster secret: there is nothing to check)."""
        super().__init__()
        self.peer = peer
        self.confirmed_by_welcome = confirmed_by_welcome

    def unexpected(self, msg: Message, payload: bool) -> str:
        return f"unexpected {msg.TYPE.name} from a peer"

    def lost(self, conn, exc):
        self.peer.gone(conn)
        self.hung_up("the peer hung up")

    def _welcome(self, conn: Connection, msg: PeerWelcome, payload) -> None:
        if self.confirmed_by_welcome:
            self.welcomed()
            return
        self.state = DialedState.WELCOMED   # this node's checks may be asked on it from now on
        self.peer.welcomed(conn)

    def _confirmed(self, conn: Connection, msg: PeerConfirmed, payload) -> None:
        if self.welcome.done():   # up already
            self.out_of_place(msg)
        self.welcome.set_result(None)

    def _checked(self, conn: Connection, msg: PeerChecked, payload) -> None:
        self.peer.answered(msg)

    RECEIVE: ClassVar[Receives] = {
        DialedState.WAITING: {PeerWelcome: _welcome, Refuse: DialedLink.refused},
        DialedState.WELCOMED: {PeerConfirmed: _confirmed, PeerChecked: _checked,
                               Heartbeat: ignore},   # (what arrives counts: liveness.py)
        DialedState.REFUSED: {},
    }
