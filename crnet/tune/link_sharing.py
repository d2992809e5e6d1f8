"""One link shared by equal-sized vectors (processor sharing): when each has fully arrived.

The run-time models' (``crnet.tune.model``, ``crnet.tune.model_spread``) one piece of queueing: the
vectors in flight on a link at any moment share its rate equally, like TCP flows into one
link. Pure math, vectorised over independent links.
"""

from __future__ import annotations

import numpy as np

__all__ = ["shared_link_arrivals"]


def shared_link_arrivals(starts: np.ndarray, unit: float, need: int | None = None) -> np.ndarray:
    """When vectors sharing one link have fully arrived (processor sharing, equal sizes).

    ``starts`` has shape (P, n): P independent links, each with n vectors that start arriving
    at the given times (any order); each vector alone would take ``unit`` seconds. The k
    vectors in flight at any moment progress at 1/k of the link's rate each. Returns shape
    (P, n): column j is when the (j+1)-th vector to complete has completely arrived (the
    vectors finish in the order they start, being of equal size). With ``need``, only the
    first ``need`` columns are computed (later starts still share the link); the rest are nan.

    Event-driven, vectorised over P: 2n events per link (n starts, n ends), each handled by
    moving a "virtual time" V (the data each in-flight vector has received, in link-seconds):
    between events V grows at 1/k per second; a vector started at virtual time V_j is complete
    when V = V_j + unit.
    """
    starts = np.sort(np.asarray(starts, dtype=np.float64), axis=1)
    p, n = starts.shape
    need = n if need is None else need
    if not 1 <= need <= n:
        raise ValueError(f"need must be in 1..{n}, got {need}")
    done = np.full((p, n), np.nan)
    rows = np.arange(p)
    v_start = np.zeros((p, n))  # V when each vector started
    t = starts[:, 0].copy()  # the first start has happened: V = 0, one vector in flight
    v = np.zeros(p)
    a = np.ones(p, dtype=np.intp)  # vectors started
    d = np.zeros(p, dtype=np.intp)  # vectors complete
    # Every link sees exactly n starts and n ends; the (need)-th end is at most the
    # (n + need - 1)-th event after the first start, and later events are not needed.
    for _ in range(n + need - 1):
        k = a - d
        has_next = a < n
        a_next = np.minimum(a, n - 1)
        d_next = np.minimum(d, n - 1)
        next_start = np.where(has_next, starts[rows, a_next], np.inf)
        v_end = v_start[rows, d_next] + unit
        busy = k > 0
        next_end = np.where(busy, t + k * (v_end - v), np.inf)
        start = next_start <= next_end
        end = ~start
        # A start: V advances by the elapsed time shared among the k in flight.
        v = np.where(start, v + np.where(busy, (next_start - t) / np.maximum(k, 1), 0.0), v_end)
        t = np.where(start, next_start, next_end)
        v_start[rows[start], a[start]] = v[start]
        done[rows[end], d[end]] = t[end]
        a += start
        d += end
    done[:, need:] = np.nan
    return done
