"""Where an optimizer's state sits in one float64 vector, the same on every replica."""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .staging import HostStaging


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


class OptimizerLayout:
    """Where an optimizer's state sits in one float64 vector, the same on every replica.

    The layout must not depend on whether a replica has state yet (a new process has
    none; Adam creates it at its first step). Horovod's trick: run one step with zero
    gradients to create the state, then overwrite it. Here that step runs on a *probe*:
    the same optimizer class over zero copies of the parameters, so it learns what a
    step creates (keys, shapes, dtypes) without moving any real parameter (a zero-grad
    step still moves them under weight decay or momentum) or touching real state. Per
    parameter the vector holds a has-state flag and then every entry the probe has; then
    each parameter group's numeric options (``lr``, ``betas``, ...; a scheduler changes
    them). The probe costs one extra copy of the parameters and state each time a layout
    is learned: whoever keeps the layout (``ReplicaState``) learns it once.
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
        # An LR scheduler wraps ``step`` in an attribute of the optimizer object, bound to
        # it: copied, the probe's step would step the real optimizer.
        probe.__dict__.pop("step", None)
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

    def _state_tensors(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """The optimizer's state tensors that have a tensor slot, in the vector's order."""
        out = []
        for p, slots in zip(self.params, self.slots):
            state = optimizer.state.get(p) or {}
            out += [state[s.key] for s in slots
                    if s.kind == "tensor" and isinstance(state.get(s.key), torch.Tensor)]
        return out

    def pack(self, optimizer: torch.optim.Optimizer, dest: np.ndarray,
             staging: HostStaging | None = None) -> None:
        """``staging``: CUDA state tensors go down through it, all at once."""
        host: dict[int, torch.Tensor] = {}    # a CUDA state tensor's values on the host
        if staging is not None:     # (Adam's step counter stays on the CPU: not staged)
            tensors = [t for t in self._state_tensors(optimizer) if staging.staged(t)]
            host = {id(t): h for t, h in zip(tensors, staging.down(tensors, "the optimizer's state"))}
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
                    t = host.get(id(state[s.key]), state[s.key])
                    flat[at:at + s.size].copy_(t.detach().reshape(-1))
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

    def unpack(self, optimizer: torch.optim.Optimizer, src: np.ndarray,
               staging: HostStaging | None = None) -> None:
        """Overwrite every state tensor (in place where it exists) and value from ``src``;
        ``staging``: CUDA state tensors come up through it, all at once."""
        ups: list[tuple[torch.Tensor, torch.Tensor]] = []     # (CUDA state tensor, its values)
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
                        fits = (isinstance(old, torch.Tensor) and old.shape == s.shape
                                and old.dtype == s.dtype)
                        if staging is not None and staging.staged(old if fits else p):
                            if not fits:
                                old = state[s.key] = torch.empty(s.shape, dtype=s.dtype, device=p.device)
                            ups.append((old, part))
                        elif fits:
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
            if ups and staging is not None:
                targets = [t for t, _ in ups]
                host = staging.room(targets, "the optimizer's state")
                for h, (_, part) in zip(host, ups):
                    h.copy_(part)
                staging.up(targets, host)
        assert at == self.size

