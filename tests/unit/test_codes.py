"""Tests for crnet.coding.codes: every straggler pattern decodes, FRC exactly, CRC to 1e-9."""
import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crnet.coding.codes import GradientCode, code_for

from ..helpers.vectors import gradients

SMALL = [(n, s) for n in range(1, 9) for s in range(n)]
KINDS = ["auto", "crc"]  # "frc" is what auto picks whenever it is allowed


def effective_weights(code, responders, a):
    """Per-part weight sum_i a[i] B[responders[i], :]; 1 everywhere means exact decode."""
    return np.asarray(a) @ code.B[list(responders)]


def supersets(n, F):
    """A few supersets of F: one extra child, and everyone in reverse order."""
    missing = [k for k in range(n) if k not in F]
    out = [list(F) + missing[:1]] if missing else []
    return out + [list(reversed(range(n)))]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n", "s"), SMALL)
def test_every_straggler_pattern_decodes(n, s, kind):
    code = GradientCode(n, s, kind)
    for F in itertools.combinations(range(n), n - s):
        for resp in [list(F), *supersets(n, F)]:
            a = code.decode(resp)
            assert a.dtype == np.float64 and a.shape == (len(resp),)
            w = effective_weights(code, resp, a)
            if code.kind == "crc":
                np.testing.assert_allclose(w, 1.0, rtol=0, atol=1e-9)
                # surplus responders beyond the first n - s are not used
                assert np.all(a[n - s:] == 0.0)
            else:
                assert set(a.tolist()) <= {0.0, 1.0}
                assert np.all(w == 1.0)  # exact in floating point


@pytest.mark.parametrize("n", range(1, 13))
def test_worst_decode_error_small_n(n):
    for s in range(n):
        for kind in KINDS:
            assert GradientCode(n, s, kind).worst_decode_error() <= 1e-9, (n, s, kind)


def test_worst_decode_error_refuses_huge_pattern_counts():
    with pytest.raises(ValueError, match="too many"):
        GradientCode(100, 20).worst_decode_error()


@pytest.mark.parametrize(("n", "s"), [(n, s) for n in range(1, 11) for s in range(n)])
@pytest.mark.parametrize("kind", KINDS)
def test_supports(n, s, kind):
    code = GradientCode(n, s, kind)
    assert code.B.shape == (n, n) and code.B.dtype == np.float64
    assert len(code.supports) == n
    for k, sup in enumerate(code.supports):
        assert sup == tuple(np.flatnonzero(code.B[k]))
        assert len(sup) == s + 1
        if code.kind == "crc":
            assert sup == tuple(sorted((k + i) % n for i in range(s + 1)))
        else:
            q = k // (s + 1)
            assert sup == tuple(range(q * (s + 1), (q + 1) * (s + 1)))
            assert np.all(code.B[k, list(sup)] == 1.0)
    # every part is held by exactly s + 1 children
    assert np.all((code.B != 0).sum(axis=0) == s + 1)


def test_kind_resolution():
    assert GradientCode(6, 2).kind == "frc"
    assert GradientCode(6, 5).kind == "frc"  # one group: everyone holds everything
    assert GradientCode(7, 2).kind == "crc"
    assert GradientCode(6, 2, "crc").kind == "crc"
    for kind in ("auto", "frc", "crc"):
        code = GradientCode(5, 0, kind)
        assert code.kind == "identity"
        assert np.array_equal(code.B, np.eye(5))
    assert repr(GradientCode(4, 1)) == "GradientCode(n=4, s=1, kind='frc')"
    assert repr(GradientCode(5, 2)) == "GradientCode(n=5, s=2, kind='crc')"


@pytest.mark.parametrize(("n", "s"), [(7, 3), (10, 4), (12, 6), (30, 7)])
def test_coefficients_follow_given_order_crc(n, s):
    code = GradientCode(n, s, "crc")
    rng = random.Random(n * 100 + s)
    F = sorted(rng.sample(range(n), n - s))
    base = dict(zip(F, code.decode(F)))
    for _ in range(5):
        perm = rng.sample(F, len(F))
        a = code.decode(perm)
        assert [base[r] for r in perm] == a.tolist()
        np.testing.assert_allclose(effective_weights(code, perm, a), 1.0, atol=1e-9)


def test_frc_uses_first_arrival_of_each_group():
    code = GradientCode(6, 2)  # groups {0,1,2}, {3,4,5}
    resp = [4, 1, 0, 3, 2]
    assert code.decode(resp).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    resp = [2, 5, 3, 0]
    assert code.decode(resp).tolist() == [1.0, 1.0, 0.0, 0.0]


def test_accepts_numpy_integers_and_iterators():
    code = GradientCode(5, 2)
    a = code.decode(np.array([4, 0, 2]))
    assert np.array_equal(a, code.decode(iter([4, 0, 2])))
    assert np.array_equal(a, code.decode((np.int32(4), np.int64(0), 2)))


def test_cache_cannot_be_corrupted():
    for code in (GradientCode(7, 3), GradientCode(6, 2)):
        resp = [6, 2, 0, 4, 5][: code.n - code.s] if code.kind == "crc" else [0, 3, 4, 5]
        first = code.decode(resp).copy()
        out = code.decode(resp)
        out[:] = 1e9  # the caller owns what it got
        assert np.array_equal(code.decode(resp), first)
        a, _ = code.decode_approx(resp)
        a[:] = -1.0
        assert np.array_equal(code.decode(resp), first)
        with pytest.raises(ValueError):
            code.B[0, 0] = 5.0  # B is read-only


@pytest.mark.parametrize(("n", "s"), [(5, 2), (9, 4), (12, 7), (20, 5), (30, 7), (40, 13)])
def test_deterministic(n, s):
    a, b = GradientCode(n, s), GradientCode(n, s)
    assert np.array_equal(a.B, b.B)
    assert a.supports == b.supports


def test_code_for_shares_instances():
    assert code_for(7, 2) is code_for(7, 2)
    assert code_for(6, 2, "crc") is not code_for(6, 2)
    assert code_for(6, 2, "crc").kind == "crc"


def test_large_n_random_construction_decodes():
    code = GradientCode(30, 7)
    rng = random.Random(0)
    for _ in range(50):
        resp = rng.sample(range(30), 23)
        a = code.decode(resp)
        np.testing.assert_allclose(effective_weights(code, resp, a), 1.0, atol=1e-9)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((4, 4), "0 <= s < n"),
        ((4, 7), "0 <= s < n"),
        ((4, -1), "0 <= s < n"),
        ((0, 0), "n >= 1"),
        ((2.0, 1), "n must be an integer"),
        ((4, 2, "frc"), r"\(s\+1\) to divide n"),
        ((4, 1, "mds"), "kind must be one of"),
    ],
)
def test_constructor_errors(args, message):
    with pytest.raises(ValueError, match=message):
        GradientCode(*args)


@pytest.mark.parametrize(
    ("responders", "message"),
    [
        ([0, 1], r"need at least 3 of 4 children to decode, got 2: \[0, 1\]"),
        ([], r"need at least 3 of 4 children to decode, got 0: \[\]"),
        ([0, 2, 2], "duplicate responder 2"),
        ([0, 7, 1], r"responder 7 out of range 0\.\.3"),
        ([0, -1, 1], r"responder -1 out of range 0\.\.3"),
        ([0, 1.0, 2], "responder 1.0 is not an integer"),
        ([0, "1", 2], "responder '1' is not an integer"),
        ([0, True, 2], "responder True is not an integer"),
        (3, "iterable"),
    ],
)
@pytest.mark.parametrize("kind", KINDS)
def test_decode_errors(responders, message, kind):
    code = GradientCode(4, 1, kind)
    with pytest.raises(ValueError, match=message):
        code.decode(responders)


def test_decode_approx_errors():
    with pytest.raises(ValueError, match="need at least 1 of 4 children"):
        GradientCode(4, 1).decode_approx([])
    with pytest.raises(ValueError, match="duplicate responder 0"):
        GradientCode(5, 1).decode_approx([0, 0])


@pytest.mark.parametrize(("n", "s"), [(5, 2), (7, 3), (8, 5), (10, 4)])
def test_decode_approx_crc_with_too_many_stragglers(n, s):
    code = GradientCode(n, s, "crc")
    rng = random.Random(n)
    for size in range(1, n - s):
        resp = rng.sample(range(n), size)
        a, err = code.decode_approx(resp)
        assert np.all(np.isfinite(a)) and a.shape == (size,)
        residual = effective_weights(code, resp, a) - 1.0
        assert err > 0 and err == pytest.approx(np.abs(residual).max())
        # least squares: the residual is orthogonal to every responder's row
        np.testing.assert_allclose(code.B[resp] @ residual, 0.0, atol=1e-9)


def test_decode_approx_frc_loses_whole_groups():
    code = GradientCode(6, 2)  # groups {0,1,2}, {3,4,5}; decode() needs 4 responders
    a, err = code.decode_approx([4])
    assert a.tolist() == [1.0] and err == 1.0
    assert np.array_equal(effective_weights(code, [4], a), [0, 0, 0, 1, 1, 1])
    a, err = code.decode_approx([5, 1])  # fewer than n - s, but every group covered
    assert a.tolist() == [1.0, 1.0] and err == 0.0
    a, err = GradientCode(3, 0).decode_approx([2, 0])
    assert a.tolist() == [1.0, 1.0] and err == 1.0


@pytest.mark.parametrize(("n", "s"), SMALL)
def test_decode_approx_matches_decode_when_enough(n, s):
    for kind in KINDS:
        code = GradientCode(n, s, kind)
        rng = random.Random(n * 10 + s)
        for size in (n - s, n):
            resp = rng.sample(range(n), size)
            a, err = code.decode_approx(resp)
            assert np.array_equal(a, code.decode(resp))
            assert err <= 1e-9
            if code.kind != "crc":
                assert err == 0.0


@st.composite
def coded_sums(draw):
    n = draw(st.integers(1, 10))
    s = draw(st.integers(0, n - 1))
    kind = draw(st.sampled_from(["auto", "crc"]))
    size = draw(st.integers(n - s, n))
    resp = draw(st.permutations(range(n)))[:size]
    seed = draw(st.integers(0, 2**32 - 1))
    dim = draw(st.integers(1, 6))
    return n, s, kind, resp, seed, dim


@settings(max_examples=300, deadline=None)
@given(coded_sums())
def test_coded_messages_sum_to_the_gradient(case):
    n, s, kind, resp, seed, dim = case
    code = GradientCode(n, s, kind)
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((n, dim)) * 10.0 ** rng.uniform(-3, 3, size=(n, 1))
    M = code.B @ G  # message of every child
    a = code.decode(resp)
    got = a @ M[resp]
    want = G.sum(axis=0)
    scale = np.abs(G).sum(axis=0).max()
    assert np.abs(got - want).max() <= 1e-9 * scale


@pytest.mark.parametrize("n, s", [(3, 1), (5, 2), (4, 1), (6, 2), (7, 3)])
def test_decode_set_depends_on_which_children_arrived_not_their_order(n, s):
    code = code_for(n, s)
    rng = random.Random(n * 10 + s)
    for size in range(n - s, n + 1):
        for arrived in itertools.combinations(range(n), size):
            chosen = code.decode_set(arrived)
            assert len(chosen) >= n - s and list(chosen) == sorted(chosen)
            assert set(chosen) <= set(arrived)
            order = list(arrived)
            rng.shuffle(order)
            assert code.decode_set(order) == chosen
            a = code.decode(chosen)
            np.testing.assert_allclose(effective_weights(code, chosen, a), 1.0, atol=1e-9)
            if code.kind == "crc":  # the best-conditioned of the sets that arrived
                best = min(np.abs(code.decode(F)).sum() for F in itertools.combinations(arrived, n - s))
                assert np.abs(a).sum() == pytest.approx(best)


def test_amplification_is_the_largest_decode_weight_sum():
    assert GradientCode(3, 1).amplification() == pytest.approx(3.6502815398728865)
    assert GradientCode(4, 1).amplification() == 2.0          # FRC: one 1.0 per group
    assert GradientCode(3, 0).amplification() == 3.0          # identity: every child once
    code = GradientCode(5, 2, kind="crc")
    assert code.amplification() == pytest.approx(max(
        np.abs(code.decode(F)).sum() for F in itertools.combinations(range(5), 3)))


# ---- FRC decodes exactly from fewer than n - s children: one of every group ----

@pytest.mark.parametrize(("n", "s"), [(4, 1), (6, 1), (6, 2), (12, 1), (8, 3)])
def test_frc_decodes_exactly_from_one_child_of_every_group(n, s):
    code = GradientCode(n, s, "frc")
    parts = gradients(n * 10 + s, n, 5)
    messages = code.B @ parts
    groups = n // (s + 1)
    for picks in itertools.product(range(s + 1), repeat=groups):
        arrived = [g * (s + 1) + p for g, p in zip(range(groups), picks)][::-1]  # any order
        assert code.covers(arrived)
        used = code.decode_set(arrived)
        assert used == tuple(sorted(arrived))
        coefficients = code.decode(used)
        assert coefficients.tolist() == [1.0] * groups   # exact in floating point too
        got = coefficients @ messages[list(used)]
        np.testing.assert_allclose(got, parts.sum(axis=0), rtol=1e-12, atol=1e-12)
    if groups > 1:   # a group with nobody: not exact, and decode says so
        short = list(range(s + 1, n))
        assert not code.covers(short)
        with pytest.raises(ValueError, match=rf"need at least {n - s} of {n} children to "
                           rf"decode, got {len(short)}.*one of every group of {s + 1}"):
            code.decode(short)


@pytest.mark.parametrize(("n", "s"), [(3, 1), (5, 2), (4, 1)])
def test_crc_needs_n_minus_s_children(n, s):
    code = GradientCode(n, s, "crc")
    assert code.covers(range(n - s))
    for fewer in itertools.combinations(range(n), n - s - 1):
        assert not code.covers(fewer)
        with pytest.raises(ValueError, match=rf"need at least {n - s} of {n} children"):
            code.decode_set(fewer)
