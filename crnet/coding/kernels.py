"""Summation kernels for decoding coded gradients.

A CodedReduce node turns the partial gradients it receives into its own
message by a linear combination ``out = sum_k c_k * x_k``.  The vectors are
large (a model's gradient), arrive as raw network payloads, and this sum is
the node's hot loop, so it is done by the compiled kernels in
``crnet.coding._core``: one pass over memory, no temporaries, no GIL held, and
straight on the received buffers without copying them.

This module is the public face of those kernels.  It

* turns every argument (numpy array, bytes, bytearray, memoryview slice of a
  payload) into a flat zero-copy numpy view and checks it, in one place
  (:func:`_as_vectors`), with error messages that say what is wrong;
* holds a plain NumPy implementation (``reference_*``), the test oracle and
  the fallback when the extension is not built.  The fallback is slow and
  says so with a :class:`RuntimeWarning` on import; ``HAVE_CYTHON`` tells
  which path is active.

Element types are float32 and float64; all vectors of one call share one.
Numpy arrays and typed buffers carry theirs.  Raw bytes (bytes, bytearray,
memoryviews of them) are read as the ``dtype`` keyword says or, without it,
as ``out`` or the first typed input is.  Coefficients are rounded to the
element type before use, as numpy does for ``float32_array * np.float32(c)``.
Vectors of any shape are taken as flat, so they only need equal sizes.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

try:
    from crnet.coding import _core
except ImportError as exc:  # extension not built: keep working, but loudly
    _core = None  # type: ignore[assignment]
    warnings.warn(  # noqa: B028 -- the warning is about this module, not its importer
        f"crnet.coding._core is not available ({exc}); crnet.coding.kernels falls back to the "
        "slow pure-NumPy path. Build the extension with `pip install -e .`.",
        RuntimeWarning,
    )

HAVE_CYTHON: bool = _core is not None

__all__ = [
    "HAVE_CYTHON",
    "add_into",
    "axpy",
    "coded_sum",
    "reference_add_into",
    "reference_axpy",
    "reference_coded_sum",
]

_FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float64))
# Buffer formats that carry no element type: their bytes are reinterpreted
# with the call's dtype.
_RAW_FORMATS = ("B", "b", "c")


# --- validation (the only place arguments are checked) ----------------------

def _buffer_view(obj: Any, name: str) -> np.ndarray | memoryview:
    """A zero-copy view of ``obj``: an array if its buffer has an element
    type, else (plain bytes) a memoryview for the caller to reinterpret."""
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            mv = memoryview(obj)
        except TypeError:
            raise TypeError(
                f"{name} must be a buffer (numpy array, bytes, bytearray, memoryview), "
                f"got {type(obj).__name__}"
            ) from None
        if mv.format.lstrip("@=<>!") in _RAW_FORMATS:
            if not mv.c_contiguous:
                raise ValueError(f"{name} is not C-contiguous")
            return mv
        arr = np.asarray(mv)
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous")
    return arr


def _as_vectors(
    out: Any, inputs: Sequence[Any], dtype: Any = None, input_names: Sequence[str] = ()
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Check ``out`` and ``inputs`` and return them as flat zero-copy views.

    The element type is ``dtype`` if given, else the type of ``out`` or, if
    ``out`` is raw bytes, of the first typed input.  Raw byte buffers are
    reinterpreted with it; typed buffers (numpy arrays included) must already
    have it.  Error messages call the inputs ``input_names`` (default
    ``inputs[i]``).
    """
    if (dtype is None and type(out) is np.ndarray and type(inputs) is tuple
            and out.ndim == 1 and out.dtype in _FLOAT_TYPES and out.flags.c_contiguous
            and out.flags.writeable):
        # The daemons' own arrays (a ring part per call, every decode): already flat,
        # contiguous and of one float type, so there is nothing to convert or check.
        for x in inputs:
            if not (type(x) is np.ndarray and x.dtype is out.dtype and x.shape == out.shape
                    and x.flags.c_contiguous):
                break
        else:
            return out, inputs
    if isinstance(inputs, (bytes, bytearray, memoryview, np.ndarray)):
        # A lone vector would be taken as a sequence of scalars.
        raise TypeError("inputs must be a sequence of vectors, not a single vector")
    inputs = tuple(inputs)
    names = ["out", *(input_names or [f"inputs[{i}]" for i in range(len(inputs))])]
    views = [_buffer_view(obj, name) for obj, name in zip([out, *inputs], names)]

    if dtype is not None:
        target = np.dtype(dtype)
    else:
        typed = [v.dtype for v in views if isinstance(v, np.ndarray)]
        if not typed:
            raise TypeError("dtype is required when out and all inputs are raw byte buffers")
        target = typed[0]
    if target not in _FLOAT_TYPES:
        raise TypeError(f"unsupported dtype {target}: only float32 and float64")

    arrays = []
    for view, name in zip(views, names):
        if isinstance(view, memoryview):
            if view.nbytes % target.itemsize:
                raise ValueError(
                    f"{name} has {view.nbytes} bytes, not a multiple of the "
                    f"{target} item size {target.itemsize}"
                )
            view = np.frombuffer(view, dtype=target)
        elif view.dtype != target:
            raise TypeError(f"{name} has dtype {view.dtype}, expected {target}")
        arrays.append(view.reshape(-1))  # contiguous, so still a view

    out_arr, in_arrs = arrays[0], tuple(arrays[1:])
    if not out_arr.flags.writeable:
        raise ValueError("out is read-only")
    for arr, name in zip(in_arrs, names[1:]):
        if arr.size != out_arr.size:
            raise ValueError(f"{name} has {arr.size} elements, out has {out_arr.size}")
    return out_arr, in_arrs


def _as_coeffs(coeffs: Any, count: int) -> np.ndarray:
    c = np.ascontiguousarray(coeffs, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"coeffs must be 1-D, got shape {c.shape}")
    if c.size != count:
        raise ValueError(f"{c.size} coefficients for {count} inputs")
    return c


# --- NumPy reference: the test oracle and the fallback ----------------------

def reference_axpy(out: Any, coeff: float, x: Any, *, dtype: Any = None) -> None:
    """out += coeff * x, in NumPy."""
    o, (v,) = _as_vectors(out, (x,), dtype, ("x",))
    o += o.dtype.type(coeff) * v  # the product is a temporary: overlap is safe


def reference_add_into(out: Any, x: Any, *, dtype: Any = None) -> None:
    """out += x, in NumPy."""
    o, (v,) = _as_vectors(out, (x,), dtype, ("x",))
    np.add(o, v, out=o)  # numpy copies an overlapping operand itself


def reference_coded_sum(
    out: Any, coeffs: Sequence[float] | np.ndarray, inputs: Sequence[Any], *, dtype: Any = None
) -> None:
    """out = sum_k coeffs[k] * inputs[k], in NumPy, same order of operations."""
    o, xs = _as_vectors(out, inputs, dtype)
    cs = _as_coeffs(coeffs, len(xs)).astype(o.dtype)
    if not xs:
        o[...] = 0
        return
    # Accumulate apart from ``out``: ``out`` may be one of the inputs.
    acc = np.multiply(xs[0], cs[0])
    for c, x in zip(cs[1:], xs[1:]):
        acc += c * x
    o[...] = acc


# --- compiled path -----------------------------------------------------------

def _compiled_axpy(out: Any, coeff: float, x: Any, *, dtype: Any = None) -> None:
    """out += coeff * x, in place; ``coeff`` is rounded to the element type."""
    o, (v,) = _as_vectors(out, (x,), dtype, ("x",))
    _core.axpy(o, float(coeff), v)


def _compiled_add_into(out: Any, x: Any, *, dtype: Any = None) -> None:
    """out += x, in place."""
    o, (v,) = _as_vectors(out, (x,), dtype, ("x",))
    _core.add_into(o, v)


def _compiled_coded_sum(
    out: Any, coeffs: Sequence[float] | np.ndarray, inputs: Sequence[Any], *, dtype: Any = None
) -> None:
    """out = sum_k coeffs[k] * inputs[k], in one pass over memory.

    ``out`` may be one of the inputs.  With no inputs ``out`` is zero-filled.
    """
    o, xs = _as_vectors(out, inputs, dtype)
    _core.coded_sum(o, _as_coeffs(coeffs, len(xs)), xs)


if HAVE_CYTHON:
    axpy = _compiled_axpy
    add_into = _compiled_add_into
    coded_sum = _compiled_coded_sum
else:
    axpy = reference_axpy
    add_into = reference_add_into
    coded_sum = reference_coded_sum
