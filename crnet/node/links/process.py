"""A training process as the handlers of its requests see it (``ClientLink``): where
it is, its shared memory, and how it is told of an error."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ...errors import ErrorKind
from ...protocol.shm import SharedRegion
from ...protocol.transport import Connection


class Process(Protocol):
    conn: Connection | None            # its control connection, once it said hello
    region: SharedRegion | None        # its shared memory, once handed over

    def error(self, reason: str, kind: ErrorKind, step: int | None = None,
              tree_wide: bool = True) -> None:
        """Tell it ``reason`` (an ERROR); it waits on no step any more."""

    def vector(self, length: int, dtype: np.dtype, half: str,
               step: int | None = None) -> np.ndarray | None:
        """Its shared ``half`` (input, output) as ``length`` x ``dtype``, or None (it was
        told why, about ``step``)."""

    def job_over(self, step: int | None = None) -> bool:
        """Its job is not the one the tree runs: it was told so (JobEnded)."""
