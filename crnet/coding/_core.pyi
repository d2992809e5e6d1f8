"""Type stubs for the compiled kernels (crnet/coding/_core.pyx).

Private: use :mod:`crnet.coding.kernels`, which accepts raw byte buffers and checks
its arguments.  Here every vector must already be a C-contiguous, 1-D buffer
of float32 or float64 elements (all of one type), e.g. a numpy array.
"""
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

_Vector: TypeAlias = npt.NDArray[np.float32] | npt.NDArray[np.float64]

def axpy(out: _Vector, coeff: float, x: _Vector) -> None:
    """out += coeff * x; coeff is rounded to the element type first."""

def add_into(out: _Vector, x: _Vector) -> None:
    """out += x."""

def coded_sum(out: _Vector, coeffs: npt.NDArray[np.float64], inputs: Sequence[_Vector]) -> None:
    """out = sum_k coeffs[k] * inputs[k] in one pass over memory; out may be an input."""
