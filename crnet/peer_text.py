"""Text a peer sent (names, reasons), on its way into a log line or on to others.

A peer chooses its text: it may hold a newline and a forged log line after it,
terminal escapes, or kilobytes, and it may send it again and again. So:

- ``shown(text)`` is how peer text appears in a log line: quoted and escaped as
  ``%r`` renders it, cut to ``SHOWN`` characters.
- ``tamed(text)`` is a peer's reason as it travels on (a child's FAIL reason becomes
  part of the step's failure reason, for the parent and every training process):
  non-printable characters escaped, and unchanged when there are none, as in every
  reason crnet writes itself. (Its length is bounded where it is parsed,
  ``fields.MAX_REASON``.) The CLI prints every peer's text through it too
  (``crnet status``'s names, hosts and addresses).
- ``Throttle`` keeps a peer that repeats itself to one log line per interval, per
  peer and kind, and the next line it lets through says how many it held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable

SHOWN = 200          # characters of a peer's text shown in a log line
EVERY = 10.0         # seconds between two log lines of one kind about one peer
MAX_KEYS = 1024      # (peer, kind) pairs a Throttle remembers


def shown(text: object, limit: int = SHOWN) -> str:
    """``text`` for a log line: ``repr`` (one line, quoted, escaped), at most ``limit``
    characters of it and how many more there were."""
    s = text if isinstance(text, str) else str(text)
    if len(s) <= limit:
        return repr(s)
    return f"{s[:limit]!r}... ({len(s) - limit} more characters)"


def tamed(text: str) -> str:
    """``text`` with each non-printable character (a newline, an escape) written as
    ``repr`` writes it; printable text is returned as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class Throttle:
    """Log lines about peers, at most one per ``every`` seconds per key (e.g. a peer's
    address and what it did); the others are counted, and the next line let through
    says how many there were. At most ``max_keys`` keys are remembered."""

    def __init__(self, logger: logging.Logger, every: float = EVERY, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.every = every
        self.max_keys = max_keys
        self._clock = clock
        self._seen: dict[Hashable, tuple[float, int]] = {}   # key -> (last logged, held back)

    def warning(self, key: Hashable, msg: str, *args: object) -> bool:
        return self._log(logging.WARNING, key, msg, args)

    def log(self, level: int, key: Hashable, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless a line of ``key`` went out less than ``every`` seconds
        ago (then it is counted). True if it was logged."""
        return self._log(level, key, msg, args)

    def _log(self, level: int, key: Hashable, msg: str, args: tuple[object, ...]) -> bool:
        now = self._clock()
        last, held = self._seen.get(key, (None, 0))
        if last is not None and now - last < self.every:
            self._seen[key] = (last, held + 1)
            return False
        if held:
            msg += " (and %d more like it in the last %.0f s, not logged)"
            args += (held, now - last if last is not None else 0.0)
        self._seen.pop(key, None)
        self._seen[key] = (now, 0)
        self._forget(now)
        self.logger.log(level, msg, *args, stacklevel=3)   # the caller's file and line
        return True

    def _forget(self, now: float) -> None:
        """Keep at most ``max_keys`` keys: the quiet ones go first, then the oldest."""
        if len(self._seen) <= self.max_keys:
            return
        for key in [k for k, (last, _) in self._seen.items() if now - last >= self.every]:
            del self._seen[key]
        while len(self._seen) > self.max_keys:
            del self._seen[next(iter(self._seen))]
