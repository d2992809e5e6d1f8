"""Drive one run of PyTorch's Gloo all_reduce for ``python -m benchmarks``: W peers, one per host.

:func:`run_gloo` starts one :mod:`benchmarks.gloo_peer` per emulated host through the
caller's ``spawn``, waits for them, stops any that froze or hung, and turns their JSON records
into per-step times comparable with crnet's schemes.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from crnet.tools.procs import stop_processes
from crnet.tune.workload import ComputeModel

from . import child_env

__all__ = ["run_gloo"]

Spawn = Callable[[int, list, dict], subprocess.Popen]


def run_gloo(spawn: Spawn, hosts: Sequence[str], ifnames: Sequence[str] | None, *,
             elements: int, dtype: str, steps: int, compute: str, loads: Sequence[int],
             seed: int, freeze: tuple[int, int] | None = None, deadline: float = 120.0,
             timeout: float = 30.0, workdir: Path, port: int = 29500,
             startup: float = 30.0, poll: float = 0.05) -> dict:
    """Run ``W = len(hosts)`` Gloo peers for ``steps`` steps and return their step times.

    ``spawn(i, argv, env)`` starts ``argv`` with environment ``env`` on emulated host ``i``
    (inside its network namespace) and returns its ``Popen``; ``env`` puts this checkout on
    PYTHONPATH, so ``python -m benchmarks.gloo_peer`` runs from any directory. The Popen's pid
    must be the peer itself (``ip netns exec`` execs it), since frozen or hung peers are
    stopped by signalling that pid. ``hosts[i]`` is host ``i``'s address; peer ``i`` has rank
    ``i``, worker index ``i`` (so it draws the same compute times as crnet's worker ``i``) and
    load ``loads[i]``; rank 0's host serves the rendezvous (``tcp://hosts[0]:port``; each
    namespace has its own ports, so a fixed port is fine there).
    ``ifnames[i]`` is the interface Gloo binds on host ``i`` (None: Gloo's own choice).
    ``freeze=(i, k)`` makes peer ``i`` SIGSTOP itself at the start of step ``k`` (a dead host).
    ``deadline`` bounds the peers' stepping (see :mod:`benchmarks.gloo_peer`), ``timeout``
    is Gloo's timeout for the rendezvous and for every all_reduce. JSON records and nothing else
    go to ``workdir``.

    Waiting: until every peer exited; once one has, the others get ``timeout`` + the longest
    compute time of a step + 5 s to follow (a live peer waiting for a gone one gets a Gloo error
    within ``timeout``), and none of that if every peer still running is stopped (frozen).
    Backstop: ``startup + deadline + 3 * timeout`` after the spawn. Leftovers get SIGCONT and
    SIGTERM (a peer writes its record on SIGTERM, even inside all_reduce), then SIGKILL 3 s
    later. Every process started is reaped before this returns, also on error.

    Per-step times: step ``t`` is complete when every peer's all_reduce of step ``t`` returned,
    ``C(t) = max over ranks of completion_times[t]`` (one kernel, one wall clock).
    ``step_times`` are ``C(t) - C(t-1)`` for ``t = 1 .. steps_completed - 1``: step 0 is kept out
    as warm-up (Gloo connects lazily, first touches of memory) and reported alone as
    ``first_step_s = C(0) - the earliest start of step 0`` (after the rendezvous). Each step
    time includes that step's compute sleep, as it does for crnet's schemes.

    Returns ``{"scheme": "gloo", "step_times", "first_step_s", "completion_times" (the C(t)),
    "steps_completed" (steps every peer completed), "steps", "correct" (every peer that wrote a
    record found every completed sum right), "errors" (one string per peer that failed, was killed
    or wrote no record), "stalled" (fewer than ``steps`` steps completed for a reason other than
    the deadline), "deadline_reached", "killed" (ranks the driver had to signal), "pids",
    "returncodes", "startup_s" (spawn to the latest start of step 0), "wall_s", "records"
    (the peers' JSON, None where missing)}``.
    """
    world = len(hosts)
    if world < 1:
        raise ValueError("run_gloo needs at least one host")
    if len(loads) != world:
        raise ValueError(f"{world} hosts but {len(loads)} loads")
    if ifnames is not None and len(ifnames) != world:
        raise ValueError(f"{world} hosts but {len(ifnames)} interface names")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    if freeze is not None and not 0 <= freeze[0] < world:
        raise ValueError(f"freeze worker {freeze[0]} is not one of the {world} peers")
    model = ComputeModel.parse(compute)          # fail here, not in W processes
    longest = _longest_compute(model, loads, seed, steps)

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    outs = [workdir / f"gloo-{i}.json" for i in range(world)]
    for out in outs:
        out.unlink(missing_ok=True)
    host0 = f"[{hosts[0]}]" if ":" in hosts[0] else hosts[0]
    init = f"tcp://{host0}:{port}"

    procs: list[subprocess.Popen] = []
    killed: list[int] = []
    env = child_env()
    t_spawn = time.time()
    try:
        for i in range(world):
            argv = [sys.executable, "-m", "benchmarks.gloo_peer",
                    "--rank", str(i), "--world", str(world), "--init", init,
                    "--elements", str(elements), "--dtype", dtype, "--steps", str(steps),
                    "--compute", compute, "--load", str(loads[i]), "--seed", str(seed),
                    "--worker-index", str(i), "--deadline", repr(float(deadline)),
                    "--timeout", repr(float(timeout)), "--out", str(outs[i])]
            if ifnames is not None and ifnames[i]:
                argv += ["--ifname", ifnames[i]]
            if freeze is not None and freeze[0] == i:
                argv += ["--freeze-at", str(freeze[1])]
            procs.append(spawn(i, argv, env))
        _wait(procs, backstop=time.monotonic() + startup + deadline + 3 * timeout,
              follow=timeout + longest + 5.0, poll=poll)
    finally:
        # SIGTERM, not SIGKILL: a peer writes its record on SIGTERM, even inside all_reduce.
        killed = [i for i, p in enumerate(procs) if p.poll() is None]
        stop_processes(procs, grace=3.0)
    wall = time.time() - t_spawn
    records = [_read(out) for out in outs]
    return _summarise(records, procs, killed, steps=steps, t_spawn=t_spawn, wall=wall)


def _longest_compute(model: ComputeModel, loads: Sequence[int], seed: int, steps: int) -> float:
    """The longest compute time any peer sleeps in one step (exact for small runs)."""
    if steps * len(loads) <= 20000:
        return max((model.compute_time(load, seed, t, i) for i, load in enumerate(loads)
                    for t in range(steps)), default=0.0)
    if model.kind == "straggle":
        return max(loads) * model.per_sample_s * model.factor
    return max(loads) * model.mean_time(1) * 10.0     # shifted-exp/empirical tails: a guess


def _state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``T``: stopped), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def _wait(procs: list[subprocess.Popen], *, backstop: float, follow: float, poll: float) -> None:
    first_exit = None
    while True:
        running = [p for p in procs if p.poll() is None]
        if not running:
            return
        now = time.monotonic()
        if now >= backstop:
            return
        if len(running) < len(procs):
            first_exit = now if first_exit is None else first_exit
            if now - first_exit >= follow:
                return
            if all(_state(p.pid) in ("T", "t") for p in running):
                return
        time.sleep(poll)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _summarise(records: list[dict | None], procs: list[subprocess.Popen], killed: list[int], *,
               steps: int, t_spawn: float, wall: float) -> dict:
    present = [r for r in records if r is not None]
    # A peer without a record is left out: a step another peer completed had its data.
    completed = min((r["steps_completed"] for r in present), default=0)
    done = [max(r["completion_times"][t] for r in present) for t in range(completed)]
    starts = [r["loop_start"] for r in present if r.get("loop_start") is not None]
    first = done[0] - min(starts) if done and starts else None

    errors = []
    for i, r in enumerate(records):
        how = f" (exit code {procs[i].returncode})" if i < len(procs) else ""
        if r is None:
            errors.append(f"rank {i}: no result" + (" (killed by the driver)" if i in killed
                                                    else how))
            continue
        notes = []
        if r.get("frozen_at") is not None:
            notes.append(f"frozen at step {r['frozen_at']}")
        if i in killed:
            notes.append("stopped by the driver")
        if r.get("error") or notes:
            errors.append(f"rank {i}: {r.get('error') or 'no error recorded'}"
                          + (f" ({', '.join(notes)})" if notes else ""))
    deadline_reached = (bool(present) and len(present) == len(records)
                        and all(r.get("stopped") == "deadline" for r in present))
    return {
        "scheme": "gloo",
        "step_times": [b - a for a, b in itertools.pairwise(done)],
        "first_step_s": first,
        "completion_times": done,
        "steps_completed": completed,
        "steps": steps,
        "correct": bool(present) and all(r.get("correct", False) for r in present),
        "errors": errors,
        "stalled": completed < steps and not deadline_reached,
        "deadline_reached": deadline_reached,
        "killed": killed,
        "pids": [p.pid for p in procs],
        "returncodes": [p.returncode for p in procs],
        "startup_s": (max(starts) - t_spawn) if starts else None,
        "wall_s": wall,
        "records": records,
    }
