"""What crnet.torch copies between backward and the network, and what that saves.

    python -m benchmarks.bench_torch_copies [--params 2000000] [--steps 30] [--dtype float32]

A local tree of real daemons (``crnet.tools.launch.LocalTree``, fanout 2, one layer: three
hosts, the master's process with an empty share) and one training thread per host
train the same MLP twice, each time as its own job:

- **flat**: ``crnet.torch.DistributedOptimizer``. Every step it checks, through the
  public API, that each ``.grad`` is a view of ``client.buffer(n)`` after backward and of
  ``client.result_buffer(n)`` after the update (``np.shares_memory`` and the data
  pointers), and reads ``opt.copied_bytes`` (the fallback copies it counts);
- **naive**: plain ``.grad`` tensors, ``torch.cat`` of the gradients, ``client.allreduce``
  of that vector (the client copies it into shared memory and the result out of it),
  and the result copied back into every ``.grad``.

Reported per step, on the client side between backward and the network and back: the
bytes copied, and the median times of the step (allreduce + the optimizer's update, what
``opt.step()`` does) and of the whole iteration (with forward and backward), over all
processes and steps after each job's first two. A warm-up job runs first, then the two
paths alternate ``--rounds`` times (the machine's load drifts).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np
import torch

from crnet import Client
from crnet.coding.plan import Tree
from crnet.tools.launch import LocalTree
from crnet.torch import CodedSampler, DistributedOptimizer, weighted_loss

WIDTH = 512
SAMPLES = 32          # the global batch
DATASET = 256


def make_model(params: int, dtype: torch.dtype) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(max(1, round(params / (WIDTH * WIDTH + WIDTH)))):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    torch.manual_seed(0)
    return torch.nn.Sequential(*layers).to(dtype)


class Run:
    """One host's training thread, in one mode; what it measured."""

    def __init__(self, lt: LocalTree, name: str, mode: str, job: str, a, x, y):
        self.lt, self.name, self.mode, self.job, self.a, self.x, self.y = lt, name, mode, job, a, x, y
        self.step_s: list[float] = []
        self.iteration_s: list[float] = []
        self.copied: list[int] = []
        self.n = 0
        self.error: BaseException | None = None

    def run(self, everyone: threading.Barrier) -> None:
        try:
            with Client(self.lt.socket_path(self.name), timeout=60, job=self.job) as c:
                model = make_model(self.a.params, self.a.torch_dtype)
                self.n = sum(p.numel() for p in model.parameters())
                sgd = torch.optim.SGD(model.parameters(), lr=0.01)
                if self.mode == "flat":
                    self.flat(c, model, sgd, everyone)
                else:
                    self.naive(c, model, sgd, everyone)
        except BaseException as e:  # noqa: BLE001 -- reported by main
            self.error = e
            everyone.abort()

    def backward(self, model, sampler, step, size=16):
        indices, weights = sampler.local(step)
        for start in range(0, len(indices), size):
            idx, w = indices[start:start + size], weights[start:start + size]
            losses = ((model(self.x[idx]) - self.y[idx]) ** 2).mean(dim=1)
            weighted_loss(losses, w).backward()

    def flat(self, c: Client, model, sgd, everyone) -> None:
        opt = DistributedOptimizer(sgd, model, c, join=False)
        sampler = CodedSampler(DATASET, c, seed=0)
        params = list(model.parameters())
        everyone.wait(60)
        for step in range(self.a.steps):
            started = time.perf_counter()
            opt.zero_grad()
            self.backward(model, sampler, step)
            shared_in, shared_out = c.buffer(self.n, opt.np_dtype), c.result_buffer(self.n, opt.np_dtype)
            assert all(np.shares_memory(p.grad.numpy(), shared_in) for p in params)
            before = opt.copied_bytes
            stepped = time.perf_counter()
            assert opt.step()
            done = time.perf_counter()
            assert all(np.shares_memory(p.grad.numpy(), shared_out) for p in params)
            assert _inside(params[0].grad, shared_out) and _inside(params[-1].grad, shared_out)
            self.record(opt.copied_bytes - before, done - stepped, done - started)

    def naive(self, c: Client, model, sgd, everyone) -> None:
        sampler = CodedSampler(DATASET, c, seed=0)
        params = list(model.parameters())
        m = c.assignment.samples
        everyone.wait(60)
        for step in range(self.a.steps):
            started = time.perf_counter()
            sgd.zero_grad()
            self.backward(model, sampler, step)
            for p in params:
                if p.grad is None:          # an empty share: no backward ran
                    p.grad = torch.zeros_like(p)
            stepped = time.perf_counter()
            flat = torch.cat([p.grad.reshape(-1) for p in params])        # copy 1
            copied = flat.numel() * flat.element_size()
            vec = flat.numpy()
            if not np.shares_memory(vec, c.buffer(vec.size, vec.dtype)):
                copied += vec.nbytes                                      # copy 2: into shm
            total = c.allreduce(vec, step)                                # copy 3: out of shm
            copied += total.nbytes
            at = 0
            for p in params:                                              # copy 4: into .grad
                k = p.numel()
                p.grad.copy_(torch.from_numpy(total[at:at + k]).view(p.shape))
                p.grad.div_(m)
                at += k
            copied += total.nbytes
            sgd.step()
            done = time.perf_counter()
            self.record(copied, done - stepped, done - started)

    def record(self, copied: int, step_s: float, iteration_s: float) -> None:
        self.copied.append(copied)
        self.step_s.append(step_s)
        self.iteration_s.append(iteration_s)


def _inside(t: torch.Tensor, arr: np.ndarray) -> bool:
    lo = arr.__array_interface__["data"][0]
    return lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= lo + arr.nbytes


def run_mode(lt: LocalTree, tree: Tree, mode: str, job: str, a, x, y) -> list[Run]:
    runs = [Run(lt, name, mode, job, a, x, y) for name in tree.names()]
    everyone = threading.Barrier(len(runs))
    threads = [threading.Thread(target=r.run, args=(everyone,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in runs:
        if r.error is not None:
            raise RuntimeError(f"{mode}, host {r.name or 'master'}: {r.error!r}") from r.error
    return runs


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_torch_copies")
    p.add_argument("--params", type=int, default=2_000_000, help="about this many parameters")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--rounds", type=int, default=2, help="naive then flat, this many times")
    a = p.parse_args()
    a.torch_dtype = getattr(torch, a.dtype)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((DATASET, WIDTH))).to(a.torch_dtype)
    y = torch.from_numpy(rng.standard_normal((DATASET, WIDTH))).to(a.torch_dtype)
    tree = Tree.regular(2, 1, 0)
    runs: dict[str, list[Run]] = {"flat": [], "naive": []}
    with LocalTree(tree, SAMPLES, log_level="warning") as lt:
        run_mode(lt, tree, "flat", "bench-torch-warm-up", a, x, y)   # daemons' buffers, caches
        for k in range(a.rounds):       # alternated: the machine's load drifts
            for mode in ("naive", "flat"):
                runs[mode] += run_mode(lt, tree, mode, f"bench-torch-{mode}-{k}", a, x, y)
    rows = []
    warm = slice(2, None)
    for mode, done in runs.items():
        n, size = done[0].n, torch.empty(0, dtype=a.torch_dtype).element_size()
        copied = sorted({c for r in done for c in r.copied})
        step = statistics.median(s for r in done for s in r.step_s[warm])
        iteration = statistics.median(s for r in done for s in r.iteration_s[warm])
        rows.append((mode, n, n * size, copied, step, iteration))
    print(f"{len(list(tree.names()))} processes (fanout 2, one layer), {a.rounds} x {a.steps} "
          f"steps per path (after a warm-up job), global batch {SAMPLES}, {a.dtype}")
    print(f"{'path':<6} {'params':>10} {'vector MB':>10} {'copied/step':>14} {'x vector':>9} "
          f"{'step() ms':>10} {'iteration ms':>13}")
    for mode, n, nbytes, copied, step, iteration in rows:
        shown = "/".join(f"{c / 1e6:.2f} MB" for c in copied)
        print(f"{mode:<6} {n:>10} {nbytes / 1e6:>10.2f} {shown:>14} {max(copied) / nbytes:>9.1f} "
              f"{1e3 * step:>10.2f} {1e3 * iteration:>13.2f}")
    print("copied/step: every distinct value seen over all processes and steps; step(): "
          "allreduce + the optimizer's update (medians over processes and steps 2..)")


if __name__ == "__main__":
    main()
