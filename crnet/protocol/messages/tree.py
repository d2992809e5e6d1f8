"""The tree links' messages (TCP, child <-> parent): joining, the authentication
handshake every TCP link shares (``crnet.protocol.auth``), and the pieces of a step."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ...coding.plan import SCHEMES, Tree
from ...defaults import LOCAL_PROCESSES_MAX
from ...dtypes import DTYPE_NAMES, DTYPES
from ...errors import ProtocolError
from ..auth import MAC_BYTES, NONCE_BYTES
from ..fields import MAX_HOST_ID, MAX_STEP, Fields, check_address, check_host_id
from ..wire import MsgType
from .base import Message

CODE_KINDS = ("auto", "frc", "crc")
BEYOND_S = ("fail", "approximate")
SPREAD_SUMS = ("ring", "direct")   # spread: its sum round the ring of ranks, or from each owner
MAX_PEERS = 1 << 16   # hosts a spread tree may have (peers in JOINED and ASSIGN)


@dataclass(frozen=True, slots=True)
class Hello(Message):
    """child -> parent, first frame: the slot it wants (``name``; None: any free one)
    and where it listens for its own children and ring predecessor (``listen``);
    ``nonce``: its half of the authentication (``crnet.protocol.auth``), with a cluster secret;
    ``host``: its host's stable identity: a node without ``name`` gets the slot that
    host had before (``node/join/membership.py``)."""

    TYPE = MsgType.HELLO
    BEFORE_AUTH = True
    name: str | None = None
    listen: str | None = None
    nonce: bytes | None = None
    host: str | None = None

    @classmethod
    def from_header(cls, h: Fields) -> Hello:
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
    local_processes: int = 1        # training processes on every host (the master's --local-processes)
    beyond_s: str = "fail"          # the master's --beyond-s
    patience: float | None = None   # the master's --patience (None: derived at each parent)
    spread_sum: str = "ring"        # the master's --spread-sum

    @property
    def tree(self) -> Tree:
        return Tree(self.fanout, self.stragglers)

    @classmethod
    def from_header(cls, h: Fields) -> Welcome:
        total = h.opt_integer("total", 1, 1 << 40)
        dtype = None if h.h.get("dtype") is None else h.text("dtype", choices=DTYPE_NAMES)
        if (total is None) != (dtype is None):
            raise ProtocolError("WELCOME: fields 'total' and 'dtype' come together")
        msg = cls(h.text("name"), h.integer("layer", 1, 16), h.integers("fanout", 1, 1 << 16),
                  h.integers("stragglers", 0, 1 << 16), h.text("code", choices=CODE_KINDS),
                  h.integer("chunk_bytes", 0, 1 << 31), h.text("scheme", choices=SCHEMES),
                  h.integer("tree_step", -1), total, dtype,
                  h.text("job", 256) if "job" in h.h else "",
                  h.integer("local_processes", 1, LOCAL_PROCESSES_MAX) if "local_processes" in h.h
                  else 1,
                  h.text("beyond_s", choices=BEYOND_S) if "beyond_s" in h.h else "fail",
                  _patience(h),
                  h.text("spread_sum", choices=SPREAD_SUMS) if "spread_sum" in h.h else "ring")
        try:
            tree = msg.tree
        except ValueError as e:
            raise ProtocolError(f"WELCOME: fields 'fanout'/'stragglers': {e}") from None
        if msg.layer > tree.layers or msg.name not in tree or tree.layer(msg.name) != msg.layer:
            raise ProtocolError(f"WELCOME: field 'name' {msg.name!r} is not a layer-{msg.layer} "
                                f"node of the tree {tree}")
        return msg


def _approx(h: Fields) -> tuple[float, float] | None:
    v = h.h.get("approx")
    if v is None:
        return None
    if (not isinstance(v, list) or len(v) != 2
            or any(type(x) not in (int, float) or not -1e18 < x < 1e18 for x in v)):
        raise h.bad("approx", "[mass or coverage, residual], two finite numbers")
    return float(v[0]), float(v[1])


def _patience(h: Fields) -> float | None:
    v = h.h.get("patience")
    if v is None:
        return None
    if type(v) not in (int, float) or not 0 < v <= 1e6:
        raise h.bad("patience", "a number of seconds in (0, 1e6]")
    return float(v)


@dataclass(frozen=True, slots=True)
class Refuse(Message):
    """parent -> child (or ring successor -> predecessor): why not; then it closes.
    ``retry``: the refusal is temporary (the parent has not joined yet, ...). ``to`` and
    ``name`` (with ``retry``): the tree has moved this host (MOVE): it joins at ``to``
    as ``name``."""

    TYPE = MsgType.REFUSE
    reason: str
    retry: bool = False
    to: str | None = None
    name: str | None = None

    @classmethod
    def from_header(cls, h: Fields) -> Refuse:
        to, name = h.opt_text("to"), h.opt_text("name")
        if (to is None) != (name is None):
            raise ProtocolError("REFUSE: fields 'to' and 'name' come together")
        if to is not None:
            _addresses(h, "to", [to])
        return cls(h.reason(), h.flag("retry"), to, name)


@dataclass(frozen=True, slots=True)
class Move(Message):
    """parent -> child, down the whole tree, between jobs (``--plan auto``, ``node/join/replan.py``):
    the tree takes another shape. Each entry is a host: its name now, its name in the new
    tree, where it joins (its new parent's address; None: the master's, which a child of
    the master fills in: it dials the master) and where it listens (how a host that
    restarts is found: ``Refuse.to``)."""

    TYPE = MsgType.MOVE
    moves: tuple[tuple[str, str, str | None, str | None], ...]

    @classmethod
    def from_header(cls, h: Fields) -> Move:
        v = h.h.get("moves")
        if (not isinstance(v, list) or len(v) > MAX_PEERS
                or any(not isinstance(e, list) or len(e) != 4
                       or any(not isinstance(x, str) or len(x) > 256 for x in e[:2])
                       or any(x is not None and not isinstance(x, str) for x in e[2:]) for e in v)):
            raise h.bad("moves", f"a list of at most {MAX_PEERS} [name, new name, parent "
                                 "address or nil, listen address or nil]")
        _addresses(h, "moves", [a for e in v for a in e[2:]])
        return cls(tuple((a, b, c, d) for a, b, c, d in v))


@dataclass(frozen=True, slots=True)
class Joined(Message):
    """child -> parent: how many workers of its subtree (itself included) have joined, and
    the newest step the master decided that it knows (a restarted master resumes after it)."""

    TYPE = MsgType.JOINED
    workers: int
    tree_step: int = -1
    job: str = ""
    # spread: where each node of the subtree below listens, (name, address) pairs, so that
    # the master can tell every host where every other one is (ASSIGN's ``peers``).
    peers: tuple[tuple[str, str], ...] = ()
    # spread with --tls-names: each node's host id below, (name, host id) pairs (ASSIGN's
    # ``hosts``); empty otherwise (and from daemons before it).
    hosts: tuple[tuple[str, str], ...] = ()
    # The tree's vector layout as the child knows it (the last result's), like WELCOME's:
    # a restarted master takes the one s + 1 children say (``Membership._children_vector``).
    total: int | None = None
    dtype: str | None = None

    @classmethod
    def from_header(cls, h: Fields) -> Joined:
        hosts = _pairs(h, "hosts", addresses=False) if "hosts" in h.h else ()
        bad = next((b for _, b in hosts if check_host_id(b)), None)
        if bad is not None:
            raise ProtocolError(f"JOINED: field 'hosts': {check_host_id(bad)}")
        total = h.opt_integer("total", 1, 1 << 40)
        dtype = None if h.h.get("dtype") is None else h.text("dtype", choices=DTYPE_NAMES)
        if (total is None) != (dtype is None):
            raise ProtocolError("JOINED: fields 'total' and 'dtype' come together")
        return cls(h.integer("workers", 0, 1 << 31), h.integer("tree_step", -1),
                   h.text("job", 256) if "job" in h.h else "",
                   _pairs(h, "peers") if "peers" in h.h else (), hosts, total, dtype)

    @property
    def vector(self) -> tuple[int, str] | None:
        return None if self.total is None or self.dtype is None else (self.total, self.dtype)


def _pairs(h: Fields, name: str, addresses: bool = True) -> tuple[tuple[str, str], ...]:
    v = h.h.get(name)
    what = "address" if addresses else "host id"
    if (not isinstance(v, list) or len(v) > MAX_PEERS
            or any(not isinstance(p, list) or len(p) != 2 or any(not isinstance(x, str) or len(x) > 256
                                                                 for x in p) for p in v)):
        raise h.bad(name, f"a list of at most {MAX_PEERS} [name, {what}] pairs")
    if addresses:
        _addresses(h, name, [b for _, b in v])
    return tuple((a, b) for a, b in v)


def _addresses(h: Fields, name: str, addresses: list) -> None:
    """Where peers listen, as a peer says: each one a host:port a node could dial."""
    for address in addresses:
        bad = None if address is None else check_address(address)
        if bad:
            raise ProtocolError(f"{h.what}: field {name!r}: {bad}")


@dataclass(frozen=True, slots=True)
class Job(Message):
    """Up: ``attached`` training processes of job ``name`` are attached in this subtree
    (when it is not the job the parent runs and ``attached`` > 0: they wait for it, and
    the master starts it if no process of the running job is attached). Down: the tree
    now runs job ``name`` (the previous job's steps and results are dropped); with
    ``refused``: the job that cannot start while ``name`` has processes attached."""

    TYPE = MsgType.JOB
    name: str
    attached: int = 0
    refused: str = ""

    @classmethod
    def from_header(cls, h: Fields) -> Job:
        return cls(h.text("name", 256), h.opt_integer("attached", 0, 1 << 31) or 0,
                   h.opt_text("refused", 256) or "")


@dataclass(frozen=True, slots=True)
class RingPlace:
    """Part of ASSIGN (rar): a worker's rank, the ring's size, where its successor and its
    predecessor listen (the predecessor's, to confirm its link: ``node/peers/mesh.py``). The ring
    is the N workers (ranks 0..N-1) and the master (rank N); the last worker's successor and
    worker 0's predecessor are None: the master, at the address it dials as its parent."""

    rank: int
    size: int
    successor: str | None
    predecessor: str | None = None

    def header(self) -> dict[str, Any]:
        return {"rank": self.rank, "size": self.size, "successor": self.successor,
                "predecessor": self.predecessor}

    @classmethod
    def from_header(cls, h: Fields) -> RingPlace:
        size = h.integer("size", 2, 1 << 16)
        successor, predecessor = h.opt_text("successor"), h.opt_text("predecessor")
        _addresses(h, "successor", [successor])
        _addresses(h, "predecessor", [predecessor])
        return cls(h.integer("rank", 0, size - 2), size, successor, predecessor)


@dataclass(frozen=True, slots=True)
class Assign(Message):
    """parent -> child: the batch size, the ring place (rar), and in the payload the
    allocation of the child's whole subtree (``crnet.protocol.allocation``)."""

    TYPE = MsgType.ASSIGN
    PAYLOAD = True
    samples: int
    ring: RingPlace | None = None
    # spread: where every node listens, by rank (``Tree.names()`` order); None where the
    # master does not know (itself: a child of the master puts its parent's address there).
    peers: tuple[str | None, ...] = ()
    # spread with --tls-names: every node's host id, by rank as ``peers`` (None: a rank the
    # master left out, ``node/peers/identity.py``); empty otherwise.
    hosts: tuple[str | None, ...] = ()

    @classmethod
    def from_header(cls, h: Fields) -> Assign:
        ring = h.h.get("ring")
        if ring is not None:
            ring = RingPlace.from_header(Fields("ASSIGN ring", h.mapping("ring")))
        peers = h.h.get("peers", [])
        if (not isinstance(peers, list) or len(peers) > MAX_PEERS
                or any(p is not None and (not isinstance(p, str) or len(p) > 256) for p in peers)):
            raise h.bad("peers", f"a list of at most {MAX_PEERS} addresses (or nil)")
        _addresses(h, "peers", peers)
        hosts = h.h.get("hosts", [])
        if (not isinstance(hosts, list) or len(hosts) > MAX_PEERS
                or any(x is not None and (not isinstance(x, str) or check_host_id(x)) for x in hosts)):
            raise h.bad("hosts", f"a list of at most {MAX_PEERS} host ids (or nil)")
        return cls(h.integer("samples", 1, 1 << 40), ring, tuple(peers), tuple(hosts))

@dataclass(frozen=True, slots=True)
class Challenge(Message):
    """acceptor -> dialer, with a cluster secret: my nonce, and my MAC over the handshake
    (proof that I hold the secret); answer with PROOF."""

    TYPE = MsgType.CHALLENGE
    nonce: bytes
    mac: bytes

    @classmethod
    def from_header(cls, h: Fields) -> Challenge:
        return cls(h.blob("nonce", NONCE_BYTES), h.blob("mac", MAC_BYTES))


@dataclass(frozen=True, slots=True)
class Proof(Message):
    """dialer -> acceptor: my MAC over the handshake; only then is my hello acted on."""

    TYPE = MsgType.PROOF
    BEFORE_AUTH = True
    mac: bytes

    @classmethod
    def from_header(cls, h: Fields) -> Proof:
        return cls(h.blob("mac", MAC_BYTES))

# ---------------------------------------------------------------- steps

@dataclass(frozen=True, slots=True)
class _Piece(Message):
    """Fields every piece of a step's vector carries: which step, which chunk, and the
    whole vector's length and dtype (so a receiver can check it against the step's)."""

    step: int
    chunk: int
    total: int
    dtype: str
    # An approximate step's (crnet.coding.approximate), on one of its pieces (the first that
    # holds for it; a CHUNK again if it changes): CHUNK (the sender's effective mass,
    # residual), RESULT (coverage, residual). Exact steps' pieces carry nothing more.
    approx: tuple[float, float] | None = None

    PAYLOAD = True

    def header(self) -> dict[str, Any]:   # written out: the hot path's message
        if self.approx is not None:
            return {"step": self.step, "chunk": self.chunk, "total": self.total,
                    "dtype": self.dtype, "approx": list(self.approx)}
        return {"step": self.step, "chunk": self.chunk, "total": self.total, "dtype": self.dtype}

    @classmethod
    def from_header(cls, h: Fields):
        # The hot path (every chunk of every step): the fields checked inline; anything
        # off takes the field-by-field checks, which name what is wrong.
        d = h.h
        step, chunk, total, dtype = d.get("step"), d.get("chunk"), d.get("total"), d.get("dtype")
        if (type(step) is int and type(chunk) is int and type(total) is int
                and 0 <= step <= MAX_STEP and 0 <= chunk <= 1 << 40 and 1 <= total <= 1 << 40
                and type(dtype) is str and dtype in DTYPES   # (a list would not hash)
                and "approx" not in d):
            return cls(step, chunk, total, dtype)
        return cls(h.integer("step"), h.integer("chunk", 0, 1 << 40), h.integer("total", 1, 1 << 40),
                   h.text("dtype", choices=DTYPE_NAMES), _approx(h))


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
    def from_header(cls, h: Fields) -> Fail:
        kind = h.text("kind", choices=tuple(k.value for k in FailKind))
        return cls(h.integer("step"), h.reason(), FailKind(kind))


@dataclass(frozen=True, slots=True)
class Open(Message):
    """child -> parent: ``step`` has begun in my subtree. The master's clock for a step
    starts when it begins anywhere, so every process waiting on it is answered in time."""

    TYPE = MsgType.OPEN
    step: int

    @classmethod
    def from_header(cls, h: Fields) -> Open:
        return cls(h.integer("step"))
