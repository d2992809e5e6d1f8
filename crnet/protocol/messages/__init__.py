"""Every crnet message as a small typed object: built here, parsed and validated here.

``wire`` moves frames (prefix, msgpack header, raw payload); this module gives each
header a meaning. ``parse`` turns a frame's header into one of the classes below,
checking every field's type and range first: a bad field raises ``ProtocolError``
naming the message and the field, and the connection it came on is closed. A
message's ``frame(payload)`` is the only way a header is built.

Tree links (TCP) carry HELLO .. FAIL between a child and its parent, and PEER_HELLO,
PEER_WELCOME (PEER_CONFIRMED) and SEGMENT between ring neighbours (``--scheme rar``),
PEER_HELLO, PEER_WELCOME, PEER_CHECK, PEER_CHECKED, PEER_CONFIRMED and PIECE between every
two hosts (``--scheme spread``), and HEARTBEAT either way on both. The Unix socket
between a daemon and its training process carries the CLIENT_* messages.

One module per kind of link: ``tree`` (join, the authentication handshake, a step's
pieces), ``ring``, ``local`` (the training process), ``broadcasts`` (and barriers),
``status``; ``base`` has ``Message``, the registry ``CLASSES`` and ``parse``. Field checks
are ``crnet.protocol.fields``; ASSIGN's payload is ``crnet.protocol.allocation``, STATUS_REPLY's tree
``crnet.protocol.status_tree``.

Adding a message: its type in ``wire.MsgType``; its class in the module of its link,
a frozen dataclass with ``TYPE`` and ``from_header`` (defining it registers it for
``parse``, and it is importable from here), ``BEFORE_AUTH = True`` if a peer may send it
before it has authenticated (``node/admission/guard.py`` derives its limits from that); then the
code that sends and handles it (a link in ``crnet/node/``, or ``crnet/client/aio.py``).
"""

from __future__ import annotations

# Each kind of link's messages in a module of its own; each class registers itself
# under its wire type (``base.CLASSES``), and every public name is re-exported here, so
# ``from crnet.protocol.messages import Hello`` works without a list to keep.
from .base import *  # noqa: F403
from .broadcasts import *  # noqa: F403
from .local import *  # noqa: F403
from .peers import *  # noqa: F403
from .status import *  # noqa: F403
from .tree import *  # noqa: F403
