"""Beyond s (crnet.coding.approximate): the decode from fewer than n - s children, its coverage and
residual, exact under every pattern of missing children, and composed down a real plan."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from crnet.coding.approximate import decode_from, node_mass
from crnet.coding.codes import GradientCode
from crnet.coding.plan import Tree, part_masses, plan, weighted_mass

FRC = [(4, 1), (6, 1), (6, 2), (2, 1)]
CRC = [(3, 1), (4, 2), (5, 1), (5, 2), (5, 3)]


def _subsets(n: int):
    for size in range(1, n + 1):
        yield from itertools.combinations(range(n), size)


@pytest.mark.parametrize("n,s", FRC)
def test_frc_coverage_is_the_fraction_of_groups_with_a_survivor(n, s):
    code = GradientCode(n, s, "frc")
    groups = n // (s + 1)
    for present in _subsets(n):
        got = decode_from(code, present)
        alive = {k // (s + 1) for k in present}
        assert got.coverage == len(alive) / groups          # exact: 0/1 weights
        assert got.residual == (0.0 if len(alive) == groups else 1.0)
        assert got.exact == (len(present) >= n - s)
        # one survivor per group (the lowest), coefficient 1
        assert got.used == tuple(min(k for k in present if k // (s + 1) == q) for q in sorted(alive))
        assert all(got.weights[k] == 1.0 for k in got.used)


@pytest.mark.parametrize("n,s", CRC)
def test_crc_coverage_and_residual_are_those_of_the_least_squares_decode(n, s):
    code = GradientCode(n, s, "crc")
    for present in _subsets(n):
        got = decode_from(code, present)
        F = list(present)
        if len(F) >= n - s:
            assert got.exact and got.coverage == 1.0
            assert got.residual < 1e-12
            continue
        assert not got.exact
        r = got.weights @ code.B - 1.0
        # least squares: the residual is orthogonal to every present child's row
        assert np.abs(code.B[F] @ r).max() < 1e-12
        assert got.residual == pytest.approx(np.abs(r).max(), abs=1e-15)
        assert got.coverage == pytest.approx(1.0 + r.mean(), abs=1e-14)
        # an independent solve (the pseudo-inverse) gives the same combination
        a = np.linalg.pinv(code.B[F].T) @ np.ones(n)
        assert np.allclose(got.weights[F], a, atol=1e-12)
        if len(F) == 1:   # closed form: a = <b, 1> / |b|^2 (unit rows), coverage <b, 1>^2 / n
            b = code.B[F[0]]
            assert got.coverage == pytest.approx(b.sum() ** 2 / n, abs=1e-14)


@pytest.mark.parametrize("n,s,kind", [(4, 1, "frc"), (5, 2, "crc"), (3, 1, "crc")])
def test_exact_decodes_are_the_codes_own(n, s, kind):
    code = GradientCode(n, s, kind)
    for present in itertools.combinations(range(n), n - s):
        got = decode_from(code, reversed(present))
        assert got.used == tuple(k for k in code.decode_set(present) if got.weights[k] != 0.0)
        assert np.array_equal(got.weights[list(code.decode_set(present))],
                              code.decode(code.decode_set(present)))
        assert (got.exact, got.coverage) == (True, 1.0)


def test_unequal_parts_weigh_coverage_by_mass():
    code = GradientCode(4, 1, "frc")
    got = decode_from(code, [0], part_mass=[3.0, 3.0, 1.0, 1.0])
    assert got.coverage == 6.0 / 8.0
    with pytest.raises(ValueError):
        decode_from(code, [], part_mass=None)
    with pytest.raises(ValueError):
        decode_from(code, [0], part_mass=[1.0, 2.0])


def _simulate(p, present: dict, m: int) -> tuple[np.ndarray, float, float]:
    """The master's result with g_i = e_i (so the result is each sample's effective weight),
    decoding at every parent from the children ``present[parent]`` (default all), and its
    composed coverage and residual from masses alone."""
    tree = p.tree

    def up(name: str) -> tuple[np.ndarray, float, float]:
        share = p.nodes[name]
        vec = np.zeros(m)
        for start, stop, w in share.local:
            vec[start:stop] += w
        code = tree.code_of(name, p.code_kind)
        if code is None:
            mass = weighted_mass(share.local)
            return vec, mass, 0.0, mass
        kids = tree.children(name)
        below = {k: up(child) for k, child in enumerate(kids)}
        got = decode_from(code, present.get(name, range(code.n)),
                          part_masses(share.responsibility, share.local, code.n))
        for k in got.used:
            vec += got.weights[k] * below[k][0]
        effective, whole = node_mass(code, got, weighted_mass(share.local),
                                     part_masses(share.responsibility, share.local, code.n),
                                     {k: below[k][1] for k in got.used if below[k][1] != below[k][3]})
        res = max([got.residual, *(below[k][2] for k in got.used)])
        assert whole == pytest.approx(weighted_mass(share.responsibility), abs=1e-9)
        return vec, effective, res, whole

    vec, effective, res, whole = up("")
    return vec, effective / whole, res


@pytest.mark.parametrize("fanout,s,kind", [((3, 3), 1, "crc"), ((4, 2), 1, "frc"), ((2, 3), 1, "auto")])
def test_coverage_composes_down_a_two_layer_tree(fanout, s, kind):
    tree = Tree(fanout, (s, s))
    m = 97
    p = plan(tree, m, kind)
    full, cov, res = _simulate(p, {}, m)
    assert np.allclose(full, 1.0) and cov == 1.0 and res < 1e-12
    # every pattern of children present at the master and at its first child (fewer than n - s
    # at one or both): the composed coverage is the result's mean effective weight, exactly
    n0, n1 = fanout
    for at_master in _subsets(n0):
        for at_child in _subsets(n1):
            vec, cov, res = _simulate(p, {"": at_master, "0": at_child}, m)
            assert cov == pytest.approx(vec.sum() / m, abs=1e-12)
            if len(at_master) >= n0 - s and len(at_child) >= n1 - s:
                assert cov == 1.0


def test_crnet_torch_divides_an_approximate_sum_by_the_batch_it_covers():
    from types import SimpleNamespace

    pytest.importorskip("torch")
    from crnet import ResultInfo
    from crnet.coding.approximate import MIN_SCALED_COVERAGE
    from crnet.torch import DistributedOptimizer

    def samples_in(info):
        opt = SimpleNamespace(approximate=0, step_index=7, client=SimpleNamespace(
            assignment=SimpleNamespace(samples=200), last_result_info=info))
        return DistributedOptimizer.samples_in(opt), opt.approximate   # type: ignore[arg-type]

    assert samples_in(None) == (200, 0)
    assert samples_in(ResultInfo()) == (200, 0)
    assert samples_in(ResultInfo(False, 0.25, 1.0)) == (50.0, 1)
    assert samples_in(ResultInfo(False, MIN_SCALED_COVERAGE / 2, 1.0)) == (200, 1)   # not rescaled
