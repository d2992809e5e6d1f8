"""The element types a crnet vector may have: one table, for the wire and for NumPy.

A message names its vector's dtype by ``name`` (``DTYPE_NAMES``, checked where a
header is parsed); a daemon or training process turns the name into a NumPy dtype
(``DTYPES``) and back (``dtype_name``). Every layer imports this module, so adding a
dtype is one entry here (and the kernels must take it: ``crnet/coding/kernels.py``).
"""

from __future__ import annotations

import numpy as np

DTYPES: dict[str, np.dtype] = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}
DTYPE_NAMES: tuple[str, ...] = tuple(DTYPES)

_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, which numpy computes anew on every read, for crnet's dtypes at once."""
    return _NAMES.get(dtype) or dtype.name
