"""Exact collectives of any tensors over crnet broadcasts and barriers: what a
``torch.distributed`` process group needs besides the gradient (DDP's setup, a loss
averaged for a log line, a checkpoint's tensors to everyone).

A crnet *step* is no plain sum: CodedReduce decodes the global sum from coded shares and
leaves stragglers out, so an arbitrary tensor allreduced through a step comes back wrong.
These collectives use only the client's ``broadcast`` and ``barrier``, which relay bytes
and count processes, so they are exact for every dtype: a tensor travels as its raw
bytes (viewed as float64, which the wire carries, and relayed untouched); an allreduce
is an allgather followed by the same reduction, in rank order, on every process, so
every process gets bit-identical results.

Pacing: a daemon keeps only the last ``HELD`` (4) complete broadcasts for processes that
ask for one later (``crnet.node.collectives.broadcasts``), and a broadcast's root returns as soon as
its daemon has its vector. Left alone, a root that broadcasts a model tensor by tensor
runs ahead, and a slow receiver finds the first tensors gone. So at most ``BUDGET``
broadcasts go out between two barriers: before a collective that would exceed it,
every process waits at a barrier, by which point every process has taken every
broadcast before it. All processes make the same calls in the same order (as
``torch.distributed`` requires), so they agree on the keys and on where the barriers go.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..client import Client

BUDGET = 3        # broadcasts between barriers: one fewer than a daemon keeps (HELD = 4)
WORD = 8          # bytes of the float64 the wire carries them in


def to_wire(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """The tensors' bytes, one after the other, as a float64 vector (zero-padded to a
    whole number of float64s): the wire relays them untouched."""
    parts = [t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy() for t in tensors]
    n = sum(p.size for p in parts)
    out = np.zeros(max(1, -(-n // WORD)) * WORD, np.uint8)
    at = 0
    for p in parts:
        out[at:at + p.size] = p
        at += p.size
    return out.view(np.float64)


def from_wire(vec: np.ndarray, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """New CPU tensors shaped and typed like ``like``, from ``to_wire``'s bytes."""
    raw = torch.from_numpy(np.ascontiguousarray(vec).view(np.uint8))
    out, at = [], 0
    for t in like:
        n = t.numel() * t.element_size()
        # a copy of its own: aligned for its dtype whatever came before it, and not a view
        # of memory the client reuses
        out.append(raw[at:at + n].clone().view(t.dtype).view(t.shape))
        at += n
    return out


class ExactCollectives:
    """Broadcast, allgather and barrier among ``size`` processes, ``rank`` being this one.

    ``prefix`` names this group's broadcasts and barriers within the job (every process
    of the group uses the same); ``timeout`` bounds each wait (torch's process group
    timeout: a receiver waits that long for a root that is slow to get there).
    ``crnet_ranks[r]`` is crnet's rank (``Assignment.rank``) of the process of rank ``r``:
    every broadcast names its root's, so that each process takes the root's copy only,
    checked to come from the root's host (a host that holds the cluster secret cannot
    replace it: docs/operations.md).
    """

    def __init__(self, client: Client, rank: int, size: int, prefix: str, timeout: float,
                 crnet_ranks: Sequence[int]):
        if len(crnet_ranks) != size or len(set(crnet_ranks)) != size:
            raise ValueError(f"crnet_ranks must give each of the {size} ranks its own crnet "
                             f"rank, got {list(crnet_ranks)}")
        self.client = client
        self.rank = rank
        self.size = size
        self.crnet_ranks = list(crnet_ranks)
        self.prefix = prefix
        self.timeout = timeout
        self.calls = 0               # collectives so far: numbers the keys
        self._sent = 0               # broadcasts since the last barrier

    def _key(self, what: str) -> str:
        return f"{self.prefix}/{self.calls}/{what}"

    def barrier(self) -> None:
        self.calls += 1
        self._barrier()

    def _barrier(self) -> None:
        self.client.barrier(self._key("barrier"), processes=self.size, timeout=self.timeout)
        self._sent = 0

    def _room(self, broadcasts: int) -> None:
        if self._sent + broadcasts > BUDGET:
            self._barrier()
        self._sent += broadcasts

    def broadcast(self, tensors: Sequence[torch.Tensor], root: int) -> None:
        """Every process's ``tensors`` (same shapes and dtypes everywhere) become the
        root's, in place."""
        self.calls += 1
        self._room(1)
        vec = to_wire(tensors)
        key = self._key(f"from{root}")
        if self.rank == root:
            self.client.broadcast(vec, key, root=self.crnet_ranks[root], timeout=self.timeout)
            return
        got = self.client.broadcast(vec, key, root=self.crnet_ranks[root], timeout=self.timeout)
        with torch.no_grad():
            for t, v in zip(tensors, from_wire(got, tensors)):
                t.copy_(v)

    def check_ranks(self) -> None:
        """That ``crnet_ranks`` is right, checked through crnet: every process sends its
        rank as its own crnet rank's broadcast (which only its host can send), and each
        compares what the crnet rank the map names for rank r says with r. The map comes
        from torch's store, which whoever reaches it can write (issue 39, row 13): a wrong
        map is a RuntimeError naming what differs, not the wrong process's tensors taken.
        The keys are crnet ranks, in order, ``BUDGET`` at a time: every process sends and
        waits for the same keys, whatever its map says (a set of the tree's crnet ranks,
        ``_crnet_ranks`` checks), so none waits for a broadcast nobody sends."""
        self.calls += 1
        mine = self.client.assignment.rank
        order = sorted(self.crnet_ranks)
        wrong: list[str] = []
        for first in range(0, self.size, BUDGET):
            window = order[first:first + BUDGET]
            self._room(len(window))
            if mine in window:
                self.client.broadcast(np.array([float(self.rank)]), self._key(f"rank{mine}"),
                                      root=mine, timeout=self.timeout)
            for m in window:
                said = (self.rank if m == mine else
                        int(self.client.broadcast(np.zeros(1), self._key(f"rank{m}"), root=m,
                                                  timeout=self.timeout)[0]))
                if not (0 <= said < self.size and self.crnet_ranks[said] == m):
                    wrong.append(f"crnet rank {m} says it is rank {said}, the map makes it "
                                 f"rank {self.crnet_ranks.index(m)}")
        if wrong:
            raise RuntimeError(
                f"torch's store gave rank {self.rank} a map of the ranks to crnet's that crnet "
                f"contradicts ({'; '.join(wrong)}): something else wrote the store's crnet/rank "
                "keys (another job on the same MASTER_ADDR:MASTER_PORT?)")

    def allgather(self, tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Every rank's ``tensors`` (same shapes and dtypes everywhere), as CPU tensors:
        ``[rank][i]``. Ranks broadcast ``BUDGET`` at a time, with a barrier in between."""
        self.calls += 1
        mine = to_wire(tensors)
        got: list[list[torch.Tensor]] = []
        for first in range(0, self.size, BUDGET):
            ranks = range(first, min(first + BUDGET, self.size))
            self._room(len(ranks))
            if self.rank in ranks:          # send first: the others wait for it
                self.client.broadcast(mine, self._key(f"from{self.rank}"),
                                      root=self.crnet_ranks[self.rank], timeout=self.timeout)
            for r in ranks:
                if r == self.rank:
                    got.append([t.detach().to("cpu").clone() for t in tensors])
                else:
                    vec = self.client.broadcast(mine, self._key(f"from{r}"),
                                                root=self.crnet_ranks[r], timeout=self.timeout)
                    got.append(from_wire(vec, tensors))
        return got
