"""A small CNN on scikit-learn's handwritten digits, trained on a crnet tree, with DDP, or alone.

::

    pip install -e '.[examples]'
    crnet run --fanout 3 --layers 2 --stragglers 1 --samples 240 -- \\
        python examples/train_digits.py --steps 100 --straggle-prob 0.1 --straggle-factor 10 \\
        --compute-ms 16 --plot digits.png
    torchrun --standalone --nproc-per-node 12 examples/train_digits.py --ddp --samples 240 \\
        --steps 100 --straggle-prob 0.1 --straggle-factor 10 --compute-ms 16
    crnet run --fanout 3 --layers 2 --stragglers 1 --samples 240 -- \\
        python examples/train_digits.py --ddp --backend crnet --steps 100 ...   # DDP on crnet
    python examples/train_digits.py --single --samples 240 --steps 100   # the reference

Every mode trains the same model from the same initial parameters on the same global
batches (``crnet.BatchSampler``: step t's batch is the same everywhere), with the update
of the mean loss over the global batch, so all three end with the same parameters up to
rounding:

- **crnet** (under ``crnet run``): each process computes its *coded* share of the batch
  (``CodedSampler``, ``weighted_loss``), in micro-batches that stop once the tree has
  finished the step without it (``DistributedOptimizer.micro_batches``); the daemons add
  the shares up without waiting for stragglers. The lines marked ``# crnet`` are all that
  differs from a single-process loop. Every process starts at step 0 from rank 0's
  parameters (``join=False``: a fresh job, not a process joining a running one), after a
  start barrier (``Client.barrier``: ``crnet run`` starts every process at once, but
  some take seconds longer to import torch, and a step waits for no one).
- **ddp** (under ``torchrun``): ``DistributedDataParallel`` over Gloo; rank r takes the
  r-th equal slice of the same global batch and every step waits for the slowest rank.
- **ddp on crnet** (``--ddp --backend crnet``, under ``crnet run``, or under ``torchrun``
  on hosts that each run a crnetd): the same ``DistributedDataParallel`` model on the
  ``"crnet"`` process group, its gradient through the coded tree by the crnet DDP hook
  (``register_crnet_hook``), with the coded shares (``CodedSampler``, ``weighted_loss``)
  and the micro-batches of the crnet mode: the lines marked ``# crnet`` in
  ``train_ddp_crnet`` are what differs from DDP over Gloo. The global batch is the tree's
  (crnet's ``--samples``); worker i is crnet's rank i + K, after the master host's K.
- **single**: one process, the whole global batch each step.

Injected stragglers (``--straggle-prob P --straggle-factor F``, with ``--compute-ms``): in
each step a compute process is slow with probability P, drawn from ``(seed, step, worker
index)`` (crnet's worker i is DDP's rank i), so every run and both frameworks see the same
stragglers in the same steps. ``--straggle-groups G`` makes them correlated: workers
0..G-1, G..2G-1, ... are slow together, with probability P per group drawn from ``(seed,
step, group)`` (crnet.tune.workload's ``grouped`` law; G = 1 is the default); in crnet's order
(a parent's children consecutive) G = n_L is the children of one parent of the last layer
when n_L divides the workers above them. ``--compute-ms`` emulates compute (a sleep before
each micro-batch) per ``--micro-batch-size`` samples, F times as long in a slow step, so that
stragglers matter on a model this small. It is per sample: a crnet worker computes ``d*``
of the batch (more than DDP's ``1/N``: the price of coding) and pays for it.

Rank 0 keeps the parameters after every step and evaluates them after training (training
loss on the step's global batch, test loss and accuracy), so that evaluation never slows
the training it measures. Times are measured on rank 0 from the end of step 0 (which
includes every process's start-up).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from tqdm import tqdm

from crnet import BatchSampler, Client  # crnet
from crnet.tools.run import DEFAULT_SAMPLES  # the global batch of --ddp and --single: crnet run's
from crnet.torch import CodedSampler, DistributedOptimizer, broadcast_parameters, weighted_loss  # crnet

FINAL_TAIL = 10   # steps whose mean test accuracy the report calls the final one (next to the last)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--ddp", action="store_true",
                      help="DistributedDataParallel over Gloo (start with torchrun)")
    mode.add_argument("--single", action="store_true",
                      help="one process, the whole global batch each step (the reference)")
    p.add_argument("--backend", choices=["gloo", "crnet"], default="gloo",
                   help="--ddp's process group: Gloo, or crnet's with its DDP hook")
    p.add_argument("--samples", type=int, default=None,
                   help="global batch of --ddp and --single (default 1024, crnet run's); on a "
                        "crnet tree it is crnet run's --samples (c.assignment.samples)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="adam")
    p.add_argument("--lr", type=float, default=None, help="default 0.01 for adam, 0.05 for sgd")
    p.add_argument("--momentum", type=float, default=0.9, help="of --optimizer sgd")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--micro-batch-size", type=int, default=8,
                   help="samples per micro-batch: a crnet process checks between two whether "
                        "the tree finished the step without it")
    p.add_argument("--seed", type=int, default=0,
                   help="initial parameters, batches, straggler draws")
    p.add_argument("--straggle-prob", type=float, default=0.0)
    p.add_argument("--straggle-factor", type=float, default=10.0)
    p.add_argument("--straggle-groups", type=int, default=1, metavar="G",
                   help="workers slowed together: --straggle-prob is per group of G consecutive "
                        "workers")
    p.add_argument("--compute-ms", type=float, default=0.0,
                   help="emulated compute per micro-batch of --micro-batch-size samples")
    p.add_argument("--target", type=float, default=0.95,
                   help="report the first step (and seconds) with this test accuracy")
    p.add_argument("--save-params", default=None,
                   help="final flat parameters as .npy; '{rank}' in the path: every process "
                        "saves, else rank 0 only")
    p.add_argument("--json", default=None,
                   help="rank 0's record of the run (curves, times); '{rank}' in the path: every "
                        "process writes its own (crnet: steps it abandoned, skipped, resynced)")
    p.add_argument("--plot", default=None, help="PNG of the loss and test accuracy curves")
    a = p.parse_args(argv)
    if a.steps < 1 or a.micro_batch_size < 1 or not 0 <= a.straggle_prob <= 1 \
            or a.straggle_factor < 1 or a.compute_ms < 0 or a.straggle_groups < 1:
        p.error("need --steps >= 1, --micro-batch-size >= 1, --straggle-prob in [0, 1], "
                "--straggle-factor >= 1, --compute-ms >= 0, --straggle-groups >= 1")
    if a.straggle_prob > 0 and a.compute_ms == 0:
        p.error("stragglers slow the emulated compute: give --compute-ms too")
    if a.backend == "crnet" and not a.ddp:
        p.error("--backend crnet is a --ddp mode")
    if a.lr is None:
        a.lr = 0.01 if a.optimizer == "adam" else 0.05
    return a


# ---------------------------------------------------------------- data and model


@dataclass(frozen=True)
class Digits:
    x_train: torch.Tensor      # (N, 1, 8, 8), pixel values / 16
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def load(dtype: torch.dtype) -> Digits:
    """1,797 8x8 images of digits; a fixed, stratified quarter held out for testing."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0,
                                                        stratify=y)

    def images(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a / 16.0).to(dtype).reshape(-1, 1, 8, 8)

    return Digits(images(x_train), torch.from_numpy(y_train), images(x_test),
                  torch.from_numpy(y_test))


def make_model(seed: int, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),     # 16 x 4 x 4
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 32 x 2 x 2
        nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10),
    ).to(dtype)


def make_optimizer(a: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    if a.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=a.lr)
    return torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)


# ---------------------------------------------------------------- injected stragglers


class Stragglers:
    """Emulated compute, slowed ``factor`` times in the steps this process's draw says.

    A micro-batch of n samples sleeps ``n * per_sample`` (``--compute-ms`` per
    ``--micro-batch-size`` samples) before its real compute, ``factor`` times that in a slow
    step: before, so that a slow DDP rank enters the all-reduce late. Only the emulated part
    is slowed: measuring the real part would count, in DDP, the wait for the others.
    """

    def __init__(self, a: argparse.Namespace, worker: int):
        self.seed, self.prob, self.factor = a.seed, a.straggle_prob, a.straggle_factor
        self.group = a.straggle_groups        # workers slowed together (by one draw)
        self.per_sample = a.compute_ms / 1000 / a.micro_batch_size
        self.worker = worker                  # < 0: computes nothing (crnet's master host)

    def slow(self, step: int, worker: int | None = None) -> bool:
        w = self.worker if worker is None else worker
        if w < 0 or self.prob == 0:
            return False
        return bool(np.random.default_rng([self.seed, step, w // self.group]).random() < self.prob)

    def micro_batch(self, step: int, n: int) -> None:
        """Call before computing a micro-batch of ``n`` samples of ``step``."""
        if self.per_sample > 0:
            time.sleep(n * self.per_sample * (self.factor if self.slow(step) else 1.0))


# ---------------------------------------------------------------- rank 0's record


class _LineFile:
    """tqdm's redraws as whole lines: ``crnet run`` forwards output line by line."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s: str) -> None:
        s = s.replace("\r", "").strip()
        if s:
            self.stream.write(s + "\n")

    def flush(self) -> None:
        self.stream.flush()


class Record:
    """Rank 0: when each step finished and the parameters after it (evaluated later)."""

    def __init__(self, model: nn.Module, rank: int, steps: int, mode: str):
        self.active = rank == 0
        self.times: dict[int, float] = {}
        self.coverage: dict[int, float] = {}    # crnet: steps whose result was approximate
        self.params = {-1: parameters_to_vector(model.parameters()).detach().clone()}
        tty = sys.stdout.isatty()
        self.bar = tqdm(total=steps, desc=mode, unit="step", disable=not self.active,
                        file=sys.stdout if tty else _LineFile(sys.stdout),
                        mininterval=0.2 if tty else 3.0)

    def step(self, step: int, model: nn.Module) -> None:
        if not self.active:
            return
        self.times[step] = time.perf_counter()
        self.params[step] = parameters_to_vector(model.parameters()).detach().clone()
        if len(self.times) >= 2:
            first, last = min(self.times), max(self.times)
            ms = 1e3 * (self.times[last] - self.times[first]) / (last - first)
            self.bar.set_postfix_str(f"{ms:.1f} ms/step", refresh=False)
        self.bar.update(step + 1 - self.bar.n)

    def close(self) -> None:
        self.bar.close()


# ---------------------------------------------------------------- the three loops


def train_crnet(a: argparse.Namespace, data: Digits) -> tuple[nn.Module, Record, dict]:
    rank = int(os.environ.get("CRNET_RANK", "0"))                   # set by crnet run
    c = Client()                                                    # crnet: this host's daemon
    if a.samples is not None and a.samples != c.assignment.samples:
        sys.exit(f"--samples {a.samples}, but the tree's batch is {c.assignment.samples}: "
                 "crnet run --samples sets it")
    c.barrier("start", timeout=300)                                 # crnet: everyone is here
    model = make_model(a.seed, dtype(a))
    broadcast_parameters(model, c, root=0)                          # crnet: rank 0's parameters
    opt = DistributedOptimizer(make_optimizer(a, model), model, c, join=False)  # crnet
    sampler = CodedSampler(len(data.y_train), c, seed=a.seed)       # crnet: the same batches
    stragglers = Stragglers(a, worker=rank - c.assignment.processes)  # the master host's: none
    record = Record(model, rank, a.steps, "crnet")
    while opt.step_index < a.steps:                                 # crnet
        step = opt.step_index                                       # crnet
        indices, weights = sampler.local(step)                      # crnet: this process's share
        opt.zero_grad()
        for idx, w in opt.micro_batches(indices, weights, a.micro_batch_size):  # crnet
            stragglers.micro_batch(step, len(idx))
            losses = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx], reduction="none")
            weighted_loss(losses, w).backward()                     # crnet: sum_i w_i loss_i
        applied = opt.step()                       # the global batch's mean gradient, everywhere
        if applied and not (got := c.last_result_info).exact:    # beyond s: estimated from
            record.coverage[step] = got.coverage                  # the share the tree covers
        record.step(step, model)
    record.close()
    info = run_info(c, opt)
    c.close()
    return model, record, info


def run_info(c, opt) -> dict:
    """What a crnet run reports beside the model: its size and the steps' outcomes."""
    return {"workers": c.assignment.workers * c.assignment.processes, "samples": c.assignment.samples,
            "abandoned": opt.abandoned, "skipped": opt.skipped, "resyncs": opt.resyncs,
            "approximate": opt.approximate}


def train_ddp(a: argparse.Namespace, data: Digits) -> tuple[nn.Module, Record, dict]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")                 # torchrun's environment
    rank, world = dist.get_rank(), dist.get_world_size()
    m = a.samples or DEFAULT_SAMPLES
    if m < world:
        sys.exit(f"--samples {m} is smaller than the {world} ranks")
    model = make_model(a.seed, dtype(a))
    ddp = DistributedDataParallel(model)            # broadcasts rank 0's parameters
    opt = make_optimizer(a, model)
    batches = BatchSampler(len(data.y_train), m, a.seed)
    stragglers = Stragglers(a, worker=rank)
    record = Record(model, rank, a.steps, "ddp")
    for step in range(a.steps):
        mine = torch.from_numpy(np.array_split(batches.indices(step), world)[rank])
        pieces = mine.split(a.micro_batch_size)
        opt.zero_grad()
        for k, idx in enumerate(pieces):            # all-reduce with the last micro-batch only
            sync = contextlib.nullcontext() if k == len(pieces) - 1 else ddp.no_sync()
            stragglers.micro_batch(step, len(idx))
            with sync:
                loss = F.cross_entropy(ddp(data.x_train[idx]), data.y_train[idx], reduction="sum")
                (loss * (world / m)).backward()     # DDP averages over ranks: the batch's mean
        opt.step()
        record.step(step, model)
    record.close()
    dist.destroy_process_group()
    return model, record, {"workers": world, "samples": m}


def train_ddp_crnet(a: argparse.Namespace, data: Digits) -> tuple[nn.Module, Record, dict]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from crnet.torch import register_crnet_hook  # crnet

    dist.init_process_group("crnet")                # crnet: this host's daemon, all attached
    rank = dist.get_rank()
    model = make_model(a.seed, dtype(a))
    ddp = DistributedDataParallel(model)            # broadcasts rank 0's parameters
    opt = register_crnet_hook(ddp, make_optimizer(a, model))  # crnet: one tree step per step
    c = opt.client
    if a.samples is not None and a.samples != c.assignment.samples:
        sys.exit(f"--samples {a.samples}, but the tree's batch is {c.assignment.samples}")
    sampler = CodedSampler(len(data.y_train), c, seed=a.seed)  # crnet: the same batches
    stragglers = Stragglers(a, worker=c.assignment.rank - c.assignment.processes)
    record = Record(model, rank, a.steps, "ddp-crnet")
    while opt.step_index < a.steps:                 # crnet: a step can be skipped or redone
        step = opt.step_index
        indices, weights = sampler.local(step)      # crnet: this process's coded share
        opt.zero_grad()
        for idx, w in opt.micro_batches(indices, weights, a.micro_batch_size):  # crnet
            stragglers.micro_batch(step, len(idx))
            losses = F.cross_entropy(ddp(data.x_train[idx]), data.y_train[idx], reduction="none")
            weighted_loss(losses, w).backward()     # crnet: sum_i w_i loss_i
        opt.step()
        record.step(step, model)
    record.close()
    info = run_info(c, opt)
    dist.destroy_process_group()
    return model, record, info


def train_single(a: argparse.Namespace, data: Digits) -> tuple[nn.Module, Record, dict]:
    m = a.samples or DEFAULT_SAMPLES
    model = make_model(a.seed, dtype(a))
    opt = make_optimizer(a, model)
    batches = BatchSampler(len(data.y_train), m, a.seed)
    record = Record(model, 0, a.steps, "single")
    for step in range(a.steps):
        idx = torch.from_numpy(batches.indices(step))
        opt.zero_grad()
        F.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
        opt.step()
        record.step(step, model)
    record.close()
    return model, record, {"workers": 1, "samples": m}


def dtype(a: argparse.Namespace) -> torch.dtype:
    return torch.float64 if a.dtype == "float64" else torch.float32


# ---------------------------------------------------------------- evaluation and report


def evaluate(a: argparse.Namespace, data: Digits, record: Record, samples: int) -> dict:
    """Per recorded step: the loss of its global batch (the parameters before it), and the
    test loss and accuracy after it."""
    model = make_model(a.seed, dtype(a))
    batches = BatchSampler(len(data.y_train), samples, a.seed)
    steps = sorted(record.times)
    out: dict[str, list] = {"step": [], "seconds": [], "loss": [], "test_loss": [], "test_accuracy": []}
    t0 = record.times[steps[0]]
    with torch.no_grad():
        for step in tqdm(steps, desc="evaluating", unit="step", disable=not sys.stdout.isatty()):
            loss = math.nan
            if step - 1 in record.params:
                vector_to_parameters(record.params[step - 1], model.parameters())
                idx = torch.from_numpy(batches.indices(step))
                loss = F.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).item()
            vector_to_parameters(record.params[step], model.parameters())
            logits = model(data.x_test)
            out["step"].append(step)
            out["seconds"].append(record.times[step] - t0)
            out["loss"].append(loss)
            out["test_loss"].append(F.cross_entropy(logits, data.y_test).item())
            out["test_accuracy"].append((logits.argmax(1) == data.y_test).double().mean().item())
    return out


def report(a: argparse.Namespace, mode: str, data: Digits, record: Record, info: dict) -> dict:
    """Rank 0: print the curves' milestones and the summary line; returns the record."""
    curves = evaluate(a, data, record, info["samples"])
    steps, acc = curves["step"], curves["test_accuracy"]
    every = max(1, len(steps) // 10)
    print(f"{'step':>6} {'loss':>8} {'test loss':>9} {'test acc':>8} {'seconds':>8}")
    for i in [*range(0, len(steps) - 1, every), len(steps) - 1]:
        print(f"{steps[i]:>6} {curves['loss'][i]:>8.4f} {curves['test_loss'][i]:>9.4f} "
              f"{acc[i]:>8.4f} {curves['seconds'][i]:>8.2f}")
    span = steps[-1] - steps[0]
    mean_step = (record.times[steps[-1]] - record.times[steps[0]]) / span if span else math.nan
    hit = next((i for i, x in enumerate(acc) if x >= a.target), None)
    # One step's test accuracy moves by up to 2 points from step to step even in exact
    # training (450 test images): the last steps' mean estimates where training ended.
    tail = float(np.mean(acc[-FINAL_TAIL:]))
    stragglers = Stragglers(a, worker=0)
    injected = sum(stragglers.slow(t, w) for t in range(a.steps) for w in range(info["workers"]))
    reached = (f"{a.target:.0%} at step {steps[hit]} after {curves['seconds'][hit]:.2f} s"
               if hit is not None else f"{a.target:.0%} not reached")
    print(f"{mode}: {info['workers']} workers, {len(steps)} steps of {info['samples']} samples, "
          f"mean step {1e3 * mean_step:.1f} ms, {injected} stragglers injected, "
          f"{len(record.coverage)} approximate steps; final loss "
          f"{curves['loss'][-1]:.4f}, test accuracy {acc[-1]:.4f} (mean of the last "
          f"{min(FINAL_TAIL, len(acc))} steps {tail:.4f}); {reached}")
    if a.plot:
        plot(a.plot, mode, curves, a.target)
    return {"mean_step_s": mean_step, "stragglers_injected": injected, "target": a.target,
            "approximate_coverage": {str(t): c for t, c in sorted(record.coverage.items())},
            "target_step": steps[hit] if hit is not None else None,
            "target_s": curves["seconds"][hit] if hit is not None else None,
            "final_test_accuracy": acc[-1], "final_test_accuracy_tail": tail, **curves}


def plot(path: str, mode: str, curves: dict, target: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(curves["step"], curves["loss"], label="training loss (global batch)")
    ax.plot(curves["step"], curves["test_loss"], label="test loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_yscale("log")
    acc = ax.twinx()
    acc.plot(curves["step"], curves["test_accuracy"], color="tab:green", label="test accuracy")
    acc.set_ylabel("test accuracy")
    acc.axhline(target, color="tab:green", linestyle=":", linewidth=1)
    acc.set_ylim(0, 1)
    lines = ax.get_lines() + acc.get_lines()
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="center right")
    ax.set_title(f"digits CNN ({mode})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    torch.set_num_threads(1)     # one core's worth per process: many processes share a machine
    data = load(dtype(a))
    if a.ddp and a.backend == "crnet":
        mode, rank, (model, record, info) = "ddp-crnet", int(os.environ["RANK"]), train_ddp_crnet(a, data)
    elif a.ddp:
        mode, rank, (model, record, info) = "ddp", int(os.environ["RANK"]), train_ddp(a, data)
    elif a.single:
        mode, rank, (model, record, info) = "single", 0, train_single(a, data)
    else:
        mode, rank, (model, record, info) = "crnet", int(os.environ.get("CRNET_RANK", "0")), \
            train_crnet(a, data)
    if a.save_params and (rank == 0 or "{rank}" in a.save_params):
        np.save(a.save_params.format(rank=rank), parameters_to_vector(model.parameters()).detach().numpy())
    doc = {"mode": mode, "rank": rank, "steps": a.steps, **info, "args": vars(a)}
    if rank == 0:
        doc.update(report(a, mode, data, record, info))
    if a.json and (rank == 0 or "{rank}" in a.json):
        Path(a.json.format(rank=rank)).write_text(json.dumps(doc))

if __name__ == "__main__":
    main()
