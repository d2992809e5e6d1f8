"""crnetd's log lines: one event per line, ``key=value`` pairs or a JSON object.

Every event carries ``ts`` (left out under systemd, whose journal stamps each line
itself), ``level``, ``logger``, ``node`` (the daemon's slot once it has one: ``master``,
``0.2``), ``step`` where the event is about one (``log.info(..., extra={"step": s})``),
``msg`` and, after an exception, ``exc``. A value with a space, a quote, ``=`` or
anything unprintable is written as a JSON string, so a newline (from a traceback, or a
peer's text) never starts a new line: one event stays one line, and a peer cannot
forge one. ``parse_kv`` reads a line back.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable
from datetime import datetime

FIELDS = ("ts", "level", "logger", "node", "step", "msg", "exc")


def under_systemd() -> bool:
    """Started by systemd (its journal adds a timestamp to every line)."""
    return "JOURNAL_STREAM" in os.environ or "INVOCATION_ID" in os.environ


class NodeTag(logging.Filter):
    """Gives each record a handler writes its ``node``: ``name()``, asked per event, so a
    node that joins later (or is given another slot) shows its slot from then on."""

    def __init__(self, name: Callable[[], str | None]):
        super().__init__()
        self.source = name

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.source()
        return True


def name_node(name: Callable[[], str | None]) -> Callable[[], None]:
    """Where crnetd's events get their ``node=`` (a ``NodeTag`` on each handler
    ``setup_logging`` installed); returns the call that takes it off again."""
    tag = NodeTag(name)
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(tag)

    def undo() -> None:
        for handler in handlers:
            handler.removeFilter(tag)
    return undo


def event(record: logging.LogRecord, timestamps: bool) -> dict[str, object]:
    """The fields of one log record, in ``FIELDS`` order; absent ones left out."""
    fields: dict[str, object] = {}
    if timestamps:
        fields["ts"] = datetime.fromtimestamp(record.created).astimezone().isoformat(
            timespec="milliseconds")
    fields["level"] = record.levelname.lower()
    fields["logger"] = record.name
    node = getattr(record, "node", None)
    if node is not None:
        fields["node"] = node
    step = getattr(record, "step", None)
    if step is not None:
        fields["step"] = step
    fields["msg"] = record.getMessage()
    if record.exc_info:
        fields["exc"] = logging.Formatter().formatException(record.exc_info)
    if record.stack_info:
        fields["exc"] = f"{fields.get('exc', '')}\n{record.stack_info}".lstrip("\n")
    return fields


_BARE = re.compile(r"[^\s\"=\\]+")


def format_kv(fields: dict[str, object]) -> str:
    """``key=value`` pairs; values that need it quoted as JSON strings (one line)."""
    out = []
    for key, value in fields.items():
        text = str(value)
        if not (_BARE.fullmatch(text) and text.isprintable()):
            text = _quoted(text)
        out.append(f"{key}={text}")
    return " ".join(out)


def _quoted(text: str) -> str:
    quoted = json.dumps(text, ensure_ascii=False)
    # JSON leaves some unprintable characters as they are (DEL, U+2028 the line
    # separator): then every non-ASCII character is escaped.
    return quoted if quoted.isprintable() else json.dumps(text)


_PAIR = re.compile(r'([A-Za-z_][\w.]*)=("(?:[^"\\]|\\.)*"|[^\s"]*)')


def parse_kv(line: str) -> dict[str, str]:
    """The fields of a ``key=value`` line (every value as a string)."""
    return {key: json.loads(value) if value.startswith('"') else value
            for key, value in _PAIR.findall(line)}


class EventFormatter(logging.Formatter):
    def __init__(self, fmt: str = "kv", timestamps: bool = True):
        super().__init__()
        self.json = fmt == "json"
        self.timestamps = timestamps

    def format(self, record: logging.LogRecord) -> str:
        fields = event(record, self.timestamps)
        if self.json:
            line = json.dumps(fields, ensure_ascii=False, default=str)
            return line if line.isprintable() else json.dumps(fields, default=str)
        return format_kv(fields)


def setup_logging(level: str, fmt: str = "kv", stream=None, timestamps: bool | None = None) -> None:
    """crnetd's logging: every logger's events to ``stream`` (stderr), one per line."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(EventFormatter(fmt, not under_systemd() if timestamps is None
                                        else timestamps))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def set_log_level(level: str, announce: str | None = None) -> None:
    """Change the level of every crnetd logger; ``announce`` is logged at INFO (or the
    level in effect) while the more verbose of the two levels holds, so it is seen."""
    root = logging.getLogger()
    old, new = root.level, logging.getLevelName(level.upper())
    log = logging.getLogger("crnet.node.observe.logs")
    if announce is not None and new > old:
        log.log(max(logging.INFO, old), "%s", announce)
    root.setLevel(new)
    if announce is not None and new <= old:
        log.log(max(logging.INFO, new), "%s", announce)
