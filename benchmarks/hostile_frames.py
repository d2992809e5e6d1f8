"""Hostile frames for the fuzzers (``benchmarks/fuzz.py``, ``benchmarks/fuzz_authenticated.py``).

``hostile_header`` is a header of any message type with some fields right and some
wrong, what a stranger can send. ``Forger`` is what a host that holds the cluster secret
and a slot of the tree can send: every message type a node may send on a tree link or a
peer link, well-formed and with values chosen from what the host knows of the tree
(``Known``: the step the tree is at, the window, the vector's layout, the job, the keys
and nonces it saw) or far from it, and replays of frames it saw or sent; ``answer()`` is
what it sends back on a host's peer link to it (forged PEER_CHECKED, PEER_CONFIRMED).

One rule keeps the forger a straggler and not a source of wrong gradients (which the
threat model lets a compromised host send, and which would spoil the sums the fuzzer
checks): a CHUNK or a PIECE with exactly the tree's layout (its total and dtype, a chunk
that exists) is only ever sent for a step it saw decided (a RESULT or a tree-wide FAIL of
that step, or a process's result). Any other step
gets a layout that differs, or a chunk that does not exist.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

import msgpack

from crnet.protocol.fields import MAX_STEP
from crnet.protocol.messages import CLASSES, VOTE, FailKind
from crnet.protocol.wire import MAGIC, PREFIX, VERSION, MsgType, encode
from crnet.schemes.ring_allreduce.messages import Phase

INTS = [0, 1, -1, 2, 255, 1 << 16, 1 << 31, (1 << 31) - 1, 1 << 40, (1 << 62), (1 << 63) - 1,
        -(1 << 63), 10 ** 30]
STRINGS = ["", "0", "0.1", "x" * 300, "x" * 70_000, "\x00\n\r", "é" * 50, "master\nINFO forged"]
OTHERS: list[object] = [None, True, 1.5, float("nan"), [], [1, 2], {}, {"a": 1}, b"\x00" * 32,
                        b"x" * 5000]


def hostile_value(rng: random.Random) -> object:
    kind = rng.random()
    if kind < 0.4:
        return rng.choice(INTS)
    if kind < 0.7:
        return rng.choice(STRINGS)
    return rng.choice(OTHERS)


def hostile_header(rng: random.Random, msg_type: MsgType) -> dict:
    """A header for ``msg_type`` with some fields right and some hostile."""
    cls = CLASSES[msg_type]
    names = list(getattr(cls, "__dataclass_fields__", {}))
    header: dict = {}
    for name in names:
        r = rng.random()
        if r < 0.15:
            continue                               # missing
        header[name] = hostile_value(rng) if r < 0.7 else rng.choice([0, 1, "float32", "0"])
    if rng.random() < 0.2:
        header[rng.choice(STRINGS)[:40] or "extra"] = hostile_value(rng)
    return header


def frame(msg_type: int, header_bytes: bytes, payload: bytes = b"") -> bytes:
    return PREFIX.pack(MAGIC, VERSION, msg_type, len(header_bytes), len(payload)) + header_bytes + payload


DTYPES = ("float64", "float32", "float16", "int32", "bfloat16")
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "int32": 4, "bfloat16": 2}
# What a node sends its parent (up a tree link), and a host its peers (spread, rar).
UP = (MsgType.JOINED, MsgType.OPEN, MsgType.FAIL, MsgType.CHUNK, MsgType.BCAST, MsgType.BARRIER,
      MsgType.JOB, MsgType.WANT_STATE, MsgType.STATUS_REPLY)
PEER = (MsgType.PIECE, MsgType.MOOT, MsgType.OWNERS, MsgType.SEGMENT, MsgType.PEER_CHECK)
ANY = tuple(MsgType)   # out of place on the link: the daemon closes it (or must ignore it)


@dataclass
class Known:
    """What the hostile host knows: the run's setup, and what it saw on its links."""

    total: int                   # the tree's vector: elements, dtype, chunk size in bytes
    dtype: str
    chunk_bytes: int
    window: int                  # --step-window
    subtree: int                 # workers of its slot's subtree, itself included
    processes: int               # the job's training processes
    names: tuple[str, ...]       # the tree's node names
    job: str = ""
    decided: int = -1            # the newest step the tree decided (a result seen)
    # The steps it saw decided. Steps are not decided in order (the master fails the open
    # ones at once when too many children are gone), so the newest says nothing of the
    # steps before it: only these may carry a piece in the tree's exact layout.
    done: deque[int] = field(default_factory=lambda: deque(maxlen=4096))
    keys: set[str] = field(default_factory=lambda: {"start", "params", "state/1"})
    nonces: list[int] = field(default_factory=lambda: [1])
    seen: deque[bytes] = field(default_factory=lambda: deque(maxlen=256))   # frames got
    sent: deque[bytes] = field(default_factory=lambda: deque(maxlen=256))   # frames sent

    @property
    def chunks(self) -> int:
        return max(1, -(-self.total * ITEMSIZE[self.dtype] // self.chunk_bytes))

    def chunk_nbytes(self, chunk: int, total: int | None = None, dtype: str | None = None) -> int:
        """Bytes of ``chunk`` of the tree's vector (or of a ``total`` x ``dtype`` one)."""
        total, dtype = total or self.total, dtype or self.dtype
        per = self.chunk_bytes // ITEMSIZE[dtype]
        return max(0, min(per, total - chunk * per)) * ITEMSIZE[dtype]


class Forger:
    """Frames a host holding the secret sends: ``up()`` on its tree link, ``peer()`` on a
    peer link; each is the bytes of one frame (or of a replayed one)."""

    def __init__(self, rng: random.Random, known: Known):
        self.rng = rng
        self.k = known

    # -- values near and far from the tree's own
    def step(self) -> int:
        r, d, w = self.rng.random(), max(self.k.decided, 0), self.k.window
        if r < 0.1 and self.k.done:
            return self.rng.choice(self.k.done)                   # one seen decided
        if r < 0.3:
            return max(0, d + self.rng.randint(-3, 3))            # near
        if r < 0.6:
            return d + 1 + self.rng.randrange(w + 3)               # inside the window, its edge
        if r < 0.75:
            return max(0, d - self.rng.randint(4, 100))            # decided long ago
        if r < 0.95:
            return min(MAX_STEP, d + self.rng.choice([w + 4, 1000, 10 ** 6, 1 << 40, MAX_STEP]))
        return self.rng.choice([MAX_STEP, 0, d])

    def count(self, right: int) -> int:
        return self.rng.choice([right, right, 0, 1, right + 1, right - 1, 1 << 20, 1 << 31])

    def name(self) -> str:
        return self.rng.choice([self.k.job, self.k.job, "evil", "", "x" * 256, "\x1b]52;c;\x07",
                                *self.k.names[:4]])

    def key(self) -> str:
        keys = sorted(self.k.keys)
        return self.rng.choice([*keys, *keys, f"state/{self.rng.choice(self.k.nonces)}", "start",
                                "params", "", "k" * 256, f"junk/{self.rng.randrange(1 << 30)}"])

    def text(self) -> str:
        return self.rng.choice(["", "stall", "x" * 4000, "missing now: none\nINFO forged",
                                "\x1b[2J", "é" * 100])

    def layout(self, step: int, exact: bool = False) -> tuple[int, str, int]:
        """(total, dtype, chunk) of a piece of ``step``: the tree's exactly only when the
        step is decided (see the module's docstring), or when ``exact`` (a frame that
        carries no gradient of the sender's: a sum's piece or a MOOT from a non-owner)."""
        k, r = self.k, self.rng.random()
        chunk = self.rng.choice([0, 0, 1, k.chunks - 1, k.chunks, k.chunks + 1, 1 << 20])
        if (exact or step in k.done) and r < 0.6:
            return k.total, k.dtype, max(0, min(chunk, k.chunks - 1))
        if r < 0.35:
            return k.total, k.dtype, self.rng.choice([k.chunks, k.chunks + 3, 1 << 32])
        total = self.rng.choice([k.total + 1, k.total - 1 or 2, 1, k.total * 2, 1 << 20, 1 << 40])
        dtype = self.rng.choice([d for d in DTYPES if d != k.dtype] if r < 0.7 else [k.dtype])
        return total, dtype, chunk

    def own_layout(self) -> tuple[int, str, int]:
        """(total, dtype, chunk) of a vector the tree does not have, well-formed: a host
        takes its pieces whole. A sum's chunk in it, for a step ahead, is what issue 54's
        row 1 was (relayed by the hosts after the holder, it fixed the step's layout there
        and refused their processes' vectors); it carries no gradient of the tree's."""
        k = self.k
        total, dtype = self.rng.choice([(k.total * 2, k.dtype), (16384, "float32"), (1 << 16, "float64"),
                                        (k.total, next(d for d in DTYPES if d != k.dtype))])
        # Any chunk: spread takes a sum's chunk only from its owner (some are the holder's),
        # or, where shares are large (1 << 16 x float64), from a host before it on the ring.
        return total, dtype, self.rng.randrange(-(-total * ITEMSIZE[dtype] // k.chunk_bytes))

    def payload(self, nbytes: int) -> bytes:
        n = self.rng.choice([nbytes, nbytes, nbytes, 0, 1, nbytes + 8, 4096])
        return self.rng.randbytes(n)

    # -- frames
    def _frame(self, msg_type: MsgType, header: dict, payload: bytes | None = None) -> bytes:
        try:
            data = b"".join(bytes(p) for p in encode(msg_type, header, payload or None))
        except (ValueError, OverflowError, TypeError):
            data = frame(msg_type, msgpack.packb({}), payload or b"")
        self.k.sent.append(data)
        return data

    def replay(self) -> bytes | None:
        """A frame seen or sent before, as it was (None if there is none)."""
        pool = self.k.seen if self.k.seen and self.rng.random() < 0.5 else self.k.sent
        return self.rng.choice(pool) if pool else None

    def up(self) -> bytes:
        """One frame for the tree link to the parent."""
        r = self.rng.random()
        if r < 0.08:
            return self.replay() or self.junk()
        if r < 0.11:
            return self.junk()
        return self.typed(self.rng.choice(UP))

    def peer(self) -> bytes:
        """One frame for a peer link (spread: to another host)."""
        r = self.rng.random()
        if r < 0.08:
            return self.replay() or self.junk()
        if r < 0.11:
            return self.junk()
        return self.typed(self.rng.choice(PEER))

    def answer(self) -> bytes:
        """One frame for a host's peer link to this one, where an honest host sends only
        PEER_WELCOME, PEER_CONFIRMED and PEER_CHECKED: answers to checks nobody asked (or
        replayed), a confirmation again, junk."""
        r = self.rng.random()
        if r < 0.5:
            return self._frame(MsgType.PEER_CHECKED, {"link_id": self.rng.randbytes(16),
                                                      "ok": self.rng.random() < 0.5})
        if r < 0.7:
            return self._frame(MsgType.PEER_CONFIRMED, {})
        if r < 0.85:
            return self.replay() or self.junk()
        return self.junk()

    def junk(self) -> bytes:
        """A frame of any type with hostile fields (most close the link)."""
        msg_type = self.rng.choice(ANY)
        try:
            head = msgpack.packb(hostile_header(self.rng, msg_type))
        except (ValueError, OverflowError):
            head = msgpack.packb({})
        return frame(msg_type, head, self.rng.randbytes(self.rng.choice([0, 0, 8, 64])))

    def typed(self, t: MsgType) -> bytes:
        k, rng = self.k, self.rng
        if t == MsgType.JOINED:
            return self._frame(t, {"workers": self.count(k.subtree), "tree_step": rng.choice(
                [-1, self.step(), k.decided]), "job": self.name()})
        if t == MsgType.OPEN:
            return self._frame(t, {"step": self.step()})
        if t == MsgType.FAIL:
            return self._frame(t, {"step": self.step(), "reason": self.text(),
                                   "kind": rng.choice([k.value for k in FailKind])})
        if t in (MsgType.CHUNK, MsgType.PIECE, MsgType.MOOT):
            step = self.step()
            # A sum's piece (GATHER) or a MOOT comes from a chunk's owner; the tree's small
            # vector has one, the master: from this host, never one to act on.
            phase = rng.choice([Phase.REDUCE.value, Phase.GATHER.value])
            gather = t == MsgType.PIECE and phase == Phase.GATHER.value
            total, dtype, chunk = self.layout(step, exact=t == MsgType.MOOT or gather)
            nbytes = self.k.chunk_nbytes(chunk) if (total, dtype) == (k.total, k.dtype) else 64
            if gather and (total, dtype) != (k.total, k.dtype) and rng.random() < 0.5:
                total, dtype, chunk = self.own_layout()
                nbytes = self.k.chunk_nbytes(chunk, total, dtype)
            header: dict = {"step": step, "chunk": chunk, "total": total, "dtype": dtype}
            if t == MsgType.MOOT:
                return self._frame(t, header)
            if t == MsgType.PIECE:
                header["phase"] = phase
            return self._frame(t, header, self.payload(nbytes))
        if t == MsgType.SEGMENT:
            step = self.step()
            total, dtype, _ = self.layout(step)
            if step > k.decided and (total, dtype) == (k.total, k.dtype):
                total += 1
            return self._frame(t, {"step": step, "phase": rng.choice(["rs", "ag"]),
                                   "round": rng.choice([0, 1, 5, 1 << 16]), "segment": rng.choice([0, 1, 99]),
                                   "total": total, "dtype": dtype, "part": rng.choice([0, 1, 4])},
                               self.payload(64))
        if t == MsgType.BCAST:
            total = rng.choice([k.total, k.total, 1, 1 << 20, 1 << 40])
            offset = rng.choice([0, 0, 8, k.total * 8, 1 << 48])
            return self._frame(t, {"key": self.key(), "origin": rng.choice([0, 1, 7, 1 << 62]),
                                   "step": rng.choice([-1, self.step()]), "offset": offset, "total": total,
                                   "dtype": rng.choice([k.dtype, k.dtype, "float32"])},
                               self.payload(k.total * ITEMSIZE[k.dtype]))
        if t == MsgType.BARRIER:
            processes = self.count(k.processes)
            arrived = rng.choice([0, 1, processes, processes - 1, k.subtree, processes + 1])
            # A vote (root=True/False) names the hosts whose process is the root.
            roots = rng.choice([None, None, [], [self.name()], [self.name(), self.name()],
                                [self.name()] * 3, "0"])
            return self._frame(t, {"key": rng.choice([self.key(), VOTE + self.key()]),
                                   "arrived": arrived, "processes": processes, "roots": roots})
        if t == MsgType.JOB:
            return self._frame(t, {"name": self.name(), "attached": self.count(k.subtree),
                                   "refused": rng.choice(["", self.name()])})
        if t == MsgType.WANT_STATE:
            return self._frame(t, {"nonce": rng.choice([*k.nonces, 1, rng.randrange(1, 1 << 62), 0])})
        if t == MsgType.OWNERS:
            return self._frame(t, {"epoch": rng.choice([0, 1, 1 << 40]), "start": self.step(),
                                   "excluded": rng.sample(range(1, len(k.names)),
                                                          rng.randrange(len(k.names) - 1))})
        if t == MsgType.PEER_CHECK:   # a question about a link id (any host's answer is no)
            return self._frame(t, {"link_id": rng.randbytes(16)})
        if t == MsgType.STATUS_REPLY:
            return self._frame(t, {"id": rng.choice([0, 1, 1 << 62]), "node": rng.choice(
                [{}, {"name": self.name(), "state": "joined"}, {"children": [{}] * 100}])})
        return self.junk()
