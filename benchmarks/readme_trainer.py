"""One training process of the README-loop soak: the README's ``train``, as printed, in a process.

    python -m benchmarks.readme_trainer '{"socket": ..., "job": ..., "name": ..., "steps": ...,
        "samples": ..., "elements": ..., "compute_ms": ..., "straggle_prob": ...,
        "straggle_factor": ..., "seed": ..., "lr": ..., "bound": ..., "out": DIR, "life": K}'

``train`` is taken from README.md itself (the first python block after the loop marker), so
the soak runs the loop users copy, not a copy of it. The process connects with the blocking
``Client`` at its daemon's socket (the same job name in every life), starts from zero
parameters (a restarted process is stale and the loop takes the others' state) and computes
an exact gradient: sample i's gradient is a fixed vector of small integers that does not
depend on the parameters, so the parameters after k applied steps are known (``updates``
reads k back from them) and every replica must equal single-process training over k steps.

Its compute is a sleep per micro-batch (``compute_ms`` a step, in two pieces; with
``straggle_prob`` that times ``straggle_factor``), which the loop stops once the tree has
finished the step without it. What it records, in ``out``:

* ``NAME.step``: the step it is on, rewritten every few steps (the soak's view of progress);
* ``NAME.waits``: one JSON line per allreduce that took longer than ``bound`` seconds,
  written at once (a later SIGKILL loses nothing);
* ``NAME.life-K.json`` at the end: its final parameters and its counts.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from crnet import Client, DaemonBusy, StepFailed, StepLost, StepRefused

from . import ROOT
from .fuzz_trainers import gradients

PROGRESS_EVERY = 5     # steps between two rewrites of NAME.step


def readme_train(readme: Path = ROOT / "README.md"):
    """The ``train`` function of the README's first python block after the loop marker."""
    text = readme.read_text()
    after = text[text.index("<!-- the training loop"):]
    block = re.search(r"```python\n(.*?)```", after, re.S)
    if block is None:
        raise ValueError(f"{readme}: no python block after the training-loop marker")
    code = block.group(1)
    namespace: dict = {}
    exec(compile(code, str(readme), "exec"), namespace)
    return namespace["train"]


def single_process(grads: np.ndarray, steps: int, lr: float = 0.5) -> np.ndarray:
    """Gradient descent in one process over the whole batch, from zero (float64)."""
    w = np.zeros(grads.shape[1])
    for _ in range(steps):
        w = w - lr * grads.sum(axis=0) / grads.shape[0]
    return w


def updates(w: np.ndarray, grads: np.ndarray, lr: float = 0.5) -> float:
    """How many updates of single-process training ``w`` is: from zero each update adds the
    same -lr x the batch's mean gradient."""
    g = lr * grads.sum(axis=0) / grads.shape[0]
    return float(-(w @ g) / (g @ g))


class TimedClient(Client):
    """The blocking Client, timing every allreduce and counting what the loop met."""

    def __init__(self, *args, bound: float, waits: Path, **kwargs):
        super().__init__(*args, **kwargs)
        self.bound, self.waits = bound, waits
        self.counts = dict(calls=0, failed_here=0, tree_wide=0, lost=0, refused=0, resyncs=0)
        self.longest = 0.0
        self.longest_state = 0.0      # seconds, the longest request_state

    def allreduce(self, *args, **kwargs):
        started = time.monotonic()
        outcome = "result"
        try:
            return super().allreduce(*args, **kwargs)
        except StepFailed as e:
            outcome = "tree_wide" if e.tree_wide else "failed_here"
            raise
        except StepLost:
            outcome = "lost"
            raise
        except StepRefused:
            outcome = "refused"
            raise
        except BaseException as e:
            outcome = type(e).__name__
            raise
        finally:
            took = time.monotonic() - started
            self.counts["calls"] += 1
            if outcome in self.counts:
                self.counts[outcome] += 1
            self.longest = max(self.longest, took)
            if took > self.bound:
                with open(self.waits, "a") as f:
                    f.write(json.dumps({"step": kwargs.get("step"), "seconds": round(took, 3),
                                        "outcome": outcome, "at": time.time()}) + "\n")

    def request_state(self, *args, **kwargs):
        self.counts["resyncs"] += 1
        started = time.monotonic()
        try:
            return super().request_state(*args, **kwargs)
        finally:
            self.longest_state = max(self.longest_state, time.monotonic() - started)


def main(spec: dict) -> int:
    name, out = spec["name"], Path(spec["out"])
    label = name or "master"
    grads = gradients(spec["samples"], spec["elements"])
    rng = np.random.default_rng([spec["seed"], spec["life"]])
    progress = out / f"{label}.step"
    train = readme_train()
    deadline = time.monotonic() + 30
    while True:    # a first job's processes may still be attached (DaemonBusy) for a moment
        try:
            c = TimedClient(spec["socket"], job=spec["job"], timeout=60, bound=spec["bound"],
                            waits=out / f"{label}.waits")
            break
        except DaemonBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

    def micro_batches(a, step):
        if step % PROGRESS_EVERY == 0:
            tmp = progress.with_suffix(".tmp")
            tmp.write_text(str(step))
            os.replace(tmp, progress)
        slow = rng.random() < spec["straggle_prob"]
        piece_s = spec["compute_ms"] / 2000 * (spec["straggle_factor"] if slow else 1)
        ranges = list(a.ranges)
        for k in range(2):
            time.sleep(piece_s)                  # the emulated compute of this piece
            yield ranges[k::2]

    def gradient(w, piece):
        g = np.zeros_like(w)
        for start, stop, weight in piece:
            g += weight * grads[start:stop].sum(axis=0)
        return g

    with c:
        w = train(c, np.zeros(spec["elements"]), spec["steps"], micro_batches, gradient,
                  spec["lr"])
        doc = dict(name=name, life=spec["life"], w=w.tolist(), longest=c.longest,
                   longest_state=c.longest_state, reconnects=c.reconnects, **c.counts)
    tmp = out / f"{label}.life-{spec['life']}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, out / f"{label}.life-{spec['life']}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
