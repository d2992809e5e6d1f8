"""Beyond s: the best decode from fewer than n - s children, and what it covers (pure math).

A parent of n children that tolerates s stragglers recovers its parts' gradient exactly from
any n - s of them (``crnet.coding.codes``). With fewer, ``decode_from`` gives the best combination
of those present (the code's ``decode_approx``: FRC one survivor per group, CRC least squares
over all of them, min ||a^T B_F - 1||_2) and says what that combination is:

* ``part_weights`` = a^T B_F: the effective weight of each part P_j in the decoded message
  (exactly 1 for every part when the decode is exact);
* ``coverage`` = sum_j part_weights[j] |P_j| / sum_j |P_j|, the mass-weighted mean effective
  weight (|P_j| is the part's weighted sample count; equal parts by default). For FRC it is
  the fraction of the parts' samples whose group has a survivor (each part's weight is 1 or
  0); for CRC it is the weight mass the least-squares decode puts on the parts, which may
  differ from the fraction of parts recovered (weights between 0 and 1, or above 1);
* ``residual`` = ||a^T B_F - 1||_inf, the largest deviation of one part's weight from 1
  (1.0 for FRC when a group has no survivor; about 1e-13 for an exact CRC decode).

Why this coverage: a result whose samples have effective weights c_i sums to
sum_i c_i g_i. When which samples sit where is independent of which children straggle
(the batch is shuffled every step, as a data loader with shuffle=True does), every g_i has
the same expectation G, so E[result] = (sum_i c_i) G = coverage * m G = coverage *
E[exact sum]: dividing by ``coverage`` gives an unbiased-in-expectation estimate of the
full sum, for FRC and CRC alike. It is not unbiased when straggling correlates with the
data (a slow host that always holds the same kind of samples: its parts are missing
systematically, and no scaling brings them back), and scaling a coverage near 0 blows up
the variance (crnet.torch does not scale below ``MIN_SCALED_COVERAGE``). The residual
says how far from a plain sum the decode is: FRC's is 1.0 as soon as a group is lost,
while its coverage still says how much of the batch is in.

Composition down a tree (``node_mass``): a node's message is its local weighted
gradient plus the decode of its children's messages, each of which may itself be
approximate. Its effective mass is M = sum_i c_i over the samples it sums (weighted):
M = |local| + sum_k a_k M_k, linear in its children's M_k, where an exact child's M_k is
T_k = sum_j B[k, j] |P_j|, the mass it answers for. So a node sends its M up (only when
it is not exact) and the master's coverage is M / m: the fraction of the global batch
(no local share, every sample weight 1). This is exact (mass is linear), however many
layers approximate. The tree's
residual is the largest residual of any decode that went into the result (a maximum, not
a sample-level norm: children's sample sets overlap, so per-decode residuals do not add).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .codes import GradientCode

__all__ = ["MIN_SCALED_COVERAGE", "Approximation", "decode_from", "node_mass"]

# Below this coverage crnet.torch does not rescale an approximate gradient (1/coverage
# would multiply its noise too much); the step's info still says what it is.
MIN_SCALED_COVERAGE = 0.05


@dataclass(frozen=True)
class Approximation:
    """The best decode from the children ``used`` (sorted): ``weights[k]`` for child k
    (0.0 for a child not used), its effective part weights, coverage and residual."""

    used: tuple[int, ...]
    weights: np.ndarray
    part_weights: np.ndarray
    coverage: float
    residual: float
    exact: bool


def _part_mass(code: GradientCode, part_mass: Sequence[float] | None) -> np.ndarray:
    if part_mass is None:
        return np.ones(code.n)
    mass = np.asarray(part_mass, dtype=np.float64)
    if mass.shape != (code.n,):
        raise ValueError(f"part_mass must be {code.n} masses, got {part_mass!r}")
    return mass


def decode_from(code: GradientCode, present: Iterable[int],
                part_mass: Sequence[float] | None = None) -> Approximation:
    """The decode from the children ``present`` (any order; at least one).

    With n - s or more present it is the exact decode (``decode_set`` then ``decode``:
    the same children and coefficients as without this module), coverage 1.0, exact True.
    With fewer it is ``decode_approx`` over all of them (in index order)."""
    chosen = sorted(int(k) for k in present)
    mass = _part_mass(code, part_mass)
    w = np.zeros(code.n)
    if len(chosen) >= code.n - code.s:
        used = code.decode_set(chosen)
        w[list(used)] = code.decode(used)
        exact = True
    else:
        coeffs, _ = code.decode_approx(chosen)
        w[chosen] = coeffs
        exact = False
    part_weights = w @ code.B
    residual = float(np.abs(part_weights - 1.0).max())
    total = float(mass.sum())
    coverage = 1.0 if exact or total == 0.0 else float(part_weights @ mass) / total
    used = tuple(k for k in chosen if w[k] != 0.0)
    w.flags.writeable = False
    part_weights.flags.writeable = False
    return Approximation(used, w, part_weights, coverage, residual, exact)


def node_mass(code: GradientCode, decode: Approximation, local_mass: float,
              part_mass: Sequence[float] | None = None,
              child_mass: Mapping[int, float] | None = None) -> tuple[float, float]:
    """(effective, whole): the mass a node's message carries, its local share
    (``local_mass``, exact) plus ``decode`` of its children, child k's message carrying
    ``child_mass[k]`` (its own ``effective``; if not given, exact: T_k, all it answers
    for), and the mass the node answers for. See the module docstring. Masses, not
    ratios, go up the tree: with CRC a subtree may answer for a mass near 0."""
    mass = _part_mass(code, part_mass)
    whole = local_mass + float(mass.sum())
    given = child_mass or {}
    if decode.exact and not any(k in given for k in decode.used):
        return whole, whole
    targets = code.B @ mass                       # T_k: the mass child k answers for
    effective = local_mass + sum(float(decode.weights[k]) * given.get(k, float(targets[k]))
                                 for k in decode.used)
    return effective, whole
