"""Gradient codes for one parent of the CodedReduce tree (pure math, numpy only).

A parent with ``n`` children that tolerates ``s`` stragglers cuts its data into parts
P_0..P_{n-1}; child k sends ``m_k = sum_j B[k, j] g(P_j)``. For every set F of at least
``n - s`` children there is a vector a with ``a^T B_F = 1^T``, so the parent recovers
``sum_j g(P_j)`` from whichever n - s children answer first (Tandon, Lei, Dimakis, Karampatziakis,
"Gradient Coding", ICML 2017).

Three codes:

* ``identity`` (s = 0): B = I.
* ``frc``, fractional repetition, when (s + 1) divides n: the children form n/(s+1) groups of
  s+1 consecutive children, each holding its group's s+1 parts with coefficient 1. Any n - s
  children include one member of every group (s stragglers cannot silence a group of s+1), and
  adding those members' messages with coefficient 1.0 sums every part exactly once: exact in
  floating point. Fewer children do too, as long as every group has one (``covers``): up to
  n - n/(s+1) stragglers, if they fall in different groups.
* ``crc``, cyclic repetition, for any s < n: child k holds parts k, k+1, ..., k+s (mod n).

Construction of the CRC matrix. Every construction here has the same shape: pick a real
(n-s)-dimensional space V of part-weight vectors, and let row k be the (unique up to scale)
vector of V supported on child k's window {k, ..., k+s}. If any n - s rows are independent they
span V, so V must contain the all-ones vector (or be column-scaled until it does).

* n <= 24: a real cyclic MDS code in the spirit of Raviv, Tamo, Tandon, Dimakis, "Gradient
  Coding from Cyclic MDS Codes and Expander Graphs" (ICML 2018 / IEEE T-IT 2020). V is spanned
  by the real Fourier vectors of n - s *consecutive* frequencies symmetric about 0: integer
  frequencies 0, +-1, ..., +-t when n - s = 2t+1 is odd (V then contains 1, and the rows are
  the cyclic shifts of the real polynomial g(x) whose roots are the other n-th roots of unity),
  half-integer frequencies +-1/2, ..., +-(t+1/2) when n - s = 2t+2 is even (the negacyclic
  analogue modulo x^n + 1; its V contains no 1, so the columns are divided by d, the projection
  of 1 onto V, whose entries are all positive: d_max/d_min <= 2n/pi, reached at n - s = 2).
  In both cases the rows F, written in the complex Fourier basis of V, are a unimodular
  diagonal times a Vandermonde matrix in the distinct nodes exp(2 pi i k / n), k in F, so every
  straggler pattern is decodable, provably. For small n it is the best conditioned construction
  we measured (worst cond(B_F) at n = 12 is 3.2e2, against 1e4 to 4e8 for Tandon's random
  construction depending on the seed), but it is Vandermonde on the unit circle: survivors that
  leave a gap of consecutive children make it grow quickly with n and min(s, n - s), and it
  loses to the random construction from about n = 28 on (error ~1 at n = 100, s = 20).
* n > 24: Tandon et al.'s Algorithm 2: V = the null space of a random s x n matrix H with
  H 1 = 0. Every pattern is decodable with probability 1; the worst patterns are random rather
  than structured, so its conditioning grows slowly with n. H comes from numpy's legacy
  ``RandomState`` (its stream is frozen across numpy versions) seeded from (n, s), so every
  process builds the identical B.

CRC rows are scaled to unit Euclidean norm with a positive entry on part k. Measured in float64
with unit-norm rows (kind="crc" forced, all C(n, s) patterns): over all n <= 12, s < n the worst
``||a^T B_F - 1||_inf`` is 1.0e-13 (n = 12, s = 3) and the worst cond(B_F) 3.2e2 (n = 12,
s = 6);
n = 20, s = 5: 5.4e-13 and 3.0e3. Random construction, 2000 random patterns plus every
consecutive gap: n = 50, s = 10: 5.5e-9 and 6.7e7; n = 100, s = 20: 2.9e-9 and 2.6e7.
float32 messages lose about ||a||_1 * 6e-8 relative (||a||_1 <= 4.4e2 for n <= 12).

More than s stragglers: ``decode_approx`` gives the least-squares best effort (approximate
gradient coding, Charles, Papailiopoulos, Ellenberg 2017) and reports its error.
"""
from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable

import numpy as np

__all__ = ["GradientCode", "code_for", "decoded_at"]

_KINDS = ("auto", "frc", "crc")
# Above this n the random (Tandon) CRC construction is better conditioned than the cyclic MDS
# one; measured crossover is n ~ 24..28 for mid-range s (see the module docstring).
_CYCLIC_MDS_MAX_N = 24
# worst_decode_error() refuses beyond this many straggler patterns (it would take minutes).
_MAX_PATTERNS = 200_000
# decode_set() compares at most this many candidate sets (each one a small least-squares solve,
# once per set of arrivals thanks to the cache); beyond it, the first n - s arrivals are used.
_MAX_CANDIDATES = 64


def _windows(n: int, s: int) -> list[list[int]]:
    """Child k's parts in CRC: k, k+1, ..., k+s (mod n), in that (unsorted) order."""
    return [[(k + i) % n for i in range(s + 1)] for k in range(n)]


def _rows_in_span(H: np.ndarray, n: int, s: int) -> np.ndarray:
    """Row k = the vector x with H x = 0 supported on child k's window, unit norm, x[k] > 0.

    H is s x n, so H restricted to a window (s x (s+1)) has a one-dimensional null space
    for every construction used here: its last right singular vector.
    """
    B = np.zeros((n, n))
    for k, win in enumerate(_windows(n, s)):
        v = np.linalg.svd(H[:, win])[2][-1]
        B[k, win] = v * np.sign(v[0])
    return B


def _cyclic_mds(n: int, s: int) -> np.ndarray:
    """Real cyclic (n-s odd) / negacyclic (n-s even) MDS code containing 1; see module doc."""
    m = n - s
    j = np.arange(n)
    cols = []
    u = 0.0 if m % 2 else 0.5           # frequencies 0, 1, 2, ... or 1/2, 3/2, ...
    if u == 0.0:
        cols.append(np.ones(n))
        u = 1.0
    while len(cols) < m:
        cols += [np.cos(2 * np.pi * u * j / n), np.sin(2 * np.pi * u * j / n)]
        u += 1.0
    Q = np.linalg.qr(np.column_stack(cols), mode="complete")[0]
    B = _rows_in_span(Q[:, m:].T, n, s)  # H = orthonormal complement of V
    if m % 2 == 0:
        # V does not contain 1; it contains d (the projection of 1, all entries > 0), and
        # dividing column j by d_j maps d to 1 without changing any support.
        d = Q[:, :m] @ Q[:, :m].sum(axis=0)
        assert d.min() > 0, (n, s)
        B /= d
        B /= np.linalg.norm(B, axis=1, keepdims=True)
    return B


def _tandon_random(n: int, s: int) -> np.ndarray:
    """Tandon et al. 2017, Algorithm 2: rows in the null space of a random H with H 1 = 0."""
    rng = np.random.RandomState((n * 1_000_003 + s) % 2**32)
    H = rng.standard_normal((s, n))
    H -= H.mean(axis=1, keepdims=True)
    return _rows_in_span(H, n, s)


class GradientCode:
    """Encoding matrix B and decoder for one parent with n children and s stragglers."""

    def __init__(self, n: int, s: int, kind: str = "auto"):
        for name, v in (("n", n), ("s", s)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"{name} must be an integer, got {v!r}")
        n, s = int(n), int(s)
        if n < 1:
            raise ValueError(f"need n >= 1 children, got n={n}")
        if not 0 <= s < n:
            raise ValueError(f"need 0 <= s < n, got n={n}, s={s}")
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        if kind == "frc" and n % (s + 1):
            raise ValueError(f"frc needs (s+1) to divide n, got n={n}, s={s}")
        if s == 0:
            kind = "identity"
        elif kind == "auto":
            kind = "frc" if n % (s + 1) == 0 else "crc"
        self.n, self.s, self.kind = n, s, kind

        if kind == "crc":
            B = _cyclic_mds(n, s) if n <= _CYCLIC_MDS_MAX_N else _tandon_random(n, s)
            self.supports = tuple(tuple(sorted(w)) for w in _windows(n, s))
        else:  # identity is FRC with groups of one
            group = np.arange(n) // (s + 1)
            B = (group[:, None] == group[None, :]).astype(np.float64)
            self.supports = tuple(tuple(range(q * (s + 1), (q + 1) * (s + 1))) for q in group)
        B.flags.writeable = False
        self.B: np.ndarray = B
        # Decoding weights per set of *used* children, as a length-n vector (0 = unused);
        # per-instance LRU so repeated straggler patterns cost one dict lookup.
        self._weights = functools.lru_cache(maxsize=4096)(self._solve)
        self._choice = functools.lru_cache(maxsize=4096)(self._choose)
        self._worst: float | None = None
        self._amplification: float | None = None

    def __repr__(self) -> str:
        return f"GradientCode(n={self.n}, s={self.s}, kind={self.kind!r})"

    # -- decoding -------------------------------------------------------------------------

    def covers(self, arrived: Iterable[int]) -> bool:
        """Do the children ``arrived`` (distinct, in range) decode the sum exactly? Any n - s
        do; for FRC (and identity), so does any set with one child of every group, which
        may be fewer: a parent need not wait for n - s children when the stragglers fall
        in different groups."""
        arrived = list(arrived)
        if len(arrived) >= self.n - self.s:
            return True
        if self.kind == "crc":
            return False
        return len({k // (self.s + 1) for k in arrived}) == self.n // (self.s + 1)

    def decode(self, responders: Iterable[int]) -> np.ndarray:
        """Coefficients a, a[i] for responders[i] (order as given), with sum_i a[i] B[r_i] = 1.

        Needs at least n - s distinct children, or for FRC one of every group (``covers``).
        FRC uses the first responder of each group (coefficient exactly 1.0); CRC solves on
        the first n - s responders. Every other responder gets 0.0, so callers may skip its
        message. Returns a fresh array.
        """
        resp = self._exact(responders)
        return self._weights(self._used(resp))[0][resp]

    def decode_set(self, arrived: Iterable[int]) -> tuple[int, ...]:
        """The n - s children to decode from, of those that ``arrived`` (in arrival order),
        sorted by index, so the sum's order does not depend on arrival order.

        With exactly n - s arrivals that is all of them; FRC with fewer that cover every
        group, all of them too. With more (the children outran this node's own gradient),
        the choice depends only on *which* children arrived: FRC the n - s lowest indices
        (so decode() uses the lowest of each group), CRC the set with the smallest
        ||a_F||_1 (float rounding in the messages reaches the result multiplied by at most
        ||a_F||_1), ties to the smaller indices; beyond _MAX_CANDIDATES sets, CRC keeps the
        first n - s arrivals.
        """
        resp = self._exact(arrived)
        if len(resp) <= self.n - self.s:
            return tuple(sorted(int(r) for r in resp))
        if self.kind != "crc" or math.comb(len(resp), self.n - self.s) <= _MAX_CANDIDATES:
            return self._choice(tuple(sorted(int(r) for r in resp)))
        return tuple(sorted(int(r) for r in resp[: self.n - self.s]))

    def amplification(self) -> float:
        """max over straggler patterns of ||a_F||_1: how much a decode can multiply the
        rounding error of its inputs (|sum_k a_k (m_k + e_k) - sum_k a_k m_k| <=
        ||a_F||_1 max_k |e_k|). n/(s+1) for FRC (n for identity, s = 0); for CRC every
        pattern is solved (e.g. 3.65 at n = 3, s = 1; 3.7e3 at n = 20, s = 5)."""
        if self.kind != "crc":
            return float(self.n // (self.s + 1))
        if self._amplification is None:
            count = math.comb(self.n, self.s)
            if count > _MAX_PATTERNS:
                raise ValueError(f"{count} straggler patterns for n={self.n}, s={self.s}: too "
                                 f"many to check exhaustively (limit {_MAX_PATTERNS})")
            self._amplification = max(
                float(np.abs(self._solve(F)[0]).sum())
                for F in itertools.combinations(range(self.n), self.n - self.s))
        return self._amplification

    def decode_approx(self, responders: Iterable[int]) -> tuple[np.ndarray, float]:
        """Best-effort decode from any non-empty set of responders: (a, error).

        error = ||a^T B_F - 1||_inf, the largest deviation of a part's effective weight from 1.
        With >= n - s responders this is decode() (error ~ 0, exactly 0.0 for FRC). With fewer,
        CRC uses least squares over all responders (min ||a^T B_F - 1||_2; Charles et al.
        2017); FRC uses one survivor per group, so a group with no survivor loses its parts
        entirely (weight 0, error 1.0) while every other part stays exact.
        """
        resp = self._check(responders, 1, "decode approximately")
        w, err = self._weights(self._used(resp))
        return w[resp], err

    def worst_decode_error(self) -> float:
        """max ||a_F^T B_F - 1||_inf over every straggler pattern (|F| = n - s), float64.

        0.0 for FRC / identity (exact by construction). For CRC all C(n, s) patterns are
        solved; supersets are decoded on a subset of size n - s, so they are covered.
        """
        if self.kind != "crc":
            return 0.0
        if self._worst is None:
            count = math.comb(self.n, self.s)
            if count > _MAX_PATTERNS:
                raise ValueError(
                    f"{count} straggler patterns for n={self.n}, s={self.s}: too many to "
                    f"check exhaustively (limit {_MAX_PATTERNS})")
            self._worst = max(self._solve(F)[1]
                              for F in itertools.combinations(range(self.n), self.n - self.s))
        return self._worst

    # -- internals ------------------------------------------------------------------------

    def _check(self, responders: Iterable[int], need: int, what: str) -> np.ndarray:
        try:
            resp = list(responders)
        except TypeError:
            raise ValueError(f"responders must be an iterable of child indices, "
                             f"got {responders!r}") from None
        seen = set()
        for r in resp:
            if isinstance(r, bool) or not isinstance(r, (int, np.integer)):
                raise ValueError(f"responder {r!r} is not an integer")
            if not 0 <= r < self.n:
                raise ValueError(f"responder {r} out of range 0..{self.n - 1}")
            if r in seen:
                raise ValueError(f"duplicate responder {r}")
            seen.add(r)
        if len(resp) < need:
            raise ValueError(f"need at least {need} of {self.n} children to {what}, "
                             f"got {len(resp)}: {[int(r) for r in resp]}")
        return np.array(resp, dtype=np.intp)

    def _exact(self, responders: Iterable[int]) -> np.ndarray:
        """``responders`` checked, and enough of them to decode exactly (``covers``)."""
        resp = self._check(responders, 0, "decode")
        if not self.covers(int(r) for r in resp):
            also = ("" if self.kind == "crc" else
                    f" (or one of every group of {self.s + 1}: this code is {self.kind})")
            raise ValueError(f"need at least {self.n - self.s} of {self.n} children to decode, "
                             f"got {len(resp)}: {[int(r) for r in resp]}{also}")
        return resp

    def _used(self, resp: np.ndarray) -> tuple[int, ...]:
        """The children whose messages get a nonzero coefficient, as a sorted cache key."""
        if self.kind == "crc":
            used = resp[: self.n - self.s]          # first n - s; or all, if fewer
        else:                                       # first arrival of each group
            _, first = np.unique(resp // (self.s + 1), return_index=True)
            used = resp[first]
        return tuple(sorted(int(r) for r in used))

    def _choose(self, arrived: tuple[int, ...]) -> tuple[int, ...]:
        """decode_set for more than n - s arrivals (sorted), cached."""
        if self.kind != "crc":
            # Any n - s children cover every group, and decode() takes the first of each
            # group, here the lowest index.
            return arrived[: self.n - self.s]
        return min(itertools.combinations(arrived, self.n - self.s),
                   key=lambda F: (float(np.abs(self._solve(F)[0]).sum()), F))

    def _solve(self, used: tuple[int, ...]) -> tuple[np.ndarray, float]:
        """Read-only length-n weights w (w[k] for child k, 0 if unused) and its error."""
        w = np.zeros(self.n)
        idx = list(used)
        if self.kind == "crc":
            # B_F^T a = 1: consistent when |F| >= n - s (exact decode), otherwise the
            # least-squares approximation. lstsq (SVD) is backward stable either way.
            w[idx] = np.linalg.lstsq(self.B[idx].T, np.ones(self.n), rcond=None)[0]
        else:
            w[idx] = 1.0
        err = float(np.abs(w @ self.B - 1.0).max())
        w.flags.writeable = False
        return w, err


@functools.cache
def code_for(n: int, s: int, kind: str = "auto") -> GradientCode:
    """One shared GradientCode per (n, s, kind) per process (B and the decode cache)."""
    return GradientCode(n, s, kind)


def decoded_at(ready: np.ndarray, n: int, s: int, kind: str = "auto") -> np.ndarray:
    """When a parent with ``n`` children (``code_for(n, s, kind)``) can first decode
    exactly, given when each child's message is in: ``ready`` (..., n) -> (...). The
    (n-s)-th earliest for CRC; for FRC the moment every group has one (``covers``), the
    latest of the groups' earliest. NaN in ``ready``: a message never considered (it is
    later than n - s others), which neither rule needs. Vectorised, for the run-time models.
    """
    ready = np.asarray(ready, dtype=np.float64)
    if code_for(n, s, kind).kind == "crc":
        return np.sort(ready, axis=-1)[..., n - s - 1]
    groups = ready.reshape(*ready.shape[:-1], n // (s + 1), s + 1)
    return np.nanmin(groups, axis=-1).max(axis=-1)
