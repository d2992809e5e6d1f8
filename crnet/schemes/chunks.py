"""How a vector is cut into chunks that pipeline through the tree."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DTYPES: dict[str, np.dtype] = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}


_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, which numpy computes anew on every read, for crnet's dtypes at once."""
    return _NAMES.get(dtype) or dtype.name


def byte_view(array: np.ndarray) -> memoryview:
    """The array's memory as bytes, where a payload is received (no copy)."""
    return memoryview(array).cast("B")  # type: ignore[arg-type]  # numpy declares __buffer__ for 3.12+


@dataclass(frozen=True)
class ChunkLayout:
    """A vector of ``total`` elements of ``dtype`` in chunks of ``chunk_bytes``.

    Every node of the tree uses the master's chunk size, so chunk c covers the
    same coordinates everywhere and each chunk decodes on its own.
    """

    total: int
    dtype: np.dtype
    chunk_elems: int
    dtype_name: str = ""        # dtype.name, which numpy computes anew on every read

    @classmethod
    def of(cls, total: int, dtype, chunk_bytes: int) -> ChunkLayout:
        dtype = np.dtype(dtype)
        return cls(int(total), dtype, max(1, int(chunk_bytes) // dtype.itemsize), dtype_name(dtype))

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
