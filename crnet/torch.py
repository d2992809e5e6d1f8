"""PyTorch training on a crnet tree: ``pip install 'crnet[torch]'``.

::

    from crnet import Client
    from crnet.torch import CodedSampler, DistributedOptimizer, weighted_loss

    c = Client()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, c)
    sampler = CodedSampler(dataset, c, seed=0)
    while opt.step_index < steps:
        indices, weights = sampler.local(opt.step_index)    # this process's coded share
        opt.zero_grad()
        for idx, w in opt.micro_batches(indices, weights, size=32):   # stops once the tree is done
            x, y = dataset[idx]
            weighted_loss(loss_fn(model(x), y), w).backward()    # loss_fn(..., reduction="none")
        opt.step()     # the global batch's mean gradient, the same on every replica

The pieces, and why each is there:

- ``CodedSampler``: CodedReduce gives every process *batch positions* with coding
  weights (``Assignment.ranges``); ``crnet.batches.BatchSampler`` maps positions to
  data set indices the same way on every host. The sampler hands out both.
- ``weighted_loss``: the process must contribute ``sum_i w_i * grad(loss_i)`` (weights
  may be negative or above 1: the share is coded); the gradient of ``sum_i w_i loss_i``
  is exactly that, so one ``backward`` computes it.
- ``DistributedOptimizer``: the parameters' ``.grad`` are views into the client's
  shared input (``Client.buffer``), so backward writes straight into memory the daemon
  reads, and the result lands in the shared output (``Client.result_buffer``), which
  ``.grad`` views for the update: no copy on this side (see the class for the
  exceptions). It numbers the steps, takes the tree's result for a step the tree
  finished without this process, skips a step that failed tree-wide, and resynchronises
  a replica that may have missed an update from a peer.
- ``broadcast_parameters`` / ``broadcast_optimizer_state``: one process's tensors to
  all (a checkpoint), and the state a process that starts mid-job takes from a peer.
- ``allreduce`` / ``result``: the client's calls, with tensors in and out.

crnet carries float32 and float64 vectors; other dtypes get a TypeError that says what
to do. The core package never imports this module (torch is an optional extra).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .batches import BatchSampler
from .client import Assignment, Client
from .errors import (
    AssignmentChanged,
    CrnetError,
    DaemonNotRunning,
    JobEnded,
    StepFailed,
    StepLost,
    StepRefused,
)

__all__ = [
    "CodedSampler",
    "DistributedOptimizer",
    "allreduce",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "result",
    "weighted_loss",
]

log = logging.getLogger(__name__)

# The dtypes crnet's wire carries, as torch and numpy spell them.
WIRE_DTYPES: dict[torch.dtype, np.dtype] = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
}


def wire_dtype(dtype: torch.dtype, what: str = "tensor") -> np.dtype:
    """The numpy dtype crnet sends for ``dtype``; a TypeError that says what to do otherwise."""
    found = WIRE_DTYPES.get(dtype)
    if found is not None:
        return found
    if dtype in (torch.bfloat16, torch.float16):
        advice = ("keep the parameters in float32 (model.float()) and run the forward pass "
                  f"under torch.autocast(..., dtype={dtype}): the gradients are then float32")
    else:
        advice = "convert it with .to(torch.float32) or .to(torch.float64)"
    raise TypeError(f"crnet reduces float32 and float64 vectors; this {what} is {dtype}: {advice}")


def _common_dtype(tensors: Sequence[torch.Tensor], what: str) -> torch.dtype:
    dtypes = sorted({t.dtype for t in tensors}, key=str)
    if len(dtypes) > 1:
        raise TypeError(f"crnet reduces one flat vector of one dtype, but the {what} mix "
                        f"{', '.join(map(str, dtypes))}: convert the model with "
                        "model.to(torch.float32) (or torch.float64)")
    wire_dtype(dtypes[0], what)
    return dtypes[0]


# ---------------------------------------------------------------- data


class CodedSampler:
    """This process's samples of each step, and their coding weights, for a torch data set.

    Built on ``crnet.batches.BatchSampler`` (``seed`` shared by every process): step ``t``'s
    global batch is the same on every host, a fresh permutation each epoch. With a
    ``Client`` it follows ``client.assignment``, so a re-formed tree's new share
    (``AssignmentChanged``) is used from the next ``local`` on.
    """

    def __init__(self, dataset: Any, source: Client | Assignment, seed: int = 0):
        """``dataset``: anything with ``len`` (a ``torch.utils.data.Dataset``), or its size."""
        self.dataset_size = dataset if isinstance(dataset, int) else len(dataset)
        self.seed = seed
        self._source = source
        self._batches: BatchSampler | None = None

    @property
    def assignment(self) -> Assignment:
        src = self._source
        return src if isinstance(src, Assignment) else src.assignment

    @property
    def batches(self) -> BatchSampler:
        """The global batches (rebuilt if the tree's batch size changed)."""
        m = self.assignment.samples
        if self._batches is None or self._batches.batch_size != m:
            self._batches = BatchSampler(self.dataset_size, m, self.seed)
        return self._batches

    def local(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(data set indices, weights): this process's coded share of ``step``'s batch.

        The gradient this process contributes is ``sum_i weights[i] * grad(loss of sample
        indices[i])``: see ``weighted_loss``. Weights are float64 (cast to the loss's dtype
        there)."""
        a = self.assignment
        idx, weights = self.batches.local(step, a)
        return torch.from_numpy(idx), torch.from_numpy(np.ascontiguousarray(weights, np.float64))

    def global_batch(self, step: int) -> torch.Tensor:
        """The data set indices of ``step``'s whole global batch (every process agrees)."""
        return torch.from_numpy(self.batches.indices(step))


def weighted_loss(losses: torch.Tensor, weights: torch.Tensor | np.ndarray | Sequence[float]
                  ) -> torch.Tensor:
    """``sum_i weights[i] * losses[i]``: its gradient is this process's coded share.

    ``losses`` holds one loss per sample, as a loss function computes it with
    ``reduction="none"`` (reduce any further dimensions per sample yourself, e.g.
    ``.mean(dim=1)``, so that the mean over the batch is the loss you mean to train on).
    Sum, not mean: the tree adds the shares up to the global batch's *sum*, and
    ``DistributedOptimizer.step`` divides by the global batch size, so the update is
    that of the mean loss over the global batch.
    """
    if losses.dim() != 1:
        raise ValueError(f"weighted_loss takes one loss per sample (shape (B,)), got shape "
                         f"{tuple(losses.shape)}: compute the loss with reduction='none' and "
                         "reduce each sample's further dimensions first (e.g. .mean(dim=1))")
    w = torch.as_tensor(weights).to(dtype=losses.dtype, device=losses.device)
    if w.shape != losses.shape:
        raise ValueError(f"{losses.shape[0]} losses but {w.numel()} weights")
    return (losses * w).sum()


# ---------------------------------------------------------------- tensors in, tensors out


def _host_array(t: torch.Tensor) -> np.ndarray:
    """A flat numpy view of a CPU tensor (a copy only if it is not contiguous)."""
    return t.detach().contiguous().numpy().reshape(-1)


def allreduce(client: Client, tensor: torch.Tensor, step: int, out: torch.Tensor | None = None,
              timeout: float | None = None) -> torch.Tensor:
    """``client.allreduce`` with a tensor: the sum over the tree, shaped like ``tensor``.

    A CPU tensor is handed over as a numpy view (``Client.allreduce`` copies it into the
    shared input, unless it *is* the shared input: ``torch.from_numpy(client.buffer(n,
    dtype))``). The result is a new CPU tensor, or lands in ``out`` (a CPU tensor; pass
    ``torch.from_numpy(client.result_buffer(n, dtype))`` and nothing is copied). A GPU
    tensor goes through host memory: one copy to the host, the result copied back to its
    device (and into ``out`` if given).
    """
    wire_dtype(tensor.dtype)
    host = tensor if tensor.device.type == "cpu" else tensor.detach().to("cpu")
    got = client.allreduce(_host_array(host), step, out=_out_array(out, tensor), timeout=timeout)
    return _returned(got, out, tensor)


def result(client: Client, step: int, like: torch.Tensor, out: torch.Tensor | None = None,
           timeout: float | None = None) -> torch.Tensor:
    """``client.result``: a step's sum without contributing, shaped like ``like`` (its
    values are not used). ``out`` and devices as for ``allreduce``."""
    wire_dtype(like.dtype)
    template = np.empty(like.numel(), dtype=WIRE_DTYPES[like.dtype])
    got = client.result(step, template, out=_out_array(out, like), timeout=timeout)
    return _returned(got, out, like)


def _out_array(out: torch.Tensor | None, like: torch.Tensor) -> np.ndarray | None:
    if out is None or out.device.type != "cpu":
        return None
    if out.dtype != like.dtype or out.numel() != like.numel() or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {like.dtype} tensor of {like.numel()} elements")
    return out.detach().numpy().reshape(-1)


def _returned(got: np.ndarray, out: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if out is not None:
        if out.device.type != "cpu":
            out.copy_(torch.from_numpy(got).view(out.shape))   # host -> device
        return out
    host = torch.from_numpy(got).view(like.shape)
    return host if like.device.type == "cpu" else host.to(like.device)


# ---------------------------------------------------------------- state as one vector


def _model_tensors(model: torch.nn.Module | Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """The model's state (parameters and persistent buffers), in ``state_dict`` order."""
    state = model.state_dict() if isinstance(model, torch.nn.Module) else model
    return [t for t in state.values() if isinstance(t, torch.Tensor)]


def _pack(tensors: Iterable[torch.Tensor], dest: np.ndarray) -> int:
    """Copy ``tensors`` into ``dest`` one after the other (converting the dtype); returns
    how many elements were written."""
    flat = torch.from_numpy(dest)
    at = 0
    for t in tensors:
        n = t.numel()
        flat[at:at + n].copy_(t.detach().reshape(-1))
        at += n
    return at


def _unpack(tensors: Iterable[torch.Tensor], src: np.ndarray) -> int:
    """Overwrite ``tensors`` in place from ``src`` (the inverse of ``_pack``)."""
    flat = torch.from_numpy(src)
    at = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[at:at + n].view(t.shape))
            at += n
    return at


@dataclass(frozen=True)
class _Slot:
    """One entry of a parameter's optimizer state: a tensor or a plain value."""

    key: Any
    kind: str                      # "tensor", "int", "float", "bool", "none"
    shape: tuple[int, ...] = ()
    dtype: torch.dtype | None = None

    @property
    def size(self) -> int:
        if self.kind == "none":
            return 0
        return int(np.prod(self.shape, dtype=np.int64)) if self.kind == "tensor" else 1


def _slot(key: Any, value: Any) -> _Slot:
    if isinstance(value, torch.Tensor):
        if value.is_complex():
            raise TypeError(f"optimizer state {key!r} is complex; crnet.torch syncs real state only")
        return _Slot(key, "tensor", tuple(value.shape), value.dtype)
    if value is None:
        return _Slot(key, "none")
    if isinstance(value, bool):
        return _Slot(key, "bool")
    if isinstance(value, int):
        return _Slot(key, "int")
    if isinstance(value, float):
        return _Slot(key, "float")
    raise TypeError(f"optimizer state {key!r} is a {type(value).__name__}, which crnet.torch "
                    "cannot send")


def _plain(slot: _Slot, value: float) -> Any:
    """A plain state value back from its float64 slot."""
    if slot.kind == "int":
        return round(value)
    if slot.kind == "bool":
        return bool(value)
    return value if slot.kind == "float" else None


class _OptimizerLayout:
    """Where an optimizer's state sits in one float64 vector, the same on every replica.

    The layout must not depend on whether a replica has state yet (a new process has
    none; Adam creates it at its first step). Horovod's trick: run one step with zero
    gradients to create the state, then overwrite it. Here that step runs on a *probe*:
    the same optimizer class over zero copies of the parameters, so it learns what a
    step creates (keys, shapes, dtypes) without moving any real parameter (a zero-grad
    step still moves them under weight decay or momentum) or touching real state. Per
    parameter the vector holds a has-state flag and then every entry the probe has; then
    each parameter group's numeric options (``lr``, ``betas``, ...; a scheduler changes
    them). The probe costs one extra copy of the parameters and state, once.
    """

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.slots = [[_slot(k, v) for k, v in state.items()] for state in self._probe(optimizer)]
        # (key, elements) of each group's numeric options, in key order
        self.options = [[(k, self._option_size(v)) for k, v in sorted(g.items(), key=lambda kv: str(kv[0]))
                         if k not in ("params", "param_names") and self._option_size(v)]
                        for g in optimizer.param_groups]
        self.size = (len(self.params) + sum(s.size for slots in self.slots for s in slots)
                     + sum(n for opts in self.options for _, n in opts))

    def fits(self, optimizer: torch.optim.Optimizer) -> bool:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        return len(params) == len(self.params) and all(a is b for a, b in zip(params, self.params))

    @staticmethod
    def _probe(optimizer: torch.optim.Optimizer) -> list[dict[Any, Any]]:
        groups = []
        for g in optimizer.param_groups:
            clones = []
            for p in g["params"]:
                clone = torch.zeros_like(p, memory_format=torch.preserve_format)
                if p.requires_grad:          # a parameter that never has a gradient has no state
                    clone.grad = torch.zeros_like(clone)
                clones.append(clone)
            groups.append({**g, "params": clones})
        # Every attribute of the real optimizer (an optimizer may keep more than its
        # param_groups), but its own state, parameters and fresh hook tables.
        probe = object.__new__(type(optimizer))
        probe.__dict__.update(optimizer.__dict__)
        for name in list(probe.__dict__):
            if name.startswith("_optimizer_") and name.endswith("_hooks"):
                setattr(probe, name, OrderedDict())
        probe.state = defaultdict(dict)
        probe.param_groups = groups
        with torch.no_grad():
            probe.step()
        return [dict(probe.state.get(c, {})) for g in groups for c in g["params"]]

    @staticmethod
    def _option_size(value: Any) -> int:
        if isinstance(value, bool):           # flags are configuration, the same everywhere
            return 0
        if isinstance(value, (int, float)):
            return 1
        if isinstance(value, torch.Tensor) and not value.is_complex():
            return value.numel()
        if (isinstance(value, (tuple, list)) and value
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            return len(value)
        return 0

    def pack(self, optimizer: torch.optim.Optimizer, dest: np.ndarray) -> None:
        flat = torch.from_numpy(dest)
        at = 0
        for p, slots in zip(self.params, self.slots):
            state = optimizer.state.get(p) or {}
            flat[at] = 1.0 if state else 0.0
            at += 1
            for s in slots:
                if not state:
                    flat[at:at + s.size] = 0
                elif s.key not in state:
                    raise ValueError(f"the optimizer state of a parameter has no {s.key!r} "
                                     f"(it has {sorted(map(str, state))}): crnet.torch cannot "
                                     "lay out state that varies between steps")
                elif s.kind == "tensor":
                    flat[at:at + s.size].copy_(state[s.key].detach().reshape(-1))
                elif s.kind != "none":
                    flat[at] = float(state[s.key])
                at += s.size
        for g, opts in zip(optimizer.param_groups, self.options):
            for k, n in opts:
                v = g[k]
                if self._option_size(v) != n:
                    raise ValueError(f"optimizer option {k!r} changed its size to {v!r}")
                if isinstance(v, torch.Tensor):
                    flat[at:at + n].copy_(v.detach().reshape(-1))
                else:
                    flat[at:at + n] = torch.as_tensor(v if isinstance(v, (tuple, list)) else [v],
                                                      dtype=torch.float64)
                at += n
        assert at == self.size

    def unpack(self, optimizer: torch.optim.Optimizer, src: np.ndarray) -> None:
        """Overwrite every state tensor (in place where it exists) and value from ``src``."""
        flat = torch.from_numpy(src)
        at = 0
        with torch.no_grad():
            for p, slots in zip(self.params, self.slots):
                has = flat[at].item() != 0
                at += 1
                if not has:
                    optimizer.state.pop(p, None)
                    at += sum(s.size for s in slots)
                    continue
                state = optimizer.state[p]
                for s in slots:
                    if s.kind == "tensor":
                        part = flat[at:at + s.size].view(s.shape)
                        old = state.get(s.key)
                        if (isinstance(old, torch.Tensor) and old.shape == s.shape
                                and old.dtype == s.dtype):
                            old.copy_(part)
                        else:   # a copy: state must never alias the client's shared memory
                            state[s.key] = part.to(dtype=s.dtype, device=p.device, copy=True)
                    else:
                        state[s.key] = _plain(s, flat[at].item() if s.size else 0.0)
                    at += s.size
            for g, opts in zip(optimizer.param_groups, self.options):
                for k, n in opts:
                    got = flat[at:at + n]
                    v = g[k]
                    if isinstance(v, torch.Tensor):
                        v.copy_(got.view(v.shape))
                    elif isinstance(v, (tuple, list)):
                        g[k] = type(v)(type(x)(y) for x, y in zip(v, got.tolist()))
                    else:
                        g[k] = type(v)(got.item())
                    at += n
        assert at == self.size


_layouts: weakref.WeakKeyDictionary[torch.optim.Optimizer, _OptimizerLayout] = \
    weakref.WeakKeyDictionary()


def _layout(optimizer: torch.optim.Optimizer) -> _OptimizerLayout:
    """The optimizer's layout, learned once (again if its parameters changed)."""
    found = _layouts.get(optimizer)
    if found is None or not found.fits(optimizer):
        found = _layouts[optimizer] = _OptimizerLayout(optimizer)
    return found


# ---------------------------------------------------------------- broadcasts

_keys: weakref.WeakKeyDictionary[Client, dict[str, int]] = weakref.WeakKeyDictionary()


def _next_key(client: Client, what: str) -> str:
    """``crnet.torch/<what>/<k>``, k counting this process's broadcasts of ``what``: every
    process of the job makes the same calls in the same order, so they agree."""
    counts = _keys.setdefault(client, {})
    k = counts[what] = counts.get(what, -1) + 1
    return f"crnet.torch/{what}/{k}"


def broadcast_parameters(model: torch.nn.Module | Mapping[str, torch.Tensor], client: Client,
                         root: bool, key: str | None = None, timeout: float | None = None) -> None:
    """Give every process the root's parameters and buffers (``model.state_dict()``).

    Collective: every process of the job calls it, one with ``root=True`` (e.g. the one
    that loaded the checkpoint). ``key`` names the broadcast within the job; by default
    ``crnet.torch/parameters/<k>`` with k counting this process's calls, so give it
    explicitly if the processes might not make the same calls in the same order.

    One vector of the model's dtype goes through the daemons (float64 if the model mixes
    dtypes, or uses one crnet does not carry: exact for float16/bfloat16/float32 and for
    integers up to 2**53). The root copies its tensors into its shared input, the others
    copy the result from their shared output into theirs; that is all that is copied.
    It reuses the client's shared memory, so call it at a step boundary: it overwrites the
    gradient buffer of a ``DistributedOptimizer``.
    """
    tensors = _model_tensors(model)
    if not tensors:
        raise ValueError("broadcast_parameters: the model has no tensors")
    dtypes = {t.dtype for t in tensors}
    np_dtype = np.dtype(np.float64)    # carries every real dtype a model mixes, exactly
    if len(dtypes) == 1:
        np_dtype = WIRE_DTYPES.get(dtypes.pop(), np_dtype)
    n = sum(t.numel() for t in tensors)
    key = key or _next_key(client, "parameters")
    vec = client.buffer(n, np_dtype)
    if root:
        _pack(tensors, vec)
        client.broadcast(vec, key, root=True, timeout=timeout)
    else:
        _unpack(tensors, client.broadcast(vec, key, root=False, out=client.result_buffer(n, np_dtype),
                                          timeout=timeout))


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, client: Client, root: bool,
                              key: str | None = None, timeout: float | None = None) -> None:
    """Give every process the root's optimizer state and numeric group options.

    Collective, like ``broadcast_parameters`` (keys ``crnet.torch/optimizer/<k>``). A
    process whose optimizer has no state yet gets the root's anyway (see
    ``_OptimizerLayout``: the state's shape is learned on a probe, nothing real is
    stepped); a parameter without state at the root has none anywhere afterwards. Sent
    as one float64 vector (exact for float32 state and counters up to 2**53).
    """
    layout = _layout(optimizer)
    key = key or _next_key(client, "optimizer")
    vec = client.buffer(layout.size, np.float64)
    if root:
        layout.pack(optimizer, vec)
        client.broadcast(vec, key, root=True, timeout=timeout)
    else:
        out = client.result_buffer(layout.size, np.float64)
        layout.unpack(optimizer, client.broadcast(vec, key, root=False, out=out, timeout=timeout))


# ---------------------------------------------------------------- the optimizer


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.nbytes == b.nbytes)


class DistributedOptimizer:
    """``optimizer`` with the gradient of the whole global batch, the same on every replica.

    Per step: ``zero_grad()``, backward over this process's coded share (``CodedSampler``,
    ``weighted_loss``, ``micro_batches``), ``step()``. ``step_index`` is the step the next
    ``step()`` takes part in (0 for a fresh job); pick the batch with it.

    **No copies on the CPU.** The gradients of the parameters (those of the optimizer that
    require grad, one dtype, float32 or float64) are views into one flat vector, the
    client's shared input (``client.buffer``): backward accumulates into it in place, the
    daemon reads it from there. The sum lands in the shared output
    (``client.result_buffer``, passed as ``out``); it is divided by the global batch size
    ``m`` in place and ``.grad`` views it for ``optimizer.step()`` (until the next
    ``zero_grad``). Copies happen only when a ``.grad`` is not the view (set to None or
    replaced, e.g. by ``model.zero_grad()``: copied into the buffer, counted in
    ``copied_bytes``), and for GPU parameters (see below). The client copies nothing: its
    input *is* the buffer, its ``out`` *is* the output.

    **GPU parameters** keep their ``.grad`` on the device: ``step()`` copies them to the
    shared input (one device-to-host copy per parameter) and the result back (host to
    device), both counted in ``copied_bytes``.

    **Outcomes.** ``step()`` returns True when it applied an update. The tree finished
    the step without this process: ``allreduce`` returns the tree's result at once and it
    is applied, like everyone else's. ``StepFailed`` with ``tree_wide``: every replica
    skips the step (no update; False). ``StepLost``, or a ``StepFailed`` that is not
    tree-wide (this replica may have missed an update): it takes the parameters,
    buffers and optimizer state from a peer (``Client.request_state``) and goes on after
    the step they were taken at (False). ``AssignmentChanged``: this step's gradient
    used the old share; False, and the same ``step_index`` again (``CodedSampler``
    follows the new share). Other errors propagate; if the state could not be fetched,
    the next ``step()`` tries again before anything else.

    **Peers.** At every step boundary (inside ``step()``, after the update) a replica in
    sync answers a pending state request (``Client.state_wanted``/``send_state``), so a
    process that (re)starts in the middle of a job (``client.tree_step >= 0`` when this
    is built, or ``join=True``) gets the current state at the next boundary and trains
    in lockstep from there; the constructor waits for it.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 model: torch.nn.Module | Mapping[str, torch.Tensor], client: Client, *,
                 join: bool | None = None, timeout: float | None = None):
        """``join``: fetch the state from a peer now (default: if the job is running, i.e.
        ``client.tree_step >= 0``). ``timeout``: for the client's calls (default theirs)."""
        self.optimizer = optimizer
        self.model = model
        self.client = client
        self.timeout = timeout
        self.params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if not self.params:
            raise ValueError("the optimizer has no parameter that requires grad")
        self.dtype = _common_dtype(self.params, "parameters")
        self.np_dtype = WIRE_DTYPES[self.dtype]
        devices = {p.device for p in self.params}
        if len(devices) > 1:
            raise ValueError(f"parameters on several devices ({', '.join(map(str, devices))}): "
                             "crnet.torch reduces one flat vector")
        self.device = devices.pop()
        self.on_host = self.device.type == "cpu"
        self.numel = sum(p.numel() for p in self.params)
        self.step_index = 0
        self.applied = self.skipped = self.resyncs = self.answered = self.abandoned = 0
        self.copied_bytes = 0          # client-side copies between backward and the network
        self._needs_resync = False
        self._bind()
        if join if join is not None else client.tree_step >= 0:
            self._resync()
            self._refresh()

    # ---- the flat buffers
    def _bind(self) -> None:
        """Point every ``.grad`` into the client's current shared input, zeroed."""
        n, c = self.numel, self.client
        self.input = c.buffer(n, self.np_dtype)
        self.output = c.result_buffer(n, self.np_dtype)
        self._input_t = torch.from_numpy(self.input)
        self._output_t = torch.from_numpy(self.output)
        self._in_views, self._out_views = [], []
        at = 0
        for p in self.params:
            k = p.numel()
            self._in_views.append(self._input_t[at:at + k].view(p.shape))
            self._out_views.append(self._output_t[at:at + k].view(p.shape))
            at += k
        self._input_t.zero_()
        if self.on_host:
            for p, v in zip(self.params, self._in_views):
                p.grad = v

    def _refresh(self) -> None:
        """Rebind if the client's shared memory moved: it grows (a new mapping) when a
        bigger vector goes through it, e.g. the state sync's."""
        c = self.client
        if not (_same_memory(c.buffer(self.numel, self.np_dtype), self.input)
                and _same_memory(c.result_buffer(self.numel, self.np_dtype), self.output)):
            self._bind()

    def zero_grad(self) -> None:
        """Zero the gradients where backward will accumulate them: the shared input."""
        self._refresh()
        if self.on_host:
            self._input_t.zero_()
            for p, v in zip(self.params, self._in_views):
                if p.grad is not v:
                    p.grad = v
        else:
            for p in self.params:
                if p.grad is not None:
                    p.grad.zero_()

    def micro_batches(self, indices: torch.Tensor, weights: torch.Tensor, size: int
                      ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This step's share in pieces of ``size`` samples, until the tree has finished the
        step: a process that fell behind stops computing a step the others already
        decided (``client.finished``, a shared-memory read, before each piece), and
        ``step()`` then takes the tree's result at once. ``abandoned`` counts such steps."""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        step = self.step_index
        for start in range(0, len(indices), size):
            if self.client.finished(step):
                self.abandoned += 1
                return
            yield indices[start:start + size], weights[start:start + size]

    # ---- one step
    def step(self) -> bool:
        """Reduce this step's gradient over the tree and apply the update; True if applied."""
        step = self.step_index
        if self._needs_resync:            # the last attempt failed: this gradient is stale
            self._resync()
            return False
        try:
            self._gather()
            self.client.allreduce(self.input, step, out=self.output, timeout=self.timeout)
        except AssignmentChanged:
            log.info("step %d: the tree re-assigned this host's share; redo the step", step)
            return False
        except StepFailed as e:
            if not e.tree_wide:
                log.warning("step %d failed here only (%s): resynchronising", step, e.reason)
                self._resync()
                return False
            # Every replica skips it and stays identical. The next step is step + 1, not
            # tree_step + 1: steps the tree decided since return at once (or StepLost),
            # and jumping over them would leave their updates out of this replica.
            self.skipped += 1
            self.step_index = step + 1
            self._answer(step)
            return False
        except StepLost as e:
            log.warning("step %d lost (%s): resynchronising", step, e)
            self._resync()
            return False
        except StepRefused as e:
            # Far ahead of what this host's daemon knows of the tree (it restarted, or
            # lost its parent): it learns where the tree is when it is back. Ask again.
            log.warning("step %d refused (%s): asking again shortly", step, e)
            time.sleep(0.1)
            return False
        self._scatter()
        self.optimizer.step()
        self.applied += 1
        self.step_index = step + 1
        self._answer(step)
        return True

    def _gather(self) -> None:
        """Make sure the shared input holds every gradient (on the CPU it already does)."""
        for p, v, w in zip(self.params, self._in_views, self._out_views):
            g = p.grad
            if g is v:
                continue
            if g is None:
                v.zero_()
            elif self.on_host and g is w:
                raise RuntimeError("the previous step's gradient is still in .grad: call "
                                   "zero_grad() of the DistributedOptimizer before backward")
            else:
                v.copy_(g)                 # replaced on the CPU, or device -> host
                self.copied_bytes += v.numel() * v.element_size()
            if self.on_host:
                p.grad = v

    def _scatter(self) -> None:
        """The sum -> the mean gradient of the global batch, in ``.grad``."""
        self._output_t.div_(self.client.assignment.samples)
        for p, w in zip(self.params, self._out_views):
            if self.on_host:
                if p.grad is not w:
                    p.grad = w
            else:
                if p.grad is None:
                    p.grad = torch.empty_like(p)
                p.grad.copy_(w)            # host -> device
                self.copied_bytes += w.numel() * w.element_size()

    # ---- the state, for peers
    def state_size(self) -> int:
        """Elements of the float64 state vector: model tensors, then the optimizer's."""
        return sum(t.numel() for t in _model_tensors(self.model)) + _layout(self.optimizer).size

    def pack_state(self, dest: np.ndarray) -> None:
        at = _pack(_model_tensors(self.model), dest)
        _layout(self.optimizer).pack(self.optimizer, dest[at:])

    def load_state(self, src: np.ndarray) -> None:
        at = _unpack(_model_tensors(self.model), src)
        _layout(self.optimizer).unpack(self.optimizer, src[at:])

    def _resync(self) -> None:
        """Take a peer's state (after its step ``t``) and continue at ``t + 1``."""
        self._needs_resync = True
        size = self.state_size()
        out = self.client.result_buffer(size, np.float64)
        vec, taken = self.client.request_state(out, out=out, timeout=self.timeout)
        self.load_state(vec)
        self._needs_resync = False
        self.resyncs += 1
        log.info("took a peer's state after step %d; going on at step %d", taken, taken + 1)
        self.step_index = taken + 1

    def _answer(self, step: int) -> None:
        """Send this replica's state (after ``step``) to a process that asked for it."""
        if self._needs_resync or not self.client.state_wanted():
            return
        vec = self.client.buffer(self.state_size(), np.float64)
        self.pack_state(vec)
        try:
            self.client.send_state(vec, step)
        except (DaemonNotRunning, JobEnded):
            raise
        except CrnetError as e:       # a service to a peer: it asks again if it must
            log.warning("could not send the state after step %d to a peer: %s", step, e)
            return
        self.answered += 1
