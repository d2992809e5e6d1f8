"""The compiled kernels against the NumPy reference, and their argument checks."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crnet.coding import kernels

DTYPES = [np.float32, np.float64]
RTOL = {np.float32: 1e-6, np.float64: 1e-12}


def make_vectors(rng, k, n, dtype):
    return [rng.standard_normal(n).astype(dtype) for _ in range(k)]


def make_coeffs(rng, k):
    return list(rng.standard_normal(k))


def expected_sum(coeffs, inputs, n, dtype):
    """The reference result, computed on copies so aliasing cannot affect it."""
    out = np.empty(n, dtype)
    kernels.reference_coded_sum(out, coeffs, [np.array(x) for x in inputs])
    return out


def assert_close(actual, expected, coeffs, inputs, dtype):
    # Kernel and reference round the same operations in the same order, but
    # a compiler may fuse a*b+c (FMA) on some targets: allow a few ulps of the
    # terms' magnitude, so cancellation near zero does not need luck.
    rtol = RTOL[dtype]
    scale = sum(abs(c) * float(np.max(np.abs(x), initial=0)) for c, x in zip(coeffs, inputs))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


def test_compiled_path_is_active():
    assert kernels.HAVE_CYTHON
    assert kernels.coded_sum is not kernels.reference_coded_sum


# --- agreement with the reference ------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 7, 4097, 12345])
@pytest.mark.parametrize("k", range(17))
def test_coded_sum_matches_reference(dtype, n, k):
    rng = np.random.default_rng([n, k])
    xs, cs = make_vectors(rng, k, n, dtype), make_coeffs(rng, k)
    out = np.full(n, np.nan, dtype)  # every element must be overwritten
    kernels.coded_sum(out, cs, xs)
    assert_close(out, expected_sum(cs, xs, n, dtype), cs, xs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [0, 1, 2, 3, 5, 8, 16])
def test_coded_sum_large(dtype, k):
    n = 3_000_001
    rng = np.random.default_rng(k)
    # Shifted views of one array: cheap to make, and most are unaligned.
    base = rng.standard_normal(n + 16).astype(dtype)
    xs, cs = [base[j:j + n] for j in range(k)], make_coeffs(rng, k)
    out = np.full(n, np.nan, dtype)
    kernels.coded_sum(out, cs, xs)
    assert_close(out, expected_sum(cs, xs, n, dtype), cs, xs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 2, 4, 5, 16])
def test_unit_coefficients_are_exact(dtype, k):
    # Products by 1.0 are exact and the additions happen in the same order as
    # in the reference, so the results must be bit-identical.
    n = 10_001
    rng = np.random.default_rng(k)
    xs = make_vectors(rng, k, n, dtype)
    out, expected = np.empty(n, dtype), np.empty(n, dtype)
    kernels.coded_sum(out, [1.0] * k, xs)
    kernels.reference_coded_sum(expected, [1.0] * k, xs)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("coeffs", [[0.5, -2.0, 3.25], np.array([0.5, -2.0, 3.25]),
                                    np.array([0.5, -2.0, 3.25], np.float32), (0.5, -2, 3.25)])
def test_coefficient_containers(coeffs):
    xs = [np.arange(5.0), np.ones(5), np.full(5, 2.0)]
    out = np.empty(5)
    kernels.coded_sum(out, coeffs, xs)
    np.testing.assert_array_equal(out, 0.5 * np.arange(5.0) - 2.0 + 6.5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_coefficients_are_rounded_to_the_element_type(dtype):
    x = np.full(8, 3.0, dtype)
    out = np.empty(8, dtype)
    kernels.coded_sum(out, [0.1], [x])
    np.testing.assert_array_equal(out, dtype(0.1) * x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_inputs_zero_fills(dtype):
    out = np.full(5000, np.nan, dtype)
    kernels.coded_sum(out, [], [])
    np.testing.assert_array_equal(out, 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 4097, 12345])
def test_axpy_matches_reference(dtype, n):
    rng = np.random.default_rng(n)
    out, x = make_vectors(rng, 2, n, dtype)
    expected = out.copy()
    kernels.reference_axpy(expected, -1.7, x)
    kernels.axpy(out, -1.7, x)
    assert_close(out, expected, [1.0, 1.7], [expected, x], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 4097, 12345])
def test_add_into_is_exact(dtype, n):
    rng = np.random.default_rng(n)
    out, x = make_vectors(rng, 2, n, dtype)
    expected = out + x
    kernels.add_into(out, x)
    np.testing.assert_array_equal(out, expected)


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    n=st.integers(0, 20_000),
    coeffs=st.lists(st.floats(-1e3, 1e3), max_size=9),
    seed=st.integers(0, 2**32 - 1),
)
def test_coded_sum_property(dtype, n, coeffs, seed):
    xs = make_vectors(np.random.default_rng(seed), len(coeffs), n, dtype)
    out = np.empty(n, dtype)
    kernels.coded_sum(out, coeffs, xs)
    assert_close(out, expected_sum(coeffs, xs, n, dtype), coeffs, xs, dtype)


# --- out aliased with inputs --------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k, positions", [
    (1, [0]), (2, [0]), (2, [1]), (5, [0]), (5, [2]), (5, [4]),
    (9, [8]), (9, [0, 6]), (16, [3, 4, 15]),
])
def test_coded_sum_out_is_an_input(dtype, k, positions):
    n = 12345  # several blocks and a ragged tail
    rng = np.random.default_rng(k)
    xs, cs = make_vectors(rng, k, n, dtype), make_coeffs(rng, k)
    out = xs[positions[0]]
    for p in positions:
        xs[p] = out
    expected = expected_sum(cs, xs, n, dtype)
    kernels.coded_sum(out, cs, xs)
    assert_close(out, expected, cs, xs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shift", [-5, -1, 1, 4100])
@pytest.mark.parametrize("position", [0, 2])
def test_coded_sum_shifted_overlap(dtype, shift, position):
    # out and one input are windows of the same buffer, `shift` elements apart.
    n = 9000
    rng = np.random.default_rng(abs(shift))
    buf = rng.standard_normal(n + abs(shift)).astype(dtype)
    out = buf[max(0, shift):][:n]
    xs, cs = make_vectors(rng, 3, n, dtype), make_coeffs(rng, 3)
    xs[position] = buf[max(0, -shift):][:n]
    expected = expected_sum(cs, xs, n, dtype)
    kernels.coded_sum(out, cs, xs)
    assert_close(out, expected, cs, xs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shift", [0, -1, 3])
@pytest.mark.parametrize("op", ["axpy", "add_into"])
def test_axpy_and_add_into_with_overlap(dtype, shift, op):
    # out and x are windows of one buffer, `shift` elements apart (0: x is out).
    n = 5000
    buf = np.random.default_rng(0).standard_normal(n + 3).astype(dtype)
    o, i = max(0, shift), max(0, -shift)
    args = (0.75,) if op == "axpy" else ()
    want = buf.copy()
    getattr(kernels, "reference_" + op)(want[o:o + n], *args, want[i:i + n].copy())
    getattr(kernels, op)(buf[o:o + n], *args, buf[i:i + n])
    np.testing.assert_allclose(buf, want, rtol=RTOL[dtype])


# --- zero-copy buffers ------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_inputs_as_bytes_out_as_array(dtype):
    rng = np.random.default_rng(1)
    xs, cs = make_vectors(rng, 3, 1001, dtype), make_coeffs(rng, 3)
    out = np.empty(1001, dtype)
    kernels.coded_sum(out, cs, [x.tobytes() for x in xs])  # dtype taken from out
    assert_close(out, expected_sum(cs, xs, 1001, dtype), cs, xs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_payload_slices_in_place(dtype):
    # Inputs are memoryview slices of one received payload (with a header),
    # out is a slice of a bigger bytearray: it must be written in place, and
    # nothing around it touched.
    n, k, header = 4099, 4, 13
    itemsize = np.dtype(dtype).itemsize
    rng = np.random.default_rng(2)
    xs, cs = make_vectors(rng, k, n, dtype), make_coeffs(rng, k)
    payload = bytearray(b"h" * header + b"".join(x.tobytes() for x in xs))
    views = [memoryview(payload)[header + j * n * itemsize:][:n * itemsize] for j in range(k)]
    target = bytearray(b"\xab" * (n * itemsize + 16))
    kernels.coded_sum(memoryview(target)[8:-8], cs, views, dtype=dtype)
    assert target[:8] == target[-8:] == b"\xab" * 8
    result = np.frombuffer(target, dtype, count=n, offset=8)
    assert_close(result, expected_sum(cs, xs, n, dtype), cs, xs, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bytearray_out_and_typed_memoryviews(dtype):
    x = np.arange(100, dtype=dtype)
    out = bytearray(x.nbytes)
    kernels.axpy(out, 2.0, memoryview(x), dtype=dtype)
    kernels.add_into(out, x.data)  # a typed input gives the raw out its dtype
    np.testing.assert_array_equal(np.frombuffer(out, dtype), 3 * x)


def test_out_may_be_raw_when_an_input_is_typed():
    out = bytearray(8 * 10)
    kernels.coded_sum(out, [2.0, 1.0], [b"\0" * 80, np.arange(10.0)])
    np.testing.assert_array_equal(np.frombuffer(out), np.arange(10.0))


def test_multidimensional_arrays_are_flat_vectors():
    out = np.zeros((3, 4), np.float32)
    kernels.coded_sum(out, [1.0, 2.0], [np.ones(12, np.float32), np.ones((2, 6), np.float32)])
    np.testing.assert_array_equal(out, 3)


# --- bad arguments ------------------------------------------------------------

IMPLS = {
    "compiled": (kernels.coded_sum, kernels.axpy, kernels.add_into),
    "reference": (kernels.reference_coded_sum, kernels.reference_axpy,
                  kernels.reference_add_into),
}


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return IMPLS[request.param]


def f32(n=100):
    return np.ones(n, np.float32)


@pytest.mark.parametrize("out, inputs, match", [
    (f32(), [f32(), np.ones(100)], r"inputs\[1\] has dtype float64, expected float32"),
    (np.ones(100, np.int32), [np.ones(100, np.int32)], "unsupported dtype int32"),
    (np.ones(100, np.float16), [np.ones(100, np.float16)], "unsupported dtype float16"),
    (f32(), [f32(), [1.0] * 100], r"inputs\[1\] must be a buffer"),
    (None, [f32()], "out must be a buffer"),
    (bytearray(400), [b"\0" * 400], "dtype is required"),
    (f32(), f32(), "sequence of vectors"),
])
def test_type_errors(impl, out, inputs, match):
    coded_sum = impl[0]
    with pytest.raises(TypeError, match=match):
        coded_sum(out, [1.0] * len(inputs), inputs)


def test_dtype_keyword_must_agree_with_typed_buffers(impl):
    with pytest.raises(TypeError, match="out has dtype float32, expected float64"):
        impl[0](f32(), [1.0], [b"\0" * 800], dtype=np.float64)


@pytest.mark.parametrize("out, inputs, coeffs, match", [
    (f32(100), [f32(100), f32(99)], [1, 1], r"inputs\[1\] has 99 elements, out has 100"),
    (f32(100), [f32(200)[::2]], [1], r"inputs\[0\] is not C-contiguous"),
    (f32(200)[::2], [f32(100)], [1], "out is not C-contiguous"),
    (np.ones((10, 10), np.float32).T, [f32(100)], [1], "out is not C-contiguous"),
    (f32(100), [f32(100), f32(100)], [1.0], "1 coefficients for 2 inputs"),
    (f32(100), [f32(100)], [[1.0]], "coeffs must be 1-D"),
    (f32(100), [b"\0" * 399], [1], r"inputs\[0\] has 399 bytes, not a multiple"),
    (b"\0" * 400, [f32(100)], [1], "out is read-only"),
])
def test_value_errors(impl, out, inputs, coeffs, match):
    with pytest.raises(ValueError, match=match):
        impl[0](out, coeffs, inputs)


def test_read_only_array_out(impl):
    out = f32()
    out.setflags(write=False)
    for call in (lambda: impl[0](out, [1.0], [f32()]),
                 lambda: impl[1](out, 1.0, f32()),
                 lambda: impl[2](out, f32())):
        with pytest.raises(ValueError, match="out is read-only"):
            call()


def test_axpy_and_add_into_errors_name_x(impl):
    _, axpy, add_into = impl
    with pytest.raises(ValueError, match="x has 99 elements, out has 100"):
        axpy(f32(100), 1.0, f32(99))
    with pytest.raises(TypeError, match="x has dtype float64"):
        add_into(f32(100), np.ones(100))
    with pytest.raises(ValueError, match="x is not C-contiguous"):
        add_into(f32(100), f32(200)[::2])


def test_failed_call_leaves_out_untouched(impl):
    out = f32()
    with pytest.raises(ValueError):
        impl[0](out, [5.0, 5.0], [f32(), f32(99)])
    np.testing.assert_array_equal(out, 1)


# --- fallback -----------------------------------------------------------------

def test_fallback_without_extension_warns():
    # In a fresh interpreter where crnet.coding._core cannot be imported.
    code = textwrap.dedent("""
        import sys, warnings
        sys.modules["crnet.coding._core"] = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from crnet.coding import kernels
        assert not kernels.HAVE_CYTHON
        assert kernels.coded_sum is kernels.reference_coded_sum
        assert any(w.category is RuntimeWarning and "slow" in str(w.message) for w in caught)
        import numpy as np
        out = np.empty(3)
        kernels.coded_sum(out, [2.0], [np.arange(3.0)])
        assert out.tolist() == [0.0, 2.0, 4.0]
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
