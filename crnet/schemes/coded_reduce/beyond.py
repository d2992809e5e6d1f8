"""Beyond s at one CodedReduce node (--beyond-s approximate): when a parent decodes from
the children there, and what its message then is (``crnet.coding.approximate`` has the math)."""

from __future__ import annotations

import statistics

from ...coding.approximate import Approximation, decode_from, node_mass
from ..base import Place, Ports
from .step import UpStep

__all__ = ["PATIENCE_MIN", "PATIENCE_SAMPLES", "message_approx", "patience"]

PATIENCE_MIN = 0.05      # seconds: the derived patience is never shorter
PATIENCE_SAMPLES = 5     # exact steps measured here before the patience is derived from them


def patience(place: Place, ports: Ports) -> float:
    """Seconds from a step's start at this parent to its approximate decode.

    Per layer: the master's --patience, else 4 x the median of this node's recent exact
    step times (at least PATIENCE_MIN). Times the layers of parents from this one down
    (layers - layer: a parent waits for its children's own approximate decodes), and at
    most --timeout x that / (layers + 1), which is also the value before PATIENCE_SAMPLES
    exact steps were measured here: every layer's decode fits within the deadline."""
    layers = place.tree.layers
    below = layers - place.layer
    cap = ports.steps.timeout * below / (layers + 1)
    per = place.patience
    if per is None:
        recent = ports.stats.times.recent_seconds
        if len(recent) < PATIENCE_SAMPLES:
            return cap
        per = max(PATIENCE_MIN, 4.0 * statistics.median(recent))
    return min(per * below, cap)


def message_approx(place: Place, up: UpStep, chunk: int) -> tuple[float, float] | None:
    """What this node's message for ``chunk`` is, if not exact: (effective mass, residual),
    at the master (coverage of the global batch, residual). None: exact (its decode, and
    every child it used, exact). Computed once per step and set of children."""
    if up.approx is None and not up.child_approx:
        return None
    code = up.code
    assert code is not None
    part_mass = place.part_mass or None
    decode: Approximation = up.approx or decode_from(code, up.decoded_from(chunk), part_mass)
    children = {k: up.child_approx[k] for k in decode.used if k in up.child_approx}
    if decode.exact and not children:
        return None
    key = (decode.used, tuple(sorted(children.items())))
    found = up.infos.get(key)
    if found is None:
        effective, whole = node_mass(code, decode, place.local_mass, part_mass,
                                     {k: mass for k, (mass, _) in children.items()})
        residual = max([decode.residual, *(res for _, res in children.values())])
        if place.is_master:
            effective = effective / whole if whole else 0.0
        found = up.infos[key] = (effective, residual)
    return found
