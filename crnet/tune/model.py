"""Run-time model: expected step time of CodedReduce, Gradient Coding, a plain tree, RAR and
spread (CodedReduce decoded at the chunks' owners: its model is ``crnet.tune.model_spread``).

Monte-Carlo over the workers' compute times (``crnet.tune.workload``, the same draws the benchmark's
emulated workers sleep) plus bandwidth and latency terms, vectorised over trials. Pure math.
``step_times_from_draws`` runs the same model on given compute times (the benchmark feeds it the
times its workers slept, to compare measured and modelled steps one by one).

The network
    Every host has one full-duplex link of rate B bytes/s (to a switch); the switch is never
    the bottleneck. A message of M bytes alone on a link costs M/B; latency λ is one-way per
    message. The result of a step is a vector of M bytes; every worker's contribution is also
    M bytes.

``cr`` on a tree (fanout n_l, stragglers s_l per layer; ``tree`` is the same with s_l = 0)
    Every worker v computes its ``local_samples`` from ``crnet.coding.plan.plan(tree, m)``, taking
    T_v. A leaf is ready at T_v.

    Up: the children share the parent's incoming link (processor sharing, like TCP flows
    into one link). Child c, ready at R_c, starts sending its vector, whose bytes reach the
    parent's link from R_c + λ on. *Every* child sends, including the ones whose vectors the
    parent will not use (crnetd still reads those off the socket into a scratch buffer). The
    k vectors in flight at any moment get B/k each: between two events (a vector starts or
    has fully arrived) each progresses at B/k. Being of equal size, the vectors finish in the
    order they started. The parent can decode when the (n-s)-th vector has fully arrived, at
    A_{n-s} (with a fractional repetition code, once one vector of every group has:
    ``codes.decoded_at``), and is ready at R_v = max(T_v, A_{n-s}) (the master computes
    nothing: R_0 = A_{n_1-s_1}). Computed exactly, event by event (``shared_link_arrivals``).

    So n children ready together all finish together, n M/B after they start, whatever s is:
    tolerating stragglers saves waiting for late children, not bandwidth. An unneeded vector
    stops slowing the needed ones only if it starts late (its child straggles) or has
    already arrived. (Vectors still arriving after the decode cost nothing more in the
    model; see what it ignores.)

    Down: the result goes back down, a parent sending it to its n children over its own
    outgoing link, n M/B + λ per level, so
        step = R_0 + sum_l (n_l M/B + λ).
    This is store-and-forward: a node forwards only whole vectors.

Pipelining (``chunk_bytes=C``, as crnetd's ``--chunk-bytes``)
    With the vector cut into chunks of C bytes, levels overlap. The model replaces the vector by
    its first chunk, c = min(C, M), in the recursion above (the shared link included: every
    child's first chunk starts at R_c + λ and the chunks in flight share the link; same order
    statistics, same latencies), which gives the time the first decoded chunk needs to travel
    up and back down, then adds the rest of the vector at the pace of the busiest link:
        step = R_0(c) + sum_l (n_l c/B + λ) + max_l n_l (M - c)/B,
    since per chunk a layer-l parent's link carries n_l chunks down and n_l chunks up (every
    child sends every chunk, on the other direction of the full-duplex link). Simple rather
    than exact: a child that starts late is assumed not to compete with the others' later
    chunks. With C >= M this is the store-and-forward model, and chunking is never slower.

``gc`` (N workers, s stragglers)
    The one-layer tree: all N workers send their vectors into the master's link (shared as
    above), the master decodes when the (N-s)-th has arrived, then sends the result to all N:
    N M/B + λ.

``rar`` (ring allreduce over N workers, each m/N samples, ``plan_uncoded``)
    Waits for the slowest worker, then 2(N-1) rounds (reduce-scatter, all-gather), each
    costing λ + M/(N B). Chunking does not change it (ignored). crnet's ring also has the
    master as a member adding nothing (2N rounds of λ + M/((N+1) B)): 2N/(N+1) against
    2(N-1)/N of the vector per link, 0.26% more at N = 20, and two more latencies, which
    small vectors feel (about 2% on the stragglers preset); left out so that rar and a
    ring of the workers alone (Gloo's) share one formula.

What the model ignores
    CPU contention between computing, coding and networking on one host; the time to decode
    (a weighted sum of n - s vectors) and encode; TCP slow start, congestion control and
    unfairness (the share is exactly B/k); per-message and per-chunk overheads beyond λ; steps
    that overlap (each step starts with every worker idle and is independent of the last);
    link stragglers (only compute straggles); the switch. And vectors still arriving after a
    parent has decoded: they keep sharing the parent's incoming link with the result coming
    down from its own parent, which the model sends down at the full rate. So with s > 0 a
    straggler's vector that arrives late costs nothing in the model, while on a real link it
    can slow the way down (and, when steps follow each other closely, the next step).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ..coding.codes import decoded_at
from ..coding.plan import SCHEMES, Tree, plan, scheme_tree
from .link_sharing import shared_link_arrivals
from .model_spread import spread_step_times
from .workload import ComputeModel, per_worker

__all__ = [
    "SCHEMES",
    "Prediction",
    "candidates",
    "predict",
    "rank",
    "scheme_tree",
    "shared_link_arrivals",
    "step_times",
    "step_times_from_draws",
    "straggler_choices",
    "summary",
    "tree_step_times",
    "worker_loads",
]



def step_times(
    scheme: str,
    *,
    tree: Tree | None = None,
    workers: int | None = None,
    stragglers: int = 0,
    samples: int,
    vector_bytes: float,
    bandwidth: float,
    latency: float,
    compute: ComputeModel,
    trials: int = 2000,
    seed: int = 0,
    chunk_bytes: float | None = None,
) -> np.ndarray:
    """Simulated step times (seconds) of ``trials`` independent steps.

    ``cr``, ``spread`` and ``tree`` need ``tree`` (``tree`` uses its fanout with no
    stragglers); ``gc`` and ``rar`` run on ``workers`` hosts (default: ``tree.workers``),
    ``gc`` tolerating ``stragglers``. The same ``seed`` gives the same draws, so schemes on the same loads, or
    one scheme under two compute models of the same kind, are compared on common random numbers.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    _check_network(vector_bytes, bandwidth, latency, chunk_bytes)
    shape = scheme_tree(scheme, tree=tree, workers=workers, stragglers=stragglers)
    loads = _worker_loads(shape, samples)
    compute_times = compute.sample(loads, np.random.default_rng(seed), trials)
    return _from_draws(scheme, shape, compute_times, vector_bytes, bandwidth, latency,
                       chunk_bytes)


def step_times_from_draws(
    scheme: str,
    *,
    compute_times: np.ndarray,
    tree: Tree | None = None,
    workers: int | None = None,
    stragglers: int = 0,
    vector_bytes: float,
    bandwidth: float,
    latency: float,
    chunk_bytes: float | None = None,
) -> np.ndarray:
    """Modelled step times (seconds) for given compute times, one per step.

    ``compute_times`` has shape (steps, N) (a 1-D array is one step): row t holds the seconds
    every worker of the scheme's shape (``scheme_tree``) computed in step t, in
    ``tree.names()`` order without the master, the order of ``worker_loads``. The shape and the
    network arguments are those of ``step_times``; the result has shape (steps,). Fed the
    compute times the benchmark's emulated workers slept, it is the model's step-by-step
    prediction of the measured steps.
    """
    _check_network(vector_bytes, bandwidth, latency, chunk_bytes)
    shape = scheme_tree(scheme, tree=tree, workers=workers, stragglers=stragglers)
    times = np.atleast_2d(np.asarray(compute_times, dtype=np.float64))
    if times.ndim != 2:
        raise ValueError(f"compute_times must be (steps, workers), got shape {times.shape}")
    return _from_draws(scheme, shape, times, vector_bytes, bandwidth, latency, chunk_bytes)


def _from_draws(scheme, shape, compute_times, vector_bytes, bandwidth, latency, chunk_bytes):
    if scheme == "rar":
        n = shape.workers
        if compute_times.shape[1] != n:
            raise ValueError(f"compute_times has {compute_times.shape[1]} columns for a ring "
                             f"of {n} workers")
        rounds = 2 * (n - 1) * (latency + vector_bytes / n / bandwidth)
        return compute_times.max(axis=1) + rounds
    if scheme == "spread":
        return spread_step_times(shape, compute_times, vector_bytes=vector_bytes,
                                 bandwidth=bandwidth, latency=latency)
    return tree_step_times(shape, compute_times, vector_bytes=vector_bytes, bandwidth=bandwidth,
                           latency=latency, chunk_bytes=chunk_bytes)


def tree_step_times(
    tree: Tree,
    compute_times: np.ndarray,
    *,
    vector_bytes: float,
    bandwidth: float,
    latency: float,
    chunk_bytes: float | None = None,
) -> np.ndarray:
    """Step times of CodedReduce on ``tree`` given the workers' compute times.

    ``compute_times`` has shape (trials, N) (or (N,) for one step), one column per worker in
    ``tree.names()`` order without the master. See the module docstring for the model.
    """
    times, one_step = per_worker(compute_times, tree.workers)
    trials = times.shape[0]
    first = vector_bytes if chunk_bytes is None else min(chunk_bytes, vector_bytes)
    unit = first / bandwidth  # one (first) chunk alone on one link
    # Columns of layer l (1-based) in names() order: the children of the i-th node of layer
    # l-1 are the n_l consecutive columns starting at offset_l + i * n_l.
    sizes = [math.prod(tree.fanout[:l]) for l in range(1, tree.layers + 1)]
    offsets = list(itertools.accumulate([0] + sizes[:-1]))
    ready = times[:, offsets[-1]:]  # the leaves
    for l in range(tree.layers, 0, -1):
        n, s = tree.fanout[l - 1], tree.stragglers[l - 1]
        # Every child of every parent starts sending at its ready time + latency, into the
        # parent's shared link; the parent decodes when the (n-s)-th vector is in, or with
        # a fractional repetition code once one of every group is (codes.decoded_at).
        starts = ready.reshape(-1, n) + latency
        in_order = shared_link_arrivals(starts, unit, need=n - s)   # (vectors finish in start order)
        per_child = np.take_along_axis(in_order, starts.argsort(axis=1).argsort(axis=1), axis=1)
        arrived = decoded_at(per_child, n, s).reshape(trials, -1)
        if l > 1:
            ready = np.maximum(times[:, offsets[l - 2]:offsets[l - 2] + sizes[l - 2]], arrived)
        else:
            ready = arrived
    down = sum(n * unit + latency for n in tree.fanout)
    stream = max(tree.fanout) * (vector_bytes - first) / bandwidth
    out = ready[:, 0] + down + stream
    return out[0] if one_step else out


def summary(times: np.ndarray) -> dict[str, float]:
    """Mean, median and 95th percentile of simulated step times (seconds)."""
    times = np.asarray(times, dtype=np.float64)
    return {"mean": float(times.mean()), "p50": float(np.percentile(times, 50)),
            "p95": float(np.percentile(times, 95))}


def worker_loads(tree: Tree, samples: int) -> np.ndarray:
    """Every worker's local samples in ``tree.names()`` order (master excluded), from the plan."""
    return _worker_loads(tree, samples).copy()


@functools.lru_cache(maxsize=1024)
def _worker_loads(tree: Tree, samples: int) -> np.ndarray:
    p = plan(tree, samples)
    return np.array([p.nodes[name].local_samples for name in tree.names() if name != ""],
                    dtype=np.float64)


@dataclass(frozen=True)
class Prediction:
    """One scheme on one shape, with its predicted step time statistics (seconds)."""

    scheme: str
    tree: Tree | None  # the one-layer tree for gc, None for rar
    workers: int
    max_load: int  # the largest local sample count
    mean: float
    p50: float
    p95: float

    @property
    def shape(self) -> str:
        if self.tree is None:
            return f"ring of {self.workers}"
        fanout = ",".join(map(str, self.tree.fanout))
        if self.scheme == "tree":
            return f"fanout {fanout}"
        if self.scheme == "gc":
            return f"star of {self.workers}, s {self.tree.stragglers[0]}"
        return f"fanout {fanout}, s {','.join(map(str, self.tree.stragglers))}"

    def to_json(self) -> dict:
        doc = {"scheme": self.scheme, "workers": self.workers, "max_load": self.max_load,
               "mean": self.mean, "p50": self.p50, "p95": self.p95}
        if self.tree is not None:
            doc["fanout"] = list(self.tree.fanout)
            doc["stragglers"] = list(self.tree.stragglers)
        return doc


def candidates(hosts: int, max_layers: int = 3) -> list[tuple[str, Tree | None]]:
    """Every scheme and tree shape on exactly ``hosts`` workers (the master is extra).

    - ``rar``: (``"rar"``, None);
    - ``gc``: the star of ``hosts`` workers (s = 0 is a parameter server);
    - trees of 2..``max_layers`` layers with fanout >= 2 at every layer and
      n_1 + n_1 n_2 + ... = hosts: ``"tree"`` when all s_l are 0, else ``"cr"``. (CodedReduce
      on one layer is ``gc``, so it is not listed twice.)
    - ``spread`` on every one of those shapes, the star (gc's) and the s = 0 trees included.

    Straggler counts tried for a parent of n children (``straggler_choices``): every s in
    0..n-1 when n <= 10; for larger n, s = 0..3 and every s with (s+1) dividing n (the exact
    FRC codes, up to s = n-1, full replication), which keeps 100 hosts to a few hundred
    candidates.
    """
    if hosts < 1:
        raise ValueError(f"hosts must be >= 1, got {hosts}")
    if max_layers < 1:
        raise ValueError(f"max_layers must be >= 1, got {max_layers}")
    out: list[tuple[str, Tree | None]] = [("rar", None)]
    spread: list[tuple[str, Tree | None]] = []
    for fanout in _fanouts(hosts, max_layers):
        for s in itertools.product(*(straggler_choices(n) for n in fanout)):
            tree = Tree(fanout, s)
            if len(fanout) == 1:
                out.append(("gc", tree))
            else:
                out.append(("cr" if any(s) else "tree", tree))
            spread.append(("spread", tree))
    return out + spread


def straggler_choices(n: int) -> list[int]:
    """The straggler counts ``candidates`` tries for a parent of ``n`` children."""
    if n <= 10:
        return list(range(n))
    return sorted({s for s in range(n) if s <= 3 or n % (s + 1) == 0})


def _fanouts(hosts: int, max_layers: int) -> Iterator[tuple[int, ...]]:
    """Fanouts (each >= 2, but a one-layer star of 1) whose prefix products sum to hosts."""
    def extend(prefix: tuple[int, ...], used: int, width: int) -> Iterator[tuple[int, ...]]:
        # ``width`` = nodes in the last layer so far; a next layer of fanout n adds width * n.
        if used == hosts:
            yield prefix
            return
        if len(prefix) == max_layers:
            return
        n = 2
        while used + width * n <= hosts:
            yield from extend(prefix + (n,), used + width * n, width * n)
            n += 1

    yield (hosts,)
    for n in range(2, hosts):
        yield from extend((n,), n, n)


def predict(
    scheme: str,
    *,
    tree: Tree | None = None,
    workers: int | None = None,
    stragglers: int = 0,
    samples: int,
    vector_bytes: float,
    bandwidth: float,
    latency: float,
    compute: ComputeModel,
    trials: int = 2000,
    seed: int = 0,
    chunk_bytes: float | None = None,
) -> Prediction:
    """``step_times`` summarised, with the shape it ran on (same arguments)."""
    times = step_times(scheme, tree=tree, workers=workers, stragglers=stragglers,
                       samples=samples, vector_bytes=vector_bytes, bandwidth=bandwidth,
                       latency=latency, compute=compute, trials=trials, seed=seed,
                       chunk_bytes=chunk_bytes)
    shape = scheme_tree(scheme, tree=tree, workers=workers, stragglers=stragglers)
    return Prediction(scheme, None if scheme == "rar" else shape, shape.workers,
                      int(_worker_loads(shape, samples).max()), **summary(times))


def rank(
    hosts: int,
    *,
    samples: int,
    vector_bytes: float,
    bandwidth: float,
    latency: float,
    compute: ComputeModel,
    trials: int = 2000,
    seed: int = 0,
    chunk_bytes: float | None = None,
    max_layers: int = 3,
    top: int | None = 5,
) -> list[Prediction]:
    """The ``top`` candidates (``candidates(hosts, max_layers)``; None: all) by predicted mean.

    Every candidate is simulated on the same seed; ties go to the lower p95.
    """
    run = functools.partial(predict, samples=samples, vector_bytes=vector_bytes,
                            bandwidth=bandwidth, latency=latency, compute=compute, trials=trials,
                            seed=seed, chunk_bytes=chunk_bytes)
    predictions = []
    for scheme, tree in candidates(hosts, max_layers):
        if scheme == "rar":
            predictions.append(run("rar", workers=hosts))
        elif scheme == "gc":
            assert tree is not None
            predictions.append(run("gc", workers=hosts, stragglers=tree.stragglers[0]))
        else:
            predictions.append(run(scheme, tree=tree))
    predictions.sort(key=lambda p: (p.mean, p.p95))
    return predictions[:top]


def _check_network(vector_bytes, bandwidth, latency, chunk_bytes) -> None:
    if not vector_bytes > 0:
        raise ValueError(f"vector_bytes must be > 0, got {vector_bytes}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
    if not latency >= 0:
        raise ValueError(f"latency must be >= 0 seconds, got {latency}")
    if chunk_bytes is not None and not chunk_bytes > 0:
        raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
