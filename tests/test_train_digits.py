"""examples/train_digits.py under ``crnet run``: every process ends with the parameters of
single-process training on the same global batches, although stragglers are injected.

12 workers (fanout 3, 2 layers, 1 straggler per parent: cyclic-repetition weights, some
negative) and the master's process: 13 processes with torch, which take about 40 s per run
on 2 cores, most of it importing torch.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("tqdm")

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_digits.py"
TREE = ["--fanout", "3", "--layers", "2", "--stragglers", "1"]
PROCESSES = 13
SAMPLES = 240
STRAGGLERS = ["--straggle-prob", "0.1", "--straggle-factor", "10", "--compute-ms", "4"]


def example():
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def single_process(args: list[str]) -> np.ndarray:
    """The reference: one process, the whole global batch each step, the mean loss."""
    ex = example()
    a = ex.parse_args([*args, "--single", "--samples", str(SAMPLES)])
    model, _, _ = ex.train_single(a, ex.load(ex.dtype(a)))
    return np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("dtype, optimizer, tol", [
    ("float64", "adam", 1e-9),
    # float32 Adam drifts by design (m / sqrt(v) turns rounding noise in a near-zero gradient
    # into a step of lr: 5e-4 after 30 steps between two single-process runs that sum in
    # another order); SGD keeps the rounding at rounding size.
    ("float32", "sgd", 1e-5),
])
def test_every_process_trains_like_one_process_under_stragglers(tmp_path, dtype, optimizer, tol):
    args = ["--steps", "30", "--dtype", dtype, "--optimizer", optimizer, *STRAGGLERS]
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    out = subprocess.run(
        [sys.executable, "-m", "crnet", "run", *TREE, "--samples", str(SAMPLES), "--",
         sys.executable, str(EXAMPLE), *args, "--save-params", str(tmp_path / "params-{rank}.npy"),
         "--json", str(tmp_path / "run-{rank}.json")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    want = single_process(args)
    params = [np.load(tmp_path / f"params-{rank}.npy") for rank in range(PROCESSES)]
    err = rel_error(params[0], want)
    print(f"{dtype} {optimizer}: max rel. difference {err:.1e} vs single-process training")
    assert err <= tol, err
    for rank, got in enumerate(params):
        assert np.array_equal(got, params[0]), rank      # the very same updates everywhere

    runs = [json.loads((tmp_path / f"run-{rank}.json").read_text()) for rank in range(PROCESSES)]
    assert runs[0]["stragglers_injected"] > 0
    assert sum(r["abandoned"] for r in runs) > 0         # processes left steps the tree had done
    assert all(r["skipped"] == r["resyncs"] == 0 for r in runs)
    assert "[master] crnet: 12 workers, 30 steps of 240 samples" in out.stdout
