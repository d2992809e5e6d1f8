"""``dist.init_process_group("crnet")``: crnet as a ``torch.distributed`` backend.

Importing ``crnet.torch`` registers the backend. Each process connects to its host's
crnetd (``$CRNET_CLIENT_SOCKET``, else the default socket, as ``crnet.Client`` does),
checks that the daemons expect the processes torch started, and waits at a barrier until
every process of the world is attached. It works under torchrun (``RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` for torch's store)
and under ``crnet run``, which sets the same variables.

**Ranks.** torch's ``RANK`` and crnet's place for a process are independent, and need
not agree: torchrun numbers hosts in the order they joined its rendezvous, crnet by
the tree (master, then layer by layer), and a host's daemon seats its K processes in
the order they connected (``Assignment.process``). Nothing needs them to agree:

- the *gradient* goes through crnet steps (``register_crnet_hook``), where each process
  computes the share crnet gave it (``CodedSampler`` reads ``client.assignment``), so
  the tree's sum is the global batch's whatever torch's ranks are;
- every *other* collective (broadcast, allgather, allreduce, barrier) goes through
  crnet broadcasts and barriers keyed by torch's rank (``exact_collectives``): the root
  of ``dist.broadcast(t, src=r)`` is rank r wherever crnet seated it, named to the
  daemons by its crnet rank, which every process tells the others through torch's store
  when the group is made (so each takes rank r's copy only, from rank r's host).

What must agree is the count: ``LOCAL_WORLD_SIZE`` (torchrun's ``--nproc-per-node K``)
must be the daemon's ``--local-processes``, and ``WORLD_SIZE`` the tree's hosts times K
(with or without a process on the master's host); otherwise ``init_process_group``
raises a ``RuntimeError`` that says which.

**Jobs.** Under ``crnet run`` the job is ``$CRNET_JOB``. Under torchrun, rank 0 names a
fresh job and the others read it from torch's store, so every launch (and every
restart of the whole group by torchrun) is a new crnet job, starting at step 0.

**What it carries.** Exact collectives of CPU or CUDA tensors of any dtype: ``broadcast``,
``allreduce`` and ``allreduce_coalesced`` (SUM, AVG, PRODUCT, MIN, MAX), ``allgather``
(so ``all_gather_object``), ``all_gather_into_tensor`` and ``barrier``. An allreduce is an
allgather plus the reduction on every process: made for what DDP's setup and training
code exchange (shapes, a loss to log), not for gradients, which go through
``register_crnet_hook``. Other operations raise a ``RuntimeError`` naming these. CUDA
tensors go down to pinned host memory and their results back up (crnet.torch.staging);
the tensors of one call must be on one device.
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..client import Client
from ..client.aio import client_socket_path
from ..errors import DaemonBusy
from ..protocol.messages.local import MAX_JOB
from .exact_collectives import ExactCollectives
from .staging import HostStaging, one_device

NAME = "crnet"
SUPPORTED = ("broadcast, all_reduce (SUM, AVG, PRODUCT, MIN, MAX), all_gather, "
             "all_gather_object, all_gather_into_tensor, barrier")
_created = itertools.count()      # process groups this process made: numbers their keys

_REDUCTIONS = {
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max",
}


class _Done(dist.Work):
    """The work of a collective that already happened (the client's calls block; a CUDA
    result's copies up are queued on the current stream, before whatever runs after)."""

    def __init__(self, result: Any, device: torch.device | None = None):
        super().__init__()
        devices: list[int | str | torch.device] | None = (
            None if device is None or device.type == "cpu" else [device])
        self._future: torch.futures.Future[Any] = torch.futures.Future(devices=devices)
        self._future.set_result(result)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[Any]:
        return self._future


def _unsupported(what: str) -> RuntimeError:
    return RuntimeError(f"the crnet process group does not support {what}; it supports {SUPPORTED} "
                        "(gradients: crnet.torch.register_crnet_hook)")


def _checked(tensors: Sequence[torch.Tensor], what: str) -> torch.device:
    """The one device of a call's tensors (a ValueError if several); none may be sparse."""
    for t in tensors:
        if t.is_sparse:
            raise _unsupported(f"sparse tensors ({what})")
    return one_device(tensors, f"the tensors of {what}")


def _reduce(parts: list[torch.Tensor], op: str) -> torch.Tensor:
    """One reduction of every rank's tensor, in rank order: the same bits everywhere."""
    acc = parts[0].clone()
    for p in parts[1:]:
        if op in ("sum", "avg"):
            acc += p
        elif op == "product":
            acc *= p
        elif op == "min":
            torch.minimum(acc, p, out=acc)
        else:
            torch.maximum(acc, p, out=acc)
    if op == "avg":
        acc /= len(parts)
    return acc


class CrnetProcessGroup(dist.ProcessGroup):
    """The world's process group on crnet (see the module). ``client`` is this process's
    connection to its daemon: ``crnet.torch.register_crnet_hook`` takes it from here."""

    def __init__(self, client: Client, rank: int, size: int, prefix: str, timeout: float,
                 crnet_ranks: Sequence[int]):
        super().__init__(rank, size)  # type: ignore[call-arg]  # the stubs miss this overload
        self.client = client
        self.ops = ExactCollectives(client, rank, size, prefix, timeout, crnet_ranks)
        self.staging = HostStaging()      # CUDA tensors' way to the host and back

    def getBackendName(self) -> str:
        return NAME

    # ---- what it carries (torch's stubs type these as overloads of its own: hence the ignores)
    # CPU tensors are their own host tensors (self.staging hands them back untouched)
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:  # type: ignore[override]
        device = _checked(tensors, "broadcast")
        st, root, mine = self.staging, opts.rootRank, opts.rootRank == self.rank()
        host = st.down(tensors) if mine else st.room(tensors)
        self.ops.broadcast(host, root)
        if not mine:
            st.up(tensors, host)
        return _Done(tensors, device)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:  # type: ignore[override]
        device = _checked(tensors, "all_reduce")
        reduce_op = opts if isinstance(opts, dist.ReduceOp) else opts.reduceOp
        op = next((name for k, name in _REDUCTIONS.items() if reduce_op == k), None)
        if op is None:
            raise _unsupported(f"all_reduce with {getattr(reduce_op, 'op', reduce_op)}")
        for t in tensors:
            if op == "avg" and not (t.is_floating_point() or t.is_complex()):
                raise RuntimeError(f"all_reduce with AVG of a {t.dtype} tensor: use SUM, or a "
                                   "floating point tensor")
        host = self.staging.down(tensors)
        got = self.ops.allgather(host)
        with torch.no_grad():
            for i, t in enumerate(host):
                t.copy_(_reduce([g[i] for g in got], op))
        self.staging.up(tensors, host)
        return _Done(tensors, device)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:  # type: ignore[override]
        return self.allreduce(tensors, opts)

    def allgather(self, outputs: list[list[torch.Tensor]],  # type: ignore[override]
                  inputs: list[torch.Tensor], opts: Any = None) -> dist.Work:
        flat = [out for outs in outputs for out in outs]
        device = _checked([*inputs, *flat], "all_gather")
        got = self.ops.allgather(self.staging.down(inputs))     # copies: the buffer is free
        host = self.staging.room(flat)
        with torch.no_grad():
            at = 0
            for i, outs in enumerate(outputs):
                for r in range(len(outs)):
                    host[at].copy_(got[r][i])
                    at += 1
        self.staging.up(flat, host)
        return _Done(outputs, device)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        device = _checked([input, output], "all_gather_into_tensor")
        got = self.ops.allgather(self.staging.down([input]))
        host = self.staging.room([output])
        with torch.no_grad():
            host[0].copy_(torch.cat([g[0].reshape(-1) for g in got]).view(output.shape))
        self.staging.up([output], host)
        return _Done([output], device)

    _allgather_base = all_gather_single

    def barrier(self, opts: Any = None) -> dist.Work:
        self.ops.barrier()
        return _Done(None)

    # ---- what it does not
    def allgather_into_tensor_coalesced(self, *args: Any) -> dist.Work:
        raise _unsupported("all_gather_into_tensor_coalesced")

    def alltoall_base(self, *args: Any) -> dist.Work:
        raise _unsupported("all_to_all")

    def alltoall(self, *args: Any) -> dist.Work:
        raise _unsupported("all_to_all")

    def reduce_scatter(self, *args: Any) -> dist.Work:
        raise _unsupported("reduce_scatter")

    def reduce_scatter_tensor_coalesced(self, *args: Any) -> dist.Work:
        raise _unsupported("reduce_scatter")

    def _reduce_scatter_base(self, *args: Any) -> dist.Work:
        raise _unsupported("reduce_scatter_tensor")

    def reduce_scatter_single(self, *args: Any) -> dist.Work:
        raise _unsupported("reduce_scatter_tensor")

    def all_to_all_single(self, *args: Any) -> dist.Work:
        raise _unsupported("all_to_all_single")

    def reduce(self, *args: Any) -> dist.Work:
        raise _unsupported("reduce (use all_reduce)")

    def gather(self, *args: Any) -> dist.Work:
        raise _unsupported("gather (use all_gather)")

    def scatter(self, *args: Any) -> dist.Work:
        raise _unsupported("scatter (use broadcast)")

    def send(self, *args: Any) -> dist.Work:
        raise _unsupported("send (point-to-point)")

    def recv(self, *args: Any) -> dist.Work:
        raise _unsupported("recv (point-to-point)")

    def recv_anysource(self, *args: Any) -> dist.Work:
        raise _unsupported("recv (point-to-point)")


def _job(store: dist.Store, rank: int, created: int) -> str:
    """``$CRNET_JOB``, else a fresh name rank 0 gives the others through torch's store."""
    job = os.environ.get("CRNET_JOB")
    if job:
        return job
    key = f"crnet/job/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{created}"
    if rank == 0:
        store.set(key, f"torch-{secrets.token_hex(6)}")
    raw = store.get(key)
    job = raw.decode("ascii", errors="replace")
    if not (0 < len(raw) <= MAX_JOB and job.isprintable() and job.isascii()):
        raise RuntimeError(f"torch's store holds {raw[:64]!r} as the crnet job's name ({key}): "
                           f"not a name rank 0 gave (set $CRNET_JOB, or keep other jobs off "
                           "this MASTER_ADDR:MASTER_PORT)")
    return job


def _crnet_ranks(store: dist.Store, rank: int, size: int, created: int, client: Client) -> list[int]:
    """crnet's rank of every torch rank, through torch's store: the roots the collectives
    name (``ExactCollectives``). Anyone who reaches the store can write it, so what it says
    is checked: numbers, each a crnet rank of this world (the tree's, host by host: from
    the master's host's first if the world has it), each once; and then through crnet
    itself (``ExactCollectives.check_ranks``, once the group is made)."""
    key = f"crnet/rank/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{created}"
    a = client.assignment
    store.set(f"{key}/{rank}", str(a.rank))
    said = [store.get(f"{key}/{r}") for r in range(size)]
    first = 0 if size == (a.workers + 1) * a.processes else a.processes
    ranks = []
    for r, raw in enumerate(said):
        text = raw.decode("ascii", errors="replace")
        if not (text.isdigit() and len(text) < 10):
            raise RuntimeError(f"torch's store holds {raw[:64]!r} as rank {r}'s crnet rank "
                               f"({key}/{r}), not a number: is another job on this "
                               "MASTER_ADDR:MASTER_PORT?")
        ranks.append(int(text))
    if sorted(ranks) != list(range(first, first + size)):
        raise RuntimeError(f"torch's store maps the {size} ranks to crnet ranks {ranks}, not to "
                           f"{first}..{first + size - 1} once each ({key}/*): is another job on "
                           "this MASTER_ADDR:MASTER_PORT?")
    return ranks


def _check_counts(client: Client, size: int) -> None:
    """The daemons expect the processes torch started: a RuntimeError saying what differs."""
    a = client.assignment
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local is not None and int(local) != a.processes:
        raise RuntimeError(
            f"crnetd at {client_socket_path(None)} serves {a.processes} training process(es) per host "
            f"(--local-processes {a.processes}) but this host runs LOCAL_WORLD_SIZE={local}: "
            f"start crnetd with --local-processes {local}, or torchrun with "
            f"--nproc-per-node {a.processes}")
    if size not in (a.workers * a.processes, (a.workers + 1) * a.processes):
        raise RuntimeError(
            f"the crnet tree has {a.workers} worker hosts (and a master) with {a.processes} "
            f"process(es) each, so its world is {a.workers * a.processes} processes (or "
            f"{(a.workers + 1) * a.processes} with the master's host), but WORLD_SIZE={size}")


def _connect(rank: int, job: str) -> Client:
    try:
        return Client(job=job)
    except DaemonBusy as e:
        raise DaemonBusy(f"{e} (rank {rank}: does this host run more processes than its crnetd's "
                         "--local-processes, i.e. torchrun's --nproc-per-node?)") from None


def create(store: dist.Store, rank: int, size: int, timeout: timedelta) -> CrnetProcessGroup:
    """The backend's constructor (``Backend.register_backend``): the world's group."""
    created = next(_created)
    if created and dist.is_initialized():
        raise RuntimeError("the crnet process group is the world's only: dist.new_group is not "
                           "supported with the crnet backend")
    client = _connect(rank, _job(store, rank, created))
    try:
        _check_counts(client, size)
        pg = CrnetProcessGroup(client, rank, size, f"crnet.torch/pg{created}",
                               timeout.total_seconds(), _crnet_ranks(store, rank, size, created, client))
        pg.ops.barrier()          # every process is attached before anything else
        pg.ops.check_ranks()
    except BaseException:
        client.close()
        raise
    return pg


def register() -> None:
    """Register the backend (importing ``crnet.torch`` does): ``init_process_group("crnet")``."""
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, create, devices=["cpu", "cuda"])


def group_client(group: Any = None) -> Client:
    """The crnet client of ``group`` (default: the world's), for ``CodedSampler`` and
    ``register_crnet_hook``; a ValueError if it is not a crnet group."""
    pg = group if group is not None else dist.group.WORLD
    if not isinstance(pg, CrnetProcessGroup):
        raise ValueError("not a crnet process group: call dist.init_process_group('crnet') "
                         "first (or pass the crnet Client yourself)")
    return pg.client
