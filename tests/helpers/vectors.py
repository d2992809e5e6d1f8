"""Per-sample gradients, a host's weighted share of them, and how far a result is from the sum."""

from __future__ import annotations

import numpy as np


def gradients(seed: int, m: int, dim: int) -> np.ndarray:
    """``m`` per-sample vectors of length ``dim`` (standard normal), the same for the same seed."""
    return np.random.default_rng(seed).standard_normal((m, dim))


def local_gradient(assignment, grads: np.ndarray) -> np.ndarray:
    """This process's weighted sum over its ranges of the per-sample vectors ``grads``."""
    out = np.zeros(grads.shape[1])
    for start, stop, weight in assignment.ranges:
        out += weight * grads[start:stop].sum(axis=0)
    return out


def rel_error(got, want) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / max(1.0, np.max(np.abs(want))))


def integers(dim: int, dtype=np.float32, period: int = 13) -> np.ndarray:
    """``dim`` small integers, -(period // 2) up to period // 2 in turn: exact in float32, and so
    are their sums with small integer weights (a float32 result is then compared exactly)."""
    return (np.arange(dim) % period - period // 2).astype(dtype)
