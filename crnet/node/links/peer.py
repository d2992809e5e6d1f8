"""``PeerLink``: a link this node dialed to a peer: the ring successor (rar), another host
(spread). Pieces go out on it; only the welcome comes in.

============  ======================================
state         the peer may send
============  ======================================
WAITING       PEER_WELCOME, REFUSE
WELCOMED      nothing
REFUSED       nothing
============  ======================================
"""

from __future__ import annotations

from typing import ClassVar

from ...messages import Message, PeerWelcome, Refuse
from ...transport import Connection
from .dialed import DialedLink, DialedState
from .machine import Receives


class PeerLink(DialedLink):
    def unexpected(self, msg: Message, payload: bool) -> str:
        return f"unexpected {msg.TYPE.name} from a peer"

    def lost(self, conn, exc):
        self.hung_up("the peer hung up")

    def _welcome(self, conn: Connection, msg: PeerWelcome, payload) -> None:
        self.welcomed()

    RECEIVE: ClassVar[Receives] = {
        DialedState.WAITING: {PeerWelcome: _welcome, Refuse: DialedLink.refused},
        DialedState.WELCOMED: {},
        DialedState.REFUSED: {},
    }
