"""``crnet tune HOST:PORT``: what the running tree measured, the model fitted to it, and every
scheme and shape ranked by the fitted model.

1. **Gather** (``crnet.tune.gather.gather``, over the network: the daemon, which ranks
   what its own ``crnet status`` service gathered, imports this module and not that one):
   the node's subtree (ask the master for the whole tree) through ``crnet status``'s
   connection and authentication (``crnet.tools.status``), every node's ``measured`` section
   included (``crnet/node/observe/measure.py``; each is checked as it arrives,
   ``crnet.protocol.status_measured``, so a malformed one is an error naming its node).
2. **Read** (``measurements``): per host, its compute time per step (its slowest process's,
   over the steps all of them measured) over its share of the batch: seconds per sample;
   its links' (bytes, busy seconds) and round-trip times; the period of the asked node's
   steps (the tree's step time); what the tree runs (scheme, shape, batch, vector, chunks).
3. **Fit** (``crnet.tune.fit``): one compute law over every host's per-sample times (the
   model draws every worker from one law), and the links' bandwidth and latency.
4. **Rank** (``tune``): ``crnet.tune.model.rank`` over every scheme and shape for this many
   workers, as ``crnet plan --auto`` does, with the fitted inputs; and the running
   configuration's own prediction, to hold against its measured step time.
5. **Apply** (``master_config``, ``config_text``): a choice as the master's ``--config``
   file keys (``crnet tune --write``); ``replan_choice``: the best one ``crnetd --plan auto``
   can take between jobs without hosts joining again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..coding.plan import Tree, scheme_tree
from ..errors import CrnetError
from ..schemes.chunks import chunk_bytes_for
from .fit import ComputeFit, LinkFit, fit_compute, fit_links, host_throughput
from .model import Prediction, predict, rank

__all__ = ["REPLANNED", "HostMeasured", "Measurements", "Probed", "Running", "TuneError", "Tuning",
           "config_text", "link_counts", "link_throughput", "master_config", "measurements",
           "named", "nodes", "placed_tree", "replan_choice", "tune"]

# The schemes a tree re-plans among between jobs without moving its hosts (``crnetd
# --plan auto``): the ones whose hosts sit in the tree the same way (a parent's children
# send it their pieces); rar's ring and spread's peers are links of their own, made when
# the hosts join (they, and another fanout, need MOVE: ``node/join/moves.py``).
REPLANNED = ("cr", "gc", "tree")


class TuneError(CrnetError):
    """What was measured does not allow a fit (yet): the message says why."""


@dataclass(frozen=True)
class Running:
    """What the tree runs, as its nodes say."""

    scheme: str
    tree: Tree
    samples: int
    chunk_bytes: int           # as configured (0: auto)
    vector_bytes: int

    @property
    def workers(self) -> int:
        return self.tree.workers

    @property
    def shape(self) -> Tree:   # (gc: its stragglers are the one layer's)
        return scheme_tree(self.scheme, tree=self.tree, stragglers=self.tree.stragglers[0])


@dataclass(frozen=True)
class HostMeasured:
    name: str                          # its place ("" the master)
    host: str | None
    local_samples: int
    per_sample: tuple[float, ...]      # seconds per sample, one per step measured
    links: tuple[tuple[int, float], ...]   # (bytes acknowledged, seconds busy sending)
    min_rtts: tuple[float, ...]        # seconds
    best_rate: float | None            # its links' best delivery rate (bytes/s)
    throughput: float | None = None    # what its links of one kind carried together (bytes/s)


@dataclass(frozen=True)
class Probed:
    """What ``crnet tune --probe`` measured instead of training (``crnet.tune.probe``)."""

    bytes: int                         # sent to each child per round
    kernel_seconds: float              # the fastest host's median time of the kernel
    per_sample: float | None           # one sample's compute as the user gave it (else the
                                       # kernel's time stood in for it)
    throughput: float | None           # the rounds' median bytes per second (send to echo)

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "kernel_s": self.kernel_seconds,
                "per_sample_s": self.per_sample, "throughput_bytes_per_s": self.throughput}


@dataclass(frozen=True)
class Measurements:
    running: Running
    hosts: tuple[HostMeasured, ...]
    periods: tuple[float, ...]         # the asked node's step periods (seconds)
    unmeasured: tuple[str, ...]        # nodes that sent no measurements (silent, missing)
    probe: Probed | None = None        # measured by a probe, not while training


def measurements(tree: dict) -> Measurements:
    """What ``gather.gather``'s answer says, per host. TuneError if it cannot be fitted from."""
    root = tree.get("measured")
    if root is None or root.get("config") is None:
        raise TuneError(f"{named(tree)} has no share of the data yet: nothing runs to tune")
    config = root["config"]
    if config["vector_bytes"] is None or config["samples"] is None:
        raise TuneError("no step has finished yet: train a few steps first, or ask "
                        "for a probe (crnet tune --probe)")
    running = Running(config["scheme"], Tree(config["fanout"], config["stragglers"]),
                      config["samples"], config["chunk_bytes"], config["vector_bytes"])
    # Where a step waits for every worker, no worker's compute of a step is longer than the
    # master's period for it (the time between its decisions of the step before and this
    # one): the master's own clock bounds each host's word (issue 39 row 10: one host that
    # said it was 100x slower on half its steps moved the fitted law, and --plan auto from
    # rar to spread). Where stragglers are left out, a straggler's compute may be longer.
    bound = (dict(zip(root["periods"]["steps"], (x / 1e6 for x in root["periods"]["micros"])))
             if running.scheme == "rar" or not any(running.tree.stragglers) else {})
    hosts, unmeasured = [], []
    for entry in nodes(tree):
        m = entry.get("measured")
        if m is None:
            unmeasured.append(entry["name"] or "master")
            continue
        links, rtts, best_rate = link_counts(m)
        load = m["local_samples"] or 0
        times = [min(t, bound.get(step, t)) for step, t in _slowest(m["compute"]).items()]
        per_sample = tuple(t / load for t in times) if load > 0 else ()
        hosts.append(HostMeasured(entry["name"], entry["host"], load, per_sample, tuple(links),
                                  tuple(rtts), best_rate, link_throughput(m)))
    periods = tuple(x / 1e6 for x in root["periods"]["micros"])
    return Measurements(running, tuple(hosts), periods, tuple(unmeasured))


def link_throughput(m: dict) -> float | None:
    """What a node's links carried together, in bytes/s: per kind of link (its children,
    its parent, its ring or spread peers: the links a step keeps busy at once), their bytes
    over the longest busy time (``tune_fit.host_throughput``); the best kind. Not all its
    links at once: a parent sends up before it sends down, and their sum over the longest
    busy time would count the up-link's bytes in the down-links' time (1.25x the host
    link in a 4,4 tree, seen)."""
    kinds: dict[str, list[tuple[int, float]]] = {}
    for x in m["links"]:
        if x["bytes"] is not None and x["busy_us"] is not None:
            kinds.setdefault(x["link"], []).append((x["bytes"], x["busy_us"] / 1e6))
    if m["summed"] is not None:
        kinds["summed"] = [(m["summed"]["bytes"], m["summed"]["busy_us"] / 1e6)]
    rates = [r for pairs in kinds.values() if (r := host_throughput(pairs)) is not None]
    return max(rates, default=None)


def link_counts(m: dict) -> tuple[list[tuple[int, float]], list[float], float | None]:
    """A node's measured section's links as the kernel counts them: (bytes acknowledged,
    seconds busy sending) per link, the least round-trip times (seconds), and its links'
    best delivery rate (bytes/s), if any."""
    links = [(x["bytes"], x["busy_us"] / 1e6) for x in m["links"]
             if x["bytes"] is not None and x["busy_us"] is not None]
    rtts = [x["min_rtt_us"] / 1e6 for x in m["links"] if x["min_rtt_us"] is not None]
    rates = [x["rate"] for x in m["links"] if x["rate"]]
    summed = m["summed"]
    if summed is not None:
        links.append((summed["bytes"], summed["busy_us"] / 1e6))
        if summed["min_rtt_us"] is not None:
            rtts.append(summed["min_rtt_us"] / 1e6)
        if summed["rate"]:
            rates.append(summed["rate"])
    return links, rtts, float(max(rates)) if rates else None


def nodes(entry: dict):
    """Every node of a status answer's tree, parents first."""
    yield entry
    for child in entry["children"]:
        yield from nodes(child)


def named(entry: dict) -> str:
    return "the master" if not entry["name"] else f"node {entry['name']}"


def _slowest(compute: list[dict]) -> dict[int, float]:
    """Per step that every shown process measured: the slowest one's seconds (the host's
    part is in once all of them submitted), in step order."""
    if not compute:
        return {}
    steps = set.intersection(*(set(c["steps"]) for c in compute))
    slowest: dict[int, int] = {}
    for c in compute:
        for step, us in zip(c["steps"], c["micros"]):
            if step in steps:
                slowest[step] = max(slowest.get(step, 0), us)
    return {s: slowest[s] / 1e6 for s in sorted(slowest)}


@dataclass(frozen=True)
class Tuning:
    measurements: Measurements
    compute: ComputeFit                     # over every host
    hosts: dict[str, ComputeFit]            # each host's own
    links: LinkFit
    running: Prediction                     # the running configuration, predicted
    running_rank: int | None                # its place in ``ranking`` (1 = best)
    ranking: list[Prediction]               # every candidate, best first

    @property
    def measured_mean(self) -> float | None:
        p = self.measurements.periods
        return float(np.mean(p)) if p else None

    @property
    def measured_p95(self) -> float | None:
        p = self.measurements.periods
        return float(np.percentile(p, 95)) if p else None

    def replan_choices(self) -> list[Prediction]:
        """What ``crnetd --plan auto`` runs next, in the order it tries them
        (``replan_choice``: the best if the hosts can move, then the best in their places;
        none: the running plan stays)."""
        return [c for c in (replan_choice(self, move=True), replan_choice(self)) if c is not None]

    @property
    def plan_auto(self) -> Prediction | None:
        """The first of ``replan_choices`` (what runs if the hosts can move), or None."""
        return next(iter(self.replan_choices()), None)

    def to_json(self, top: int | None = None) -> dict:
        run = self.measurements.running
        return {
            "workers": run.workers, "samples": run.samples, "vector_bytes": run.vector_bytes,
            "chunk_bytes": chunk_bytes_for(run.vector_bytes, run.chunk_bytes),
            "measured": {"steps": len(self.measurements.periods), "mean": self.measured_mean,
                         "p95": self.measured_p95},
            "compute": self.compute.to_json(),
            "hosts": {name or "master": fit.to_json() for name, fit in self.hosts.items()},
            "unmeasured": list(self.measurements.unmeasured),
            "links": self.links.to_json(),
            "running": {**self.running.to_json(), "rank": self.running_rank},
            "plan_auto": None if self.plan_auto is None else self.plan_auto.to_json(),
            "candidates": len(self.ranking),
            "ranking": [p.to_json() for p in self.ranking[:top]],
            "probe": None if self.measurements.probe is None else self.measurements.probe.to_json()}


def tune(m: Measurements, *, trials: int = 1000, seed: int = 0, max_layers: int = 3,
         bandwidth: float | None = None, latency: float | None = None) -> Tuning:
    """Fit ``m`` and rank every scheme and shape for its number of workers by the fitted
    model; ``bandwidth`` and ``latency`` replace the links' fit if given."""
    per_host = {h.name: fit_compute(h.per_sample) for h in m.hosts if h.per_sample}
    every = [x for h in m.hosts for x in h.per_sample]
    if not every:
        raise TuneError("no compute times measured yet: a training process's compute time "
                        "is from one result to its next SUBMIT, so it needs two steps")
    compute = fit_compute(every)
    pairs = [pair for h in m.hosts for pair in h.links]
    rtts = [r for h in m.hosts for r in h.min_rtts]
    rates = [h.best_rate for h in m.hosts if h.best_rate is not None]
    try:
        # (None after a probe: its pairs are rounds one after another, not links busy together.)
        busy = [h.throughput for h in m.hosts if h.throughput is not None]
        links = fit_links(pairs, rtts, rates=rates, hosts=busy, vector_bytes=m.running.vector_bytes)
    except ValueError:
        if bandwidth is None:
            raise TuneError("no link carried bytes the kernel could count (TCP_INFO): "
                            "give --bandwidth") from None
        links = LinkFit(bandwidth, latency or 0.0, 0)
    links = LinkFit(bandwidth if bandwidth is not None else links.bandwidth,
                    latency if latency is not None else links.latency, links.pairs)
    run = m.running
    chunk = chunk_bytes_for(run.vector_bytes, run.chunk_bytes)
    ranking = rank(run.workers, samples=run.samples, vector_bytes=run.vector_bytes,
                   bandwidth=links.bandwidth, latency=links.latency, compute=compute.model,
                   trials=trials, seed=seed, chunk_bytes=chunk, max_layers=max_layers, top=None)
    running = predict(run.scheme, tree=None if run.scheme in ("gc", "rar") else run.tree,
                      workers=run.workers, stragglers=run.shape.stragglers[0],
                      samples=run.samples, vector_bytes=run.vector_bytes,
                      bandwidth=links.bandwidth, latency=links.latency, compute=compute.model,
                      trials=trials, seed=seed, chunk_bytes=chunk)
    place = next((i + 1 for i, p in enumerate(ranking)
                  if p.scheme == running.scheme and p.tree == running.tree), None)
    return Tuning(m, compute, per_host, links, running, place, ranking)


def replan_choice(t: Tuning, margin: float = 0.05, move: bool = False) -> Prediction | None:
    """The candidate the tree should run next, if its predicted mean is more than ``margin``
    below the running configuration's; else None (the running plan stays).

    Without ``move``, the best that keeps every host in its place: the running fanout, a
    scheme of ``REPLANNED``, from one of them. With ``move`` (every host can take any
    place: ``crnetd --plan auto``, ``node/join/moves.py``), the best of all, but one that moves
    hosts only if it is also more than ``margin`` below the best that keeps them: the
    model ranks many shapes within a few percent of each other, and a move for less
    than its noise would only cost the join."""
    run = t.measurements.running
    fanout = run.shape.fanout
    same = [p for p in t.ranking if p.scheme in REPLANNED and p.tree is not None
            and p.tree.fanout == fanout] if run.scheme in REPLANNED else []
    best = same[0] if same else None
    if move and t.ranking:
        other = t.ranking[0]
        if best is None or other.mean < best.mean * (1 - margin):
            best = other
    if best is None or (best.scheme, placed_tree(best)) == (t.running.scheme, placed_tree(t.running)):
        return None
    return best if best.mean < t.running.mean * (1 - margin) else None


def placed_tree(p: Prediction) -> Tree:
    """The tree ``p``'s hosts join (rar: a star of its workers)."""
    return Tree((p.workers,), (0,)) if p.tree is None else p.tree


def master_config(choice: Prediction, running: Running) -> dict[str, object]:
    """``choice`` as the master's configuration: its ``--config`` file's keys (``crnet.config.options``)
    for the scheme and shape, the batch and the chunk size (the ones ``tune`` ranked with)."""
    tree = placed_tree(choice)                    # rar: a ring of N (it joins as a star)
    fanout, stragglers = list(tree.fanout), list(tree.stragglers)
    out: dict[str, object] = {"role": "master", "scheme": choice.scheme}
    if choice.scheme in ("gc", "rar"):
        out["workers"] = choice.workers
    out.update(fanout=fanout, layers=len(fanout), stragglers=stragglers, samples=running.samples,
               chunk_bytes=running.chunk_bytes or "auto")
    return out


def config_text(t: Tuning, choice: Prediction | None = None) -> str:
    """``master_config`` of ``choice`` (the best ranked, by default) as a TOML file for
    ``crnetd --config``, with what it was chosen from in comments."""
    from ..units import format_seconds

    choice = choice or t.ranking[0]
    run = t.measurements.running
    measured = "-" if t.measured_mean is None else format_seconds(t.measured_mean)
    lines = [
        "# crnetd --config: the master's plan, as crnet tune chose it (the other options,",
        "# --listen, --secret-file and so on, from flags or CRNET_*: they win over this file).",
        f"# running: {run.scheme} {t.running.shape}, measured mean {measured}, predicted "
        f"{format_seconds(t.running.mean)}",
        f"# chosen:  {choice.scheme} {choice.shape}, predicted mean "
        f"{format_seconds(choice.mean)}, p95 {format_seconds(choice.p95)}",
        f"# compute: {t.compute.model.describe()} per sample",
    ]
    for key, value in master_config(choice, run).items():
        lines.append(f"{key} = {_toml(value)}")
    return "\n".join(lines) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)
