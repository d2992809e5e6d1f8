# cython: language_level=3
"""Compiled summation kernels behind :mod:`crnet.coding.kernels`.

Private module: call it through ``crnet.coding.kernels``, which turns raw byte buffers
into typed views and gives the user-facing error messages.  The typed
memoryview signatures below are only a memory-safety net: Cython refuses a
buffer of the wrong element type or layout, and the length checks keep every
loop inside its buffers even when this module is called directly.

``coded_sum`` walks ``out`` in cache-sized blocks and adds the inputs into
each block a few at a time, prefetching ahead, so that memory sees each input
read once and ``out`` written once.  The loops are over raw pointers with unit
stride, so that gcc's auto-vectorizer turns them into SIMD code at -O3.
"""
from cython cimport floating
from libc.stdint cimport uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

import numpy as np

cdef extern from *:
    # A prefetch is only a hint; compilers without the builtin just skip it.
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define CRNET_PREFETCH(p) __builtin_prefetch((p), 0, 3)
    #else
    #define CRNET_PREFETCH(p) ((void)0)
    #endif
    """
    void prefetch "CRNET_PREFETCH"(const void *p) noexcept nogil

cdef enum:
    # Elements per block of ``coded_sum``: a block of ``out`` (or of the
    # scratch buffer) stays in L1 while all k inputs are added into it.
    # 4096 = 16 KiB of float32 / 32 KiB of float64; 2048..16384 measured the
    # same, so the smallest that keeps loop overhead negligible is used.
    BLOCK = 4096
    # Inputs added per pass over a block.  A single core here is limited by
    # how many memory reads it has in flight, and several read streams at
    # once keep more in flight than one: with 4, k=8 at 64M float32 went from
    # ~10 to ~15 GB/s.
    GROUP = 4
    # Each pass walks its block in chunks of CHUNK elements, prefetching every
    # input AHEAD elements further on (2 KiB of float32): the hardware
    # prefetcher alone stops at each 4 KiB page and ramps up again.
    CHUNK = 256
    AHEAD = 512


# --- inner loops (no GIL, no Python objects) ---------------------------------

cdef void _pass(floating *d, const floating **x, const floating *c, int g,
                bint first, Py_ssize_t n, Py_ssize_t room) noexcept nogil:
    # d[i] = (d[i] +) c[0]*x[0][i] + ... + c[g-1]*x[g-1][i] for g in 1..4,
    # summed left to right: the same rounding as adding one input at a time
    # (and as the NumPy reference).  ``room`` is how many elements the x[j]
    # hold from x[j][0] on, which can be more than n: prefetching runs on
    # into the next block.
    cdef const floating *x0 = x[0]
    cdef const floating *x1 = x[1] if g > 1 else x0
    cdef const floating *x2 = x[2] if g > 2 else x0
    cdef const floating *x3 = x[3] if g > 3 else x0
    cdef floating c0 = c[0]
    cdef floating c1 = c[1] if g > 1 else 0
    cdef floating c2 = c[2] if g > 2 else 0
    cdef floating c3 = c[3] if g > 3 else 0
    cdef Py_ssize_t line = 64 // sizeof(floating)  # elements per cache line
    cdef Py_ssize_t i = 0, p, q, end
    cdef int j
    while i < n:
        end = min(i + CHUNK, n)
        # Prefetch one line at a time, and never past the inputs' ends.
        p = i + AHEAD
        while p < end + AHEAD and p < room:
            for j in range(g):
                prefetch(x[j] + p)
            p += line
        # Loop-invariant branches: gcc unswitches them, and vectorizes each
        # loop (with a runtime check, since d may be x[0]).
        if first:
            if g == 1:
                for q in range(i, end):
                    d[q] = c0 * x0[q]
            elif g == 2:
                for q in range(i, end):
                    d[q] = c0 * x0[q] + c1 * x1[q]
            elif g == 3:
                for q in range(i, end):
                    d[q] = c0 * x0[q] + c1 * x1[q] + c2 * x2[q]
            else:
                for q in range(i, end):
                    d[q] = c0 * x0[q] + c1 * x1[q] + c2 * x2[q] + c3 * x3[q]
        else:
            if g == 1:
                for q in range(i, end):
                    d[q] = d[q] + c0 * x0[q]
            elif g == 2:
                for q in range(i, end):
                    d[q] = d[q] + c0 * x0[q] + c1 * x1[q]
            elif g == 3:
                for q in range(i, end):
                    d[q] = d[q] + c0 * x0[q] + c1 * x1[q] + c2 * x2[q]
            else:
                for q in range(i, end):
                    d[q] = d[q] + c0 * x0[q] + c1 * x1[q] + c2 * x2[q] + c3 * x3[q]
        i = end


cdef void _blocked_sum(floating *out, const floating **xs, const floating *cs,
                       Py_ssize_t k, Py_ssize_t n,
                       floating *scratch) noexcept nogil:
    # One pass over memory: each block of ``out`` is written once and stays
    # hot in cache while the k inputs stream through it, so main memory sees
    # k reads + 1 write per element.  With ``scratch`` set (``out`` is also a
    # later input) the block is built in scratch and copied out afterwards,
    # because writing the first terms straight into ``out`` would clobber
    # that input.
    cdef Py_ssize_t start = 0, m, j, q
    cdef int g
    cdef const floating *x[GROUP]
    cdef floating *dst
    while start < n:
        m = min(<Py_ssize_t>BLOCK, n - start)
        dst = scratch if scratch != NULL else out + start
        j = 0
        while j < k:
            g = <int>min(<Py_ssize_t>GROUP, k - j)
            for q in range(g):
                x[q] = xs[j + q] + start
            _pass(dst, x, cs + j, g, j == 0, m, n - start)
            j += g
        if scratch != NULL:
            memcpy(out + start, scratch, m * sizeof(floating))
        start += m


# --- helpers that hold the GIL -----------------------------------------------

cdef inline bint _overlaps(const void *a, const void *b, size_t nbytes) noexcept:
    cdef uintptr_t pa = <uintptr_t>a, pb = <uintptr_t>b
    return pa < pb + nbytes and pb < pa + nbytes


cdef inline void _check_len(Py_ssize_t got, Py_ssize_t n, str what) except *:
    if got != n:
        raise ValueError(f"{what} has {got} elements, out has {n}")


# --- entry points ------------------------------------------------------------

def axpy(floating[::1] out, double coeff, const floating[::1] x):
    """out += coeff * x (coeff is rounded to the element type first)."""
    cdef Py_ssize_t n = out.shape[0]
    _check_len(x.shape[0], n, "x")
    if n == 0:
        return
    # An elementwise loop is safe when x *is* out, but a shifted overlap would
    # read values already updated; numpy copies in that case, and so do we.
    if &x[0] != &out[0] and _overlaps(&x[0], &out[0], n * sizeof(floating)):
        x = np.array(x)
    cdef floating c = <floating>coeff
    cdef const floating *xp = &x[0]
    with nogil:
        _pass(&out[0], &xp, &c, 1, False, n, n)


def add_into(floating[::1] out, const floating[::1] x):
    """out += x."""
    cdef Py_ssize_t n = out.shape[0]
    _check_len(x.shape[0], n, "x")
    if n == 0:
        return
    if &x[0] != &out[0] and _overlaps(&x[0], &out[0], n * sizeof(floating)):
        x = np.array(x)
    # 1 * x is exact, so this is exactly out + x.
    cdef floating one = 1
    cdef const floating *xp = &x[0]
    with nogil:
        _pass(&out[0], &xp, &one, 1, False, n, n)


def coded_sum(floating[::1] out, const double[::1] coeffs, inputs):
    """out = sum_k coeffs[k] * inputs[k] in one blocked pass over memory.

    ``inputs`` is a sequence of buffers of out's element type.  Coefficients
    are rounded to the element type, as numpy does for a float32 array times
    a float32 scalar.
    """
    cdef Py_ssize_t n = out.shape[0]
    cdef Py_ssize_t k = len(inputs)
    cdef Py_ssize_t j
    if coeffs.shape[0] != k:
        raise ValueError(f"{coeffs.shape[0]} coefficients for {k} inputs")
    cdef const floating[::1] x
    # The typed views are kept in a Python list for the whole call: each holds
    # a buffer export, so no other thread can free or resize an input's memory
    # while the loops below run without the GIL.
    views = []
    for j in range(k):
        x = inputs[j]
        _check_len(x.shape[0], n, f"inputs[{j}]")
        views.append(x)
    if n == 0:
        return
    if k == 0:
        with nogil:
            memset(&out[0], 0, n * sizeof(floating))
        return

    cdef floating *outp = &out[0]
    cdef size_t nbytes = n * sizeof(floating)
    cdef bint need_scratch = False
    cdef const floating **xs = <const floating **>malloc(k * sizeof(floating *))
    cdef floating *cs = <floating *>malloc(k * sizeof(floating))
    cdef floating *scratch = NULL
    try:
        if xs == NULL or cs == NULL:
            raise MemoryError()
        for j in range(k):
            x = views[j]
            if _overlaps(&x[0], outp, nbytes):
                if &x[0] != outp:
                    # Shifted overlap: no block order is safe, so copy it.
                    x = np.array(x)
                    views[j] = x
                elif j > 0:
                    need_scratch = True
                # j == 0 and x is out: out[i] = c0 * out[i] is fine in place.
            xs[j] = &x[0]
            cs[j] = <floating>coeffs[j]
        if need_scratch:
            scratch = <floating *>malloc(BLOCK * sizeof(floating))
            if scratch == NULL:
                raise MemoryError()
        with nogil:
            _blocked_sum(outp, xs, cs, k, n, scratch)
    finally:
        free(xs)
        free(cs)
        free(scratch)
