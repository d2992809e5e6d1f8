"""CodedReduce at one node (schemes cr, gc and tree): decode each chunk from the fastest children.

Up: a node's message is its local weighted gradient plus the decode of any n-s of
its children's coded messages, chunk by chunk (``coded_step.UpStep``); it goes to the parent,
or at the master it is the step's full gradient. Down: the full gradient flows to
every child as RESULT chunks, each forwarded the moment it arrives (``coded_step.ResultStep``); a
leaf receives them straight into its training process's shared output (``Memory.alloc_result``).
``CodedReduce`` drives both over the ``Ports`` the step engine gives it; gc is CodedReduce on a
one-layer tree and tree is CodedReduce with s = 0 (``plan.scheme_tree``).
(``../shared/codedreduce.md``, "One step, end to end".)

A step's layout (its vectors' length and dtype) is the layout vote's (``layouts.py``): the
driver asks it where each piece goes, and it never lets the first child's chunk set it.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np

from ...coding.approximate import decode_from
from ...dtypes import dtype_name
from ...errors import ProtocolError
from ...protocol.messages import Chunk, Fail, FailKind, Result
from ..base import Origin, Place, Ports, Scheme, Stall, Takes
from ..chunks import ChunkLayout
from .beyond import message_approx, patience
from .layouts import LayoutVote, fits
from .step import ResultStep, UpStep

log = logging.getLogger("crnet.schemes")



class CodedReduce(Scheme):
    """cr, gc and tree at one node: each open step up, results down as they come."""

    TAKES = (Takes(Chunk, Origin.CHILD, "child_chunk", dest="child_chunk_dest"),
             Takes(Result, Origin.PARENT, "result", dest="result_dest"))

    def __init__(self, place: Place, ports: Ports):
        super().__init__(place, ports)
        self.code = place.code()
        self.ups: dict[int, UpStep] = {}
        self.down: dict[int, ResultStep] = {}
        # Steps known here before any piece of them came (the master's training process
        # asked, or a child gave up early), with the children already out of each.
        self._ahead: dict[int, dict[int, str]] = {}
        # Which layout each step's vectors have, and where a child's piece goes (layouts.py).
        self.vote = LayoutVote(place, ports, self.code, self.ups, self._new_up, self._up_for,
                               self._check_quorum)
        # Beyond s (--beyond-s approximate): a parent short of n - s children when its
        # patience runs out decodes from those there (approximate.py); step -> its timer.
        self.approximate = place.beyond_s == "approximate" and self.code is not None
        self._patience: dict[int, asyncio.TimerHandle] = {}
        # Steps whose patience ran out while this node's own gradient was late: it decodes
        # from the children there the moment that gradient comes.
        self._impatient: set[int] = set()

    # -- up: the local vector and the children's chunks --------------------------------
    def local(self, step: int, vector: np.ndarray) -> str | None:
        if self.place.is_master:  # the master computes nothing; its process only waits
            if step not in self.ups and not self.ports.steps.is_decided(step):
                self._ahead.setdefault(step, {})
                self._check_ahead(step)
            return None
        name = dtype_name(vector.dtype)
        up = self.vote.accept(step, vector.size, name)
        if up is None:
            return None
        if not fits(up.layout, vector.size, name):
            if self.vote.settled(up):
                return up.layout.mismatch(self.place.layout(vector.size, vector.dtype), step)
            # Only children's vectors came, and nothing settled their layout: this
            # process's vector does.
            up = self.vote.switch(up, vector.size, name, "this node's training process's vector")
            if up is None:
                return None
        ready = up.local_arrived(vector)
        self.vote.settle(up)
        if self.ups.get(step) is up:
            self._emit(up, ready)
        if step in self._impatient:
            self._patience_up(step)
        return None

    def child_chunk_dest(self, k: int, msg: Chunk, nbytes: int) -> memoryview | None:
        up = self.vote.accept(msg.step, msg.total, msg.dtype)
        if up is None or k in up.silent:
            return None
        main = up
        if msg.step in self.vote.rivals or not fits(up.layout, msg.total, msg.dtype):
            up = self.vote.held(up, k, msg.total, msg.dtype)
        problem = up.layout.check(msg.total, msg.dtype, msg.chunk, nbytes)
        if problem:
            log.warning("step %d: child %d: %s; ignoring it this step", msg.step, k, problem)
            self.ports.send.to_child(k, Fail(msg.step, problem, FailKind.MISMATCH))
            self.child_silent(k, msg.step, f"its vector does not fit: {problem}")
            return None
        if k not in up.arrived_at:            # once per child and step: its arrival lag
            up.arrived_at[k] = time.perf_counter()
            if up.first_byte is None:
                up.first_byte = up.arrived_at[k]
        if k not in up.senders and msg.step in self.vote.rivals:
            up.senders.add(k)         # one child fewer to side with another layout
            self.vote.drop_hopeless(main)
            if self.ups.get(msg.step) is not main:
                return None           # (that decided the step)
        up.senders.add(k)
        if msg.approx is not None:
            up.child_approx[k] = msg.approx
        return up.child_buffer(k, msg.chunk)

    def child_chunk(self, k: int, msg: Chunk) -> None:
        up = self.ups.get(msg.step)
        if up is None:
            return
        if not fits(up.layout, msg.total, msg.dtype):
            held = self.vote.rivals.get(msg.step, {}).get((msg.total, msg.dtype))
            # (A chunk received into a step that began again since is not this step's.)
            if held is None or k not in held.senders:
                return
            self.ports.stats.bytes_up += held.layout.nbytes(msg.chunk)
            ready = held.child_arrived(k, msg.chunk)
            if ready and self.vote.settled(up):   # (the tree's layout, since: it stays)
                self.vote.settle(up)
            elif ready:   # n - s children agree on this layout: the step's is theirs
                switched = self.vote.switch(up, msg.total, msg.dtype,
                                        f"the vector of {len(held.senders)} children")
                if switched is not None:
                    self._emit(switched, ready)
            return
        self.ports.stats.bytes_up += up.layout.nbytes(msg.chunk)
        self._emit(up, up.child_arrived(k, msg.chunk))

    def child_silent(self, k: int, step: int | None, why: str) -> None:
        if self.code is None:
            return
        if step is None:  # the link is gone: every step known here lost the child
            for known in list(self._ahead):
                # (A stall may have decided, and dropped, it; one not open waits for that.)
                if known in self._ahead and self.ports.steps.is_open(known):
                    self._check_ahead(known)
            for open_up in list(self.ups.values()):
                if open_up.step in self.ups and k not in open_up.silent:
                    open_up.silent[k] = why
                    self.vote.drop_hopeless(open_up)
            return
        up = self.ups.get(step)
        if up is None:
            # A step not begun here yet (the child gave up before anything else came).
            # Its FAIL opens nothing and starts no clock (a child may name any step of the
            # window): it is remembered for when the step opens, and counts now if it is
            # open (then it fails now if too many children are out).
            if step not in self._ahead:   # what is kept lies in the window
                for known in [s for s in self._ahead if self.ports.steps.is_decided(s)]:
                    del self._ahead[known]
            self._ahead.setdefault(step, {})[k] = why
            if self.ports.steps.is_open(step):
                self._check_ahead(step)
        elif k not in up.silent:
            up.silent[k] = why
            self.vote.drop_hopeless(up)

    def opened(self, step: int) -> None:
        if self.approximate and step not in self._patience:
            self._patience[step] = asyncio.get_running_loop().call_later(
                patience(self.place, self.ports), self._patience_up, step)
        # Children that gave up on it before it began here count from now on.
        if step in self._ahead and step not in self.ups:
            self._check_ahead(step)

    def _check_ahead(self, step: int) -> None:
        """A step known here before any piece of it came: fail it now if more than s
        children are already out of it."""
        assert self.code is not None
        out = {**self.ports.send.absent_children(), **self._ahead[step]}
        if len(out) > self.code.s and not (self.approximate and len(out) < self.code.n):
            self._stall(step, out)

    def _new_up(self, step: int, layout: ChunkLayout, alloc) -> UpStep:
        buffers: list[np.ndarray | None] | None = (
            None if self.code is None else [None] * self.code.n)   # allocated as chunks come
        # A decode from fewer than n - s children (FRC: one of every group) settles no
        # layout: it is taken only once one is settled (a node's own vector comes before any
        # decode; at the master, the tree's), so a layout still needs n - s children to win.
        early = not self.place.is_master or \
            self.ports.steps.tree_vector == (layout.total, layout.dtype_name)
        return UpStep(step, layout, self.code, has_local=not self.place.is_master,
                      child_buffers=buffers, alloc=alloc, early=early)

    def _up_for(self, step: int, total: int, dtype) -> UpStep | None:
        """The UpStep for ``step``, begun if new (None if the step is decided)."""
        up = self.ups.get(step)
        if up is not None or self.ports.steps.is_decided(step):
            return up
        up = self.ups[step] = self._new_up(step, self.place.layout(total, dtype), self.ports.memory.alloc)
        if self.code is not None:
            up.silent.update(self.ports.send.absent_children())
            up.silent.update(self._ahead.pop(step, {}))
            self._check_quorum(up)
        return self.ups.get(step)   # a stall may have decided it already

    def _check_quorum(self, up: UpStep) -> None:
        if up.decodable or up.complete:
            return
        if self.approximate and len(up.silent) < up.code.n:   # type: ignore[union-attr]
            return   # the patience decides: it decodes from the children there
        self._stall(up.step, up.silent)

    # -- beyond s: decode from fewer than n - s children (--beyond-s approximate)
    def _patience_up(self, step: int) -> None:
        """The patience for ``step`` ran out: short of n - s children (for some chunk),
        decode every chunk not yet decoded from the children that sent something."""
        self._patience.pop(step, None)
        self._impatient.discard(step)
        up = self.ups.get(step)
        if up is None or up.complete or up.approx is not None or self.code is None:
            return
        if up.has_local and up.local is None:
            self._impatient.add(step)   # this node's own gradient is late: decoded when it comes
            return
        present = sorted(k for k in up.senders if k not in up.silent)
        if not present:
            return          # nobody to decode from: the deadline fails the step
        if self.code.covers(present):
            return          # a quorum is on its way (a chunk at a time): no approximation
        decode = decode_from(self.code, present, self.place.part_mass or None)
        log.warning("step %d: %s has %d of the %d children it needs after its patience: "
                    "decoding from children %s (an approximate result: coverage of its parts "
                    "%.4g, residual %.3g)", step, self.place.label, len(present), up.needed,
                    present, decode.coverage, decode.residual, extra={"step": step})
        self._emit(up, up.go_approximate(decode))

    def _stall(self, step: int, silent: dict[int, str]) -> None:
        """More than s children are out of ``step``: it cannot be decoded here."""
        assert self.code is not None
        gone = "; ".join(f"child {k}: {why}" for k, why in sorted(silent.items()))
        n = len(silent)
        self.ports.steps.stall(step, f"{self.place.label} did not get {self.code.n - self.code.s} of "
                               f"{self.code.n} children: {n} of them {'is' if n == 1 else 'are'} "
                               f"gone or failed ({gone})")

    def _emit(self, up: UpStep, chunks: list[int]) -> None:
        """Decode the chunks that are ready; each goes up, or down from the master."""
        if chunks and up.step in self.vote.rivals:
            self.vote.settle(up)   # decoded from: the step's layout is this one
            if self.ups.get(up.step) is not up:
                return
        stats = self.ports.stats
        for c in chunks:
            t0, cpu0 = time.perf_counter(), time.thread_time()   # the kernels run in this thread
            message = up.decode(c)
            stats.decode_seconds += time.perf_counter() - t0
            stats.decode_cpu_seconds += time.thread_time() - cpu0
            approx = message_approx(self.place, up, c)
            if self.place.is_master:
                result = self.down.get(up.step)
                if result is None:
                    result = self.down[up.step] = ResultStep(up.step, up.layout, up.output)
                if approx is not None:
                    result.approx = approx
                self._down(result, c)
            else:
                # Said on the first chunk it holds for (once per step, unless it changes).
                said = None if approx == up.approx_sent else approx
                up.approx_sent = approx if approx is not None else up.approx_sent
                self.ports.send.to_parent(Chunk(up.step, c, up.layout.total, up.layout.dtype_name,
                                                said), message)
        if chunks and up.complete and up.code is not None:
            stats.children_skipped += up.code.n - len(up.used)
            for k in range(up.code.n):   # once per step: who this step was decoded without
                record = stats.times.child(k)
                record.recent.append(k not in up.used)
                if k not in up.used:
                    record.skipped += 1
            if up.first_byte is not None:
                stats.receive_seconds += time.perf_counter() - up.first_byte

    def stalled(self, step: int) -> Stall | None:
        up = self.ups.get(step)
        if up is not None:
            return None if up.complete else Stall(up.waiting_for())  # complete: the parent decides
        if self.code is None:
            return Stall("the local training process's gradient")
        return Stall(f"{self.code.n - self.code.s} of {self.code.n} children (got 0)")

    # -- down: the full gradient ------------------------------------------------------
    def result_dest(self, parent: int, msg: Result, nbytes: int) -> memoryview | None:
        result = self.down.get(msg.step)
        if result is None:
            result = self.down[msg.step] = ResultStep(
                msg.step, self.place.layout(msg.total, msg.dtype), alloc=self._result_alloc(msg.step))
        problem = result.layout.check(msg.total, msg.dtype, msg.chunk, nbytes)
        if problem:
            raise ProtocolError(f"RESULT for step {msg.step}: {problem}")
        if msg.approx is not None:
            result.approx = msg.approx
        return result.dest(msg.chunk)

    def _result_alloc(self, step: int):
        """Where a step's result is received: at a leaf, which forwards none of it, straight
        into the shared output of the training process waiting on it. A node with children
        sends each chunk on to all of them, and a straggling child's queue may hold the
        chunks long after the step: its training process would wait for that (or the child
        be cut off; ``Memory.alloc_result``), so it receives into the pool and copies."""
        if not self.place.is_leaf:
            return self.ports.memory.alloc
        return lambda total, dtype: self.ports.memory.alloc_result(step, total, dtype)

    def result(self, parent: int, msg: Result) -> None:
        result = self.down.get(msg.step)
        if result is not None:
            self.ports.stats.bytes_down += result.layout.nbytes(msg.chunk)
            self._down(result, msg.chunk)

    def _down(self, result: ResultStep, c: int) -> None:
        """Chunk c of a step's full gradient is here: pass it on to every child."""
        result.arrived(c)
        layout = result.layout
        said = None if result.approx_sent else result.approx   # on one chunk: once per step
        result.approx_sent = result.approx is not None
        self.ports.send.to_children(Result(result.step, c, layout.total, layout.dtype_name, said),
                                    result.chunk(c))
        if result.complete:
            self.forget(result.step, resolved=True)
            if result.approx is None:
                self.ports.steps.resolved(result.step, layout, result.vector)
            else:
                self.ports.steps.resolved(result.step, layout, result.vector, result.approx)

    def forget(self, step: int, resolved: bool) -> None:
        timer = self._patience.pop(step, None)
        if timer is not None:
            timer.cancel()
        self._impatient.discard(step)
        self.down.pop(step, None)
        self._ahead.pop(step, None)
        self.vote.rivals.pop(step, None)
        up = self.ups.pop(step, None)
        if up is not None and up.first_byte is not None:   # each child's lag, once per step
            self.ports.stats.measured.arrived(step, up.arrived_at)
            for k, at in up.arrived_at.items():
                self.ports.stats.times.child(k).lag.observe(at - up.first_byte)
        if resolved and not self.place.is_master and (up is None or not up.complete):
            self.ports.stats.times_skipped += 1
            log.info("step %d finished without this node, %s", step,
                     "before anything of it came here" if up is None
                     else f"which still waited for {up.waiting_for()}")
