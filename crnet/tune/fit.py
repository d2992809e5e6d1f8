"""``crnet tune``'s fit: from measured times to the run-time model's inputs. Pure math.

**Compute.** A worker's time is its load times a per-sample time drawn from a law
(``crnet.tune.workload``), so the fit takes per-sample times (a host's step compute time over
its local samples) and finds the simplest law that reproduces them:

==============  =====================================================================
fixed:A         the times' spread is small: coefficient of variation <= ``FIXED_CV``
straggle:A,P,F  they fall in two tight groups (each CV <= ``GROUP_CV``), the slow one at
                least ``STRAGGLE_GAP`` x the fast: A the fast group's mean, F the ratio of
                the means, P the slow group's share
shifted-exp     A the least time (less the bias of a minimum, scale/n), 1/MU the mean's
                excess over it (the maximum-likelihood estimates), if the
                Kolmogorov-Smirnov distance to the data is within the 5% critical value
                1.36/sqrt(n)
empirical       otherwise: A the least time, the multipliers every time over it (the model
                then draws the measured times themselves)
==============  =====================================================================

The empirical law is fitted too, always (``ComputeFit.empirical``).

**Links.** Bandwidth: the median of the given rates (bytes/s: ``crnet tune`` gives each
host's best link's delivery rate, as the kernel estimates it), if any; else from (bytes,
seconds) pairs: with single transfers of varied sizes (at least three, the largest at
least twice the smallest), a least-squares line seconds = c + bytes/B
(``intercept=True``); otherwise (counts summed over many transfers) B = sum of bytes / sum
of seconds. The one-way latency is half the median round-trip time when there are any,
else the line's intercept, else 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .workload import ComputeModel

__all__ = ["ComputeFit", "LinkFit", "fit_compute", "fit_links", "host_throughput", "ks_distance"]

FIXED_CV = 0.05
GROUP_CV = 0.10
STRAGGLE_GAP = 1.5
KS_ALPHA_05 = 1.36


@dataclass(frozen=True)
class ComputeFit:
    model: ComputeModel         # the law the planner takes
    empirical: ComputeModel     # the measured per-sample times as multipliers
    samples: int                # how many per-sample times it was fitted from
    distance: float             # Kolmogorov-Smirnov distance of ``model`` to them

    def to_json(self) -> dict:
        return {"law": self.model.describe(), "kind": self.model.kind,
                "mean_per_sample_s": self.model.mean_time(1), "samples": self.samples,
                "ks_distance": self.distance, "empirical": self.empirical.describe()}


@dataclass(frozen=True)
class LinkFit:
    bandwidth: float            # bytes per second
    latency: float              # seconds, one way
    pairs: int

    def to_json(self) -> dict:
        return {"bandwidth_bytes_per_s": self.bandwidth, "latency_s": self.latency,
                "pairs": self.pairs}


def fit_compute(per_sample: Sequence[float]) -> ComputeFit:
    """The law of these per-sample times (seconds; at least one, none negative)."""
    x = np.sort(np.asarray(per_sample, dtype=np.float64))
    if x.size == 0 or not np.all(np.isfinite(x)) or x[0] < 0:
        raise ValueError("fit_compute needs at least one finite per-sample time >= 0")
    positive = x[x > 0]
    if positive.size == 0:
        zero = ComputeModel("fixed", 0.0)
        return ComputeFit(zero, zero, int(x.size), 0.0)
    empirical = ComputeModel("empirical", float(positive[0]),
                             multipliers=tuple(positive / positive[0]))
    mean = float(x.mean())
    model = empirical
    if float(x.std()) <= FIXED_CV * mean:
        model = ComputeModel("fixed", _sig(mean))
    else:
        model = _straggle(x) or _shifted_exp(x) or empirical
    return ComputeFit(model, empirical, int(x.size), ks_distance(model, x))


def _cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean()) if x.size and x.mean() > 0 else math.inf


def _straggle(x: np.ndarray) -> ComputeModel | None:
    """Two tight groups, the slow one ``STRAGGLE_GAP`` x the fast (x sorted, > 0 at the top)."""
    if x.size < 2 or x[0] <= 0:
        return None
    ratios = x[1:] / x[:-1]
    cut = int(np.argmax(ratios)) + 1
    fast, slow = x[:cut], x[cut:]
    if ratios[cut - 1] < STRAGGLE_GAP or _cv(fast) > GROUP_CV or _cv(slow) > GROUP_CV:
        return None
    a = float(fast.mean())
    return ComputeModel("straggle", _sig(a), prob=_sig(slow.size / x.size),
                        factor=_sig(float(slow.mean()) / a))


def _shifted_exp(x: np.ndarray) -> ComputeModel | None:
    if x.size < 8:
        return None
    scale = float(x.mean() - x[0]) * x.size / (x.size - 1)   # unbiased
    if scale <= 0:
        return None
    model = ComputeModel("shifted_exp", _sig(max(0.0, float(x[0]) - scale / x.size)),
                         mu=_sig(1.0 / scale))
    return model if ks_distance(model, x) <= KS_ALPHA_05 / math.sqrt(x.size) else None


def ks_distance(model: ComputeModel, per_sample: Sequence[float] | np.ndarray) -> float:
    """The largest gap between the law's CDF and the times' empirical CDF."""
    x = np.sort(np.asarray(per_sample, dtype=np.float64))
    n = x.size
    if n == 0:
        return 0.0
    # Both sides of every point: the laws fixed and straggle jump, and times repeat. A
    # relative 1e-6 either side: the fitted values are rounded to six digits (``_sig``).
    after = np.abs(np.searchsorted(x, x, side="right") / n - _cdf(model, x * (1 + 1e-6)))
    before = np.abs(np.searchsorted(x, x, side="left") / n - _cdf(model, x * (1 - 1e-6)))
    return float(max(after.max(), before.max()))


def _sig(x: float) -> float:
    """Six significant digits: what was measured holds no more, and the law reads well."""
    return float(f"{x:.6g}")


def _cdf(model: ComputeModel, x: np.ndarray) -> np.ndarray:
    a = model.per_sample_s
    if model.kind == "fixed":
        return (x >= a).astype(np.float64)
    if model.kind == "straggle":
        slow = a * model.factor
        return np.where(x >= a, 1.0 - model.prob, 0.0) + np.where(x >= slow, model.prob, 0.0)
    if model.kind == "shifted_exp":
        return np.where(x >= a, 1.0 - np.exp(-model.mu * np.maximum(x - a, 0.0)), 0.0)
    values = np.sort(a * np.asarray(model.multipliers))
    return np.searchsorted(values, x, side="right") / values.size


# A vector that keeps a link busy this long (seconds) makes the kernel's busy time a good
# measure of its rate: the busy time's ticks (4 ms at HZ=250) and a delayed ACK's wait (up
# to 40 ms once per message, not per vector) are then a small part of it.
LONG_BUSY = 0.05


def host_throughput(pairs: Sequence[tuple[float, float]]) -> float | None:
    """What one host's links carried together, in bytes/s: their bytes over the longest
    busy time (a tree's links run at once: a parent sends to every child together, through
    the one host link the model's bandwidth is); None if none carried bytes."""
    used = [(float(b), float(s)) for b, s in pairs if b > 0 and s > 0]
    if not used:
        return None
    return sum(b for b, _ in used) / max(s for _, s in used)


def fit_links(pairs: Sequence[tuple[float, float]], rtts: Sequence[float] = (),
              intercept: bool = False, rates: Sequence[float] = (),
              hosts: Sequence[float] = (), vector_bytes: int | None = None) -> LinkFit:
    """Bandwidth (bytes/s) and one-way latency (s) from (bytes, seconds) pairs, rates
    (bytes/s, the kernel's delivery-rate estimates) and round-trip times (seconds).

    ``hosts``: each host's ``host_throughput``. Where a vector of ``vector_bytes`` keeps
    the fastest of them busy ``LONG_BUSY`` or more, that host's throughput is the
    bandwidth: it is what a host link carried, and a shaped link's delivery-rate estimates
    run far above it (a token bucket lets each flight's head through at the wire's speed:
    5x over a 100 Mbit/s tbf link, seen). Else the median rate, else the pairs' bytes over
    their busy time. ValueError if there is no rate > 0 and no pair that carried bytes in
    time > 0."""
    used = [(float(b), float(s)) for b, s in pairs if b > 0 and s > 0]
    good_rates = [float(r) for r in rates if r > 0]
    if not used and not good_rates:
        raise ValueError("no link carried any bytes to measure")
    b = np.array([p[0] for p in used])
    s = np.array([p[1] for p in used])
    line_latency = None
    busiest = max((h for h in hosts if h > 0), default=None)
    if busiest is not None and vector_bytes and vector_bytes / busiest >= LONG_BUSY:
        bandwidth = busiest
        good_rates = []           # (and no intercept fit: the pairs are what it came from)
        intercept = False
    else:
        bandwidth = float(np.median(good_rates)) if good_rates else float(b.sum() / s.sum())
    if not good_rates and intercept and len(used) >= 3 and b.max() >= 2 * b.min():
        slope, c = np.polyfit(b, s, 1)
        if slope > 0:
            bandwidth, line_latency = 1.0 / float(slope), max(0.0, float(c))
    good_rtts = [r for r in rtts if r is not None and r >= 0]
    if good_rtts:
        latency = float(np.median(good_rtts)) / 2
    else:
        latency = line_latency if line_latency is not None else 0.0
    return LinkFit(bandwidth, latency, max(len(used), len(good_rates)))
