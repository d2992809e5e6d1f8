"""crnet tune --write: the best choice as the master's --config file, read back by crnetd's
own option parser (--check-config) as the same scheme, shape, stragglers, batch and chunks."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from crnet.cli import crnetd
from crnet.coding.plan import Tree, scheme_tree
from crnet.config.tree import tree_for_scheme
from crnet.tune.tuning import HostMeasured, Measurements, Running, config_text, master_config, tune
from crnet.tune.workload import ComputeModel

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def tuning(chunk_bytes: int = 0):
    rng = np.random.default_rng(3)
    times = ComputeModel.parse("straggle:1e-4,0.1,10").sample(np.full(6, 10.0), rng, 32) / 10
    x = times.ravel()
    hosts = tuple(HostMeasured(str(k), None, 10, tuple(x[k::6]), ((10 ** 7, 0.1),), (1e-4,), 1e8)
                  for k in range(6))
    run = Running("cr", Tree((2, 2), (1, 0)), 60, chunk_bytes, 400_000)
    return tune(Measurements(run, hosts, (0.01, 0.02), ()), trials=100)


def read_back(path) -> dict:
    """What crnetd --config PATH (with --listen and --insecure, as a unit's flags would
    add) takes: its --check-config output, which is TOML."""
    env = {k: None for k in os.environ if k.startswith("CRNET_")}
    got = CliRunner().invoke(crnetd, ["--config", str(path), "--listen", "127.0.0.1:0",
                                      "--insecure", "--check-config"], env=env)
    assert got.exit_code == 0, got.output
    return tomllib.loads(got.output)


@pytest.mark.parametrize("chunk_bytes, chunk_text", [(0, "auto"), (65536, 65536)])
def test_every_ranked_choice_reads_back_as_that_plan(tmp_path, chunk_bytes, chunk_text):
    t = tuning(chunk_bytes)
    schemes = {}
    for p in t.ranking:        # one choice of every scheme, the best written by default
        schemes.setdefault(p.scheme, p)
    assert set(schemes) == {"cr", "gc", "tree", "rar", "spread"}
    for choice in [t.ranking[0], *schemes.values()]:
        path = tmp_path / "tuned.toml"
        path.write_text(config_text(t, None if choice is t.ranking[0] else choice))
        got = read_back(path)
        assert got["role"] == "master" and got["scheme"] == choice.scheme
        assert got["samples"] == 60 and got["chunk_bytes"] == chunk_text
        tree = tree_for_scheme(got["scheme"], got.get("workers"), got["fanout"], got["layers"],
                               got["stragglers"])
        want = scheme_tree(choice.scheme, tree=choice.tree, workers=choice.workers,
                           stragglers=0 if choice.tree is None else choice.tree.stragglers[0])
        assert tree == want, (choice, got)
    assert master_config(schemes["gc"], t.measurements.running)["workers"] == 6


def test_the_cli_writes_the_file_or_says_why_not(tmp_path):
    """Without a tree to ask the CLI fails before writing anything."""
    from crnet.cli import main

    path = tmp_path / "tuned.toml"
    got = CliRunner().invoke(main, ["tune", "127.0.0.1:1", "--write", str(path)])
    assert got.exit_code != 0 and "Traceback" not in got.output
    assert not path.exists()


def test_a_running_gc_tree_is_predicted_with_its_own_stragglers():
    """gc's s is its one layer's stragglers: the running configuration is predicted (and
    shown, and compared with what --plan auto would run) with it, not with s = 0."""
    rng = np.random.default_rng(4)
    x = (ComputeModel.parse("straggle:1e-4,0.3,10").sample(np.full(6, 10.0), rng, 32) / 10).ravel()
    hosts = tuple(HostMeasured(str(k), None, 20, tuple(x[k::6]), ((10 ** 7, 0.1),), (1e-4,), 1e8)
                  for k in range(6))
    run = Running("gc", Tree((6,), (2,)), 60, 0, 400_000)
    assert run.shape == Tree((6,), (2,))
    t = tune(Measurements(run, hosts, (0.01, 0.02), ()), trials=100)
    assert t.running.tree == Tree((6,), (2,)) and t.running.max_load == 30
    auto = t.to_json()["plan_auto"]
    assert auto is None or (auto["scheme"], auto["stragglers"]) != ("gc", [2])
