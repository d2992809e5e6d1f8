"""Every crnet message as a small typed object: built here, parsed and validated here.

``wire`` moves frames (prefix, msgpack header, raw payload); this module gives each
header a meaning. ``parse`` turns a frame's header into one of the classes below,
checking every field's type and range first: a bad field raises ``ProtocolError``
naming the message and the field, and the connection it came on is closed. A
message's ``frame(payload)`` is the only way a header is built.

Tree links (TCP) carry HELLO .. FAIL between a child and its parent, and PEER_HELLO,
PEER_WELCOME and SEGMENT between ring neighbours (``--scheme rar``). The Unix socket
between a daemon and its training process carries the CLIENT_* messages.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import msgpack

from .auth import MAC_BYTES, NONCE_BYTES
from .dtypes import DTYPE_NAMES
from .errors import CrnetError, ErrorKind, ProtocolError
from .plan import SCHEMES, Tree
from .wire import MsgType, encode

__all__ = [
    "Assign",
    "Attach",
    "Attached",
    "Barrier",
    "Bcast",
    "Challenge",
    "Chunk",
    "ClientError",
    "ClientHello",
    "ClientWelcome",
    "Decided",
    "Delivered",
    "Done",
    "Fail",
    "FailKind",
    "Fetch",
    "Hello",
    "Job",
    "Joined",
    "Message",
    "NodeShare",
    "Open",
    "PeerHello",
    "PeerWelcome",
    "Phase",
    "Proof",
    "Publish",
    "Receive",
    "Refuse",
    "Result",
    "RingPlace",
    "Segment",
    "StatsReply",
    "StatsRequest",
    "StatusHello",
    "StatusReply",
    "StatusRequest",
    "Submit",
    "WantState",
    "Watch",
    "Welcome",
    "check_host_id",
    "parse",
    "parse_allocation",
    "state_key",
]

MAX_STEP = (1 << 63) - 1        # steps are non-negative int64s
CODE_KINDS = ("auto", "frc", "crc")
MAX_REASON = 4096               # characters of a failure reason we keep
_DTYPES = frozenset(DTYPE_NAMES)


class Message:
    """Base of every message: ``TYPE`` is its wire type, ``PAYLOAD`` whether a frame
    of this type must carry raw bytes after the header (and may not otherwise)."""

    TYPE: ClassVar[MsgType]
    PAYLOAD: ClassVar[bool] = False
    EMPTY_PAYLOAD: ClassVar[bool] = False   # PAYLOAD, and zero bytes of it are valid

    def header(self) -> dict[str, Any]:
        names = _FIELD_NAMES.get(type(self))
        if names is None:  # once per class: dataclasses.fields is slow on the hot path
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in fields(self))  # type: ignore[arg-type]
        return {name: _plain(getattr(self, name)) for name in names}

    def frame(self, payload=None) -> list:
        """The frame for ``transport.writelines``; the payload is referenced, not copied."""
        return encode(self.TYPE, self.header(), payload)

    @classmethod
    def from_header(cls, h: _Fields) -> Message:
        raise NotImplementedError


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(value):
    if type(value) in (int, str, bool, float) or value is None:
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "header"):
        return value.header()
    return value


class _Fields:
    """A header map being validated: each accessor names the message and the field."""

    def __init__(self, what: str | MsgType, header: dict):
        self._what, self.h = what, header   # a message type's name is looked up when needed

    @property
    def what(self) -> str:
        return self._what.name if isinstance(self._what, MsgType) else self._what

    def _bad(self, name: str, want: str) -> ProtocolError:
        value = self.h.get(name, "<missing>")
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return ProtocolError(f"{self.what}: field {name!r} must be {want}, got {shown}")

    def integer(self, name: str, lo: int = 0, hi: int = MAX_STEP) -> int:
        v = self.h.get(name)
        if type(v) is not int or not lo <= v <= hi:
            raise self._bad(name, f"an integer in {lo}..{hi}")
        return v

    def opt_integer(self, name: str, lo: int = 0, hi: int = MAX_STEP) -> int | None:
        return None if self.h.get(name) is None else self.integer(name, lo, hi)

    def text(self, name: str, limit: int = 256, choices: tuple[str, ...] | None = None) -> str:
        v = self.h.get(name)
        if not isinstance(v, str) or len(v) > limit:
            raise self._bad(name, f"a string of at most {limit} characters")
        if choices is not None and v not in choices:
            raise self._bad(name, "one of " + ", ".join(choices))
        return v

    def opt_text(self, name: str, limit: int = 256) -> str | None:
        return None if self.h.get(name) is None else self.text(name, limit)

    def reason(self, name: str = "reason") -> str:
        v = self.h.get(name)
        if not isinstance(v, str):
            raise self._bad(name, "a string")
        return v[:MAX_REASON]

    def number(self, name: str, lo: float, hi: float) -> float:
        v = self.h.get(name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
            raise self._bad(name, f"a number in {lo:g}..{hi:g}")
        return float(v)

    def flag(self, name: str, default: bool = False) -> bool:
        v = self.h.get(name, default)
        if not isinstance(v, bool):
            raise self._bad(name, "true or false")
        return v

    def integers(self, name: str, lo: int, hi: int, max_len: int = 16) -> tuple[int, ...]:
        v = self.h.get(name)
        if (not isinstance(v, list) or not 1 <= len(v) <= max_len
                or any(type(x) is not int or not lo <= x <= hi for x in v)):
            raise self._bad(name, f"a list of 1..{max_len} integers in {lo}..{hi}")
        return tuple(v)

    def blob(self, name: str, size: int) -> bytes:
        v = self.h.get(name)
        if not isinstance(v, bytes) or len(v) != size:
            raise self._bad(name, f"{size} bytes")
        return v

    def opt_blob(self, name: str, size: int) -> bytes | None:
        return None if self.h.get(name) is None else self.blob(name, size)

    def mapping(self, name: str) -> dict:
        v = self.h.get(name)
        if not isinstance(v, dict):
            raise self._bad(name, "a map")
        return v


# ---------------------------------------------------------------- join (tree links)

MAX_HOST_ID = 64                # characters of a host's identity (a hostname, or --host-id)


def check_host_id(host: str) -> str | None:
    """Why ``host`` is no host identity (None if it is one): 1..64 printable ASCII
    characters, no spaces (it is shown in logs, metrics and ``crnet status``)."""
    if not 1 <= len(host) <= MAX_HOST_ID:
        return f"a host id has 1..{MAX_HOST_ID} characters, not {len(host)}"
    if not all("!" <= c <= "~" for c in host):
        return f"a host id is printable ASCII without spaces: {host[:MAX_HOST_ID]!r} is not"
    return None


@dataclass(frozen=True, slots=True)
class Hello(Message):
    """child -> parent, first frame: the slot it wants (``name``; None: any free one)
    and where it listens for its own children and ring predecessor (``listen``);
    ``nonce``: its half of the authentication (``crnet.auth``), with a cluster secret;
    ``host``: its host's stable identity: a node without ``name`` gets the slot that
    host had before (``membership.py``)."""

    TYPE = MsgType.HELLO
    name: str | None = None
    listen: str | None = None
    nonce: bytes | None = None
    host: str | None = None

    @classmethod
    def from_header(cls, h: _Fields) -> Hello:
        host = h.opt_text("host", MAX_HOST_ID)
        if host is not None and check_host_id(host):
            raise ProtocolError(f"HELLO: field 'host': {check_host_id(host)}")
        return cls(h.opt_text("name"), h.opt_text("listen"), h.opt_blob("nonce", NONCE_BYTES),
                   host)


@dataclass(frozen=True, slots=True)
class Welcome(Message):
    """parent -> child: its place in the tree and the tree's settings."""

    TYPE = MsgType.WELCOME
    name: str
    layer: int
    fanout: tuple[int, ...]
    stragglers: tuple[int, ...]
    code: str
    chunk_bytes: int
    scheme: str
    tree_step: int = -1             # the newest step the master decided, as the parent knows it
    total: int | None = None        # the tree's vector layout, once a step has a result
    dtype: str | None = None
    job: str = ""                   # the training job the tree runs

    @property
    def tree(self) -> Tree:
        return Tree(self.fanout, self.stragglers)

    @classmethod
    def from_header(cls, h: _Fields) -> Welcome:
        total = h.opt_integer("total", 1, 1 << 40)
        dtype = None if h.h.get("dtype") is None else h.text("dtype", choices=DTYPE_NAMES)
        if (total is None) != (dtype is None):
            raise ProtocolError("WELCOME: fields 'total' and 'dtype' come together")
        msg = cls(h.text("name"), h.integer("layer", 1, 16), h.integers("fanout", 1, 1 << 16),
                  h.integers("stragglers", 0, 1 << 16), h.text("code", choices=CODE_KINDS),
                  h.integer("chunk_bytes", 0, 1 << 31), h.text("scheme", choices=SCHEMES),
                  h.integer("tree_step", -1), total, dtype,
                  h.text("job", 256) if "job" in h.h else "")
        try:
            tree = msg.tree
        except ValueError as e:
            raise ProtocolError(f"WELCOME: fields 'fanout'/'stragglers': {e}") from None
        if msg.layer > tree.layers or msg.name not in tree or tree.layer(msg.name) != msg.layer:
            raise ProtocolError(f"WELCOME: field 'name' {msg.name!r} is not a layer-{msg.layer} "
                                f"node of the tree {tree}")
        return msg


@dataclass(frozen=True, slots=True)
class Refuse(Message):
    """parent -> child (or ring successor -> predecessor): why not; then it closes.
    ``retry``: the refusal is temporary (the parent has not joined yet, ...)."""

    TYPE = MsgType.REFUSE
    reason: str
    retry: bool = False

    @classmethod
    def from_header(cls, h: _Fields) -> Refuse:
        return cls(h.reason(), h.flag("retry"))


@dataclass(frozen=True, slots=True)
class Joined(Message):
    """child -> parent: how many workers of its subtree (itself included) have joined, and
    the newest step the master decided that it knows (a restarted master resumes after it)."""

    TYPE = MsgType.JOINED
    workers: int
    tree_step: int = -1
    job: str = ""

    @classmethod
    def from_header(cls, h: _Fields) -> Joined:
        return cls(h.integer("workers", 0, 1 << 31), h.integer("tree_step", -1),
                   h.text("job", 256) if "job" in h.h else "")


@dataclass(frozen=True, slots=True)
class Job(Message):
    """Up: a training process of job ``name`` joined below (the master starts it). Down: the
    tree now runs job ``name``; the previous job's steps and results are dropped."""

    TYPE = MsgType.JOB
    name: str

    @classmethod
    def from_header(cls, h: _Fields) -> Job:
        return cls(h.text("name", 256))


@dataclass(frozen=True, slots=True)
class RingPlace:
    """Part of ASSIGN (rar): a worker's rank, the ring's size, where its successor listens.
    The ring is the N workers (ranks 0..N-1) and the master (rank N); the last worker's
    successor is None: the master, at the address it dials as its parent."""

    rank: int
    size: int
    successor: str | None

    def header(self) -> dict[str, Any]:
        return {"rank": self.rank, "size": self.size, "successor": self.successor}

    @classmethod
    def from_header(cls, h: _Fields) -> RingPlace:
        size = h.integer("size", 2, 1 << 16)
        return cls(h.integer("rank", 0, size - 2), size, h.opt_text("successor"))


@dataclass(frozen=True, slots=True)
class Assign(Message):
    """parent -> child: the batch size, the ring place (rar), and in the payload the
    allocation of the child's whole subtree (``parse_allocation``)."""

    TYPE = MsgType.ASSIGN
    PAYLOAD = True
    samples: int
    ring: RingPlace | None = None

    @classmethod
    def from_header(cls, h: _Fields) -> Assign:
        ring = h.h.get("ring")
        if ring is not None:
            ring = RingPlace.from_header(_Fields("ASSIGN ring", h.mapping("ring")))
        return cls(h.integer("samples", 1, 1 << 40), ring)


@dataclass(frozen=True, slots=True)
class NodeShare:
    """One node's part of the allocation: its layer, the weighted ranges it computes
    (``local``) and the ones its subtree answers for (``responsibility``)."""

    layer: int
    local: tuple[tuple[int, int, float], ...]
    responsibility: tuple[tuple[int, int, float], ...]

    def to_wire(self) -> list:
        return [self.layer, [list(r) for r in self.local], [list(r) for r in self.responsibility]]


def pack_allocation(shares: dict[str, NodeShare]) -> bytes:
    """ASSIGN's payload."""
    return msgpack.packb({name: share.to_wire() for name, share in shares.items()})


def parse_allocation(payload, samples: int) -> dict[str, NodeShare]:
    """ASSIGN's payload, checked: node name -> NodeShare with ranges inside the batch."""
    try:
        doc = msgpack.unpackb(payload, max_array_len=1 << 24, max_map_len=1 << 24,
                              max_str_len=1 << 10, max_bin_len=0, max_ext_len=0)
    except Exception as e:  # noqa: BLE001 -- msgpack raises several types for bad input
        raise ProtocolError(f"ASSIGN: undecodable allocation: {e}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("ASSIGN: the allocation must be a map of node names")
    out = {}
    for name, share in doc.items():
        if (not isinstance(name, str) or not isinstance(share, list) or len(share) != 3
                or type(share[0]) is not int):
            raise ProtocolError(f"ASSIGN: allocation entry {name!r} must be [layer, local, responsibility]")
        out[name] = NodeShare(share[0], _ranges("ASSIGN", name, share[1], samples),
                              _ranges("ASSIGN", name, share[2], samples))
    return out


def _ranges(what: str, name, value, samples: int) -> tuple[tuple[int, int, float], ...]:
    if not isinstance(value, list):
        raise ProtocolError(f"{what}: ranges of {name!r} must be a list")
    out = []
    for r in value:
        if (not isinstance(r, list) or len(r) != 3 or type(r[0]) is not int
                or type(r[1]) is not int or type(r[2]) not in (int, float)
                or not math.isfinite(r[2]) or not 0 <= r[0] <= r[1] <= samples):
            raise ProtocolError(f"{what}: range {r!r} of {name!r} is not [start, stop, weight] "
                                f"within 0..{samples} with a finite weight")
        out.append((r[0], r[1], float(r[2])))
    return tuple(out)


# ---------------------------------------------------------------- steps (tree links)

@dataclass(frozen=True, slots=True)
class _Piece(Message):
    """Fields every piece of a step's vector carries: which step, which chunk, and the
    whole vector's length and dtype (so a receiver can check it against the step's)."""

    step: int
    chunk: int
    total: int
    dtype: str

    PAYLOAD = True

    def header(self) -> dict[str, Any]:   # written out: the hot path's message
        return {"step": self.step, "chunk": self.chunk, "total": self.total, "dtype": self.dtype}

    @classmethod
    def from_header(cls, h: _Fields):
        # The hot path (every chunk of every step): the fields checked inline; anything
        # off takes the field-by-field checks, which name what is wrong.
        d = h.h
        step, chunk, total, dtype = d.get("step"), d.get("chunk"), d.get("total"), d.get("dtype")
        if (type(step) is int and type(chunk) is int and type(total) is int
                and 0 <= step <= MAX_STEP and 0 <= chunk <= 1 << 40 and 1 <= total <= 1 << 40
                and type(dtype) is str and dtype in _DTYPES):   # (a list would not hash)
            return cls(step, chunk, total, dtype)
        return cls(h.integer("step"), h.integer("chunk", 0, 1 << 40), h.integer("total", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES))


@dataclass(frozen=True, slots=True)
class Chunk(_Piece):
    """child -> parent: chunk ``chunk`` of the child's coded message for ``step``."""

    TYPE = MsgType.CHUNK


@dataclass(frozen=True, slots=True)
class Result(_Piece):
    """parent -> child: chunk ``chunk`` of the step's full gradient."""

    TYPE = MsgType.RESULT


class FailKind(str, enum.Enum):
    """Who a FAIL is about."""

    TREE = "tree"           # down: the master decided it: the same StepFailed everywhere
    LOCAL = "local"         # down: a node cut off from the master gave up on it for its subtree
    STALL = "stall"         # up: the child cannot deliver its part (a straggler)
    MISMATCH = "mismatch"   # down: the child's vector does not fit the tree's
    REFUSED = "refused"     # down: the step is outside the parent's window
    LOST = "lost"           # down: decided, but the parent no longer holds its outcome


@dataclass(frozen=True, slots=True)
class Fail(Message):
    """either way: ``step`` cannot complete, and why (``kind``, ``reason``)."""

    TYPE = MsgType.FAIL
    step: int
    reason: str
    kind: FailKind = FailKind.TREE

    @classmethod
    def from_header(cls, h: _Fields) -> Fail:
        kind = h.text("kind", choices=tuple(k.value for k in FailKind))
        return cls(h.integer("step"), h.reason(), FailKind(kind))


@dataclass(frozen=True, slots=True)
class Open(Message):
    """child -> parent: ``step`` has begun in my subtree. The master's clock for a step
    starts when it begins anywhere, so every process waiting on it is answered in time."""

    TYPE = MsgType.OPEN
    step: int

    @classmethod
    def from_header(cls, h: _Fields) -> Open:
        return cls(h.integer("step"))


class Phase(str, enum.Enum):
    """The two halves of ring allreduce."""

    REDUCE = "rs"    # reduce-scatter
    GATHER = "ag"    # all-gather


_PHASES = {p.value: p for p in Phase}   # Phase(x) costs two Python calls per frame


@dataclass(frozen=True, slots=True)
class PeerHello(Message):
    """ring predecessor -> successor, first frame: I am rank ``rank`` (``nonce``: as HELLO's)."""

    TYPE = MsgType.PEER_HELLO
    rank: int
    nonce: bytes | None = None

    @classmethod
    def from_header(cls, h: _Fields) -> PeerHello:
        return cls(h.integer("rank", 0, 1 << 16), h.opt_blob("nonce", NONCE_BYTES))


@dataclass(frozen=True, slots=True)
class Challenge(Message):
    """acceptor -> dialer, with a cluster secret: my nonce, and my MAC over the handshake
    (proof that I hold the secret); answer with PROOF."""

    TYPE = MsgType.CHALLENGE
    nonce: bytes
    mac: bytes

    @classmethod
    def from_header(cls, h: _Fields) -> Challenge:
        return cls(h.blob("nonce", NONCE_BYTES), h.blob("mac", MAC_BYTES))


@dataclass(frozen=True, slots=True)
class Proof(Message):
    """dialer -> acceptor: my MAC over the handshake; only then is my hello acted on."""

    TYPE = MsgType.PROOF
    mac: bytes

    @classmethod
    def from_header(cls, h: _Fields) -> Proof:
        return cls(h.blob("mac", MAC_BYTES))


@dataclass(frozen=True, slots=True)
class PeerWelcome(Message):
    """ring successor -> predecessor: segments may flow."""

    TYPE = MsgType.PEER_WELCOME

    @classmethod
    def from_header(cls, h: _Fields) -> PeerWelcome:
        return cls()


@dataclass(frozen=True, slots=True)
class Segment(Message):
    """ring predecessor -> successor: part ``part`` of segment ``segment`` of ``phase``,
    round ``round``."""

    TYPE = MsgType.SEGMENT
    PAYLOAD = True
    EMPTY_PAYLOAD = True     # a ring of more workers than the vector has elements
    step: int
    phase: Phase
    round: int
    segment: int
    total: int
    dtype: str
    part: int = 0            # which of the segment's pipelined parts (ring_parts)

    def header(self) -> dict[str, Any]:   # written out: the ring's hot path
        return {"step": self.step, "phase": self.phase.value, "round": self.round,
                "segment": self.segment, "total": self.total, "dtype": self.dtype, "part": self.part}

    @classmethod
    def from_header(cls, h: _Fields) -> Segment:
        # The ring's hot path: checked inline, or field by field when anything is off.
        d = h.h
        step, phase, rnd, segment = d.get("step"), d.get("phase"), d.get("round"), d.get("segment")
        total, dtype, part = d.get("total"), d.get("dtype"), d.get("part", 0)
        if (type(step) is int and type(rnd) is int and type(segment) is int
                and type(total) is int and type(part) is int and 0 <= step <= MAX_STEP
                and 0 <= rnd <= 1 << 16 and 0 <= segment <= 1 << 16 and 1 <= total <= 1 << 40
                and 0 <= part <= 1 << 16 and type(dtype) is str and dtype in _DTYPES
                and type(phase) is str and phase in _PHASES):
            return cls(step, _PHASES[phase], rnd, segment, total, dtype, part)
        return cls(h.integer("step"), Phase(h.text("phase", choices=("rs", "ag"))),
                   h.integer("round", 0, 1 << 16), h.integer("segment", 0, 1 << 16),
                   h.integer("total", 1, 1 << 40), h.text("dtype", choices=DTYPE_NAMES),
                   h.integer("part", 0, 1 << 16) if "part" in h.h else 0)


# ---------------------------------------------------------------- the local client (Unix socket)

@dataclass(frozen=True, slots=True)
class ClientHello(Message):
    """training process -> daemon, first frame."""

    TYPE = MsgType.CLIENT_HELLO
    pid: int
    job: str = ""          # the training job it belongs to; "" joins whatever job runs

    @classmethod
    def from_header(cls, h: _Fields) -> ClientHello:
        return cls(h.integer("pid", 0, 1 << 31), h.text("job", 256) if "job" in h.h else "")


@dataclass(frozen=True, slots=True)
class ClientWelcome(Message):
    """daemon -> training process, once the tree has assigned this host its share."""

    TYPE = MsgType.CLIENT_WELCOME
    assignment: dict
    tree_step: int
    answer_within: float        # seconds within which the daemon answers every request
    token: str = ""             # names this process when it hands over its shared memory

    @classmethod
    def from_header(cls, h: _Fields) -> ClientWelcome:
        a = _Fields("CLIENT_WELCOME assignment", h.mapping("assignment"))
        samples = a.integer("samples", 1, 1 << 40)
        assignment = {"name": a.text("name"), "layer": a.integer("layer", 0, 16), "samples": samples,
                      "workers": a.integer("workers", 1, 1 << 31),
                      "ranges": _ranges("CLIENT_WELCOME", "assignment", a.h.get("ranges"),
                                        samples)}
        if "processes" in a.h:   # --local-processes: which of this host's processes it is
            processes = a.integer("processes", 1, 1 << 10)
            assignment.update(processes=processes, process=a.integer("process", 0, processes - 1))
        return cls(assignment, h.integer("tree_step", -1), h.number("answer_within", 0.0, 1e7),
                   h.text("token", 64) if "token" in h.h else "")


@dataclass(frozen=True, slots=True)
class Attach(Message):
    """training process -> daemon, alone on a connection of its own and with the shared
    memory's descriptor attached (SCM_RIGHTS): map it for the process whose CLIENT_WELCOME
    carried ``token`` (two halves of ``capacity``). The answer comes on that process's
    connection."""

    TYPE = MsgType.ATTACH
    token: str
    capacity: int

    @classmethod
    def from_header(cls, h: _Fields) -> Attach:
        return cls(h.text("token", 64), h.integer("capacity", 1, 1 << 40))


@dataclass(frozen=True, slots=True)
class Attached(Message):
    """daemon -> training process: the shared memory is mapped."""

    TYPE = MsgType.ATTACHED

    @classmethod
    def from_header(cls, h: _Fields) -> Attached:
        return cls()


@dataclass(frozen=True, slots=True)
class Submit(Message):
    """training process -> daemon: my local gradient for ``step`` is in shared memory."""

    TYPE = MsgType.SUBMIT
    step: int
    length: int
    dtype: str

    def header(self) -> dict[str, Any]:   # once per step: written out
        return {"step": self.step, "length": self.length, "dtype": self.dtype}

    @classmethod
    def from_header(cls, h: _Fields):
        return cls(h.integer("step"), h.integer("length", 1, 1 << 40), h.text("dtype", choices=DTYPE_NAMES))


@dataclass(frozen=True, slots=True)
class Fetch(Submit):
    """training process -> daemon: the result of ``step``; I contribute nothing to it."""

    TYPE = MsgType.FETCH


@dataclass(frozen=True, slots=True)
class Done(Message):
    """daemon -> training process: the result of ``step`` is in shared memory."""

    TYPE = MsgType.DONE
    step: int
    tree_step: int

    def header(self) -> dict[str, Any]:   # once per step: written out
        return {"step": self.step, "tree_step": self.tree_step}

    @classmethod
    def from_header(cls, h: _Fields) -> Done:
        return cls(h.integer("step"), h.integer("tree_step", -1))


@dataclass(frozen=True, slots=True)
class ClientError(Message):
    """daemon -> training process: a request failed; ``kind`` says which exception."""

    TYPE = MsgType.ERROR
    reason: str
    kind: ErrorKind
    step: int | None = None
    tree_step: int = -1        # the newest step the master decided, as this daemon knows it
    tree_wide: bool = True     # FAILED: decided by the master for every process

    @classmethod
    def from_header(cls, h: _Fields) -> ClientError:
        kind = h.text("kind", choices=tuple(k.value for k in ErrorKind))
        return cls(h.reason(), ErrorKind(kind), h.opt_integer("step"), h.integer("tree_step", -1),
                   h.flag("tree_wide", default=True))

    def exception(self) -> CrnetError:
        return self.kind.exception(self.reason, self.step, self.tree_step, self.tree_wide)


@dataclass(frozen=True, slots=True)
class StatsRequest(Message):
    """training process -> daemon: the counters, please."""

    TYPE = MsgType.STATS

    @classmethod
    def from_header(cls, h: _Fields) -> StatsRequest:
        return cls()


@dataclass(frozen=True, slots=True)
class StatsReply(Message):
    """daemon -> training process: counters and where the node stands."""

    TYPE = MsgType.STATS_REPLY
    stats: dict
    name: str | None
    state: str
    tree_step: int
    open_steps: tuple[int, ...]
    links: dict              # parent: up?, children: [up? per slot], successor/predecessor: up?

    @classmethod
    def from_header(cls, h: _Fields) -> StatsReply:
        steps = h.h.get("open_steps")
        if not isinstance(steps, list) or any(type(s) is not int for s in steps):
            raise ProtocolError("STATS_REPLY: field 'open_steps' must be a list of integers")
        return cls(h.mapping("stats"), h.opt_text("name"), h.text("state"),
                   h.integer("tree_step", -1), tuple(steps), h.mapping("links"))


@dataclass(frozen=True, slots=True)
class Watch(Message):
    """training process -> daemon: send DECIDED once ``step`` is decided (``wait_finished``)."""

    TYPE = MsgType.WATCH
    step: int

    @classmethod
    def from_header(cls, h: _Fields) -> Watch:
        return cls(h.integer("step"))


@dataclass(frozen=True, slots=True)
class Decided(Message):
    """daemon -> training process: ``step`` is decided; its outcome is one request away."""

    TYPE = MsgType.DECIDED
    step: int
    tree_step: int

    @classmethod
    def from_header(cls, h: _Fields) -> Decided:
        return cls(h.integer("step"), h.integer("tree_step", -1))


# ---------------------------------------------------------------- broadcasts

MAX_KEY = 256                   # characters of a broadcast's key


def state_key(nonce: int) -> str:
    """The key of the broadcast that answers state request ``nonce`` (WANT_STATE)."""
    return f"state/{nonce}"


@dataclass(frozen=True, slots=True)
class Bcast(Message):
    """A piece of broadcast ``key``: bytes ``offset``.. of a ``total`` x ``dtype`` vector.
    Up (child -> parent): from the process that sent it (``origin``, chosen by its daemon),
    toward the master; down (parent -> child): the master's copy, to every node. ``step``
    is what the sender says the vector belongs to (a state: the step it was taken after)."""

    TYPE = MsgType.BCAST
    PAYLOAD = True
    key: str
    origin: int
    step: int
    offset: int
    total: int
    dtype: str

    @classmethod
    def from_header(cls, h: _Fields) -> Bcast:
        return cls(h.text("key", MAX_KEY), h.integer("origin"), h.integer("step", -1),
                   h.integer("offset", 0, 1 << 48), h.integer("total", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES))


@dataclass(frozen=True, slots=True)
class WantState(Message):
    """Up (and training process -> daemon): a process that joined a running job wants a
    peer's state, as broadcast ``state/<nonce>``. Down: the master asks every process."""

    TYPE = MsgType.WANT_STATE
    nonce: int

    @classmethod
    def from_header(cls, h: _Fields) -> WantState:
        return cls(h.integer("nonce", 1))


@dataclass(frozen=True, slots=True)
class Publish(Message):
    """training process -> daemon: send the vector in my shared input to every process of
    the job as broadcast ``key`` (``step``: what it belongs to, -1 if nothing)."""

    TYPE = MsgType.PUBLISH
    key: str
    step: int
    length: int
    dtype: str

    @classmethod
    def from_header(cls, h: _Fields) -> Publish:
        return cls(h.text("key", MAX_KEY), h.integer("step", -1), h.integer("length", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES))


@dataclass(frozen=True, slots=True)
class Receive(Message):
    """training process -> daemon: broadcast ``key`` into my shared output once it is here."""

    TYPE = MsgType.RECEIVE
    key: str
    length: int
    dtype: str

    @classmethod
    def from_header(cls, h: _Fields) -> Receive:
        return cls(h.text("key", MAX_KEY), h.integer("length", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES))


@dataclass(frozen=True, slots=True)
class Delivered(Message):
    """daemon -> training process: broadcast ``key`` was taken (PUBLISH) or is in shared
    memory (RECEIVE); ``step`` is what its sender said it belongs to."""

    TYPE = MsgType.DELIVERED
    key: str
    step: int

    @classmethod
    def from_header(cls, h: _Fields) -> Delivered:
        return cls(h.text("key", MAX_KEY), h.integer("step", -1))


@dataclass(frozen=True, slots=True)
class Barrier(Message):
    """Barrier ``key`` of ``processes`` training processes. Up (and training process ->
    daemon, with ``arrived`` 1): ``arrived`` of them are at it in this subtree. Down: all
    are (``arrived == processes``): go on."""

    TYPE = MsgType.BARRIER
    key: str
    arrived: int
    processes: int

    @classmethod
    def from_header(cls, h: _Fields) -> Barrier:
        processes = h.integer("processes", 1, 1 << 20)
        return cls(h.text("key", MAX_KEY), h.integer("arrived", 0, processes), processes)


# ---------------------------------------------------------------- crnet status

STATUS_STATES = ("joined", "joining", "reconnecting", "missing", "silent", "unreachable")
MAX_STATUS_DEADLINE = 30.0


@dataclass(frozen=True, slots=True)
class StatusHello(Message):
    """``crnet status`` -> a node's --listen, first frame (``nonce``: as HELLO's)."""

    TYPE = MsgType.STATUS_HELLO
    nonce: bytes | None = None

    @classmethod
    def from_header(cls, h: _Fields) -> StatusHello:
        return cls(h.opt_blob("nonce", NONCE_BYTES))


@dataclass(frozen=True, slots=True)
class StatusRequest(Message):
    """``crnet status`` -> node, or parent -> child: your subtree's state within
    ``deadline`` seconds, as answer ``id``."""

    TYPE = MsgType.STATUS
    id: int
    deadline: float

    @classmethod
    def from_header(cls, h: _Fields) -> StatusRequest:
        return cls(h.integer("id", 0, 1 << 62), h.number("deadline", 0.0, MAX_STATUS_DEADLINE))


@dataclass(frozen=True, slots=True)
class StatusReply(Message):
    """node -> whoever asked: ``node``, its subtree's state (``status_entry``)."""

    TYPE = MsgType.STATUS_REPLY
    id: int
    node: dict

    @classmethod
    def from_header(cls, h: _Fields) -> StatusReply:
        return cls(h.integer("id", 0, 1 << 62), status_entry(h.mapping("node"), depth=0))


def status_entry(entry: dict, depth: int) -> dict:
    """One node of a STATUS_REPLY, checked field by field, with its children (at most
    16 layers deep). The parent also checks that the names are its child's subtree's
    (``crnet/node/status.py``)."""
    f = _Fields("STATUS_REPLY node", entry)
    if depth > 16:
        raise ProtocolError("STATUS_REPLY: more than 16 layers")
    host = f.opt_text("host", MAX_HOST_ID)
    if host is not None and check_host_id(host):
        raise ProtocolError(f"STATUS_REPLY: field 'host': {check_host_id(host)}")
    last = entry.get("last_step_seconds")
    children = entry.get("children", [])
    if not isinstance(children, list):
        raise f._bad("children", "a list")
    return {"name": f.text("name", 256), "host": host, "address": f.opt_text("address", 300),
            "state": f.text("state", choices=STATUS_STATES),
            "tree_step": f.integer("tree_step", -1),
            "steps_done": f.integer("steps_done"),
            "last_step_seconds": None if last is None else f.number("last_step_seconds", 0, 1e9),
            "straggled": f.opt_integer("straggled", 0, 1 << 20),
            "recent": f.opt_integer("recent", 0, 1 << 20),
            "children": [status_entry(_entry_map(c), depth + 1) for c in children]}


def _entry_map(value) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError("STATUS_REPLY: a node must be a map")
    return value


# ---------------------------------------------------------------- parsing

_CLASSES: dict[MsgType, type[Message]] = {
    cls.TYPE: cls for cls in (Hello, Welcome, Refuse, Joined, Job, Assign, Chunk, Result, Fail, Open,
                              PeerHello, PeerWelcome, Challenge, Proof, Segment, ClientHello, ClientWelcome,
                              Attach, Attached, Submit, Fetch, Done, ClientError, StatsRequest,
                              StatsReply, Watch, Decided, Bcast, WantState, Publish, Receive,
                              Delivered, Barrier, StatusHello, StatusRequest, StatusReply)
}


def parse(msg_type: MsgType, header: dict, nbytes: int) -> Message:
    """The typed message a frame holds; ProtocolError (naming the field) if it is not one."""
    cls = _CLASSES[msg_type]
    if cls.PAYLOAD and nbytes == 0 and not cls.EMPTY_PAYLOAD:
        raise ProtocolError(f"{msg_type.name} without a payload")
    if not cls.PAYLOAD and nbytes:
        raise ProtocolError(f"{msg_type.name} with a payload of {nbytes} bytes")
    return cls.from_header(_Fields(msg_type, header))


Parser = Callable[[MsgType, dict, int], Message]
