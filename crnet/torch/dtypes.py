"""The dtypes crnet's wire carries, as torch and numpy spell them, and the TypeError that
says what to do with any other."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

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


def common_dtype(tensors: Sequence[torch.Tensor], what: str) -> torch.dtype:
    """The one wire dtype all ``tensors`` share; a TypeError if they mix dtypes or have
    one the wire does not carry."""
    dtypes = sorted({t.dtype for t in tensors}, key=str)
    if len(dtypes) > 1:
        raise TypeError(f"crnet reduces one flat vector of one dtype, but the {what} mix "
                        f"{', '.join(map(str, dtypes))}: convert the model with "
                        "model.to(torch.float32) (or torch.float64)")
    wire_dtype(dtypes[0], what)
    return dtypes[0]
