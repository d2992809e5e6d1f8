"""crnet as a torch.distributed backend, and PyTorch DDP on it with the crnet hook.

tests/torch/ddp_script.py is a plain DDP script changed only by the backend name, the hook
registration, the sampler and the weighted loss. Under ``crnet run`` (4 hosts, 2
processes each: LOCAL_WORLD_SIZE = 2, cyclic repetition weights, stragglers injected)
every process must end with the parameters of single-process training on the same
global batches (float64, 1e-9), bit-identical, after exactly one crnet step per training
step although DDP made several buckets; the same run checks torch.distributed's
collectives on the crnet group and their errors. Under one torchrun per daemon of a
local tree (the multi-host launch, on one machine), a step that fails tree-wide is
skipped by every replica.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from crnet import BatchSampler  # noqa: E402
from crnet.coding.plan import Tree  # noqa: E402
from crnet.tools.launch import free_port  # noqa: E402
from crnet.torch import process_group  # noqa: E402

from ..helpers import REPO  # noqa: E402
from ..helpers.vectors import rel_error  # noqa: E402
from . import ddp_script  # noqa: E402

pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(ddp_script.__file__).resolve()   # run by path, under crnet run or torchrun

TREE = ["--fanout", "3", "--layers", "1", "--stragglers", "1", "--local-processes", "2"]
WORLD = 8              # 4 hosts (the master's included) x 2
SAMPLES = 24
STEPS = 12


def crnet_run(out: Path, tree: list[str], samples: int, *script_args: str) -> None:
    """The DDP script under ``crnet run``, writing into ``out``."""
    (out / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(out / "tmp"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(
        [sys.executable, "-m", "crnet", "run", *tree, "--samples", str(samples), "--",
         sys.executable, "-W", "ignore", str(SCRIPT), "--out", str(out),
         *script_args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=250)
    except subprocess.TimeoutExpired:
        proc.terminate()          # crnet run stops its processes and daemons (SIGKILL would not)
        stdout, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The DDP script under ``crnet run`` with stragglers: its output directory."""
    out = tmp_path_factory.mktemp("ddp")
    crnet_run(out, TREE, SAMPLES, "--steps", str(STEPS), "--straggle-prob", "0.15",
              "--straggle-ms", "300")
    return out


def single_process(samples: int = SAMPLES, steps: int = STEPS, skipped=()) -> np.ndarray:
    """The reference: rank 0's initial model, the whole global batch each step, mean loss
    (no update in the ``skipped`` steps)."""
    x, y = ddp_script.data()
    model = ddp_script.make_model(0)
    opt = ddp_script.make_optimizer(model.parameters())
    batches = BatchSampler(ddp_script.DATASET, samples, ddp_script.SEED)
    for t in range(steps):
        if t in skipped:
            continue
        idx = torch.from_numpy(batches.indices(t))
        opt.zero_grad()
        F.mse_loss(model(x[idx]), y[idx], reduction="none").mean(dim=1).mean().backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def test_a_ddp_script_trains_like_one_process_on_the_global_batch(run):
    params = [np.load(run / f"params-{rank}.npy") for rank in range(WORLD)]
    err = rel_error(params[0], single_process())
    print(f"DDP on crnet: max rel. difference {err:.1e} vs single-process training")
    assert err <= 1e-9, err
    for rank, got in enumerate(params):
        assert np.array_equal(got, params[0]), rank       # the very same updates everywhere
    runs = [json.loads((run / f"run-{rank}.json").read_text()) for rank in range(WORLD)]
    for r in runs:
        # one crnet step per training step, however many buckets DDP made
        assert r["reductions"] == r["applied"] == STEPS, r
        assert r["buckets"] >= 2, r
        assert r["skipped"] == r["resyncs"] == 0, r
    assert sum(r["abandoned"] for r in runs) > 0           # stragglers left steps the tree had done


def test_collectives_are_exact_and_the_same_on_every_process(run):
    seen = [json.loads((run / f"collectives-{rank}.json").read_text()) for rank in range(WORLD)]
    s = seen[0]
    want_sum = 0.0
    for rank in range(WORLD):                               # in rank order, as the backend adds
        want_sum += 0.1 * (rank + 1)
    assert s["sum"] == [want_sum] * 4
    assert s["avg"] == [sum(range(WORLD)) / WORLD] * 2
    assert s["max"] == [WORLD - 1, 0, 1 << 60]
    assert s["bits"] == [-1, 2**53 + 1, WORLD - 1]          # bytes, not values: exact for any dtype
    assert s["half"] == [1.5, WORLD - 1] and s["flags"] == [(WORLD - 1) % 2 == 0, True]
    want = torch.cat([p.detach().reshape(-1) for p in ddp_script.make_model(0).parameters()])
    assert s["params"] == want.tolist()                     # rank 0's, tensor by tensor
    assert [o["rank"] for o in s["objects"]] == list(range(WORLD))
    for other in seen[1:]:
        assert other == s


def test_unsupported_operations_raise_errors_that_name_what_is_supported(run):
    errors = json.loads((run / "collectives-0.json").read_text())["errors"]
    assert set(errors) == {"reduce", "reduce_scatter", "all_to_all", "band", "gather", "scatter",
                           "send", "recv", "new_group"}
    assert errors.pop("new_group") == ("RuntimeError: the crnet process group is the world's only: "
                                       "dist.new_group is not supported with the crnet backend")
    for name, message in errors.items():
        assert message is not None, name
        assert message.startswith("RuntimeError: the crnet process group does not support"), message
        assert "it supports broadcast, all_reduce (SUM, AVG, PRODUCT, MIN, MAX), all_gather" in message
    assert "BAND" in errors["band"]


def test_hosts_each_running_torchrun_against_their_own_daemon_skip_a_failed_step_together(
        local_tree, tmp_path):
    """The multi-host launch on one machine: a tree of 3 daemons, and per daemon one
    torchrun (c10d rendezvous, --nnodes 3) whose process finds that daemon through
    CRNET_CLIENT_SOCKET; no CRNET_JOB: rank 0 names the job through torch's store, and
    torch's ranks follow its rendezvous, not the tree. No straggler tolerated, and host
    1's process sits step 3 out: the master fails the step at --timeout, the hook gets
    the same StepFailed everywhere, every replica's step() applies nothing, and all end
    equal to single-process training without that step."""
    steps, skipped = 6, 3
    lt = local_tree(Tree.regular(2, 1, 0), 12, timeout=1)
    port = free_port()
    env = dict(os.environ, TMPDIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("CRNET_JOB", None)
    procs = []
    try:
        for host in ("", "0", "1"):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "3", "--nproc-per-node", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t",
                 "--max-restarts", "0", str(SCRIPT), "--out", str(tmp_path),
                 "--steps", str(steps), *(["--sit-out", str(skipped)] if host == "1" else [])],
                env=dict(env, CRNET_CLIENT_SOCKET=lt.socket_path(host)), cwd=REPO,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        for p in procs:
            out, _ = p.communicate(timeout=240)
            assert p.returncode == 0, out[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    params = [np.load(tmp_path / f"params-{rank}.npy") for rank in range(3)]
    assert rel_error(params[0], single_process(12, steps, skipped={skipped})) <= 1e-9
    for rank, got in enumerate(params):
        assert np.array_equal(got, params[0]), rank
    for rank in range(3):
        r = json.loads((tmp_path / f"run-{rank}.json").read_text())
        assert (r["skipped"], r["applied"], r["reductions"], r["resyncs"]) == (1, steps - 1, steps, 0), r


@pytest.mark.parametrize("local_world, world, says", [
    ("2", 3, "--local-processes 1) but this host runs LOCAL_WORLD_SIZE=2"),
    ("1", 5, "its world is 2 processes (or 3 with the master's host), but WORLD_SIZE=5"),
])
def test_init_refuses_a_world_the_daemons_do_not_expect(local_tree, monkeypatch, local_world, world, says):
    lt = local_tree(Tree.regular(2, 1, 1), 4)
    monkeypatch.setenv("CRNET_CLIENT_SOCKET", lt.socket_path("0"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
    monkeypatch.delenv("CRNET_JOB", raising=False)
    store = dist.HashStore()
    with pytest.raises(RuntimeError, match=says.replace("(", r"\(").replace(")", r"\)")):
        process_group.create(store, 0, world, timedelta(seconds=30))


def test_tensors_of_any_dtype_travel_as_their_bytes():
    """What the backend's broadcasts carry: the bytes of every tensor, one after the other,
    as float64 words the wire relays untouched (a NaN's bit pattern included), back with
    their dtypes, shapes and values, aligned whatever came before."""
    from crnet.torch.exact_collectives import from_wire, to_wire

    tensors = [torch.tensor([True, False, True]), torch.tensor([1.5, -2.0]),
               torch.tensor([-1, 2**62], dtype=torch.int64), torch.zeros(0),
               torch.tensor([1 + 2j]), torch.tensor([3.0], dtype=torch.bfloat16),
               torch.arange(6.0).reshape(2, 3).t()]
    wire = to_wire(tensors)
    assert wire.dtype == np.float64 and wire.nbytes == 64    # 3+8+16+0+8+2+24 = 61, padded
    for sent, got in zip(tensors, from_wire(wire.copy(), tensors)):
        assert got.dtype == sent.dtype and got.shape == sent.shape and torch.equal(got, sent)


def test_importing_crnet_imports_no_torch():
    """The core has no torch dependency: every module but crnet.torch imports without it."""
    code = ("import pkgutil, importlib, sys\n"
            "def walk(name):\n"       # not pkgutil.walk_packages: it imports crnet.torch to walk it
            "    package = importlib.import_module(name)\n"
            "    for m in pkgutil.iter_modules(package.__path__, name + '.'):\n"
            "        if m.name in ('crnet.torch', 'crnet.__main__'):\n"
            "            continue\n"
            "        walk(m.name) if m.ispkg else importlib.import_module(m.name)\n"
            "walk('crnet')\n"
            "assert 'crnet.tools.run' in sys.modules and 'crnet.node.collectives.broadcasts' in sys.modules\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


class RecordingClient:
    """What ExactCollectives asks of a client: each broadcast's key and root, recorded."""

    def __init__(self):
        self.roots: list[tuple[str, object]] = []

    def broadcast(self, vec, key, root, timeout=None, out=None):
        self.roots.append((key, root))
        return vec

    def barrier(self, key, processes=None, timeout=None):
        pass


def test_every_broadcast_names_its_roots_crnet_rank_never_the_first_copy():
    """With ``root=True``/``False`` a host that holds the secret could send the first copy
    of a key; a crnet rank makes every process take the root's host's copy only."""
    from crnet.torch.exact_collectives import ExactCollectives

    crnet_ranks = [3, 0, 2, 1]            # torchrun's order is not the tree's
    for me in range(4):
        c = RecordingClient()
        ops = ExactCollectives(c, me, 4, "t", 5.0, crnet_ranks)
        ops.broadcast([torch.zeros(2)], root=0)
        ops.allgather([torch.zeros(2)])
        roots = [root for _, root in c.roots]
        assert roots[0] == 3 and sorted(roots[1:]) == sorted(crnet_ranks), roots
        assert all(type(root) is int for root in roots), roots
    with pytest.raises(ValueError, match="its own crnet rank"):
        ExactCollectives(RecordingClient(), 0, 3, "t", 5.0, [0, 1, 1])


class StoreOf(dict):
    """What ``process_group`` asks of torch's store: ``set`` and ``get``, bytes back."""

    def set(self, key, value):
        self[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self[key]


class Attached:
    """A client as far as the store's checks look at it: its assignment."""

    def __init__(self, rank, workers=2, processes=1):
        from crnet.client.assignment import Assignment
        self.assignment = Assignment("0", 1, 4, workers, ((0, 2, 1.0),), 0, processes, rank)


@pytest.mark.parametrize("written, says", [
    ({"crnet/rank/0/0/1": b"1; rm -rf /"}, "holds b'1; rm -rf /' as rank 1's crnet rank"),
    ({"crnet/rank/0/0/1": b"7"}, r"to crnet ranks \[1, 7\], not to 1..2 once each"),
    ({"crnet/rank/0/0/1": b"1"}, r"to crnet ranks \[1, 1\], not to 1..2 once each"),
])
def test_junk_in_torchs_store_is_a_clear_error_not_a_traceback(monkeypatch, written, says):
    """Issue 39 row 13: torch's store is not authenticated; whatever is in it where crnet's
    keys are (another job's, or anyone's who reaches it) used to be ``int()``-ed, a
    ValueError from deep in init_process_group. Now it is a RuntimeError saying what the
    store holds where, and each map is a set of this world's crnet ranks."""
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    store = StoreOf(written)
    store.set = lambda key, value: None if key in written else dict.__setitem__(
        store, key, value.encode())
    with pytest.raises(RuntimeError, match=says):
        process_group._crnet_ranks(store, 0, 2, 0, Attached(rank=1))   # world 2: no master's
    store = StoreOf({"crnet/job/0/0": b"\x1b[2Jjob"})
    store.set = lambda key, value: None
    with pytest.raises(RuntimeError, match="as the crnet job's name"):
        process_group._job(store, 0, 0)


class TreeOfRanks:
    """A client whose broadcasts come from the process that really has each crnet rank:
    ``truth[r]`` is rank r's crnet rank."""

    def __init__(self, me, truth):
        self.truth = truth
        self.assignment = Attached(truth[me]).assignment

    def broadcast(self, vec, key, root, timeout=None, out=None):
        return vec if root == self.assignment.rank else np.array([float(self.truth.index(root))])

    def barrier(self, key, processes=None, timeout=None):
        pass


def test_a_map_of_ranks_the_tree_contradicts_is_refused():
    """Issue 39 row 13: a map of torch's ranks to crnet's that someone wrote into the store
    (ranks 0 and 1 swapped) would make every broadcast take the wrong process's tensors.
    Each process now asks crnet what every crnet rank's process says its rank is (a
    broadcast only that host can send) and refuses a map that disagrees; a right map
    passes, in any order torchrun numbers the hosts."""
    from crnet.torch.exact_collectives import ExactCollectives

    truth = [2, 1, 3, 0]
    for me in range(4):
        ExactCollectives(TreeOfRanks(me, truth), me, 4, "t", 5.0, truth).check_ranks()
        swapped = [1, 2, 3, 0]
        with pytest.raises(RuntimeError, match="crnet rank 1 says it is rank 1, the map makes it "
                                               "rank 0"):
            ExactCollectives(TreeOfRanks(me, truth), me, 4, "t", 5.0, swapped).check_ranks()
