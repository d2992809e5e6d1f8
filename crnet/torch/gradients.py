"""The parameters' gradients as views into the client's shared memory: backward writes
where the daemon reads, and the update reads where the daemon writes the result."""

from __future__ import annotations

import numpy as np
import torch

from ..client import Client
from .dtypes import WIRE_DTYPES, common_dtype
from .staging import HostStaging, one_device


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.nbytes == b.nbytes)


class SharedGradients:
    """The gradients of ``params`` (one dtype, float32 or float64, one device) as one flat
    vector: the client's shared input (``input``, ``client.buffer``) for backward, its
    shared output (``output``, ``client.result_buffer``) for the update.

    On the CPU every ``.grad`` is a view: ``input`` until the allreduce, then ``output``.
    A ``.grad`` that is not the view (set to None or replaced) is copied, and GPU
    gradients go through host memory: ``copied_bytes`` counts both. With ``views=False``
    the ``.grad`` tensors stay whoever's they are (DDP's: its buckets own them) and are
    copied in (``gather``, or ``take`` and ``taken``) and out (``scatter``, ``give``).

    On a GPU (``staging``, crnet.torch.staging) the gradient goes down into a pinned
    mirror of the flat vector (queued copies, one wait), from there into ``input``; the
    result from ``output`` into the mirror, and up (queued copies).
    """

    def __init__(self, params: list[torch.Tensor], client: Client, views: bool = True):
        self.params = params
        self.client = client
        self.dtype = common_dtype(params, "parameters")
        self.np_dtype = WIRE_DTYPES[self.dtype]
        self.device = one_device(params, "parameters")
        self.staging = HostStaging()
        self.on_host = not self.staging.needed(params)
        self.views = views and self.on_host   # .grad is a view into the shared memory
        self.numel = sum(p.numel() for p in params)
        self.copied_bytes = 0          # client-side copies between backward and the network

    def bind(self) -> None:
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
        if self.views:
            for p, v in zip(self.params, self._in_views):
                p.grad = v

    def refresh(self) -> None:
        """Rebind if the client's shared memory moved: it grows (a new mapping) when a
        bigger vector goes through it, e.g. the state sync's."""
        c = self.client
        if not (_same_memory(c.buffer(self.numel, self.np_dtype), self.input)
                and _same_memory(c.result_buffer(self.numel, self.np_dtype), self.output)):
            self.bind()

    def zero(self) -> None:
        """Zero the gradients where backward will accumulate them: the shared input."""
        self.refresh()
        if self.views:
            self._input_t.zero_()
            for p, v in zip(self.params, self._in_views):
                if p.grad is not v:
                    p.grad = v
        else:
            for p in self.params:
                if p.grad is not None:
                    p.grad.zero_()

    def gather(self) -> None:
        """Make sure the shared input holds every gradient (on the CPU it already does)."""
        if not self.on_host:
            for i, p in enumerate(self.params):
                if p.grad is None:
                    self._mirror(i).zero_()
                else:
                    self.take(i, p.grad)
            self.taken()
            return
        for p, v, w in zip(self.params, self._in_views, self._out_views):
            g = p.grad
            if g is v:
                continue
            if g is None:
                v.zero_()
            elif self.views and g is w:
                raise RuntimeError("the previous step's gradient is still in .grad: call "
                                   "zero_grad() of the DistributedOptimizer before backward")
            else:
                v.copy_(g)                 # replaced or not ours on the CPU, or device -> host
                self.copied_bytes += v.numel() * v.element_size()
            if self.views:
                p.grad = v

    def scatter(self, samples: float) -> None:
        """The sum of ``samples`` samples' gradients -> their mean, in ``.grad``."""
        self._output_t.div_(samples)
        if not self.on_host:
            grads = []
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.empty_like(p)
                grads.append(p.grad)
            self.give(list(enumerate(grads)))
            return
        for p, w in zip(self.params, self._out_views):
            if self.views:
                if p.grad is not w:
                    p.grad = w
            else:
                if p.grad is None:
                    p.grad = torch.empty_like(p)
                p.grad.copy_(w)            # into .grad: on the device, or not ours
                self.copied_bytes += w.numel() * w.element_size()

    # ---- one gradient at a time (the DDP hook: its buckets, as backward fills them)
    def take(self, i: int, g: torch.Tensor) -> None:
        """Parameter ``i``'s gradient ``g`` into the shared input; on a GPU queued into the
        mirror: ``taken`` finishes."""
        if self.on_host:
            self._in_views[i].copy_(g)
        else:
            self.staging.to_host(self._mirror(i), g)
        self.copied_bytes += g.numel() * g.element_size()

    def taken(self) -> None:
        """Every gradient was taken: on a GPU, wait for the copies, mirror -> shared input."""
        if self.on_host:
            return
        self.staging.wait(self.device)
        self._input_t.copy_(self._mirror())
        self.copied_bytes += self.numel * self._input_t.element_size()

    def give(self, entries: list[tuple[int, torch.Tensor]]) -> None:
        """The result (the shared output) of parameter ``i`` into ``g``, for each ``(i, g)``."""
        if self.on_host:
            for i, g in entries:
                g.copy_(self._out_views[i])
                self.copied_bytes += g.numel() * g.element_size()
            return
        self._mirror().copy_(self._output_t)        # after the copies up that read it
        self.copied_bytes += self.numel * self._output_t.element_size()
        for i, g in entries:
            self.staging.to_device(g, self._mirror(i))
            self.copied_bytes += g.numel() * g.element_size()
        self.staging.queued(self.device)

    def _mirror(self, i: int | None = None) -> torch.Tensor:
        """The pinned mirror of the flat vector (``i``: parameter ``i``'s part, shaped
        like it), free for the host (staging.HostStaging.flat)."""
        flat = self.staging.flat(self.numel, self.dtype)      # allocated once, then the same
        if i is None:
            return flat
        v = self._in_views[i]
        at = v.storage_offset() - self._input_t.storage_offset()
        return flat[at:at + v.numel()].view(v.shape)
