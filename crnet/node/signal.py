"""One small observer type for the node's rooms: ``connect`` returns the handle that
disconnects, so whoever listens also owns ending it (no bare callback lists, no
``in``/``remove`` pairs). Emitting iterates over a copy: a slot may disconnect itself,
or another, while it is called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["Signal"]


class Signal(Generic[T]):
    """Slots called in the order they connected, each with the emitted value."""

    __slots__ = ("_slots",)

    def __init__(self) -> None:
        self._slots: list[Callable[[T], object]] = []

    def connect(self, slot: Callable[[T], object]) -> Callable[[], None]:
        """Call ``slot`` on every ``emit``; the returned function stops that (idempotent)."""
        self._slots.append(slot)

        def disconnect() -> None:
            if slot in self._slots:
                self._slots.remove(slot)
        return disconnect

    def emit(self, value: T) -> list:
        """Call every slot with ``value``; what each returned, in order (a poll: e.g. the
        oldest step each training process may still ask for)."""
        return [slot(value) for slot in tuple(self._slots)]

    def __len__(self) -> int:
        return len(self._slots)
