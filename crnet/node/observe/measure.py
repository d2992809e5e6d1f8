"""This node's ``measured`` status section: its windows (``crnet.measure.windows``), its links as
the kernel counts them (``crnet.protocol.tcp_info``), its share, and at the master what the tree runs.

Built only when a status request asks for it (``crnet status --json``, ``crnet tune``), and
bounded whatever the tree's size: every window is cut to at most ``limit`` steps, where
``limit`` also shrinks with the tree so that a whole tree's answer stays within
``MEASURED_BUDGET`` bytes (a STATUS_REPLY travels in one frame header). Tree links (the
parent, the children, a ring's neighbours) are listed one by one, in a tree of up to
``LINKS_LISTED_MAX`` hosts; spread's links to every other host (as many as hosts), and in
a larger tree every link, are summed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from prometheus_client.core import GaugeMetricFamily, Metric

from ...dtypes import DTYPES
from ...measure.stats import Stats
from ...measure.windows import MAX_PROCESSES_SHOWN, micros
from ...protocol.tcp_info import tcp_info
from ...protocol.transport import Connection
from ...schemes.base import Place
from ..neighbours import Neighbours

__all__ = ["LINKS_LISTED_MAX", "MEASURED_BUDGET", "MeasuredView", "measured_metrics", "tree_links"]

MEASURED_BUDGET = 384 << 10    # bytes of windows a whole tree's answer may carry
SAMPLE_BYTES = 12              # a window's step and time, packed, at most (about)
LINKS_LISTED_MAX = 256         # hosts in a tree up to which every tree link is listed


@dataclass(frozen=True)
class MeasuredView:
    """What the section reads of the node (``rooms.Rooms`` builds it): read-only."""

    stats: Stats
    neighbours: Neighbours
    place: Callable[[], Place | None]
    samples: Callable[[], int | None]              # the global batch (once assigned)
    local_samples: Callable[[], int | None]        # this host's share of it
    processes: int                                 # --local-processes
    tree_vector: Callable[[], tuple[int, str] | None]

    def section(self, limit: int) -> dict:
        """The section, each window cut to its newest ``limit`` steps (fewer in a big tree)."""
        place = self.place()
        measured = self.stats.measured
        hosts = 1 if place is None else place.tree.workers + 1
        # Windows per host: its processes' (every host runs as many), its periods, and its
        # arrivals at its parent.
        lists = min(self.processes, MAX_PROCESSES_SHOWN) + 2
        limit = min(limit, measured.window, MEASURED_BUDGET // (hosts * lists * SAMPLE_BYTES))
        out = measured.snapshot(limit)
        out.update(processes=self.processes, local_samples=self.local_samples(), links=[],
                   summed=None, config=None, probe=None)
        listed = list(tree_links(self.neighbours, place))
        summed = list(self.neighbours.peers.values()) if place and place.scheme == "spread" else []
        if hosts > LINKS_LISTED_MAX:       # a link is some 100 bytes: in a big tree, summed
            summed += [conn for _, _, conn in listed if conn is not None]
            listed = []
        for kind, peer, conn in listed:
            info = tcp_info(conn)
            out["links"].append({
                "link": kind, "peer": peer, "up": conn is not None and not conn.is_closing,
                "rtt_us": None if info is None else micros(info.rtt),
                "min_rtt_us": None if info is None else micros(info.min_rtt),
                "bytes": None if info is None else info.bytes_acked,
                "busy_us": None if info is None else micros(info.busy_seconds),
                "rate": None if info is None else round(info.delivery_rate)})
        if summed:
            infos = [i for i in map(tcp_info, summed) if i is not None]
            out["summed"] = {"links": len(summed),
                            "bytes": sum(i.bytes_acked for i in infos),
                            "busy_us": sum(micros(i.busy_seconds) for i in infos),
                            "min_rtt_us": min((micros(i.min_rtt) for i in infos), default=None),
                            "rate": max((round(i.delivery_rate) for i in infos), default=None)}
        vector = self.tree_vector()
        if place is not None:
            out["config"] = {
                "scheme": place.scheme, "fanout": list(place.tree.fanout),
                "stragglers": list(place.tree.stragglers), "samples": self.samples(),
                "chunk_bytes": place.chunk_bytes,
                "vector_bytes": None if vector is None else vector[0] * DTYPES[vector[1]].itemsize}
        return out


def tree_links(nb: Neighbours, place: Place | None) -> Iterator[tuple[str, str, Connection | None]]:
    """(kind, peer's name, connection or None) for this node's parent, children and ring
    neighbours (spread's peer links are ``nb.peers``)."""
    if place is None:
        return
    if not place.is_master:
        yield "parent", place.tree.parent(place.name) or "master", nb.parent
    children = place.tree.children(place.name)
    for k, slot in enumerate(nb.slots):
        yield "child", children[k] if k < len(children) else str(k), slot.link
    if place.ring is not None:
        yield "successor", "", nb.successor
        yield "predecessor", "", nb.predecessor


QUANTILES = (0.5, 0.95)


def measured_metrics(stats: Stats, place: Place | None, nb: Neighbours) -> Iterator[Metric]:
    """The windows and the links, summarised for ``crnetd --metrics`` (``metrics.py``):
    each window's median and 95th percentile, each tree link's throughput and RTT."""
    m = stats.measured
    children = [] if place is None else place.tree.children(place.name)
    compute = GaugeMetricFamily(
        "crnet_compute_seconds", "A local training process's compute time per step (its "
        "answer to its next SUBMIT), over the last --tune-window steps", labels=["process", "quantile"])
    for k, window in sorted(m.compute.items()):
        _quantiles(compute, [str(k)], window)
    yield compute
    arrival = GaugeMetricFamily(
        "crnet_child_arrival_seconds", "Seconds from a step's start here (the previous step "
        "decided) to each child's first chunk, over the last --tune-window steps",
        labels=["child", "quantile"])
    for k, window in sorted(m.arrivals.items()):
        _quantiles(arrival, [children[k] if k < len(children) else str(k)], window)
    yield arrival
    period = GaugeMetricFamily(
        "crnet_step_period_seconds", "Seconds between this node's decisions of consecutive "
        "steps, over the last --tune-window steps", labels=["quantile"])
    _quantiles(period, [], m.periods)
    yield period
    throughput = GaugeMetricFamily(
        "crnet_link_throughput_bytes_per_second", "Bytes the peer acknowledged per second the "
        "link was busy sending (the kernel's count, TCP_INFO, over the connection's life)",
        labels=["link", "peer"])
    rate = GaugeMetricFamily(
        "crnet_link_delivery_rate_bytes_per_second", "The kernel's newest estimate of the "
        "link's delivery rate (TCP_INFO, from the ACKs of the newest flight)", labels=["link", "peer"])
    rtt = GaugeMetricFamily("crnet_link_rtt_seconds", "The link's smoothed round-trip time "
                            "(TCP_INFO)", labels=["link", "peer"])
    for kind, peer, conn in tree_links(nb, place):
        info = tcp_info(conn)
        if info is not None:
            rtt.add_metric([kind, peer], info.rtt)
            rate.add_metric([kind, peer], info.delivery_rate)
            if info.throughput is not None:
                throughput.add_metric([kind, peer], info.throughput)
    yield from (throughput, rate, rtt)


def _quantiles(family: GaugeMetricFamily, labels: list[str], window) -> None:
    if window:
        values = np.fromiter((x for _, x in window), dtype=np.float64)
        for q in QUANTILES:
            family.add_metric([*labels, repr(q)], float(np.quantile(values, q)))
