"""How a vector is cut into chunks that pipeline through the tree."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..defaults import CHUNK_AUTO
from ..dtypes import dtype_name

# --chunk-bytes auto (0 on the wire): a chunk size that grows with the vector. Each chunk is a
# frame at every hop (~0.1 ms of Python per end), so large vectors want large chunks: the
# hop measured 1.31 GB/s with 1 MiB chunks of a 64 MiB vector and 1.84 GB/s with 4 MiB
# (docs/lab/daemon.md). Yet a vector must still cut into enough chunks for the
# layers to work at once: AUTO_CHUNKS of them, so up to 16 MiB the chunk stays 1 MiB.
AUTO = CHUNK_AUTO
AUTO_CHUNKS = 16
AUTO_MIN_BYTES = 1 << 20
AUTO_MAX_BYTES = 4 << 20


def chunk_bytes_for(vector_bytes: int, chunk_bytes: int = AUTO) -> int:
    """The chunk size of a ``vector_bytes`` vector: ``chunk_bytes`` when set, else (AUTO) the
    power of two nearest above 1/AUTO_CHUNKS of the vector, within 1..4 MiB."""
    if chunk_bytes != AUTO:
        return chunk_bytes
    want = max(1, vector_bytes // AUTO_CHUNKS)
    return min(AUTO_MAX_BYTES, max(AUTO_MIN_BYTES, 1 << (want - 1).bit_length()))


def largest_chunk(chunk_bytes: int) -> int:
    """The largest chunk a tree with this setting sends (the frame limit it needs)."""
    return AUTO_MAX_BYTES if chunk_bytes == AUTO else chunk_bytes


def byte_view(array: np.ndarray) -> memoryview:
    """The array's memory as bytes, where a payload is received (no copy)."""
    return memoryview(array).cast("B")  # type: ignore[arg-type]  # numpy declares __buffer__ for 3.12+


@dataclass(frozen=True)
class ChunkLayout:
    """A vector of ``total`` elements of ``dtype`` in chunks of ``chunk_bytes``.

    Every node of the tree uses the master's chunk size setting (a size, or AUTO: one
    from the vector's size, ``chunk_bytes_for``), so chunk c covers the same coordinates
    everywhere and each chunk decodes on its own.
    """

    total: int
    dtype: np.dtype
    chunk_elems: int
    dtype_name: str = ""        # dtype.name, which numpy computes anew on every read

    @classmethod
    def of(cls, total: int, dtype, chunk_bytes: int) -> ChunkLayout:
        # Asked for several times per message, nearly always of the same few vectors:
        # a layout is immutable, so one per (total, dtype, chunk) is shared.
        return _layout(total, dtype, chunk_bytes)

    @property
    def chunks(self) -> int:
        return max(1, -(-self.total // self.chunk_elems))

    def bounds(self, chunk: int) -> tuple[int, int]:
        start = chunk * self.chunk_elems
        return start, min(start + self.chunk_elems, self.total)

    def nbytes(self, chunk: int) -> int:
        start, stop = self.bounds(chunk)
        return (stop - start) * self.dtype.itemsize

    def describe(self) -> str:
        return f"{self.total} x {self.dtype_name}"

    def mismatch(self, local: ChunkLayout, step: int) -> str | None:
        """Why a training process's vector (``local``) can't join this step, or None."""
        if local.total == self.total and local.dtype == self.dtype:
            return None
        return (f"this process's vector is {local.describe()} but the tree's for step {step} "
                f"is {self.describe()}")

    def check(self, total, dtype_name, chunk, nbytes) -> str | None:
        """Why a chunk header does not fit this layout, or None if it does."""
        if dtype_name != self.dtype_name or total != self.total:
            return (f"vector is {total} x {dtype_name} but the step's is "
                    f"{self.total} x {self.dtype_name}")
        if not isinstance(chunk, int) or not 0 <= chunk < self.chunks:
            return f"chunk {chunk!r} out of range 0..{self.chunks - 1}"
        if nbytes != self.nbytes(chunk):
            return f"chunk {chunk} has {nbytes} bytes, expected {self.nbytes(chunk)}"
        return None


@functools.lru_cache(maxsize=256)
def _layout(total: int, dtype, chunk_bytes: int) -> ChunkLayout:
    dtype = np.dtype(dtype)
    total = int(total)
    chunk = chunk_bytes_for(total * dtype.itemsize, int(chunk_bytes))
    return ChunkLayout(total, dtype, max(1, chunk // dtype.itemsize), dtype_name(dtype))
