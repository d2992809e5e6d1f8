"""The messages between a daemon and its training process (the Unix socket, ``crnet.client``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...dtypes import DTYPE_NAMES
from ...errors import CrnetError, ErrorKind, ProtocolError
from ..allocation import check_ranges
from ..fields import Fields
from ..wire import MsgType
from .base import Message

MAX_JOB = 256     # characters of a job's name (JOB, WELCOME and ASSIGN carry it too)


@dataclass(frozen=True, slots=True)
class ClientHello(Message):
    """training process -> daemon, first frame."""

    TYPE = MsgType.CLIENT_HELLO
    pid: int
    job: str = ""          # the training job it belongs to; "" joins whatever job runs

    @classmethod
    def from_header(cls, h: Fields) -> ClientHello:
        return cls(h.integer("pid", 0, 1 << 31), h.text("job", MAX_JOB) if "job" in h.h else "")


@dataclass(frozen=True, slots=True)
class ClientWelcome(Message):
    """daemon -> training process, once the tree has assigned this host its share."""

    TYPE = MsgType.CLIENT_WELCOME
    assignment: dict
    tree_step: int
    answer_within: float        # seconds within which the daemon answers every request
    token: str = ""             # names this process when it hands over its shared memory

    @classmethod
    def from_header(cls, h: Fields) -> ClientWelcome:
        a = Fields("CLIENT_WELCOME assignment", h.mapping("assignment"))
        samples = a.integer("samples", 1, 1 << 40)
        assignment = {"name": a.text("name"), "layer": a.integer("layer", 0, 16), "samples": samples,
                      "workers": a.integer("workers", 1, 1 << 31),
                      "ranges": check_ranges("CLIENT_WELCOME", "assignment", a.h.get("ranges"),
                                        samples)}
        if "processes" in a.h:   # --local-processes: which of this host's processes it is
            processes = a.integer("processes", 1, 1 << 10)
            assignment.update(processes=processes, process=a.integer("process", 0, processes - 1))
        if "rank" in a.h:        # its place among every process of the tree
            assignment["rank"] = a.integer("rank", 0, 1 << 31)
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
    def from_header(cls, h: Fields) -> Attach:
        return cls(h.text("token", 64), h.integer("capacity", 1, 1 << 40))


@dataclass(frozen=True, slots=True)
class Attached(Message):
    """daemon -> training process: the shared memory is mapped."""

    TYPE = MsgType.ATTACHED

    @classmethod
    def from_header(cls, h: Fields) -> Attached:
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
    def from_header(cls, h: Fields):
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
    approx: tuple[float, float] | None = None   # an approximate result: (coverage, residual)

    def header(self) -> dict[str, Any]:   # once per step: written out
        if self.approx is not None:
            return {"step": self.step, "tree_step": self.tree_step, "approx": list(self.approx)}
        return {"step": self.step, "tree_step": self.tree_step}

    @classmethod
    def from_header(cls, h: Fields) -> Done:
        v = h.h.get("approx")
        if v is not None and (not isinstance(v, list) or len(v) != 2
                              or any(type(x) not in (int, float) for x in v)):
            raise h.bad("approx", "[coverage, residual]")
        return cls(h.integer("step"), h.integer("tree_step", -1),
                   None if v is None else (float(v[0]), float(v[1])))


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
    def from_header(cls, h: Fields) -> ClientError:
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
    def from_header(cls, h: Fields) -> StatsRequest:
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
    def from_header(cls, h: Fields) -> StatsReply:
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
    def from_header(cls, h: Fields) -> Watch:
        return cls(h.integer("step"))


@dataclass(frozen=True, slots=True)
class Decided(Message):
    """daemon -> training process: ``step`` is decided; its outcome is one request away."""

    TYPE = MsgType.DECIDED
    step: int
    tree_step: int

    @classmethod
    def from_header(cls, h: Fields) -> Decided:
        return cls(h.integer("step"), h.integer("tree_step", -1))
