"""An emulated training process for ``python -m benchmarks`` (one per emulated host).

Compute is emulated: each step the worker sleeps its load x per-sample time x
straggle factor (``crnet.tune.workload``), so the benchmark measures aggregation, not
this machine's two cores. The vector is the sum over the worker's batch share of
per-sample gradients that are all ``(t + 1) * ones``, so every result is checkable:
it must be ``samples * (t + 1)`` everywhere; an approximate result (the master's
``--beyond-s approximate``) must be ``coverage * samples * (t + 1)``, its coverage the
one ``Client.last_result_info`` gives (every sample's gradient is the same, so the
result is the batch's effective mass times it), and the record lists those steps.

Compute times are independent from step to step (the paper's model): a worker
"computes" in micro-batches of ``SLICE`` and checks ``Client.finished(t)``
between them, as the README's training loop does; if the tree finished the
step without it, it stops and takes the tree's result. ``--persistent-stragglers``
instead makes a slow worker finish its computation (a loop that cannot stop
mid-step): it then starts the next steps late too (``python -m benchmarks
--persistent-stragglers`` reports that mode).

    python -m benchmarks.worker --socket S --elements E --steps T --compute SPEC \
        --seed 0 --worker-index I --out result.json [--observer] [--freeze-at K --daemon-pid P] \
        [--barrier N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

from crnet.client import Client
from crnet.errors import CrnetError, StepFailed
from crnet.tune.workload import ComputeModel


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.worker")
    p.add_argument("--socket", required=True)
    p.add_argument("--elements", type=int, required=True)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--compute", default="fixed:0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker-index", type=int, default=0)
    p.add_argument("--persistent-stragglers", action="store_true",
                   help="finish every emulated computation, even for a step the tree finished")
    p.add_argument("--observer", action="store_true",
                   help="the master's client: take every result, compute nothing")
    p.add_argument("--barrier", type=int, default=None, metavar="N",
                   help="wait until N processes (this one included) are there before step 0")
    p.add_argument("--freeze-at", type=int, default=None)
    p.add_argument("--daemon-pid", type=int, default=None)
    p.add_argument("--deadline", type=float, default=300.0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--out", required=True)
    p.add_argument("--job", default="", help="the training job (Client(job=...)); default: any")
    a = p.parse_args(argv)
    record = run(a)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, a.out)


def run(a) -> dict:
    compute = ComputeModel.parse(a.compute)
    record = {"worker": a.worker_index, "steps_completed": 0, "completion_times": [],
              "compute_s": [], "skipped_compute": 0, "failed_steps": [], "correct": True,
              "error": None, "cpu_steady_s": 0.0, "cpu_steps": 0,
              "approximate": []}   # [step, coverage, residual] of every approximate result
    cpu_from = None   # this process's CPU time when step 1 began (step 0 includes start-up)
    try:
        with Client(a.socket, timeout=a.timeout * 2, job=a.job or None) as c:
            load = c.assignment.local_samples
            weight = sum((b - s) * w for s, b, w in c.assignment.ranges)
            vec = c.buffer(a.elements, a.dtype)
            if a.barrier:
                c.barrier("start", processes=a.barrier, timeout=max(a.timeout, 120.0))
            start = time.monotonic()
            for t in range(a.steps):
                if time.monotonic() - start > a.deadline:
                    record["error"] = f"deadline of {a.deadline:g} s reached"
                    break
                if t == a.freeze_at:
                    _freeze(a.daemon_pid)
                if t == 1:
                    cpu_from = time.process_time()
                try:
                    if a.observer:
                        result = c.result(t, like=vec, timeout=a.timeout)
                        record["compute_s"].append(0.0)
                    else:
                        busy = compute.compute_time(load, a.seed, t, a.worker_index)
                        spent = _compute(c, t, busy, stoppable=not a.persistent_stragglers)
                        record["skipped_compute"] += spent < busy
                        record["compute_s"].append(spent)
                        vec.fill(weight * (t + 1))
                        c.mark_current()   # the vector depends on no parameters: never stale
                        # The tree's result, at once if the step is finished already.
                        result = c.allreduce(vec, step=t, timeout=a.timeout)
                except StepFailed as e:
                    record["failed_steps"].append([t, e.reason])
                    record["completion_times"].append(None)
                    continue
                record["completion_times"].append(time.time())
                record["steps_completed"] += 1
                if cpu_from is not None:
                    record["cpu_steady_s"] = time.process_time() - cpu_from
                    record["cpu_steps"] = t
                full = want = c.assignment.samples * (t + 1)
                info = c.last_result_info
                if info is not None and not info.exact:
                    record["approximate"].append([t, info.coverage, info.residual])
                    want = full * info.coverage
                if not (abs(result[0] - want) <= 1e-4 * full and abs(result[-1] - want) <= 1e-4 * full):
                    record["correct"] = False
    except (CrnetError, OSError) as e:
        record["error"] = f"{type(e).__name__}: {e}"
    return record


SLICE = 0.002   # seconds of emulated compute between two looks at the tree's progress


def _compute(c: Client, step: int, seconds: float, stoppable: bool) -> float:
    """Emulate ``seconds`` of compute in micro-batches, as the README's loop does: stop
    once the tree has finished the step (unless not ``stoppable``); returns the time spent."""
    started = time.monotonic()
    end = started + seconds
    while True:
        now = time.monotonic()
        if now >= end or (stoppable and c.finished(step)):
            return now - started
        time.sleep(min(SLICE, end - now))


def _freeze(daemon_pid: int | None) -> None:
    """Freeze this emulated host: its daemon and this process (the driver thaws and kills)."""
    if daemon_pid is not None:
        os.kill(daemon_pid, signal.SIGSTOP)
    os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    main()
