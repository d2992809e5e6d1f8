"""Compute-time distributions: deterministic draws, CLI spellings, and their statistics."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crnet.tune.workload import ComputeModel

MODELS = [
    ComputeModel("fixed", 1e-4),
    ComputeModel("straggle", 1e-4, prob=0.1, factor=10),
    ComputeModel("grouped", 1e-4, prob=0.1, factor=10, group=1),
    ComputeModel("shifted_exp", 1e-4, mu=2000.0),
    ComputeModel("empirical", 1e-4, multipliers=(1.0, 1.5, 4.0)),
]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.kind)
def test_compute_time_is_deterministic_in_seed_step_worker(model):
    t = model.compute_time(500, seed=7, step=3, worker=11)
    assert t == model.compute_time(500, seed=7, step=3, worker=11)
    # The single draw and the vectorised draw are the same draw.
    rng = np.random.default_rng([7, 3, 11])
    assert t == model.sample(np.array([500]), rng, 1)[0, 0]
    assert model.compute_time(0, seed=7, step=3, worker=11) == 0.0  # the master computes nothing
    times = {model.compute_time(500, seed=7, step=step, worker=11) for step in range(200)}
    assert len(times) == 1 if model.kind == "fixed" else len(times) > 1  # steps differ


def test_sample_shape_and_proportional_to_load():
    model = ComputeModel("shifted_exp", 1e-4, mu=1000.0)
    loads = np.array([0, 10, 20])
    draws = model.sample(loads, np.random.default_rng(0), 50)
    assert draws.shape == (50, 3)
    assert np.all(draws[:, 0] == 0)
    assert np.all(draws[:, 1:] >= loads[1:] * 1e-4)
    with pytest.raises(ValueError, match="one-dimensional"):
        model.sample(np.zeros((2, 2)), np.random.default_rng(0), 5)


@pytest.mark.parametrize("text, want", [
    ("fixed:1e-4", ComputeModel("fixed", 1e-4)),
    ("straggle:1e-4,0.1,10", ComputeModel("straggle", 1e-4, prob=0.1, factor=10.0)),
    ("shifted-exp:2e-5,5000", ComputeModel("shifted_exp", 2e-5, mu=5000.0)),
    ("shifted_exp:2e-5,5000", ComputeModel("shifted_exp", 2e-5, mu=5000.0)),
    (" Straggle: 0.001, 0.5, 3 ", ComputeModel("straggle", 1e-3, prob=0.5, factor=3.0)),
    ("grouped:1e-4,0.1,10,3", ComputeModel("grouped", 1e-4, prob=0.1, factor=10.0, group=3)),
])
def test_parse(text, want):
    assert ComputeModel.parse(text) == want


@settings(max_examples=60, deadline=None)
@given(a=st.floats(0, 1), p=st.floats(0, 1), f=st.floats(1, 1e3), mu=st.floats(1e-3, 1e6))
def test_parse_describe_round_trip(a, p, f, mu):
    for model in (ComputeModel("fixed", a), ComputeModel("straggle", a, prob=p, factor=f),
                  ComputeModel("grouped", a, prob=p, factor=f, group=4),
                  ComputeModel("shifted_exp", a, mu=mu)):
        assert ComputeModel.parse(model.describe()) == model


def test_describe_is_short():
    straggle = ComputeModel("straggle", 1e-4, prob=0.1, factor=10)
    assert straggle.describe() == "straggle:0.0001,0.1,10"
    assert ComputeModel("shifted_exp", 2e-5, mu=5000).describe() == "shifted-exp:2e-05,5000"
    grouped = ComputeModel("grouped", 1e-4, prob=0.1, factor=10, group=3)
    assert grouped.describe() == "grouped:0.0001,0.1,10,3"


@pytest.mark.parametrize("text, message", [
    ("", "expected fixed:A"),
    ("fixed", "expected fixed:A"),
    ("gamma:1,2", "expected fixed:A"),
    ("fixed:", "expected fixed:A"),
    ("fixed:1,2", "expected fixed:A"),
    ("fixed:fast", "per-sample time A 'fast' is not a number"),
    ("fixed:nan", "must be finite"),
    ("fixed:-1", "must be a finite number >= 0"),
    ("straggle:1e-4,0.1", "expected straggle:A,P,F"),
    ("straggle:1e-4,1.5,10", "probability must be in [0, 1]"),
    ("straggle:1e-4,0.1,0.5", "factor must be a finite number >= 1"),
    ("grouped:1e-4,0.1,10", "expected grouped:A,P,F,G"),
    ("grouped:1e-4,0.1,10,2.5", "group size G '2.5' is not a whole number"),
    ("grouped:1e-4,0.1,10,0", "group size must be an integer >= 1"),
    ("grouped:1e-4,1.5,10,3", "probability must be in [0, 1]"),
    ("shifted-exp:1e-4,0", "mu must be a finite number > 0"),
    ("shifted-exp:1e-4", "expected shifted-exp:A,MU"),
    ("empirical:1e-4", "expected empirical:A,FILE"),
    ("empirical:1e-4,/no/such/file", "cannot read '/no/such/file'"),
])
def test_bad_spellings_raise_clear_value_errors(text, message):
    with pytest.raises(ValueError) as e:
        ComputeModel.parse(text)
    assert message in str(e.value)


@pytest.mark.parametrize("text, want", [
    ("fixed:20ms", ComputeModel("fixed", 0.02)),
    ("fixed:20us", ComputeModel("fixed", 2e-5)),
    ("straggle:20us,0.1,10", ComputeModel("straggle", 2e-5, prob=0.1, factor=10.0)),
    ("shifted-exp:10us,1e5/s", ComputeModel("shifted_exp", 1e-5, mu=1e5)),
    ("shifted-exp:0.01ms,100/ms", ComputeModel("shifted_exp", 1e-5, mu=1e5)),
])
def test_every_compute_spelling_takes_units(text, want):
    """As --latency 50us does: A a duration, MU a rate; plain numbers stay seconds, per second."""
    got = ComputeModel.parse(text)
    assert got.kind == want.kind and got.prob == want.prob and got.factor == want.factor
    assert got.per_sample_s == pytest.approx(want.per_sample_s, rel=1e-12)
    assert got.mu == pytest.approx(want.mu, rel=1e-12)


@pytest.mark.parametrize("text, message", [
    ("fixed:20xs", "per-sample time A: duration '20xs': unknown unit 'xs'"),
    ("shifted-exp:1e-5,1/h", "rate MU: rate '1/h': expected a number per s, ms, us or ns"),
])
def test_a_unit_that_is_not_one_is_named(text, message):
    with pytest.raises(ValueError) as e:
        ComputeModel.parse(text)
    assert message in str(e.value) and str(e.value).count("compute model") == 1


def test_constructor_validates():
    with pytest.raises(ValueError, match="kind must be one of"):
        ComputeModel("shifted-exp", 1e-4)  # the constructor takes the identifier spelling
    with pytest.raises(ValueError, match="at least one multiplier"):
        ComputeModel("empirical", 1e-4)


def test_empirical_file_is_normalised_by_its_minimum(tmp_path):
    path = tmp_path / "steps.txt"
    path.write_text("# measured step times, seconds\n0.020\n0.040\n\n0.020  # again\n0.100\n")
    model = ComputeModel.parse(f"empirical:1e-4,{path}")
    assert model.multipliers == (1.0, 2.0, 1.0, 5.0)
    draws = model.sample(np.array([100]), np.random.default_rng(0), 4000)[:, 0]
    assert set(np.round(draws / 1e-2, 9)) == {1.0, 2.0, 5.0}
    assert draws.mean() == pytest.approx(model.mean_time(100), rel=0.05)
    assert model.describe().startswith("empirical:0.0001 (4 multipliers")
    (tmp_path / "bad.txt").write_text("0.1\nslow\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: 'slow' is not a number"):
        ComputeModel.parse(f"empirical:1e-4,{tmp_path / 'bad.txt'}")
    (tmp_path / "zero.txt").write_text("0.1\n0\n")
    with pytest.raises(ValueError, match="finite and > 0"):
        ComputeModel.parse(f"empirical:1e-4,{tmp_path / 'zero.txt'}")


def test_straggle_frequency_matches_probability():
    model = ComputeModel("straggle", 1e-4, prob=0.1, factor=10)
    draws = model.sample(np.full(20, 100), np.random.default_rng(1), 10_000)
    assert set(np.unique(np.round(draws, 12))) == {0.01, 0.1}
    slowed = np.mean(draws > 0.05)
    assert abs(slowed - 0.1) < 4 * math.sqrt(0.1 * 0.9 / draws.size)
    # The per-(seed, step, worker) draws the benchmark sleeps straggle just as often.
    single = [model.compute_time(100, seed=3, step=s, worker=w)
              for s in range(200) for w in range(20)]
    assert abs(np.mean(np.array(single) > 0.05) - 0.1) < 4 * math.sqrt(0.1 * 0.9 / len(single))


def test_shifted_exponential_mean():
    a, mu = 1e-4, 5000.0
    model = ComputeModel("shifted_exp", a, mu=mu)
    loads = np.array([10, 100, 1000])
    draws = model.sample(loads, np.random.default_rng(2), 40_000)
    np.testing.assert_allclose(draws.mean(axis=0), loads * (a + 1 / mu), rtol=0.02)
    assert np.all(draws >= loads * a)
    np.testing.assert_allclose(model.mean_time(loads), loads * (a + 1 / mu))


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.kind)
def test_mean_time_matches_the_draws(model):
    draws = model.sample(np.array([200]), np.random.default_rng(4), 50_000)
    assert draws.mean() == pytest.approx(model.mean_time(200), rel=0.03)
