"""``crnet tune --probe``: the model's inputs for a tree that has not trained yet.

1. **Gather** (``crnet.tune.gather.gather_probe``, over the network): the master runs a
   probe on every node of its tree (``crnet/node/observe/probe.py``: each node sends
   ``probe`` bytes to each of its children a few times, timed to the child's echo, and
   times a fixed compute kernel; who may start one, and when, is said there) and answers
   with every node's ``measured`` section, its ``probe`` part included, checked as every
   status answer is (``crnet.protocol.status_measured``: a malformed one is an error
   naming its node).
2. **Read** (``probed_measurements``): the links as ``crnet tune`` reads them after
   training (the kernel's delivery rate of the probe's flights, the least round-trip
   times: ``tune.link_counts``), with the probe's rounds as (bytes, seconds) pairs; and
   per worker host, its kernel times over the fastest host's median time: a host-speed
   and noise law, which is what a cold tree can tell. Those ratios times one sample's
   compute (``per_sample``: the user's measurement, e.g. one local step of their model
   over its batch) are the per-sample times ``crnet.tune.tuning.tune`` fits as if they had been
   measured while training; without it, the kernel's own time (the fastest host's
   median) stands in for one sample's, and only the relative law is real.

The vector size ranked with is the tree's if a step ran, else the probe's payload.
"""

from __future__ import annotations

import numpy as np

from ..coding.plan import Tree
from ..defaults import PROBE_BYTES, PROBE_BYTES_MAX, PROBE_BYTES_MIN
from .tuning import HostMeasured, Measurements, Probed, Running, TuneError, link_counts, named, nodes

__all__ = ["probe_size", "probed_measurements"]


def probe_size(vector_bytes: int | None) -> int:
    """The bytes a probe sends per round: the tree's vector, if known, else ``PROBE_BYTES``;
    within ``PROBE_BYTES_MIN`` .. ``PROBE_BYTES_MAX``."""
    return max(PROBE_BYTES_MIN, min(PROBE_BYTES_MAX, vector_bytes or PROBE_BYTES))


def probed_measurements(tree: dict, per_sample: float | None = None) -> Measurements:
    """What ``gather.gather_probe``'s answer says, per host. TuneError if it cannot be fitted from."""
    root = tree.get("measured")
    if root is None or root.get("config") is None or root["config"]["samples"] is None:
        raise TuneError(f"{named(tree)} has no share of the data yet: ask the master of a "
                        "complete tree")
    if root.get("probe") is None:
        raise TuneError(f"{named(tree)} answered without a probe")
    config = root["config"]
    vector = config["vector_bytes"] or root["probe"]["bytes"]
    running = Running(config["scheme"], Tree(config["fanout"], config["stragglers"]),
                      config["samples"], config["chunk_bytes"], vector)
    probed, unmeasured, kernels = [], [], {}
    for entry in nodes(tree):
        m = entry.get("measured")
        if m is None or m["probe"] is None:
            unmeasured.append(entry["name"] or "master")
            continue
        probed.append(entry)
        if (m["local_samples"] or 0) > 0 and m["probe"]["kernel_micros"]:
            kernels[entry["name"]] = np.asarray(m["probe"]["kernel_micros"], dtype=np.float64) / 1e6
    if not kernels:
        raise TuneError("no worker timed the probe's kernel")
    fastest = min(float(np.median(k)) for k in kernels.values())
    scale = (per_sample if per_sample is not None else fastest) / fastest
    hosts, rounds = [], []
    for entry in probed:
        m = entry["measured"]
        size = m["probe"]["bytes"]
        pairs = [(size, us / 1e6) for link in m["probe"]["links"] for us in link["micros"]]
        rounds += [b / s for b, s in pairs]
        _, rtts, best_rate = link_counts(m)
        times = kernels.get(entry["name"])
        hosts.append(HostMeasured(
            entry["name"], entry["host"], m["local_samples"] or 0,
            () if times is None else tuple(float(t) * scale for t in times), tuple(pairs),
            tuple(rtts), best_rate))
    probe = Probed(root["probe"]["bytes"], fastest, per_sample,
                   float(np.median(rounds)) if rounds else None)
    return Measurements(running, tuple(hosts), (), tuple(unmeasured), probe)
