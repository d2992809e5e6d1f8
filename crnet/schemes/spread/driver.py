"""spread at one host: CodedReduce with each chunk decoded at its owner, not up the tree.

CodedReduce's tree makes every parent take n vectors and send n back down: where the
vector is large next to the links, its steps are several times a ring's. spread keeps
CodedReduce's tree, codes, allocation and straggler tolerance, and moves the decoding:
``owners.py`` gives each host (the master included) a share of the vector's chunks, and

1. every worker sends each owner its piece of its local vector (PIECE, REDUCE) over a
   direct peer link (``node/peers/mesh.py``);
2. an owner decodes each of its chunks the moment the tree's recursion is satisfied on
   the pieces in (``step.py``), and sends the chunk of the sum to every host
   (PIECE, GATHER);
3. a host's step resolves when it has every chunk of the sum and the master's word
   that it has them too (SETTLED): the master decides for the tree, so no host applies a
   step the master fails (its chunks stuck behind a frozen host, say).

Every host moves about 2N/(N+1) of the vector each way, as in a ring, in two hops. The
design, its traffic and its faults: docs/spread.md.

A step's layout is this host's vector's or the tree's (the last result's), else for now
its first piece's: this host's vector, once in, is the step's (a new model's vectors
change everywhere at once), and a piece of the tree's layout begins again a step that
began with a piece of another, as long as nothing was decoded or gathered in it (so one
host's piece of another layout, come first, cannot take the step from the others:
the master adds no vector of its own). Pieces of another layout than the step's are
dropped (their senders count as missing here), and the sum's chunks of another layout
close the link they came on (an owner decodes only the step's layout).
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from ... import defaults
from ...dtypes import dtype_name
from ...errors import ProtocolError
from ...peer_text import Throttle
from ..base import Origin, Place, Ports, Scheme, Stall, Takes
from ..ring_allreduce.messages import Phase
from .messages import Moot, Owners, Piece, Settled, SumDigest, SumWanted
from .owners import OwnerMap, owners
from .step import OwnedSums, Recursion, SpreadStep, chunk_digest

log = logging.getLogger("crnet.schemes")

REDUCE, GATHER = Phase.REDUCE, Phase.GATHER

ON_TIME = 3   # steps in a row an excluded host's pieces must reach the master in time to own again
# Shares larger than this go round the ring of ranks, each host relaying them on: owners that
# decode at different times and each send to every host in turn would load some downlinks
# twice while others idle, for the whole phase. Smaller ones (latency-bound) take one hop,
# and so do all where the master says so (--spread-sum direct): where the CPUs, not the
# links, bound a step, a relay's copy and its check against the owner's digest cost more
# than the downlinks' balance gains.
RELAYED_SHARE = defaults.PACED_UNSENT
# Steps resolved here whose owned chunks of the sum an owner keeps, to send one straight to a
# host whose relayed copy did not match its digest (SUM_WANTED): the host may ask after this
# owner resolved the step (the master settled it with a good copy).
KEPT_SUMS = 4
# A chunk of the sum relayed round the ring that has not come CHASE_FACTOR times as long after
# its owner's digest as the ring's hops took of late (their slowest, slowly forgotten; at
# least CHASE_MIN s, at most a peer's stall_after) is asked of its owner straight: a relay
# holding the secret may pass nothing on (issue 39 row 3 (A)), and the hosts after it would
# lose every step.
CHASE_FACTOR, CHASE_MIN = 4.0, 0.05
# Steps open here at once whose layout nothing settled (peers' pieces began them: ``_step``).
# Each holds memory for the vector its pieces claim, up to the host's memory: a peer that
# holds the secret could claim a huge one for every step of the window (issue 39 row 2).
# Honest hosts begin at most a step or two ahead of a host this way (a slow process's):
# every step after the first in the tree's layout is settled, a decode here settles one.
UNSETTLED_STEPS = 2


class Spread(Scheme):
    """spread: one SpreadStep per step at every host."""

    SUMS_OVER_PEERS = True
    TAKES = (Takes(Piece, Origin.PEER, "piece", dest="piece_dest",
                   beyond=lambda msg: msg.phase is Phase.GATHER),   # a chunk of the tree's sum
             Takes(Moot, Origin.PEER, "moot"),
             Takes(Settled, Origin.PEER, "settled", beyond=lambda msg: True),   # the master's word
             Takes(SumDigest, Origin.PEER, "sum_digest", beyond=lambda msg: True),  # an owner's
             # (answered from a step resolved here too: ``KEPT_SUMS``)
             Takes(SumWanted, Origin.PEER, "sum_wanted", stepped=False),
             Takes(Owners, Origin.PEER, "owners", stepped=False))

    def __init__(self, place: Place, ports: Ports):
        super().__init__(place, ports)
        assert ports.peers is not None, "spread's hosts send to each other"
        self.peers = ports.peers
        self.recursion = Recursion.of(place.tree, place.code_kind)
        self.rank = place.tree.rank(place.name)
        self.hosts = self.recursion.hosts
        # Every other host, in the order this one sends to them: a rotation, so that hosts
        # sending at once send to different hosts, over the ranks with the parents' groups
        # interleaved (the first children of every parent, then the second ones, ...), so that
        # the last pieces an owner gets come from different groups, and a decode that may
        # leave s children of every parent out does not wait for them.
        order = sorted(place.tree.names(), key=lambda n: tuple(map(int, reversed(n.split(".")))) if n else ())
        me = order.index(place.name)
        self.after = [place.tree.rank(n) for n in order[me + 1:] + order[:me]]
        self.map = OwnerMap()
        self.steps: dict[int, SpreadStep] = {}
        self.newest = -1                       # the newest step begun here
        self._on_time: dict[int, int] = {}     # master: excluded rank -> steps in time in a row
        self._receiving: dict[int, SpreadStep] = {}   # a peer's piece being received: into which
        self._resolved: dict[int, OwnedSums] = {}     # the last KEPT_SUMS resolved (relayed sums)
        self._hop: float | None = None    # seconds the slowest hop of the ring of sums took of late
        self._lines = Throttle(log)
        if place.is_master:   # every host hears the master's map first (again after a restart)
            self.peers.announce(Owners(0, 0, ()))

    # -- this host's vector
    def local(self, step: int, vector: np.ndarray) -> str | None:
        if self.place.is_master:   # the master adds nothing; its process only waits
            return None
        st = self._step(step, vector.size, dtype_name(vector.dtype), local=True)
        if st is None:
            return None
        if not _fits(st, vector.size, dtype_name(vector.dtype)):
            return st.layout.mismatch(self.place.layout(vector.size, vector.dtype), step)
        if st.mine is not None:
            return None   # (the engine lets one vector per host and step through)
        ready = st.local_arrived(vector)
        self._send_pieces(st)
        self._tell_moot(st, st.owned)
        self._decode(st, ready)
        return None

    def _send_pieces(self, st: SpreadStep) -> None:
        """Each owner its pieces, in this host's rotation (``after``), every owner's first
        chunk before any owner's second; none an owner said it does without (MOOT), and
        those it says so of later are withdrawn while they wait their turn (``moot``)."""
        assert st.mine is not None
        layout, ranks = st.layout, st.owners.ranks
        owning = set(ranks)
        order = [o for o in self.after if o in owning]
        chunks = {o: st.owners.chunks_of(o) for o in order}
        for j in range(max((len(r) for r in chunks.values()), default=0)):
            for owner in order:   # every owner's first chunk, then every owner's second, ...
                if j < len(chunks[owner]):
                    c = chunks[owner][j]
                    if c in st.not_needed:
                        self.ports.stats.pieces_withdrawn += 1
                        continue
                    a, b = layout.bounds(c)
                    self.peers.in_turn((owner,), st.step, Piece(st.step, REDUCE, c, layout.total,
                                                                  layout.dtype_name), st.mine[a:b], tag=c)

    # -- pieces from peers
    def piece_dest(self, rank: int, msg: Piece, nbytes: int) -> memoryview | None:
        st = self._step(msg.step, msg.total, msg.dtype)
        if st is None:
            return None
        if not _fits(st, msg.total, msg.dtype):
            if msg.phase is GATHER:
                raise ProtocolError(f"PIECE: step {msg.step}'s sum is {msg.total} x {msg.dtype}, "
                                    f"but the step's vector is {st.layout.describe()} here")
            self._lines.warning((rank, "layout"), "step %d: rank %d's piece is %d x %s, but the "
                                "step's vector is %s here: dropped", msg.step, rank, msg.total,
                                msg.dtype, st.layout.describe())
            return None
        problem = st.layout.check(msg.total, msg.dtype, msg.chunk, nbytes)
        if problem is not None:
            raise ProtocolError(f"PIECE from rank {rank}, step {msg.step}: {problem}")
        misplaced = self._misplaced(st, rank, msg)
        if misplaced is not None:
            # A map of owners this host has not heard yet, or had before: not this host's
            # to take now. Dropped (the step may lack it: it fails at its deadline).
            self._lines.warning((rank, "misplaced"), "step %d: rank %d's piece: %s (map %d); "
                                "dropped", msg.step, rank, misplaced, self.map.epoch)
            return None
        if msg.phase is REDUCE:
            if st.decoded == len(st.owned):
                # Every owned chunk is decoded: the piece is moot, but it came while the step
                # was open (the master counts an excluded host's pieces in time by this).
                st.senders.add(rank)
                return None
            self.ports.stats.bytes_up += nbytes
            dest = st.piece_dest(rank, msg.chunk)
        elif msg.chunk in st.gathered:
            return None
        else:
            self.ports.stats.bytes_down += nbytes
            dest = st.sum_dest(msg.chunk)
        self._receiving[rank] = st   # (the step may begin again before the bytes are in)
        return dest

    def _misplaced(self, st: SpreadStep, rank: int, msg: Piece) -> str | None:
        owner = st.owners.owner(msg.chunk)
        if msg.phase is REDUCE:
            if owner != self.rank:
                return f"chunk {msg.chunk} is rank {owner}'s to decode, not this host's"
            if rank == 0:
                return "the master adds nothing"
            return None
        if st.relayed is None:
            if owner != rank:
                return f"chunk {msg.chunk} of the sum is rank {owner}'s, not rank {rank}'s"
        elif (rank - owner) % self.hosts >= (self.rank - owner) % self.hosts:
            return (f"chunk {msg.chunk} of the sum goes round the ring from rank {owner}: rank "
                    f"{rank} is not before this host")
        return None

    def piece(self, rank: int, msg: Piece) -> None:
        st = self._receiving.pop(rank, None)
        if st is None or self.steps.get(msg.step) is not st:
            return   # received into a step decided or begun again since: not this one's
        if msg.phase is REDUCE:
            decodes = st.piece_arrived(rank, msg.chunk)
            self._tell_moot(st, (msg.chunk,))
            if decodes:
                self._decode(st, [msg.chunk])
        else:
            owner = st.owners.owner(msg.chunk)
            relayed = self.ports.check_relays and st.relayed is not None and rank != owner
            st.sum_arrived(msg.chunk, rank if relayed else None)
            self._timed_hop(st, msg.chunk, owner)
            if st.relayed is not None:
                self._relay_copy(st, msg.chunk)
            self._verify(st, msg.chunk)
            self._check_complete(st)

    def _tell_moot(self, st: SpreadStep, chunks) -> None:
        """The hosts whose pieces of ``chunks`` are no longer needed here: MOOT, so that they
        do not send them (the master tells no excluded host: its pieces in time are how it
        owns chunks again)."""
        layout = st.layout
        for c in chunks:
            for rank in st.moot(c):
                if self.place.is_master and rank in self.map.latest:
                    continue
                msg = Moot(st.step, c, layout.total, layout.dtype_name)
                self.peers.to_peer(rank, st.step, msg, None, keep=True)   # (a link coming up)

    def moot(self, rank: int, msg: Moot) -> None:
        """Owner ``rank`` needs not this host's piece of ``msg.chunk``: withdrawn if not sent."""
        st = self._step(msg.step, msg.total, msg.dtype)
        if st is None or not _fits(st, msg.total, msg.dtype):
            return
        if msg.chunk >= st.layout.chunks or st.owners.owner(msg.chunk) != rank:
            self._lines.warning((rank, "moot"), "step %d: rank %d says chunk %d needs not this "
                                "host's piece, but it does not own it (map %d): ignored",
                                msg.step, rank, msg.chunk, self.map.epoch)
            return
        st.not_needed.add(msg.chunk)
        if self.peers.withdraw(rank, msg.step, msg.chunk):
            self.ports.stats.pieces_withdrawn += 1

    # -- decoding and the sum
    def _decode(self, st: SpreadStep, chunks: list[int]) -> None:
        stats = self.ports.stats
        layout = st.layout
        for c in chunks:
            t0, cpu0 = time.perf_counter(), time.thread_time()   # the kernels run in this thread
            out = st.decode(c)
            stats.decode_seconds += time.perf_counter() - t0
            stats.decode_cpu_seconds += time.thread_time() - cpu0
            if st.relayed is not None:
                self._relay(st, c, out)
            if st.relayed is not None and self.ports.guarded:
                # Its digest to every host, straight: a relay's copy counts only if it matches.
                digest = SumDigest(st.step, c, layout.total, layout.dtype_name, chunk_digest(out))
                for rank in range(self.hosts):
                    if rank != self.rank:
                        self.peers.to_peer(rank, st.step, digest, None, keep=True)
            if st.relayed is None:
                # Every host needs it, also once this host has the whole sum: in rotation.
                msg = Piece(st.step, GATHER, c, layout.total, layout.dtype_name)
                self.peers.in_turn(self.after, st.step, msg, out, keep=True)
        if chunks and st.decoded == len(st.owned):
            stats.children_skipped += self.hosts - 1 - len(st.used - {self.rank})
        self._check_complete(st)

    # -- the sum round the ring (large shares)
    def _relay(self, st: SpreadStep, chunk: int, data: np.ndarray) -> None:
        """The sum's ``chunk`` on to the next host of the ring of ranks that is reachable and
        not excluded, unless that one is, or is past, the chunk's owner (every host has it
        then). An excluded host between (one the master found silent: frozen, say, with
        its kernel still taking bytes it never reads) gets its copy but relays nothing, so
        that a host that is gone holds up no other host's sum. ``data``: a copy this send may
        keep (the step's result may be a training process's, which it may write)."""
        assert st.relayed is not None
        excluded = self.map.excluded(st.step)
        if self.rank in excluded:
            return   # the host before this one relays past it
        owner, hosts = st.owners.owner(chunk), self.hosts
        here = (self.rank - owner) % hosts
        layout = st.layout
        msg = Piece(st.step, GATHER, chunk, layout.total, layout.dtype_name)
        passed = []
        for d in range(1, hosts):
            r = (self.rank + d) % hosts
            if (r - owner) % hosts <= here:
                break   # round to the owner: none left to tell
            if not self.peers.reachable(r):
                continue
            if r in excluded:
                passed.append(r)
                continue
            self.peers.in_turn((r,), st.step, msg, data, keep=True)
            st.relayed[chunk] = r
            break
        if passed:
            self.peers.in_turn(passed, st.step, msg, data, keep=True)

    def sum_digest(self, rank: int, msg: SumDigest) -> None:
        """Owner ``rank``'s digest of a chunk of the sum: the relayed copy here, if in, is
        checked against it (and every later one)."""
        if not self.ports.guarded:
            return   # (--insecure: relays are not checked, nor digests sent)
        st = self._step(msg.step, msg.total, msg.dtype)
        if st is None or not _fits(st, msg.total, msg.dtype) or st.relayed is None:
            return
        if msg.chunk >= st.layout.chunks or st.owners.owner(msg.chunk) != rank:
            self._lines.warning((rank, "digest"), "step %d: rank %d sent the digest of chunk %d, "
                                "which it does not own (map %d): ignored", msg.step, rank,
                                msg.chunk, self.map.epoch)
            return
        st.digest_arrived(msg.chunk, msg.digest)
        if msg.chunk not in st.gathered:
            self._chase_later(st, msg.chunk)
        self._verify(st, msg.chunk)
        self._check_complete(st)

    def _hops(self, owner: int) -> int:
        """Hops of the ring of sums from ``owner`` to this host."""
        return (self.rank - owner) % self.hosts

    def _timed_hop(self, st: SpreadStep, chunk: int, owner: int) -> None:
        """A chunk of the sum came, after its owner's digest: how long a hop took (the
        slowest of late: chunks queue behind each other on the ring's links, and a chunk
        asked for while it is on its way costs its owner's link a second copy)."""
        at = st.digest_at.get(chunk)
        hops = self._hops(owner)
        if at is None or hops < 2:
            return
        hop = (asyncio.get_running_loop().time() - at) / (hops - 1)
        self._hop = hop if self._hop is None else max(hop, 0.95 * self._hop)

    def _chase_later(self, st: SpreadStep, chunk: int) -> None:
        """The owner's digest of ``chunk`` came before the chunk: if the chunk does not come
        in time (``CHASE_FACTOR``), it is asked of its owner."""
        if chunk in st.digest_at:
            return   # (one timer a chunk, however often its digest comes)
        loop = asyncio.get_running_loop()
        st.digest_at[chunk] = loop.time()
        hops = self._hops(st.owners.owner(chunk))
        wait = self.ports.stall_after
        if self._hop is not None:
            wait = min(wait, max(CHASE_MIN, CHASE_FACTOR * self._hop * max(1, hops - 1)))
        # (By its number: a timer that held the step would hold its memory, which the pool
        # could then not hand out again, for as long as the timer waits.)
        loop.call_later(wait, self._chase, st.step, chunk)

    def _chase(self, step: int, chunk: int) -> None:
        st = self.steps.get(step)
        if st is None or st.relayed is None or chunk >= st.layout.chunks or chunk in st.gathered:
            return
        self._want(st, chunk, "it did not come round the ring in time (a relay before this "
                              "host passed nothing on?)")

    def _want(self, st: SpreadStep, chunk: int, why: str) -> None:
        """Chunk ``chunk`` of the sum, asked of its owner straight (SUM_WANTED), once."""
        if chunk in st.wanted:
            return
        st.wanted.add(chunk)
        owner = st.owners.owner(chunk)
        self._lines.warning((owner, "wanted"), "step %d: chunk %d of the sum asked of its owner, "
                            "rank %d: %s", st.step, chunk, owner, why)
        layout = st.layout
        self.peers.to_peer(owner, st.step, SumWanted(st.step, chunk, layout.total, layout.dtype_name),
                           None, keep=True)

    def _verify(self, st: SpreadStep, chunk: int) -> None:
        """A relayed chunk of the sum, once its owner's digest is in: one that does not match
        is not taken (a relay holding the cluster secret made it up, or passed on one that
        was: issue 39 row 3). The step then lacks it here."""
        relay = st.verify(chunk)
        if relay is None:
            return
        self.ports.stats.sums_refused += 1
        self._want(st, chunk, f"the copy rank {relay} relayed does not match the owner's digest")

    def sum_wanted(self, rank: int, msg: SumWanted) -> None:
        """Host ``rank``'s relayed copy of owned chunk ``msg.chunk`` did not match: the chunk
        straight from here, once per host (from a step open here, or one of the last
        ``KEPT_SUMS`` resolved)."""
        open_ = self.steps.get(msg.step)
        st = self._resolved.get(msg.step) if open_ is None or open_.relayed is None else open_
        if st is None or not _fits(st, msg.total, msg.dtype) or not 0 <= rank < self.hosts \
                or (rank, msg.chunk) in st.resent:
            return
        data = st.owned_sum(msg.chunk) if msg.chunk < st.layout.chunks else None
        if data is None:
            return
        st.resent.add((rank, msg.chunk))
        layout = st.layout
        self.peers.to_peer(rank, st.step, Piece(st.step, GATHER, msg.chunk, layout.total,
                                                layout.dtype_name), data, keep=True)

    def _relay_copy(self, st: SpreadStep, chunk: int) -> None:
        a, b = st.layout.bounds(chunk)
        assert st.result is not None
        data = self.ports.memory.alloc(b - a, st.layout.dtype)
        np.copyto(data, st.result[a:b])
        self._relay(st, chunk, data)

    def peer_unreachable(self, rank: int) -> None:
        """This host's link to ``rank`` is down: the sum's chunks it was the next host for
        go on to the one after it (steps still open here; those decided here are not held)."""
        for st in list(self.steps.values()):
            if st.relayed is not None:
                for c in [c for c, r in st.relayed.items() if r == rank]:
                    self._relay_copy(st, c)

    def _check_complete(self, st: SpreadStep) -> None:
        if not st.complete or not self._settled(st.step) or self.steps.get(st.step) is not st:
            return
        del self.steps[st.step]
        assert st.result is not None
        if st.relayed is not None and st.decoded:
            self._resolved[st.step] = st.kept()
            while len(self._resolved) > KEPT_SUMS:
                del self._resolved[min(self._resolved)]
        if self.place.is_master:
            self._count_on_time(st)
            # The tree's decision: every host applies the step on this word only.
            msg = Settled(st.step, st.layout.total, st.layout.dtype_name)
            for rank in range(1, self.hosts):
                self.peers.to_peer(rank, st.step, msg, None, keep=True)   # (a link coming up)
        self.ports.steps.resolved(st.step, st.layout, st.result)

    def settled(self, rank: int, msg: Settled) -> None:
        """The master has the step's whole sum: it resolves here once this host has it too."""
        if rank != 0:
            raise ProtocolError(f"SETTLED from rank {rank}: only the master (rank 0) decides a step")
        if self.place.is_master:
            raise ProtocolError("SETTLED at the master")
        st = self._step(msg.step, msg.total, msg.dtype)
        if st is None:
            return
        if not _fits(st, msg.total, msg.dtype):
            raise ProtocolError(f"SETTLED: step {msg.step}'s sum is {msg.total} x {msg.dtype}, "
                                f"but the step's vector is {st.layout.describe()} here")
        self.ports.steps.settle(msg.step)
        self._check_complete(st)

    def _settled(self, step: int) -> bool:
        """The master has the step's whole sum (it is the master, or its word came: kept in
        the node's record of the step, so a step begun again here keeps it)."""
        return self.place.is_master or self.ports.steps.is_settled(step)

    # -- the map of owners
    def owners(self, rank: int, msg: Owners) -> None:
        if rank != 0:
            raise ProtocolError(f"OWNERS from rank {rank}: only the master (rank 0) decides who owns chunks")
        if self.place.is_master:
            raise ProtocolError("OWNERS at the master")
        if msg.excluded != tuple(sorted(self.map.latest)) or msg.start != 0:
            log.warning("the master's map %d: from step %d on, rank(s) %s own no chunks",
                        msg.epoch, msg.start, ", ".join(map(str, msg.excluded)) or "none")
        self._new_map(msg.epoch, msg.start, msg.excluded)

    def _new_map(self, epoch: int, start: int, excluded) -> None:
        self.map.replace(epoch, start, excluded)
        for step, st in sorted(self.steps.items()):
            if step >= start and st.owners.ranks != self._cut(step, st.layout.total,
                                                             st.layout.dtype_name).ranks:
                self._begin_again(st)

    def _begin_again(self, st: SpreadStep) -> None:
        """The step's owners changed: begin it again with the new ones, this host's vector
        sent anew, if nothing of it was decoded or gathered here (else it goes on as it is,
        and fails if it must)."""
        if st.decoded or st.gathered:
            return
        again = self.steps[st.step] = self._new_step(st.step, st.layout.total, st.layout.dtype_name)
        if st.mine is not None:
            ready = again.local_arrived(st.mine, copied=True)
            self._send_pieces(again)
            self._decode(again, ready)

    def _exclude(self, ranks: set[int], start: int, why: str) -> None:
        """Master: ``ranks`` own no chunks from step ``start`` on; every host is told."""
        excluded = self.map.latest | (ranks - {0})
        if excluded == self.map.latest:
            return
        for r in excluded - self.map.latest:
            self._on_time[r] = 0
        log.warning("from step %d on, rank(s) %s own no chunks (%s)", start,
                    ", ".join(map(str, sorted(ranks))), why)
        self._announce(self.map.epoch + 1, start, excluded)

    def _announce(self, epoch: int, start: int, excluded: frozenset[int]) -> None:
        self.peers.announce(Owners(epoch, start, tuple(sorted(excluded))))
        self._new_map(epoch, start, excluded)

    def _count_on_time(self, st: SpreadStep) -> None:
        """Master: an excluded host whose pieces came in time for ON_TIME steps in a row owns
        chunks again."""
        back = set()
        for r in self.map.latest:
            self._on_time[r] = self._on_time.get(r, 0) + 1 if r in st.senders else 0
            if self._on_time[r] >= ON_TIME:
                back.add(r)
        if back:
            log.warning("from step %d on, rank(s) %s own chunks again (their pieces came in time "
                        "for %d steps)", st.step + 1, ", ".join(map(str, sorted(back))), ON_TIME)
            for r in back:
                del self._on_time[r]
            self._announce(self.map.epoch + 1, max(st.step, self.newest) + 1, self.map.latest - back)

    # -- the step's state
    def _step(self, step: int, total: int, dtype: str, local: bool = False) -> SpreadStep | None:
        """The step's SpreadStep, begun with a ``total`` x ``dtype`` layout if new.

        A peer's piece never fixes a step's layout here. What does: this host's vector
        (``local``), the tree's layout (the last result's), or a decode here (n - s hosts'
        pieces agreed on it). A sum's chunk alone does not: one peer relays it, and a peer
        holding the secret may make one up in any layout for any step ahead, which would
        refuse this host's vector at that step. So a step begun by pieces of a layout
        nothing settled begins again, chunks of the sum gathered or not, when this host's
        vector or a piece of the tree's layout comes in another one."""
        if self.ports.steps.is_decided(step):
            return None
        st = self.steps.get(step)
        settles = local or self.ports.steps.tree_vector == (total, dtype)
        if st is not None and (_fits(st, total, dtype) or not settles or self._layout_settled(st)):
            return st
        if st is not None:
            log.warning("step %d began here with pieces of %s, but %s is %d x %s: beginning it "
                        "again", step, st.layout.describe(),
                        "this host's vector" if local else "the tree's", total, dtype)
        elif not settles and sum(not self._layout_settled(s) for s in self.steps.values()) \
                >= UNSETTLED_STEPS:
            self._lines.warning("unsettled", "step %d: a piece of %d x %s, but %d steps "
                                "are open here in layouts nothing settled: dropped", step, total,
                                dtype, UNSETTLED_STEPS)
            return None
        self.newest = max(self.newest, step)
        st = self.steps[step] = self._new_step(step, total, dtype)
        return st

    def _layout_settled(self, st: SpreadStep) -> bool:
        """Is ``st``'s layout settled here (``_step``)?"""
        layout = st.layout
        return (st.mine is not None or st.decoded > 0
                or self.ports.steps.tree_vector == (layout.total, layout.dtype_name))

    def _cut(self, step: int, total: int, dtype: str):
        return owners(total, dtype, self.place.chunk_bytes, self.hosts, self.map.excluded(step))

    def _new_step(self, step: int, total: int, dtype: str) -> SpreadStep:
        cut = self._cut(step, total, dtype)
        st = SpreadStep(
            step, cut, self.recursion, self.rank, alloc=self.ports.memory.alloc,
            result_alloc=lambda total, dtype: self.ports.memory.alloc_result(step, total, dtype))
        if cut.share_bytes > RELAYED_SHARE and self.place.spread_sum == "ring":
            st.relayed = {}
        return st

    def peer_disowned(self, rank: int) -> None:
        """At the master: ``rank`` owns no chunks from the next step on, rather than fail
        the first step it owns. Its pieces cannot reach the master either (its links are
        not confirmed: ``node/peers/identity.py``), so it does not own again."""
        if self.place.is_master:
            self._exclude({rank}, self.newest + 1, f"rank {rank} is not at the address the "
                          "tree gave for it, or was left out (--tls-names)")

    def peer_silent(self, rank: int) -> None:
        """Peer ``rank``'s link is gone: the sum's chunks it owns will not come for the steps
        under way, which fail here now rather than at their deadline. At the master, it owns
        no chunks from the next step on (until its pieces come in time again)."""
        if self.place.is_master:
            self._exclude({rank}, self.newest + 1, f"rank {rank}'s link to the master is gone")
        for st in list(self.steps.values()):
            missing = [c for c in st.owners.chunks_of(rank) if c not in st.gathered]
            # (round the ring, its chunks may be on their way still: they fail at the deadline)
            if missing and rank != self.rank and st.relayed is None:
                # The master's to decide (it fails the step now if it lacks them too): a
                # host waits for its word, and gives up alone only if it has no parent.
                self.ports.steps.stall(st.step, f"owner rank {rank} (chunks {missing[0]}.."
                                       f"{missing[-1]} of the sum) disconnected")

    def stalled(self, step: int) -> Stall | None:
        st = self.steps.get(step)
        if st is not None and self.place.is_master:
            # Owners whose chunks did not come and whose own pieces did not either: their
            # daemons are gone or frozen (one that only lacked pieces is not to blame; one
            # whose piece this host said it could do without may be, and owns again after
            # ON_TIME steps: the master tells excluded hosts no MOOT).
            missing = {st.owners.owner(c) for c in range(st.layout.chunks) if c not in st.gathered}
            silent = missing - st.senders - {0}
            # An owner whose digest of a chunk relayed here did not come owes it: it alone
            # can send it (its chunks count nowhere without it).
            silent |= {st.owners.owner(c) for c in st.unverified if c not in st.digests} - {0}
            if missing and st.relayed is not None:
                # Round the ring, a host that froze holds every chunk relayed to it: the
                # chunks missing here are those of the owners up to it, and it is one of the
                # hosts from the last of them to the next owner whose chunks came.
                last = max(missing)
                after = min((o for o in st.owners.ranks if o > last), default=self.hosts)
                silent |= set(range(last, after)) - st.senders - {0}
            if silent:
                self._exclude(silent, step + 1, f"step {step}'s chunks from them (or relayed "
                              "through them) did not come, nor their pieces")
        # A host that lacks something waits for the master's verdict (FAIL, or SETTLED) up
        # to the grace, as a tree node does: the master decides, never a host alone. Once
        # the master settled it, chunks still missing past the grace are gone (relayed
        # through a host that froze, or sent on a link that broke): the step is lost here.
        if st is None:
            lacking = ("the pieces of the step" if self.place.is_master
                       else "this host's training process's vector and the sum")
            return Stall(lacking)
        settled = self._settled(step)
        return Stall(st.waiting_for(settled), lost=settled and not self.place.is_master)

    def forget(self, step: int, resolved: bool) -> None:
        self.steps.pop(step, None)


def _fits(st: SpreadStep | OwnedSums, total: int, dtype: str) -> bool:
    return st.layout.total == total and st.layout.dtype_name == dtype
