"""A node's links: what each kind of peer may send, in which state, and who handles it.

Each link is a ``transport.Handler`` and a state machine (``machine.py``): the
connection gives it typed, validated messages (``crnet.protocol.messages``); its state's table
says which it may get now and which method hands each to membership (joining), the
step engine (steps), broadcasts, barriers or status. Any other is a ``ProtocolError``:
that connection closes.

- ``child.py``   ``ChildLink``: accepted on ``--listen``: a child, a peer or ``crnet status``.
- ``parent.py``  ``ParentLink``: dialed to the parent.
- ``peer.py``    ``PeerLink``: dialed to a peer (the ring successor, a spread host); this node
  sends its pieces on it, and asks there about links that claim that peer's rank.
- ``client.py``  ``ClientLink``: the local training process on the Unix socket, with
  ``client_steps.py`` (its steps: requests, answers, progress) and ``client_group.py``
  (broadcasts and barriers with the rest of its job).
"""

from .child import ChildLink, ChildState
from .client import ClientLink, ClientState
from .dialed import DialedLink, DialedState
from .parent import ParentLink
from .peer import PeerLink

__all__ = ["ChildLink", "ChildState", "ClientLink", "ClientState", "DialedLink", "DialedState",
           "ParentLink", "PeerLink"]
