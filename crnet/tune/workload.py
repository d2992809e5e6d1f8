"""Compute-time distributions of a worker's step: one definition for the model and the benchmark.

``crnet.tune.model`` draws from a :class:`ComputeModel` in bulk (Monte-Carlo over many steps), and the
benchmark's emulated workers draw one time per (seed, step, worker) and sleep it. Both go through
the same draw (:meth:`ComputeModel._seconds_per_sample`), so the model predicts exactly the
distribution the benchmark emulates.

A worker's compute time is proportional to its *load*, the number of samples it computes
locally in a step (``crnet.coding.plan``'s ``local_samples``; the master computes nothing, load 0):

============  ======================================  =====================================
kind          time of a step with load d              CLI spelling (:meth:`ComputeModel.parse`)
============  ======================================  =====================================
fixed         d * a                                   ``fixed:A``
straggle      d * a, times F with probability P       ``straggle:A,P,F``
grouped       d * a, times F with probability P per   ``grouped:A,P,F,G``
              group of G workers, all of it at once
shifted_exp   d * (a + X), X ~ Exp(rate mu)           ``shifted-exp:A,MU``
empirical     d * a * x, x uniform over a sample      ``empirical:A,FILE``
============  ======================================  =====================================

``a`` is seconds per sample at normal speed. ``shifted_exp`` is the model of the gradient coding
literature (CodedReduce's analysis included): the mean is d * (a + 1/mu), ``mu`` a rate per
second (per sample: 1/mu is seconds). On the command line A may carry a unit (``fixed:20us``;
a plain number is seconds) and so may MU (``shifted-exp:20us,1e5/s`` or ``100/ms``; a plain
number is per second).

``grouped`` is correlated straggling (a rack, a noisy neighbour): the workers, in the order the
model and the benchmark number them (``crnet.coding.plan.Tree.names()`` without the master: layer by
layer, a parent's children consecutive), are cut into consecutive groups of G, worker w in
group w // G, and a group is slow or not as a whole, drawn from (seed, step, group). In a tree
whose fanout is n at every layer, G = n makes every group the children of one parent (group 0
the master's, group k >= 1 those of the (k-1)-th worker): a slow group is more stragglers than
a parent with s < n tolerates. (With unequal fanouts, the children of each parent of layer
l - 1 are groups when G = n_l divides n_1 + n_1 n_2 + ... + n_1...n_{l-1}, the workers above
them.) G = 1 is ``straggle``: the same draws.

Pure math except :meth:`ComputeModel.parse`, which reads the ``empirical`` file it names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..units import parse_per_second, parse_seconds

__all__ = ["KINDS", "ComputeModel", "per_worker"]

KINDS = ("fixed", "straggle", "grouped", "shifted_exp", "empirical")


@dataclass(frozen=True)
class ComputeModel:
    """How long a worker computes in one step, given its load in samples."""

    kind: str
    per_sample_s: float
    prob: float = 0.0
    factor: float = 1.0
    mu: float = 1.0
    multipliers: tuple[float, ...] = ()
    group: int = 1                  # grouped: workers per group (slowed together)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"compute model kind must be one of {', '.join(KINDS)}, "
                             f"got {self.kind!r}")
        object.__setattr__(self, "multipliers", tuple(float(x) for x in self.multipliers))
        _check(math.isfinite(self.per_sample_s) and self.per_sample_s >= 0,
               f"per-sample time must be a finite number >= 0 seconds, got {self.per_sample_s!r}")
        if self.kind in ("straggle", "grouped"):
            _check(0.0 <= self.prob <= 1.0,
                   f"straggle probability must be in [0, 1], got {self.prob!r}")
            _check(math.isfinite(self.factor) and self.factor >= 1.0,
                   f"straggle factor must be a finite number >= 1, got {self.factor!r}")
        if self.kind == "grouped":
            _check(isinstance(self.group, int) and self.group >= 1,
                   f"group size must be an integer >= 1, got {self.group!r}")
        if self.kind == "shifted_exp":
            _check(math.isfinite(self.mu) and self.mu > 0,
                   f"shifted-exp rate mu must be a finite number > 0, got {self.mu!r}")
        if self.kind == "empirical":
            _check(len(self.multipliers) > 0,
                   "empirical compute model needs at least one multiplier")
            _check(all(math.isfinite(x) and x > 0 for x in self.multipliers),
                   "empirical multipliers must be finite numbers > 0")

    def compute_time(self, load_samples: int, seed: int, step: int, worker: int) -> float:
        """One worker's compute time in seconds for one step: deterministic in (seed, step, worker)
        (``grouped``: in (seed, step, group), the same for every worker of the group).

        Equal to ``sample(np.array([load_samples]), np.random.default_rng([seed, step, unit]),
        1)[0, 0]``, ``unit = group_of(worker)`` (the worker, or its group), so every
        process that knows the three integers draws the same time.
        """
        rng = np.random.default_rng([seed, step, self.group_of(worker)])
        return float(load_samples * self._seconds_per_sample(rng, (1, 1))[0, 0])

    def sample(self, load_samples: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` independent steps of every worker: shape (size, len(load_samples)), seconds.

        ``grouped``: one draw per group of ``group`` consecutive columns (the last group may be
        short), every column of a group the same draw."""
        loads = np.asarray(load_samples, dtype=np.float64)
        if loads.ndim != 1:
            raise ValueError(f"load_samples must be one-dimensional, got shape {loads.shape}")
        if self.kind == "grouped":
            groups = -(-loads.size // self.group)
            per = self._seconds_per_sample(rng, (int(size), groups))
            return loads * np.repeat(per, self.group, axis=1)[:, :loads.size]
        return loads * self._seconds_per_sample(rng, (int(size), loads.size))

    def group_of(self, worker: int) -> int:
        """The group whose draw ``worker``'s compute time follows (itself but for ``grouped``)."""
        return worker // self.group if self.kind == "grouped" else worker

    def mean_time(self, load_samples: float) -> float:
        """The expected compute time of a worker with this load (closed form)."""
        a = self.per_sample_s
        if self.kind in ("straggle", "grouped"):
            return load_samples * a * (1.0 - self.prob + self.prob * self.factor)
        if self.kind == "shifted_exp":
            return load_samples * (a + 1.0 / self.mu)
        if self.kind == "empirical":
            return load_samples * a * float(np.mean(self.multipliers))
        return load_samples * a

    def _seconds_per_sample(self, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        """The one draw both the model and the benchmark use: seconds per sample, this shape."""
        a = self.per_sample_s
        if self.kind == "fixed":
            return np.full(shape, a)
        if self.kind in ("straggle", "grouped"):
            slowed = rng.random(shape) < self.prob
            return np.where(slowed, a * self.factor, a)
        if self.kind == "shifted_exp":
            return a + rng.exponential(1.0 / self.mu, shape)
        return a * np.asarray(self.multipliers)[rng.integers(len(self.multipliers), size=shape)]

    @classmethod
    def parse(cls, text: str) -> ComputeModel:
        """Read the CLI spelling.

        ``fixed:A``, ``straggle:A,P,F`` (e.g. ``straggle:1e-4,0.1,10``: 0.1 ms per sample,
        one step in ten is 10x slower), ``grouped:A,P,F,G`` (the same, for groups of G
        workers together), ``shifted-exp:A,MU`` and ``empirical:A,FILE``.

        FILE holds positive numbers, one per line (blank lines and ``#`` comments ignored):
        either slowdown multipliers or measured step times of one worker at a fixed load. They
        are divided by their minimum, so the fastest value becomes multiplier 1 and A stays the
        per-sample time at normal speed; a file of multipliers should therefore contain 1 for
        normal speed.
        """
        kind, sep, rest = str(text).strip().partition(":")
        kind = kind.strip().lower().replace("-", "_")
        if not sep or kind not in KINDS:
            raise ValueError(f"compute model {text!r}: expected fixed:A, straggle:A,P,F, "
                             "grouped:A,P,F,G, shifted-exp:A,MU or empirical:A,FILE")
        args = [x.strip() for x in rest.split(",")]
        if kind == "empirical":
            # The file name may itself contain commas: only the first comma separates A.
            args = [x.strip() for x in rest.split(",", 1)]
        spelling = {"fixed": "fixed:A", "straggle": "straggle:A,P,F", "grouped": "grouped:A,P,F,G",
                    "shifted_exp": "shifted-exp:A,MU", "empirical": "empirical:A,FILE"}[kind]
        want = {"fixed": 1, "straggle": 3, "grouped": 4, "shifted_exp": 2, "empirical": 2}[kind]
        if len(args) != want or not all(args):
            raise ValueError(f"compute model {text!r}: expected {spelling}")
        a = _quantity(args[0], "per-sample time A", text, parse_seconds)
        try:
            if kind == "fixed":
                return cls("fixed", a)
            if kind == "straggle":
                return cls("straggle", a, prob=_number(args[1], "probability P", text),
                           factor=_number(args[2], "factor F", text))
            if kind == "grouped":
                return cls("grouped", a, prob=_number(args[1], "probability P", text),
                           factor=_number(args[2], "factor F", text),
                           group=_count(args[3], "group size G", text))
            if kind == "shifted_exp":
                return cls("shifted_exp", a, mu=_quantity(args[1], "rate MU", text, parse_per_second))
            return cls("empirical", a, multipliers=_read_multipliers(args[1]))
        except ValueError as e:
            if str(e).startswith("compute model"):   # said so already (_number and the like)
                raise
            raise ValueError(f"compute model {text!r}: {e}") from None

    def describe(self) -> str:
        """The CLI spelling (parse(describe()) == self), except ``empirical``, which summarises."""
        a = _num(self.per_sample_s)
        if self.kind == "fixed":
            return f"fixed:{a}"
        if self.kind == "straggle":
            return f"straggle:{a},{_num(self.prob)},{_num(self.factor)}"
        if self.kind == "grouped":
            return f"grouped:{a},{_num(self.prob)},{_num(self.factor)},{self.group}"
        if self.kind == "shifted_exp":
            return f"shifted-exp:{a},{_num(self.mu)}"
        m = np.asarray(self.multipliers)
        return (f"empirical:{a} ({m.size} multipliers, mean {m.mean():.4g}, "
                f"max {m.max():.4g})")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _num(x: float) -> str:
    """Shortest spelling that reads back to the same float (1e-4, not 0.0001000)."""
    r = repr(float(x))
    return r[:-2] if r.endswith(".0") else r


def _number(word: str, what: str, text: str) -> float:
    try:
        value = float(word)
    except ValueError:
        raise ValueError(f"compute model {text!r}: {what} {word!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"compute model {text!r}: {what} must be finite, got {word!r}")
    return value


def _count(word: str, what: str, text: str) -> int:
    try:
        return int(word)
    except ValueError:
        raise ValueError(f"compute model {text!r}: {what} {word!r} is not a whole number") from None


def _is_number(word: str) -> bool:
    """A plain number, or no number at all (``fast``): ``_number`` says what is wrong."""
    try:
        float(word)
    except ValueError:
        return not word.lstrip("+-")[:1].isdigit() and not word.lstrip("+-").startswith(".")
    return True


def _quantity(word: str, what: str, text: str, parse: Callable[[str], float]) -> float:
    """A plain number (seconds, or per second) or a value with its unit, read by ``parse``
    (``parse_seconds``: 20us, 0.02ms; ``parse_per_second``: 1e5/s, 100/ms)."""
    if _is_number(word):
        return _number(word, what, text)
    try:
        return parse(word)
    except ValueError as e:
        raise ValueError(f"compute model {text!r}: {what}: {e}") from None


def _read_multipliers(path: str) -> tuple[float, ...]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read {path!r}: {e.strerror or e}") from None
    values = []
    for number, line in enumerate(lines, start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            value = float(line)
        except ValueError:
            raise ValueError(f"{path}:{number}: {line!r} is not a number") from None
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{path}:{number}: values must be finite and > 0, got {line!r}")
        values.append(value)
    if not values:
        raise ValueError(f"{path} holds no values")
    low = min(values)
    return tuple(v / low for v in values)


def per_worker(compute_times, workers: int) -> tuple[np.ndarray, bool]:
    """Compute times as (trials, ``workers``) float64, and whether they were one step's (a 1-D
    array): what the models take. ValueError if there is not one column per worker."""
    times = np.asarray(compute_times, dtype=np.float64)
    one_step = times.ndim == 1
    times = np.atleast_2d(times)
    if times.shape[1] != workers:
        raise ValueError(f"compute_times has {times.shape[1]} columns for a tree of "
                         f"{workers} workers")
    return times, one_step
