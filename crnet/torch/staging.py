"""Device tensors (CUDA) through pinned host memory: the one path every part of
``crnet.torch`` takes for them.

crnet moves vectors in host memory (the client's shared memory with its daemon), so a
tensor on a device is copied into a *pinned* host buffer, the host path runs as for a
CPU tensor, and the result is copied back. Why pinned: a copy between the device and
pinned memory is a DMA transfer queued on the device's stream (``non_blocking=True``),
so the DDP hook queues each gradient bucket's copy as DDP hands it over, while backward
goes on, and waits once; a copy from pageable memory would block on every tensor.

**Synchronisation.** Down (device to host): the copies are queued on the device's
current stream, then an event recorded after them is synchronised before the host reads
the buffer. Up (host to device): the copies are queued and an event recorded; the
device's later work on that stream sees the values (stream order), and the host waits
for the event before it writes the buffer again (``room``, ``down``).

**One buffer per ``HostStaging``**, allocated on first use (``torch.empty(...,
pin_memory=True)``), reused while it is big enough, replaced by a bigger one when not
(``allocations`` counts them): the gradient's staging is allocated once.

**CPU tensors never come here**: ``down``, ``room`` and ``up`` hand them back untouched,
so their path has no extra copy. Tensors of one call on several devices get a
ValueError (crnet reduces one flat vector, moved from one device).

``DeviceOps`` is how the staging talks to a device (which devices are staged, the
copies, the events); ``DEVICES`` is the default, and tests without a GPU replace it with
one that treats CPU tensors as a device's and defers their copies until an event is
synchronised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

ALIGN = 64          # bytes: every tensor's place in the buffer is aligned for any dtype


class DeviceOps:
    """Accelerator devices (CUDA) through torch's device module: staged unless on the CPU."""

    pin_memory = True

    def staged(self, device: torch.device) -> bool:
        return device.type != "cpu"

    def copy_down(self, host: torch.Tensor, t: torch.Tensor) -> None:
        host.copy_(t, non_blocking=True)          # queued on the current stream

    def copy_up(self, t: torch.Tensor, host: torch.Tensor) -> None:
        t.copy_(host, non_blocking=True)

    def record(self, device: torch.device) -> Any:
        """An event recorded on ``device``'s current stream (``.synchronize()`` waits for it)."""
        module = torch.get_device_module(device)
        event = module.Event()
        event.record(module.current_stream(device))
        return event


DEVICES = DeviceOps()


def one_device(tensors: Sequence[torch.Tensor], what: str = "tensors") -> torch.device:
    """The device all ``tensors`` are on (the CPU for none); a ValueError if several."""
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"{what} on several devices ({', '.join(sorted(map(str, devices)))}): "
                         "crnet.torch moves one device's tensors at a time; put them on one "
                         "device (model.to(device))")
    return devices.pop() if devices else torch.device("cpu")


class HostStaging:
    """A pinned host buffer that device tensors go down into and results come up from
    (see the module). ``ops``: default ``DEVICES`` as it is when this is made."""

    def __init__(self, ops: DeviceOps | None = None):
        self.ops = ops if ops is not None else DEVICES
        self._buffer: torch.Tensor | None = None       # bytes, pinned
        self._up: Any = None            # event after the last copies up: they read the buffer
        self.allocations = 0
        self.copied_bytes = 0           # both ways, between the device and the buffer

    def staged(self, t: torch.Tensor) -> bool:
        """Whether the tensor ``t`` goes through the staging."""
        return self.ops.staged(t.device)

    def needed(self, tensors: Sequence[torch.Tensor], what: str = "tensors") -> bool:
        """Whether ``tensors`` (on one device) go through the staging."""
        return self.ops.staged(one_device(tensors, what))

    def room(self, tensors: Sequence[torch.Tensor], what: str = "tensors") -> list[torch.Tensor]:
        """Host tensors shaped and typed like ``tensors``, for the host to write: CPU
        tensors themselves; for device tensors, places in the buffer (valid until the next
        ``room`` or ``down``), once the copies up that read it are done."""
        if not self.needed(tensors, what):
            return list(tensors)
        return self._places([(t.numel(), t.dtype, t.shape) for t in tensors])

    def down(self, tensors: Sequence[torch.Tensor], what: str = "tensors") -> list[torch.Tensor]:
        """``tensors``' values on the host: CPU tensors themselves; device tensors copied
        into the buffer, waited for."""
        device = one_device(tensors, what)
        if not self.ops.staged(device):
            return list(tensors)
        host = self._places([(t.numel(), t.dtype, t.shape) for t in tensors])
        for h, t in zip(host, tensors):
            self.to_host(h, t)
        self.wait(device)
        return host

    def up(self, tensors: Sequence[torch.Tensor], host: Sequence[torch.Tensor]) -> None:
        """``host`` (from ``room`` or ``down``) into the device ``tensors``; nothing for
        CPU tensors (``host`` is them)."""
        device = one_device(tensors)
        if not self.ops.staged(device):
            return
        with torch.no_grad():
            for t, h in zip(tensors, host):
                self.to_device(t, h)
        self.queued(device)

    # ---- the parts, for a caller that queues copies as it goes (the DDP hook)
    def flat(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """One flat host tensor in the buffer, free for the host (as ``room``)."""
        return self._places([(numel, dtype, (numel,))])[0]

    def to_host(self, host: torch.Tensor, t: torch.Tensor) -> None:
        """Queue ``t`` (on the device) into ``host`` (in the buffer); ``wait`` before reading."""
        self.ops.copy_down(host, t.detach())
        self.copied_bytes += t.numel() * t.element_size()

    def to_device(self, t: torch.Tensor, host: torch.Tensor) -> None:
        """Queue ``host`` (in the buffer) into ``t`` (on the device); then ``queued``."""
        self.ops.copy_up(t, host)
        self.copied_bytes += t.numel() * t.element_size()

    def wait(self, device: torch.device) -> None:
        """Wait for every copy queued on ``device`` so far: the host may read the buffer."""
        self.ops.record(device).synchronize()
        self._up = None

    def queued(self, device: torch.device) -> None:
        """Copies up were queued: the host waits for them before writing the buffer."""
        self._up = self.ops.record(device)

    def _places(self, specs: Sequence[tuple[int, torch.dtype, Sequence[int]]]) -> list[torch.Tensor]:
        """Host tensors of these (elements, dtype, shape), one after the other in the buffer."""
        spans, at = [], 0
        for numel, dtype, _ in specs:
            n = numel * dtype.itemsize
            spans.append((at, n))
            at += -(-n // ALIGN) * ALIGN
        if self._up is not None:           # copies up may still be reading the buffer
            self._up.synchronize()
            self._up = None
        if self._buffer is None or self._buffer.numel() < at:
            self._buffer = torch.empty(max(at, ALIGN), dtype=torch.uint8, pin_memory=self.ops.pin_memory)
            self.allocations += 1
        return [self._buffer[a:a + n].view(dtype).view(shape)
                for (a, n), (_, dtype, shape) in zip(spans, specs)]
