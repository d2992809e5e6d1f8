"""A node's ``measured`` status section (``crnet/node/observe/measure.py``), checked field by field.

Every list is bounded (a window holds at most ``TUNE_WINDOW_MAX`` steps; a host shows at
most ``MAX_PROCESSES_SHOWN`` processes, ``MAX_CHILDREN`` children's arrivals and as many
tree links plus three), every number is in a range: a section that is not is a
ProtocolError naming the field, as any STATUS_REPLY field (``crnet.protocol.status_tree``). So is
``crnet tune --probe``'s part (``probe``: the bytes sent, each child link's round times,
the kernel's times; ``crnet/node/observe/probe.py``).
"""

from __future__ import annotations

from ..coding.plan import SCHEMES
from ..defaults import PROBE_BYTES_MAX, PROBE_ROUNDS, TUNE_WINDOW_MAX
from ..errors import ProtocolError
from ..measure.windows import MAX_PROCESSES_SHOWN
from .fields import MAX_STEP, Fields

__all__ = ["MAX_CHILDREN", "measured_entry"]

MAX_CHILDREN = 4096            # child slots of one node (a star of that many workers)
MAX_MICROS = 1 << 40           # about 12 days: any time a step or a link could take
MAX_BYTES = 1 << 62
LINKS = ("parent", "child", "successor", "predecessor")


def measured_entry(value: object) -> dict | None:
    """The section, checked (None if the node sent none)."""
    if value is None:
        return None
    f = Fields("STATUS_REPLY measured", _map(value, "measured"))
    compute, arrivals, links = (_list(f, name, limit) for name, limit in (
        ("compute", MAX_PROCESSES_SHOWN), ("arrivals", MAX_CHILDREN), ("links", MAX_CHILDREN + 3)))
    return {"window": f.integer("window", 1, TUNE_WINDOW_MAX),
            "processes": f.integer("processes", 1, 1 << 20),
            "local_samples": f.opt_integer("local_samples", 0, MAX_STEP),
            "compute": [_of("process", c, 1 << 20) for c in compute],
            "arrivals": [_of("child", a, MAX_CHILDREN) for a in arrivals],
            "periods": _window(f.mapping("periods")),
            "links": [_link(x) for x in links],
            "summed": _summed(f.h.get("summed")),
            "config": _config(f.h.get("config")),
            "probe": _probe(f.h.get("probe"))}


def _map(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(f"STATUS_REPLY measured: {what} must be a map")
    return value


def _list(f: Fields, name: str, limit: int) -> list:
    value = f.h.get(name)
    if not isinstance(value, list) or len(value) > limit:
        raise f.bad(name, f"a list of at most {limit} entries")
    return value


def _of(key: str, value: object, hi: int) -> dict:
    """A process's or a child's window."""
    entry = _map(value, f"a {key}'s window")
    return {key: Fields(f"STATUS_REPLY measured {key}", entry).integer(key, 0, hi), **_window(entry)}


def _window(value: dict) -> dict:
    f = Fields("STATUS_REPLY measured window", value)
    steps, times = (_list(f, name, TUNE_WINDOW_MAX) for name in ("steps", "micros"))
    if len(steps) != len(times):
        raise f.bad("micros", "as many times as steps")
    for name, values, hi in (("steps", steps, MAX_STEP), ("micros", times, MAX_MICROS)):
        if any(type(x) is not int or not 0 <= x <= hi for x in values):
            raise f.bad(name, f"integers in 0..{hi}")
    return {"steps": steps, "micros": times}


def _link(value: object) -> dict:
    f = Fields("STATUS_REPLY measured link", _map(value, "a link"))
    return {"link": f.text("link", choices=LINKS), "peer": f.text("peer", 256), "up": f.flag("up"),
            "rtt_us": f.opt_integer("rtt_us", 0, MAX_MICROS),
            "min_rtt_us": f.opt_integer("min_rtt_us", 0, MAX_MICROS),
            "bytes": f.opt_integer("bytes", 0, MAX_BYTES),
            "busy_us": f.opt_integer("busy_us", 0, MAX_MICROS),
            "rate": f.opt_integer("rate", 0, MAX_BYTES)}


def _summed(value: object) -> dict | None:
    if value is None:
        return None
    f = Fields("STATUS_REPLY measured summed", _map(value, "summed"))
    return {"links": f.integer("links", 0, 1 << 20), "bytes": f.integer("bytes", 0, MAX_BYTES),
            "busy_us": f.integer("busy_us", 0, MAX_MICROS * (1 << 20)),
            "min_rtt_us": f.opt_integer("min_rtt_us", 0, MAX_MICROS),
            "rate": f.opt_integer("rate", 0, MAX_BYTES)}


def _config(value: object) -> dict | None:
    if value is None:
        return None
    f = Fields("STATUS_REPLY measured config", _map(value, "config"))
    return {"scheme": f.text("scheme", choices=SCHEMES),
            "fanout": list(f.integers("fanout", 1, 1 << 20)),
            "stragglers": list(f.integers("stragglers", 0, 1 << 20)),
            "samples": f.opt_integer("samples", 1, MAX_STEP),
            "chunk_bytes": f.integer("chunk_bytes", 0, MAX_BYTES),
            "vector_bytes": f.opt_integer("vector_bytes", 1, MAX_BYTES)}


def _probe(value: object) -> dict | None:
    if value is None:
        return None
    f = Fields("STATUS_REPLY measured probe", _map(value, "probe"))
    links = _list(f, "links", MAX_CHILDREN)
    return {"bytes": f.integer("bytes", 1, PROBE_BYTES_MAX),
            "kernel_micros": _times(f, "kernel_micros"),
            "links": [_probed_link(x) for x in links]}


def _probed_link(value: object) -> dict:
    f = Fields("STATUS_REPLY measured probe link", _map(value, "a probed link"))
    return {"child": f.integer("child", 0, MAX_CHILDREN), "micros": _times(f, "micros")}


def _times(f: Fields, name: str) -> list[int]:
    """A probe's times: at most ``PROBE_ROUNDS``, each at least a microsecond."""
    values = _list(f, name, PROBE_ROUNDS)
    if any(type(x) is not int or not 1 <= x <= MAX_MICROS for x in values):
        raise f.bad(name, f"integers in 1..{MAX_MICROS}")
    return values
