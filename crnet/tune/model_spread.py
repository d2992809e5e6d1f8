"""Run-time model of ``spread``: CodedReduce decoded at the chunks' owners (pure math).

``crnet.tune.model`` dispatches ``scheme="spread"`` here; the network is its (full-duplex links of
B bytes/s per host, λ one-way per message, processor sharing on a shared link), and so are the
compute times (one column per worker in ``Tree.names()`` order without the master).

``spread`` on a tree (the tree, codes, allocation and straggler tolerance of ``cr``)
    H = N + 1 hosts (the master is rank 0); the vector of M bytes is split among
    k = ``owner_count(M, H)`` owners (``crnet.schemes.spread.owners``, the rule the daemons use), each
    owning a share of M/k bytes. Let u = (M/k)/B, one share alone on one link.

    Up, one hop: worker v, done computing at T_v, sends its local weighted gradient cut into k
    pieces, one to each owner, one after another over its uplink (the piece of its own share,
    if it is an owner, stays local). A share larger than the kernel takes at once
    (``defaults.PACED_UNSENT``) waits for the daemon to wake up and write the next once the
    last has left: a gap g = λ per piece (g = 0 for smaller shares). Its p_v pieces on the
    network (k, or k - 1 for an owner) are all in by T_v + λ + p_v (u + g) (the sender's
    limit; the model takes every piece to arrive then, the last one's time). An owner's
    downlink is shared by every worker's piece (``shared_link_arrivals``, pieces starting at
    T_v + λ). A piece arrives at the later of the two: A_v.

    Decode, local: the owner evaluates CodedReduce's recursion on the arrival times. A leaf
    is available at A_v; an inner node v of layer l - 1 when its own piece has arrived and
    n_l - s_l of its children are available, max(A_v, (n_l - s_l)-th child); the master (the
    root) when n_1 - s_1 of its children are: D. No transfers between levels.

    Down: a share no larger than the kernel takes at once (g = 0) goes from the owner to the
    H - 1 other hosts in turn over its uplink, (H - 1) u, one hop; a larger one goes round
    the ring of ranks, each host relaying it on once it is in, H - 1 hops of u and a
    message's latency each, (H - 1)(u + g) with g = λ. A host's downlink receives k - 1
    shares (k if it owns none, which happens only when k < H), never more than H - 1. Both:
        step = D + λ + (H - 1)(u + g).

    The master is an owner (rank 0 first) and computes nothing, so every worker's piece
    reaches it over the network: its downlink carries the most pieces, and a worker's own
    piece is local at another owner. Arrivals at the master are therefore the latest at any
    owner (fewer flows on a link never delay the others), the recursion is monotone in them,
    and the master's D is the last: the model evaluates the step there.

    With k = H, every host sends and receives about 2 M N/(N + 1) per step, the ring's
    traffic, in two hops (the ring: 2N rounds); with k = 1 (small vectors) it is CodedReduce
    with every worker sending straight to the master, which then sends the sum to all.

What it ignores, beyond ``crnet.tune.model``'s list
    The pieces an owner withdraws once it can decode without them (MOOT): the model sends
    every piece, which can only make it pessimistic about a sender's uplink.
    Pipelining in chunks (``chunk_bytes`` is accepted and not used): a share is sent, decoded
    and sent on whole, so hops never overlap within a step. It would matter only for shares
    larger than a chunk (1-4 MiB: vectors over ~20 MB on 21 hosts). The owners' shares are
    taken to be exactly M/k (the daemons cut on chunk boundaries). A straggler's uplink still
    sending its pieces while, as an owner, it sends its decoded share, and pieces still
    arriving at a host after the owner decoded: both share links with the down hop, which the
    model sends at full rate. The time to decode (a weighted sum per chunk at one host).
    Latency beyond the gaps: once per hop, however many pieces a host receives. A sender's
    pieces to the owners it reaches first arrive earlier than the model says (the order of the
    rotation is not modelled), which can only make it pessimistic about the decode.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .. import defaults
from ..coding.codes import decoded_at
from ..coding.plan import Tree
from ..schemes.spread.owners import owners
from .link_sharing import shared_link_arrivals
from .workload import per_worker

__all__ = ["owner_ranks", "spread_step_times"]


def owner_ranks(vector_bytes: float, hosts: int) -> tuple[int, ...]:
    """The ranks that own a share of a ``vector_bytes`` vector on ``hosts`` hosts (master = 0).

    The daemons' rule (``crnet.schemes.spread.owners``) on the vector seen as bytes, none excluded.
    """
    size = max(1, int(vector_bytes))
    return owners(size, np.uint8, size, hosts).ranks


def spread_step_times(
    tree: Tree,
    compute_times: np.ndarray,
    *,
    vector_bytes: float,
    bandwidth: float,
    latency: float,
) -> np.ndarray:
    """Step times of ``spread`` on ``tree`` given the workers' compute times.

    ``compute_times`` has shape (trials, N) (or (N,) for one step), one column per worker in
    ``tree.names()`` order without the master. See the module docstring for the model.
    """
    times, one_step = per_worker(compute_times, tree.workers)
    n_workers = tree.workers
    hosts = n_workers + 1
    ranks = owner_ranks(vector_bytes, hosts)
    k = len(ranks)
    unit = vector_bytes / k / bandwidth  # one share alone on one link
    # Shares larger than the kernel takes at once go out in turn (``defaults.PACED_UNSENT``):
    # the next waits for the daemon to wake up once the last has left, a message's latency.
    gap = latency if vector_bytes / k > defaults.PACED_UNSENT else 0.0
    # Worker in column c is rank c + 1; an owner keeps its own piece.
    sent = np.full(n_workers, float(k))
    sent[[r - 1 for r in ranks if r > 0]] -= 1
    starts = times + latency
    # Pieces into the master's downlink, mapped back from completion order to their senders
    # (equal pieces finish in the order they start).
    order = np.argsort(starts, axis=1, kind="stable")
    received = np.empty_like(starts)
    np.put_along_axis(received, order, shared_link_arrivals(starts, unit), axis=1)
    arrived = np.maximum(received, starts + sent * (unit + gap))
    out = root_available(tree, arrived) + latency + (hosts - 1) * (unit + gap)
    return out[0] if one_step else out


def root_available(tree: Tree, arrived: np.ndarray) -> np.ndarray:
    """When CodedReduce's recursion makes the master available, evaluated on ``arrived``
    (trials, N): every worker's piece's arrival time, ``tree.names()`` order without the master.

    A leaf is available when its piece is in; an inner node when its piece is in and
    n_l - s_l of its children are available (or, FRC, one of every group: ``decoded_at``);
    the master when n_1 - s_1 of its children are (or cover every group).
    """
    trials = arrived.shape[0]
    # Columns of layer l (1-based): the children of the i-th node of layer l-1 are the n_l
    # consecutive columns starting at offset_l + i * n_l (as in ``tree_step_times``).
    sizes = [math.prod(tree.fanout[:l]) for l in range(1, tree.layers + 1)]
    offsets = list(itertools.accumulate([0] + sizes[:-1]))
    ready = arrived[:, offsets[-1]:]  # the leaves
    for l in range(tree.layers, 0, -1):
        n, s = tree.fanout[l - 1], tree.stragglers[l - 1]
        quorum = decoded_at(ready.reshape(trials, -1, n), n, s)
        if l > 1:
            ready = np.maximum(arrived[:, offsets[l - 2]:offsets[l - 2] + sizes[l - 2]], quorum)
        else:
            ready = quorum
    return ready[:, 0]
