"""``crnet demo``: a local CodedReduce tree training logistic regression, with stragglers.

Real crnetd processes on 127.0.0.1, one real training process per worker. Each
worker computes the weighted logistic-loss gradient over its share of the batch
(``Client.assignment``); with probability ``straggle_prob`` a step takes it
``straggle_factor`` times as long. Every worker applies the full gradient the tree
returns, and the final model is compared with single-process full-batch gradient
descent: the tree skipped the stragglers but lost nothing.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..client import Client
from ..coding.plan import Tree
from ..errors import CrnetError, LaunchError
from .launch import MASTER, LocalTree


@dataclass
class DemoConfig:
    fanout: tuple[int, ...] = (3, 3)
    stragglers: tuple[int, ...] = (1, 1)
    steps: int = 30
    samples: int = 6000
    features: int = 20
    straggle_prob: float = 0.1
    straggle_factor: float = 5.0
    compute_ms: float = 20.0
    lr: float = 1.0
    seed: int = 0
    timeout: float = 30.0
    scheme: str = "cr"          # the join tree above is already the scheme's (see plan.scheme_tree)
    strict: bool = False        # strict daemons: an internal error in one fails the demo


def synthetic_data(samples: int, features: int, seed: int):
    """A linearly separable-ish binary problem every process regenerates identically."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((samples, features))
    w_true = rng.standard_normal(features)
    y = (X @ w_true + 0.5 * rng.standard_normal(samples) > 0).astype(np.float64)
    return X, y


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # stable for large |z|


def gradient_sum(w, X, y, weights):
    """sum_i weights_i * grad of the logistic loss of sample i."""
    return X.T @ (weights * (_sigmoid(X @ w) - y))


def loss(w, X, y) -> float:
    z = X @ w
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def reference_model(cfg: DemoConfig) -> np.ndarray:
    """Single-process full-batch gradient descent: what the tree must reproduce."""
    X, y = synthetic_data(cfg.samples, cfg.features, cfg.seed)
    w = np.zeros(cfg.features)
    ones = np.ones(cfg.samples)
    for _ in range(cfg.steps):
        w -= cfg.lr * gradient_sum(w, X, y, ones) / cfg.samples
    return w


MICRO_BATCHES = 4


def worker(socket_path: str, cfg: DemoConfig, index: int, everyone: int, out: mp.Queue) -> None:
    """One training process, as the README's loop: the local gradient in micro-batches,
    stopping as soon as the tree has finished the step; allreduce; the same update."""
    try:
        X, y = synthetic_data(cfg.samples, cfg.features, cfg.seed)
        with Client(socket_path, timeout=120) as c:
            c.barrier("start", processes=everyone, timeout=120)   # no one starts late
            pos, weights = c.assignment.positions()
            pieces = [(X[p], y[p], weights[k]) for k in np.array_split(np.arange(len(pos)),
                                                                         MICRO_BATCHES)
                      for p in [pos[k]]]
            rng = np.random.default_rng([cfg.seed, index])
            w = np.zeros(cfg.features)
            straggled = 0
            for t in range(cfg.steps):
                slow = cfg.straggle_factor if rng.random() < cfg.straggle_prob else 1.0
                straggled += slow > 1
                g = np.zeros_like(w)
                for Xp, yp, wp in pieces:
                    if c.finished(t):          # the tree finished the step without us: stop
                        break
                    start = time.perf_counter()
                    g += gradient_sum(w, Xp, yp, wp)
                    # Emulated compute: each micro-batch takes its share of compute_ms.
                    busy = slow * cfg.compute_ms / 1e3 / MICRO_BATCHES
                    time.sleep(max(0.0, busy - (time.perf_counter() - start)))
                g = c.allreduce(g, step=t, timeout=cfg.timeout * 4)   # at once if finished
                w -= cfg.lr * g / cfg.samples
            out.put(("done", c.assignment.name, w, c.stats()["stats"], straggled))
    except BaseException as e:  # noqa: BLE001 -- report anything, don't hang the demo
        out.put(("error", index, f"{type(e).__name__}: {e}"))


def run_demo(cfg: DemoConfig, progress=sys.stderr) -> dict:
    """Run the demo end to end; returns the summary (also what ``--json`` prints).

    With ``cfg.strict`` the daemons are strict (an internal error stops one with exit code
    70) and the demo fails, naming each daemon that failed and its log, if any did. The
    daemons' logs are removed unless the demo failed."""
    tree = Tree(cfg.fanout, cfg.stragglers)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    workers = []
    names = [n for n in tree.names() if n != MASTER]
    workdir = Path(tempfile.mkdtemp(prefix="crnet-demo-"))
    # A secret even on 127.0.0.1: other users of this host cannot join the demo's tree. Every
    # host on one machine: its CPUs bound a step, so spread's sum goes straight from owners.
    local = LocalTree(tree, cfg.samples, workdir=workdir, timeout=cfg.timeout, scheme=cfg.scheme,
                      strict=cfg.strict, secret=True, spread_sum="direct")
    error: Exception | None = None
    try:
        with local:
            try:
                for i, name in enumerate(names):
                    p = ctx.Process(target=worker, daemon=True,
                                    args=(local.socket_path(name), cfg, i, len(names) + 1, out))
                    p.start()
                    workers.append(p)
                summary = _observe(local, tree, cfg, out, len(workers), progress)
            finally:
                for p in workers:
                    if p.is_alive():
                        p.terminate()
                for p in workers:
                    p.join(5)
    except (CrnetError, OSError) as e:
        error = e
    finally:
        problems = local.problems() if cfg.strict else []
        if error is None and not problems:
            shutil.rmtree(workdir, ignore_errors=True)
    if problems:
        raise LaunchError("\n".join([*([str(error)] if error else []),
                                      "a daemon failed (--strict):", *problems]))
    if error is not None:
        raise LaunchError(f"{error} (daemon logs in {workdir / 'logs'})") from error
    return summary


def _observe(local, tree, cfg, out, n_workers, progress) -> dict:
    """Follow the steps from the master's side: progress, loss, step times."""
    X, y = synthetic_data(cfg.samples, cfg.features, cfg.seed)
    w = np.zeros(cfg.features)
    times = []
    with Client(local.socket_path(MASTER), timeout=120) as master:
        master.barrier("start", processes=n_workers + 1, timeout=120)   # the workers, and us
        last = time.perf_counter()
        for t in range(cfg.steps):
            g = master.result(t, like=w, timeout=cfg.timeout * 4)
            now = time.perf_counter()
            times.append(now - last)
            last = now
            w -= cfg.lr * g / cfg.samples
            _progress(progress, t + 1, cfg.steps, loss(w, X, y), times[-1])
        master_stats = master.stats()["stats"]
    if progress is not None:
        progress.write("\n")
    finals, skipped, straggled = [w], master_stats["children_skipped"], 0
    for _ in range(n_workers):
        try:
            item = out.get(timeout=cfg.timeout * 4)
        except queue.Empty:
            raise LaunchError("a training process did not report back") from None
        if item[0] == "error":
            raise LaunchError(f"training process {item[1]} failed: {item[2]}")
        _, _, w_final, stats, n_straggled = item
        finals.append(w_final)
        skipped += stats["children_skipped"]
        straggled += n_straggled
    ref = reference_model(cfg)
    scale = np.max(np.abs(ref))
    err = max(float(np.max(np.abs(f - ref)) / scale) for f in finals)
    steady = times[1:] or times  # step 0 includes start-up
    return {"steps": cfg.steps, "mean_step_s": float(np.mean(steady)),
            "max_rel_error": err, "stragglers_skipped": int(skipped),
            "stragglers_injected": straggled, "workers": tree.workers,
            "final_loss": loss(w, X, y)}


def _progress(stream, done, total, current_loss, step_s) -> None:
    if stream is None:
        return
    width = 30
    bar = "#" * (width * done // total) + "." * (width - width * done // total)
    line = f"step {done:>4}/{total} [{bar}] loss {current_loss:.5f}  step {1e3 * step_s:7.1f} ms"
    if stream.isatty():
        stream.write("\r" + line)
    elif done == total or done % max(1, total // 10) == 0:
        stream.write(line + "\n")
    stream.flush()
