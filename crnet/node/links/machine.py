"""What every link is: a state, and per state a table from message class to handler.

As asyncpg's ``CoreProtocol``: a link's ``state`` says what the peer may send now;
``RECEIVE[state]`` maps each message class allowed in that state to the method that
handles it, ``PAYLOAD[state]`` each one that carries a payload to the method that says
where its bytes go. Anything else is out of place, and takes one path for every link:
a ``ProtocolError`` worded by the link (``unexpected``), which the connection logs
and closes on (``protocol/transport.py``). A table may map ``Message`` itself: any message,
e.g. a refused peer's, read and dropped.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NoReturn

from ...errors import ProtocolError
from ...protocol.messages import Message
from ...protocol.transport import Connection

# A handler is a method of the link: (self, conn, msg, payload); a payload's
# destination likewise (self, conn, msg, nbytes) -> a buffer, or None to drop it.
Handler = Callable[[Any, Connection, Any, Any], None]
Dest = Callable[[Any, Connection, Any, int], Any]
Receives = Mapping[enum.Enum, Mapping[type[Message], Handler]]   # a link's RECEIVE
Payloads = Mapping[enum.Enum, Mapping[type[Message], Dest]]      # a link's PAYLOAD


class StateMachine:
    """A ``transport.Handler`` that dispatches on (state, message class)."""

    state: enum.Enum
    RECEIVE: ClassVar[Receives]
    PAYLOAD: ClassVar[Payloads] = {}

    def payload_dest(self, conn: Connection, msg: Message, nbytes: int):
        dest = _lookup(self.PAYLOAD.get(self.state, {}), msg)
        if dest is None:
            self.out_of_place(msg, payload=True)
        return dest(self, conn, msg, nbytes)

    def received(self, conn: Connection, msg: Message, payload) -> None:
        handler = _lookup(self.RECEIVE[self.state], msg)
        if handler is None:
            self.out_of_place(msg)
        handler(self, conn, msg, payload)

    def out_of_place(self, msg: Message, payload: bool = False) -> NoReturn:
        """The one path for a message the peer may not send now: that connection closes."""
        raise ProtocolError(self.unexpected(msg, payload))

    def unexpected(self, msg: Message, payload: bool) -> str:
        """Why ``msg`` is out of place (``payload``: asked where its payload goes)."""
        return f"unexpected {msg.TYPE.name}"


def ignore(link: Any, conn: Connection, msg: Message, payload: Any) -> None:
    """A table's handler for a message that is read and dropped."""


def drop(link: Any, conn: Connection, msg: Message, nbytes: int) -> None:
    """A table's destination for a payload that is read and dropped."""
    return None


def _lookup(table: Mapping[type[Message], Any], msg: Message) -> Any:
    found = table.get(type(msg))
    return table.get(Message) if found is None else found
