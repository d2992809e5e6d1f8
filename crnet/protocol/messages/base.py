"""What every message is: ``Message``, the registry from wire type to class, and ``parse``.

A message class says its wire type (``TYPE``) and is registered under it when it is
defined: ``parse`` finds it there, so no list of classes is kept by hand. A frame's
header reaches ``from_header`` as ``crnet.protocol.fields.Fields``, which checks each field.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import Any, ClassVar

from ...errors import ProtocolError
from ..fields import Fields
from ..wire import MsgType, encode

__all__ = ["CLASSES", "Message", "Parser", "before_auth", "parse"]   # (not its imports)

_REGISTRY: dict[MsgType, type[Message]] = {}
# Every message class by its wire type, read-only (``crnet.protocol.messages`` imports them all).
CLASSES: Mapping[MsgType, type[Message]] = MappingProxyType(_REGISTRY)


class Message:
    """Base of every message: ``TYPE`` is its wire type, ``PAYLOAD`` whether a frame
    of this type must carry raw bytes after the header (and may not otherwise).
    ``BEFORE_AUTH``: a peer may send it before it has authenticated (a hello, a proof)."""

    TYPE: ClassVar[MsgType]
    PAYLOAD: ClassVar[bool] = False
    EMPTY_PAYLOAD: ClassVar[bool] = False   # PAYLOAD, and zero bytes of it are valid
    BEFORE_AUTH: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        msg_type = cls.__dict__.get("TYPE")
        if msg_type is None:      # a base of messages, not one itself
            return
        known = _REGISTRY.get(msg_type)
        # @dataclass(slots=True) makes the class anew under its name: that one replaces it.
        if known is not None and (known.__module__, known.__name__) != (cls.__module__, cls.__name__):
            raise TypeError(f"{cls.__name__} and {known.__name__} are both {msg_type.name}")
        _REGISTRY[msg_type] = cls

    def header(self) -> dict[str, Any]:
        names = _FIELD_NAMES.get(type(self))
        if names is None:  # once per class: dataclasses.fields is slow on the hot path
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in fields(self))  # type: ignore[arg-type]
        return {name: _plain(getattr(self, name)) for name in names}

    def frame(self, payload=None) -> list:
        """The frame for ``transport.writelines``; the payload is referenced, not copied."""
        return encode(self.TYPE, self.header(), payload)

    @classmethod
    def from_header(cls, h: Fields) -> Message:
        raise NotImplementedError


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(value):
    if type(value) in (int, str, bool, float) or value is None:
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "header"):
        return value.header()
    return value


def parse(msg_type: MsgType, header: dict, nbytes: int) -> Message:
    """The typed message a frame holds; ProtocolError (naming the field) if it is not one."""
    cls = _REGISTRY[msg_type]
    if cls.PAYLOAD and nbytes == 0 and not cls.EMPTY_PAYLOAD:
        raise ProtocolError(f"{msg_type.name} without a payload")
    if not cls.PAYLOAD and nbytes:
        raise ProtocolError(f"{msg_type.name} with a payload of {nbytes} bytes")
    return cls.from_header(Fields(msg_type, header))


def before_auth() -> frozenset[MsgType]:
    """The frame types a peer may send before it has authenticated (``BEFORE_AUTH``)."""
    return frozenset(t for t, cls in _REGISTRY.items() if cls.BEFORE_AUTH)


Parser = Callable[[MsgType, dict, int], Message]
