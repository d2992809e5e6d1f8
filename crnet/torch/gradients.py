"""The parameters' gradients as views into the client's shared memory: backward writes
where the daemon reads, and the update reads where the daemon writes the result."""

from __future__ import annotations

import numpy as np
import torch

from ..client import Client
from .dtypes import WIRE_DTYPES, common_dtype


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
    copied in (``gather``) and out (``scatter``), as on a GPU.
    """

    def __init__(self, params: list[torch.Tensor], client: Client, views: bool = True):
        self.params = params
        self.client = client
        self.dtype = common_dtype(params, "parameters")
        self.np_dtype = WIRE_DTYPES[self.dtype]
        devices = {p.device for p in params}
        if len(devices) > 1:
            raise ValueError(f"parameters on several devices ({', '.join(map(str, devices))}): "
                             "crnet.torch reduces one flat vector")
        self.device = devices.pop()
        self.on_host = self.device.type == "cpu"
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

    def slot(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Parameter ``i``'s part of the shared input and of the shared output, shaped like
        it (call ``refresh`` first: the shared memory may have moved)."""
        return self._in_views[i], self._out_views[i]

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
        for p, w in zip(self.params, self._out_views):
            if self.views:
                if p.grad is not w:
                    p.grad = w
            else:
                if p.grad is None:
                    p.grad = torch.empty_like(p)
                p.grad.copy_(w)            # into .grad: on the device, or not ours
                self.copied_bytes += w.numel() * w.element_size()
