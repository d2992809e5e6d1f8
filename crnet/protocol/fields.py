"""A frame header's fields, checked one by one: each check names the message and the field.

A typed message (``crnet.protocol.messages``) reads its header through a ``Fields``: an integer
in a range, a string of a bounded length (or one of a few), a flag, a blob of a set
size. A field that is missing or out of range raises ``ProtocolError`` with the
message, the field and (shortened) the value it held, and the connection it came on
is closed. The allocation (``crnet.protocol.allocation``) and the status tree
(``crnet.protocol.status_tree``) check their maps the same way.
"""

from __future__ import annotations

import ipaddress
import re

from ..errors import ProtocolError
from .wire import MsgType

MAX_STEP = (1 << 63) - 1        # steps are non-negative int64s
MAX_REASON = 4096               # characters of a failure reason we keep
MAX_HOST_ID = 64                # characters of a host's identity (a hostname, or --host-id)


class Fields:
    """A header map being validated: each accessor names the message and the field."""

    def __init__(self, what: str | MsgType, header: dict):
        self._what, self.h = what, header   # a message type's name is looked up when needed

    @property
    def what(self) -> str:
        return self._what.name if isinstance(self._what, MsgType) else self._what

    def bad(self, name: str, want: str) -> ProtocolError:
        value = self.h.get(name, "<missing>")
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return ProtocolError(f"{self.what}: field {name!r} must be {want}, got {shown}")

    def integer(self, name: str, lo: int = 0, hi: int = MAX_STEP) -> int:
        v = self.h.get(name)
        if type(v) is not int or not lo <= v <= hi:
            raise self.bad(name, f"an integer in {lo}..{hi}")
        return v

    def opt_integer(self, name: str, lo: int = 0, hi: int = MAX_STEP) -> int | None:
        return None if self.h.get(name) is None else self.integer(name, lo, hi)

    def text(self, name: str, limit: int = 256, choices: tuple[str, ...] | None = None) -> str:
        v = self.h.get(name)
        if not isinstance(v, str) or len(v) > limit:
            raise self.bad(name, f"a string of at most {limit} characters")
        if choices is not None and v not in choices:
            raise self.bad(name, "one of " + ", ".join(choices))
        return v

    def opt_text(self, name: str, limit: int = 256) -> str | None:
        return None if self.h.get(name) is None else self.text(name, limit)

    def reason(self, name: str = "reason") -> str:
        v = self.h.get(name)
        if not isinstance(v, str):
            raise self.bad(name, "a string")
        return v[:MAX_REASON]

    def number(self, name: str, lo: float, hi: float) -> float:
        v = self.h.get(name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
            raise self.bad(name, f"a number in {lo:g}..{hi:g}")
        return float(v)

    def flag(self, name: str, default: bool = False) -> bool:
        v = self.h.get(name, default)
        if not isinstance(v, bool):
            raise self.bad(name, "true or false")
        return v

    def integers(self, name: str, lo: int, hi: int, max_len: int = 16) -> tuple[int, ...]:
        v = self.h.get(name)
        if (not isinstance(v, list) or not 1 <= len(v) <= max_len
                or any(type(x) is not int or not lo <= x <= hi for x in v)):
            raise self.bad(name, f"a list of 1..{max_len} integers in {lo}..{hi}")
        return tuple(v)

    def blob(self, name: str, size: int) -> bytes:
        v = self.h.get(name)
        if not isinstance(v, bytes) or len(v) != size:
            raise self.bad(name, f"{size} bytes")
        return v

    def opt_blob(self, name: str, size: int) -> bytes | None:
        return None if self.h.get(name) is None else self.blob(name, size)

    def mapping(self, name: str) -> dict:
        v = self.h.get(name)
        if not isinstance(v, dict):
            raise self.bad(name, "a map")
        return v


def check_host_id(host: str) -> str | None:
    """Why ``host`` is no host identity (None if it is one): 1..64 printable ASCII
    characters, no spaces (it is shown in logs, metrics and ``crnet status``)."""
    if not 1 <= len(host) <= MAX_HOST_ID:
        return f"a host id has 1..{MAX_HOST_ID} characters, not {len(host)}"
    if not all("!" <= c <= "~" for c in host):
        return f"a host id is printable ASCII without spaces: {host[:MAX_HOST_ID]!r} is not"
    return None


_HOST_NAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})"
                        r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?")


def split_address(address: str) -> tuple[str, int]:
    """``address`` (checked: ``check_address``) as the host and port to connect to."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def check_address(address: str) -> str | None:
    """Why ``address`` is no host:port a node could dial (None if it is one): a host name
    or an IP address (IPv6 bare or in brackets), a colon, a port in 1..65535. A peer's
    word for where a node listens (HELLO's ``listen``, JOINED's ``peers``, ASSIGN's) is
    checked once, where it comes in: a dial never meets a port that is not a number."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{address[:80]!r} is not host:port with a port in 1..65535"
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        ipaddress.ip_address(host[1:-1] if bracketed else host)
        return None
    except ValueError:
        pass
    if not bracketed and _HOST_NAME.fullmatch(host):
        return None
    return f"{address[:80]!r}: {host[:80]!r} is neither a host name nor an IP address"
