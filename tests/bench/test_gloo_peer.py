"""benchmarks.gloo_peer and gloo_run: PyTorch Gloo all_reduce peers on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from benchmarks.gloo_run import run_gloo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(i, argv, env):
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)


def _run(world: int, tmp_path, **kw) -> dict:
    kw.setdefault("elements", 1000)
    kw.setdefault("dtype", "float32")
    kw.setdefault("loads", [100] * world)
    kw.setdefault("seed", 0)
    return run_gloo(_spawn, ["127.0.0.1"] * world, ["lo"] * world, workdir=tmp_path,
                    port=_free_port(), **kw)


def _assert_all_gone(out: dict) -> None:
    assert all(rc is not None for rc in out["returncodes"])
    for pid in out["pids"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.timeout(120)
def test_four_ranks_sum_correctly(tmp_path):
    out = _run(4, tmp_path, steps=5, compute="fixed:1e-5")
    assert out["scheme"] == "gloo"
    assert out["errors"] == []
    assert out["correct"] is True
    assert out["steps_completed"] == 5
    assert out["stalled"] is False
    assert len(out["step_times"]) == 4                 # steps 1..4; step 0 is warm-up
    assert all(t > 0 for t in out["step_times"])
    assert out["first_step_s"] > 0
    assert out["returncodes"] == [0, 0, 0, 0]
    for r in out["records"]:
        assert r["steps_completed"] == 5 and r["correct"] and r["stopped"] == "steps"
        assert r["compute_s"] == pytest.approx([1e-3] * 5)
    _assert_all_gone(out)


@pytest.mark.timeout(120)
def test_every_step_waits_for_the_slowest(tmp_path):
    # Every worker straggles in every step: 100 samples x 1e-4 s x 10 = 0.1 s of compute.
    out = _run(4, tmp_path, steps=5, compute="straggle:1e-4,1.0,10")
    assert out["correct"] and out["steps_completed"] == 5, out["errors"]
    times = out["step_times"]
    assert sum(times) / len(times) >= 0.1
    _assert_all_gone(out)


@pytest.mark.timeout(120)
def test_frozen_peer_stalls_the_run_and_nothing_is_left(tmp_path):
    out = _run(3, tmp_path, steps=10, compute="fixed:1e-5", freeze=(1, 2), deadline=8.0,
               timeout=3.0)
    assert out["steps_completed"] == 2
    assert out["stalled"] is True
    assert out["deadline_reached"] is False
    assert out["correct"] is True                      # the two steps done were right
    assert 1 in out["killed"]
    assert any("frozen at step 2" in e for e in out["errors"])
    assert any("Timed out" in e or "closed" in e.lower() for e in out["errors"])
    assert out["records"][1]["frozen_at"] == 2
    _assert_all_gone(out)


@pytest.mark.timeout(120)
def test_deadline_stops_every_peer_after_the_same_step(tmp_path):
    # 0.05 s per step, deadline 0.5 s: ~10 steps, then all peers leave together, no timeouts.
    out = _run(3, tmp_path, steps=10_000, compute="fixed:5e-4", deadline=0.5, timeout=5.0)
    assert out["errors"] == []
    assert out["deadline_reached"] is True and out["stalled"] is False
    assert out["correct"] is True
    assert 5 <= out["steps_completed"] < 100
    assert len({r["steps_completed"] for r in out["records"]}) == 1
    assert out["returncodes"] == [0, 0, 0]
    _assert_all_gone(out)
