"""A subtree's state as STATUS_REPLY carries it (``crnet status``), checked entry by entry.

Each node answers with its own entry and its children's, nested: a name, host,
address, one of ``STATUS_STATES``, where its steps stand, how often it straggled;
within ``DEADLINE`` seconds unless the asker says otherwise.
``status_entry`` checks one such tree before anyone reads it (the daemon asking its
children, ``crnet/node/observe/status.py``, and the ``crnet status`` client, ``crnet/tools/status.py``).
"""

from __future__ import annotations

from ..errors import ProtocolError
from .fields import MAX_HOST_ID, Fields, check_host_id
from .status_measured import measured_entry

STATUS_STATES = ("joined", "joining", "reconnecting", "missing", "silent", "unreachable")
DEADLINE = 3.0          # seconds for a whole tree's answer (crnet status)
MAX_STATUS_DEADLINE = 30.0   # the longest deadline a STATUS request may ask for


def status_entry(entry: dict, depth: int) -> dict:
    """One node of a STATUS_REPLY, checked field by field, with its children (at most
    16 layers deep). The parent also checks that the names are its child's subtree's
    (``crnet/node/observe/status.py``)."""
    f = Fields("STATUS_REPLY node", entry)
    if depth > 16:
        raise ProtocolError("STATUS_REPLY: more than 16 layers")
    host = f.opt_text("host", MAX_HOST_ID)
    if host is not None and check_host_id(host):
        raise ProtocolError(f"STATUS_REPLY: field 'host': {check_host_id(host)}")
    last = entry.get("last_step_seconds")
    children = entry.get("children", [])
    if not isinstance(children, list):
        raise f.bad("children", "a list")
    return {"name": f.text("name", 256), "host": host, "address": f.opt_text("address", 300),
            "state": f.text("state", choices=STATUS_STATES),
            "tree_step": f.integer("tree_step", -1),
            "steps_done": f.integer("steps_done"),
            "last_step_seconds": None if last is None else f.number("last_step_seconds", 0, 1e9),
            "straggled": f.opt_integer("straggled", 0, 1 << 20),
            "recent": f.opt_integer("recent", 0, 1 << 20),
            "measured": _measured(entry),
            "children": [status_entry(_entry_map(c), depth + 1) for c in children]}


def _entry_map(value) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError("STATUS_REPLY: a node must be a map")
    return value


def _measured(entry: dict):
    """The node's measured section, checked; an error names the node (the asker may be
    several layers above it)."""
    try:
        return measured_entry(entry.get("measured"))
    except ProtocolError as e:
        raise ProtocolError(f"node {str(entry.get('name'))[:64]!r}: {e}") from None
