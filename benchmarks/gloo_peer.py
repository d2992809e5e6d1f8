"""One PyTorch Gloo peer of ``python -m benchmarks``: the baseline crnet's schemes are compared against.

One process per emulated host, ``world`` of them, each ``dist.all_reduce`` (SUM; Gloo's ring
allreduce for CPU tensors) of one tensor of ``elements`` per step::

    python -m benchmarks.gloo_peer --rank R --world W --init tcp://ADDR:PORT \
        --elements E --dtype float32 --steps S --compute SPEC --load L --seed SEED \
        --worker-index I [--ifname IF] [--freeze-at K] [--deadline D] [--timeout T] --out FILE.json

Step ``t`` of a peer: sleep the emulated compute time ``ComputeModel.compute_time(L, SEED, t, I)``
(the benchmark measures aggregation, not this machine's cores), fill the tensor with
``rank + 1 + t``, all_reduce it and check the result is ``sum over ranks of (rank + 1 + t)``.
Recorded per step: ``start_times`` (wall clock when all_reduce was called), ``completion_times``
(when it returned) and ``compute_s`` (the time slept); a peer signalled inside an all_reduce has
one more start than completions. All processes of the emulated cluster run
on one kernel, so their wall clocks are the same clock and the driver
(:mod:`benchmarks.gloo_run`) can compare completion times across ranks.

Ending a run:

* ``--steps``: after S steps (``stopped: "steps"``).
* ``--deadline D``: once D seconds have passed since this peer started step 0 it *votes* to stop,
  and the run ends after the step in which any peer voted (``stopped: "deadline"``). Every peer
  must leave after the same step, or the ones still going would wait for the others until the
  Gloo timeout; the vote therefore travels inside that step's all_reduce, at no extra cost: a
  voting peer adds ``V = S_t + 1`` to its fill value (``S_t`` the expected sum), so the sum is
  ``S_t + k V`` with ``k`` the number of voters, the same on every rank. The check of that step
  accepts exactly that sum. The step during which the deadline passes is thus completed and is
  the last one.
* an all_reduce that raises (Gloo timeout of ``--timeout`` seconds, peer gone): its message is
  recorded as ``error`` and the run ends (``stopped: "error"``).
* ``--freeze-at K``: at the start of step K the peer stops itself with SIGSTOP, like a host
  that died without closing its connections; the driver later sends SIGCONT and SIGTERM/SIGKILL.
* SIGTERM or SIGINT, even while blocked inside all_reduce: the result is written with
  ``error: "terminated by SIGTERM"`` (``stopped: "signal"``) and the process exits at once.

The JSON result is always written, atomically (temporary file + rename)::

    {"rank", "world", "worker_index", "steps_completed", "completion_times": [...],
     "start_times": [...], "compute_s": [...], "correct": bool, "error": str | None,
     "stopped": "steps" | "deadline" | "error" | "signal", "frozen_at": int | None,
     "loop_start": wall time step 0 started | None, "init_s": seconds in init_process_group}

``correct`` covers the completed steps (true if none completed). Besides the all_reduce, each step
fills the tensor and checks it (one pass each over the tensor: ~1 ms for 4 MB); those passes
are part of the step time, as the compute sleep is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from datetime import timedelta

from crnet.tune.workload import ComputeModel

DTYPES = ("float32", "float64")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gloo_peer",
                                description="One Gloo all_reduce peer of python -m benchmarks.")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init", required=True, help="init method, e.g. tcp://10.77.0.2:29500")
    p.add_argument("--elements", type=int, required=True)
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--compute", default="fixed:0", help="compute model, e.g. straggle:1e-4,0.1,10")
    p.add_argument("--load", type=int, default=0, help="samples this worker computes per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker-index", type=int, default=None,
                   help="index for the compute draws (default: the rank)")
    p.add_argument("--ifname", default=None, help="network interface Gloo binds (GLOO_SOCKET_IFNAME)")
    p.add_argument("--freeze-at", type=int, default=None, help="SIGSTOP self at the start of this step")
    p.add_argument("--deadline", type=float, default=300.0,
                   help="seconds from step 0 after which the run stops (after the current step)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="Gloo timeout in seconds (rendezvous and every collective)")
    p.add_argument("--out", required=True, help="result JSON file")
    return p


class _Result:
    """The record, written exactly once: by the main thread or by the signal watcher."""

    def __init__(self, path: str, record: dict):
        self.path = path
        self.record = record
        self._lock = threading.Lock()
        self._written = False

    def write(self) -> bool:
        with self._lock:
            if self._written:
                return False
            tmp = f"{self.path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(self.record, f)
            os.replace(tmp, self.path)
            self._written = True
            return True


def _watch_signals(result: _Result) -> None:
    """Write the result and exit on SIGTERM/SIGINT, even while the main thread is blocked.

    Python runs signal handlers only in the main thread, between bytecodes; the main thread may
    sit in all_reduce for the whole Gloo timeout. The C-level handler also writes the signal
    number to a wakeup fd, which this daemon thread reads.
    """
    r, w = os.pipe()
    os.set_blocking(w, False)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            data = os.read(r, 64)
            sigs = [s for s in data if s in (signal.SIGTERM, signal.SIGINT)]
            if sigs:
                name = signal.Signals(sigs[0]).name
                if result.record["error"] is None:
                    result.record["error"] = f"terminated by {name}"
                result.record["stopped"] = "signal"
                result.write()
                os._exit(128 + sigs[0])

    threading.Thread(target=watch, name="signal-watch", daemon=True).start()


def run(a: argparse.Namespace, result: _Result) -> None:
    rec = result.record
    if a.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = a.ifname
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)   # fill/check only; do not compete with the other peers' cores
    compute = ComputeModel.parse(a.compute)
    worker = a.rank if a.worker_index is None else a.worker_index
    dtype = getattr(torch, a.dtype)
    eps = torch.finfo(dtype).eps
    base = a.world * (a.world + 1) // 2        # sum over ranks of (rank + 1)

    t0 = time.time()
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world,
                            timeout=timedelta(seconds=a.timeout))
    rec["init_s"] = time.time() - t0
    tensor = torch.empty(a.elements, dtype=dtype)
    loop_start = time.time()
    rec["loop_start"] = loop_start
    cpu_from = time.process_time()
    for t in range(a.steps):
        if t == a.freeze_at:
            rec["frozen_at"] = t
            os.kill(os.getpid(), signal.SIGSTOP)
        if t == 1:
            cpu_from = time.process_time()   # (step 0 includes start-up)
        busy = compute.compute_time(a.load, a.seed, t, worker)
        if busy > 0:
            time.sleep(busy)
        want = base + a.world * t                  # sum over ranks of (rank + 1 + t)
        vote = want + 1                            # added by a peer that votes to stop
        stop = time.time() - loop_start >= a.deadline
        tensor.fill_(a.rank + 1 + t + (vote if stop else 0))
        rec["start_times"].append(time.time())
        cpu_at = time.process_time()
        try:
            dist.all_reduce(tensor)
        except Exception as e:  # noqa: BLE001 -- whatever failed the step goes in the record
            rec["error"] = f"step {t}: {type(e).__name__}: {_oneline(e)}"
            rec["stopped"] = "error"
            rec["start_times"].pop()
            return
        done = time.time()
        rec["completion_times"].append(done)
        rec["compute_s"].append(busy)
        rec["steps_completed"] = t + 1
        if t >= 1:
            # (all_reduce's own CPU, Gloo's threads included: what allreduce_perf compares)
            rec["cpu_allreduce_s"] = rec.get("cpu_allreduce_s", 0.0) + time.process_time() - cpu_at
            rec["cpu_steady_s"], rec["cpu_steps"] = time.process_time() - cpu_from, t
        lo, hi = (float(x) for x in torch.aminmax(tensor)) if a.elements else (want, want)
        voters = round((lo - want) / vote)
        expect = want + voters * vote
        tol = expect * a.world * eps
        if not (0 <= voters <= a.world and abs(lo - expect) <= tol and abs(hi - expect) <= tol):
            rec["correct"] = False
        if voters > 0:
            rec["stopped"] = "deadline"
            break
    else:
        rec["stopped"] = "steps"
    # Leave together: a peer that exits while another still drains its last sends could
    # reset the connection under it.
    with contextlib.suppress(Exception):  # a peer already gone: the record is complete
        dist.barrier()
        dist.destroy_process_group()


def _oneline(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 500 else text[:497] + "..."


def main(argv=None) -> None:
    a = _parser().parse_args(argv)
    record = {"rank": a.rank, "world": a.world,
              "worker_index": a.rank if a.worker_index is None else a.worker_index,
              "steps_completed": 0, "completion_times": [], "start_times": [], "compute_s": [],
              "correct": True, "error": None, "stopped": None, "frozen_at": None,
              "loop_start": None, "init_s": None}
    result = _Result(a.out, record)
    _watch_signals(result)
    code = 0
    try:
        run(a, result)
    except Exception as e:  # noqa: BLE001 -- any error (init timeout, bad spec, ...) goes in the record
        record["error"] = f"{type(e).__name__}: {_oneline(e)}"
        record["stopped"] = "error"
    if record["error"] is not None:
        code = 1
    result.write()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: with a peer gone, Gloo's destructors can block on its sockets.
    os._exit(code)


if __name__ == "__main__":
    main()
